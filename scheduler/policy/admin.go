package policy

import (
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// Clamp is a temporary restriction of a tenant: a safe mode for a tenant
// under suspicion. Zero fields leave that limit as configured. A clamp
// never drops admitted requests; it applies from the next admission (output
// cap, models) or dispatch (concurrency, weight).
type Clamp struct {
	Tenant          string    `json:"tenant"`
	Concurrency     int       `json:"concurrency,omitempty"`
	Weight          int       `json:"weight,omitempty"`
	MaxOutputTokens int64     `json:"max_output_tokens,omitempty"`
	Models          []string  `json:"models,omitempty"`
	Reason          string    `json:"reason"`
	ExpiresAt       time.Time `json:"expires_at"`
	Source          string    `json:"source"` // admin | auto
}

// BudgetOverride is a budget set or removed through the admin API.
type BudgetOverride struct {
	Tenant  string        `json:"tenant"`
	Budget  config.Budget `json:"budget"`
	Removed bool          `json:"removed,omitempty"`
}

// AdminState is what the admin API changed: the content of
// admin.state_file and of the shared admin document (AdminDoc).
type AdminState struct {
	Budgets map[string]BudgetOverride `json:"budgets"` // by budget id
	Clamps  map[string]Clamp          `json:"clamps"`  // by tenant
}

// The admin state's source of truth. Without a shared store it is the
// instance's own (persisted in admin.state_file). With one (the Redis
// layout: Redis; the embedded layout: files next to the journal) it is the
// document AdminDoc, written by compare-and-set and polled every
// AdminPoll, so a budget or clamp set through any instance applies on
// every instance; admin.state_file then keeps a local copy.
const (
	AdminDoc  = "admin-state"
	AdminPoll = time.Second
)

// GlobalTenant is the name under which fleet-wide budgets appear in the
// admin API and in metrics' tenant label.
const GlobalTenant = "_global"

// ErrAdminInput marks a bad admin request (400 with a field path).
var ErrAdminInput = errors.New("invalid admin input")

// ErrInvalidAdmin marks an admin change the policy refuses.
var ErrInvalidAdmin = errors.New("admin change refused")

// InputError is an admin input error naming its field (Param).
type InputError struct {
	Param, Msg string
}

func (e *InputError) Error() string        { return e.Param + ": " + e.Msg }
func (e *InputError) Is(target error) bool { return target == ErrAdminInput }

// InputErr is an InputError of param with a formatted message.
func InputErr(param, format string, a ...any) error {
	return &InputError{Param: param, Msg: fmt.Sprintf(format, a...)}
}

// EffectiveConfig applies the admin state to the file config: budget
// overrides replace or remove file budgets by id; clamps lower concurrency,
// weight and output caps. The result is what the snapshot is built from.
func EffectiveConfig(file *config.File, st *AdminState, now time.Time) *config.File {
	cfg := *file
	cfg.Global.Budgets = applyOverrides(GlobalTenant, file.Global.Budgets, st)
	cfg.Tenants = make([]config.Tenant, len(file.Tenants))
	for i, t := range file.Tenants {
		t.Budgets = applyOverrides(t.Name, t.Budgets, st)
		if c, ok := st.Clamps[t.Name]; ok && now.Before(c.ExpiresAt) {
			if c.Concurrency > 0 && (t.Concurrency == 0 || c.Concurrency < t.Concurrency) { // 0: uncapped
				t.Concurrency = c.Concurrency
			}
			if c.Weight > 0 && c.Weight < t.Weight {
				t.Weight = c.Weight
			}
			if c.MaxOutputTokens > 0 && (t.MaxOutputTokens == 0 || c.MaxOutputTokens < t.MaxOutputTokens) { // 0: uncapped
				t.MaxOutputTokens = c.MaxOutputTokens
			}
		}
		cfg.Tenants[i] = t
	}
	return &cfg
}

// applyOverrides applies the admin budget overrides of one tenant (or of
// GlobalTenant) to a copy of its file budgets.
func applyOverrides(tenant string, file []config.Budget, st *AdminState) []config.Budget {
	out := slices.Clone(file)
	ids := make([]string, 0, len(st.Budgets))
	for id := range st.Budgets {
		ids = append(ids, id)
	}
	sort.Strings(ids) // deterministic order of appended budgets
	for _, id := range ids {
		o := st.Budgets[id]
		if o.Tenant != tenant {
			continue
		}
		j := slices.IndexFunc(out, func(b config.Budget) bool { return config.BudgetID(tenant, b) == id })
		switch {
		case o.Removed && j >= 0:
			out = slices.Delete(out, j, j+1)
		case !o.Removed && j >= 0:
			out[j] = o.Budget
		case !o.Removed:
			out = append(out, o.Budget)
		}
	}
	return out
}

// Check refuses (ErrInvalidAdmin) an admin state the file config cannot
// take: the effective config must validate and build.
func Check(file *config.File, st *AdminState, now time.Time, keyer *ledger.Keyer) error {
	eff := EffectiveConfig(file, st, now)
	if err := eff.Validate(); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidAdmin, err)
	}
	if _, err := Build(eff, 0, keyer, NewRuntimes(nil)); err != nil {
		return fmt.Errorf("%w: %w", ErrInvalidAdmin, err)
	}
	return nil
}

// ClampsInForce is st's clamps that have not expired at now.
func ClampsInForce(st *AdminState, now time.Time) map[string]Clamp {
	out := map[string]Clamp{}
	for k, c := range st.Clamps {
		if now.Before(c.ExpiresAt) {
			out[k] = c
		}
	}
	return out
}

// LoadAdminState reads admin.state_file; a missing file is an empty state.
func LoadAdminState(path string) (AdminState, error) {
	st := AdminState{Budgets: map[string]BudgetOverride{}, Clamps: map[string]Clamp{}}
	if path == "" {
		return st, nil
	}
	b, err := os.ReadFile(path)
	if errors.Is(err, os.ErrNotExist) {
		return st, nil
	}
	if err != nil {
		return st, fmt.Errorf("admin state: %w", err)
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("admin state %s is corrupt: %w", path, err)
	}
	if st.Budgets == nil {
		st.Budgets = map[string]BudgetOverride{}
	}
	if st.Clamps == nil {
		st.Clamps = map[string]Clamp{}
	}
	return st, nil
}

// EncodeFile is st as admin.state_file holds it (LoadAdminState reads it).
func (st AdminState) EncodeFile() ([]byte, error) {
	return json.MarshalIndent(st, "", "  ")
}

// Clone is a copy of st whose maps can be changed (never nil).
func (st AdminState) Clone() AdminState {
	out := AdminState{Budgets: maps.Clone(st.Budgets), Clamps: maps.Clone(st.Clamps)}
	if out.Budgets == nil {
		out.Budgets = map[string]BudgetOverride{}
	}
	if out.Clamps == nil {
		out.Clamps = map[string]Clamp{}
	}
	return out
}

// DecodeAdmin parses the shared admin document; an absent one is empty.
func DecodeAdmin(b []byte) (AdminState, error) {
	var st AdminState
	if len(b) > 0 {
		if err := json.Unmarshal(b, &st); err != nil {
			return st, fmt.Errorf("shared admin state is corrupt: %w", err)
		}
	}
	return st.Clone(), nil
}

// NormalizeBudgetID writes the window of an id <tenant>:<dimension>:<window>
// the way BudgetID does, so "acme:tokens:24h" and "acme:tokens:1440m" name
// the budget listed as acme:tokens:24h0m0s.
func NormalizeBudgetID(id string) (string, error) {
	i := strings.LastIndexByte(id, ':')
	if i < 0 || !strings.Contains(id[:i], ":") {
		return "", InputErr("id", "a budget id is <tenant>:<dimension>:<window>, like acme:tokens:24h (got %q)", id)
	}
	w, err := time.ParseDuration(id[i+1:])
	if err != nil || w <= 0 {
		return "", InputErr("id", "the window of budget id %q must be a duration such as 24h", id)
	}
	return id[:i+1] + w.String(), nil
}
