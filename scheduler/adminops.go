package scheduler

import (
	"encoding/json"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"time"

	"github.com/sluicehq/sluice/scheduler/audit"
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

// adminState is what the admin API changed, persisted in admin.state_file.
type adminState struct {
	Budgets map[string]BudgetOverride `json:"budgets"` // by budget id
	Clamps  map[string]Clamp          `json:"clamps"`  // by tenant
}

// ErrAdminInput marks a bad admin request (400 with a field path).
var ErrAdminInput = errors.New("invalid admin input")

// adminInputError is an admin input error naming its field.
type adminInputError struct {
	param, msg string
}

func (e *adminInputError) Error() string        { return e.param + ": " + e.msg }
func (e *adminInputError) Is(target error) bool { return target == ErrAdminInput }

func inputErr(param, format string, a ...any) error {
	return &adminInputError{param: param, msg: fmt.Sprintf(format, a...)}
}

// effectiveConfig applies the admin state to the file config: budget
// overrides replace or remove file budgets by id; clamps lower concurrency,
// weight and output caps. The result is what the policy is built from.
func effectiveConfig(file *config.File, st *adminState, now time.Time) *config.File {
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
			if c.MaxOutputTokens > 0 && c.MaxOutputTokens < t.MaxOutputTokens {
				t.MaxOutputTokens = c.MaxOutputTokens
			}
		}
		cfg.Tenants[i] = t
	}
	return &cfg
}

// GlobalTenant is the name under which fleet-wide budgets appear in the
// admin API and in metrics' tenant label.
const GlobalTenant = "_global"

// applyOverrides applies the admin budget overrides of one tenant (or of
// GlobalTenant) to a copy of its file budgets.
func applyOverrides(tenant string, file []config.Budget, st *adminState) []config.Budget {
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

// rebuildLocked builds and commits a policy from the file config plus the
// admin state (s.polMu held). Queued and running requests keep the policy
// they were admitted under.
func (s *Server) rebuildLocked(file *config.File) error {
	eff := effectiveConfig(file, &s.admin, s.now())
	if err := eff.Validate(); err != nil {
		return err
	}
	s.configureAbuse(eff)
	old := s.pol.Load()
	pol, err := buildPolicy(eff, old.version+1, s.keyer, s.runtimes)
	if err != nil {
		return err
	}
	pol.file = file
	pol.clamps = map[string]Clamp{}
	for k, c := range s.admin.Clamps {
		if s.now().Before(c.ExpiresAt) {
			pol.clamps[k] = c
		}
	}
	commit, err := s.q.Prepare(queueConfig(eff))
	if err != nil {
		return fmt.Errorf("queue config: %w", err)
	}
	commit()
	s.pol.Store(pol)
	s.reps.mu.Lock()
	s.reps.headroom = eff.Server.Headroom
	s.reps.mu.Unlock()
	s.signal(s.wake)
	return nil
}

// loadAdminState reads admin.state_file; a missing file is an empty state.
func loadAdminState(path string) (adminState, error) {
	st := adminState{Budgets: map[string]BudgetOverride{}, Clamps: map[string]Clamp{}}
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

// persistLocked writes the admin state atomically (s.polMu held).
func (s *Server) persistLocked() error {
	path := s.pol.Load().file.Admin.StateFile
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(s.admin, "", "  ")
	if err != nil {
		return err
	}
	tmp, err := os.CreateTemp(filepath.Dir(path), ".sluice-admin-*")
	if err != nil {
		return fmt.Errorf("admin state: %w", err)
	}
	_, werr := tmp.Write(b)
	serr := tmp.Sync()
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("admin state: %w", err)
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return fmt.Errorf("admin state: %w", err)
	}
	return nil
}

// BudgetRow is one budget as the admin API lists it.
type BudgetRow struct {
	ID        string `json:"id"`
	Tenant    string `json:"tenant"`
	Dimension string `json:"dimension"`
	Limit     int64  `json:"limit"`
	Window    string `json:"window"`
	Mode      string `json:"mode"`
	Source    string `json:"source"` // config | admin
}

// Budgets lists the budgets in force, optionally for one tenant.
func (s *Server) Budgets(tenant string) []BudgetRow {
	pol := s.pol.Load()
	rows := []BudgetRow{}
	if tenant == "" || tenant == GlobalTenant {
		for _, b := range pol.cfg.Global.Budgets {
			id := config.BudgetID(GlobalTenant, b)
			src := "config"
			s.polMu.Lock()
			if _, ok := s.admin.Budgets[id]; ok {
				src = "admin"
			}
			s.polMu.Unlock()
			rows = append(rows, BudgetRow{ID: id, Tenant: GlobalTenant, Dimension: b.Dimension, Limit: b.Limit,
				Window: b.Window.String(), Mode: b.Mode, Source: src})
		}
	}
	for _, t := range pol.order {
		if tenant != "" && t.name != tenant {
			continue
		}
		for _, b := range t.cfg.Budgets {
			id := config.BudgetID(t.name, b)
			src := "config"
			s.polMu.Lock()
			if _, ok := s.admin.Budgets[id]; ok {
				src = "admin"
			}
			s.polMu.Unlock()
			rows = append(rows, BudgetRow{ID: id, Tenant: t.name, Dimension: b.Dimension, Limit: b.Limit,
				Window: b.Window.String(), Mode: b.Mode, Source: src})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ID < rows[j].ID })
	return rows
}

// SetBudget upserts a tenant budget by its id <tenant>:<dimension>:<window>;
// it applies to new requests only, existing holds stay.
func (s *Server) SetBudget(tenant string, b config.Budget) (BudgetRow, error) {
	if b.Mode == "" {
		b.Mode = "block"
	}
	if b.WarnRatio == 0 {
		b.WarnRatio = 0.8
	}
	s.polMu.Lock()
	defer s.polMu.Unlock()
	file := s.pol.Load().file
	if tenant != GlobalTenant && !slices.ContainsFunc(file.Tenants, func(t config.Tenant) bool { return t.Name == tenant }) {
		return BudgetRow{}, inputErr("tenant", "unknown tenant %q", tenant)
	}
	id := config.BudgetID(tenant, b)
	prev, had := s.admin.Budgets[id]
	s.admin.Budgets[id] = BudgetOverride{Tenant: tenant, Budget: b}
	if err := s.rebuildLocked(file); err != nil {
		if had {
			s.admin.Budgets[id] = prev
		} else {
			delete(s.admin.Budgets, id)
		}
		return BudgetRow{}, &adminInputError{param: "budget", msg: oneLine(err)}
	}
	if err := s.persistLocked(); err != nil {
		return BudgetRow{}, err
	}
	s.record(audit.Record{Kind: audit.KindBudgetSet, Tenant: tenant, Reason: fmt.Sprintf("%s = %d per %s (%s)", id, b.Limit, b.Window, b.Mode)})
	return BudgetRow{ID: id, Tenant: tenant, Dimension: b.Dimension, Limit: b.Limit, Window: b.Window.String(), Mode: b.Mode, Source: "admin"}, nil
}

// RemoveBudget removes a budget by id (a config budget is masked).
func (s *Server) RemoveBudget(id string) error {
	s.polMu.Lock()
	defer s.polMu.Unlock()
	var found *BudgetRow
	for _, r := range s.budgetsLocked() {
		if r.ID == id {
			found = &r
			break
		}
	}
	if found == nil {
		return fmt.Errorf("budget %q: %w", id, ErrNotFound)
	}
	prev, had := s.admin.Budgets[id]
	s.admin.Budgets[id] = BudgetOverride{Tenant: found.Tenant, Removed: true}
	if err := s.rebuildLocked(s.pol.Load().file); err != nil {
		if had {
			s.admin.Budgets[id] = prev
		} else {
			delete(s.admin.Budgets, id)
		}
		return err
	}
	s.record(audit.Record{Kind: audit.KindBudgetRm, Tenant: found.Tenant, Reason: id})
	return s.persistLocked()
}

func (s *Server) budgetsLocked() []BudgetRow {
	var rows []BudgetRow
	for _, b := range s.pol.Load().cfg.Global.Budgets {
		rows = append(rows, BudgetRow{ID: config.BudgetID(GlobalTenant, b), Tenant: GlobalTenant})
	}
	for _, t := range s.pol.Load().order {
		for _, b := range t.cfg.Budgets {
			rows = append(rows, BudgetRow{ID: config.BudgetID(t.name, b), Tenant: t.name})
		}
	}
	return rows
}

// SetClamp applies (or replaces) a tenant clamp.
func (s *Server) SetClamp(c Clamp) (Clamp, error) {
	switch {
	case c.Reason == "":
		return c, inputErr("reason", "a clamp needs a reason")
	case !c.ExpiresAt.After(s.now()):
		return c, inputErr("expires_in", "must be a positive duration")
	case c.Concurrency < 0 || c.Weight < 0 || c.MaxOutputTokens < 0:
		return c, inputErr("concurrency", "limits must be >= 0")
	case c.Concurrency == 0 && c.Weight == 0 && c.MaxOutputTokens == 0 && len(c.Models) == 0:
		return c, inputErr("concurrency", "a clamp must restrict at least one of concurrency, weight, max_output_tokens, models")
	}
	if c.Source == "" {
		c.Source = "admin"
	}
	s.polMu.Lock()
	defer s.polMu.Unlock()
	file := s.pol.Load().file
	if !slices.ContainsFunc(file.Tenants, func(t config.Tenant) bool { return t.Name == c.Tenant }) {
		return c, fmt.Errorf("tenant %q: %w", c.Tenant, ErrNotFound)
	}
	prev, had := s.admin.Clamps[c.Tenant]
	s.admin.Clamps[c.Tenant] = c
	if err := s.rebuildLocked(file); err != nil {
		if had {
			s.admin.Clamps[c.Tenant] = prev
		} else {
			delete(s.admin.Clamps, c.Tenant)
		}
		return c, err
	}
	if c.Source != "auto" {
		s.abuse.Clamped(c.Tenant, c.ExpiresAt)
	}
	s.log.Warn("tenant clamped", "tenant", c.Tenant, "reason", c.Reason, "until", c.ExpiresAt, "source", c.Source)
	s.record(audit.Record{Kind: audit.KindClamp, Tenant: c.Tenant, Source: c.Source, Reason: c.Reason,
		Code: fmt.Sprintf("concurrency=%d weight=%d max_output_tokens=%d models=%v until=%s", c.Concurrency, c.Weight, c.MaxOutputTokens, c.Models, c.ExpiresAt.UTC().Format(time.RFC3339))})
	return c, s.persistLocked()
}

// Unclamp lifts a tenant's clamp; it reports whether there was one.
func (s *Server) Unclamp(tenant string) (bool, error) {
	s.polMu.Lock()
	defer s.polMu.Unlock()
	if _, ok := s.admin.Clamps[tenant]; !ok {
		return false, nil
	}
	delete(s.admin.Clamps, tenant)
	if err := s.rebuildLocked(s.pol.Load().file); err != nil {
		return true, err
	}
	s.abuse.Lifted(tenant)
	s.log.Info("tenant unclamped", "tenant", tenant)
	s.record(audit.Record{Kind: audit.KindUnclamp, Tenant: tenant, Source: "admin", Reason: "lifted by operator"})
	return true, s.persistLocked()
}

// expireClamps drops clamps whose time has come and rebuilds the policy, so
// a clamp ends on time even with no admin call.
func (s *Server) expireClamps() {
	now := s.now()
	s.polMu.Lock()
	defer s.polMu.Unlock()
	changed := false
	for name, c := range s.admin.Clamps {
		if !now.Before(c.ExpiresAt) {
			delete(s.admin.Clamps, name)
			changed = true
			s.log.Info("tenant clamp expired", "tenant", name, "reason", c.Reason)
			s.record(audit.Record{Kind: audit.KindUnclamp, Tenant: name, Source: c.Source, Reason: "expired: " + c.Reason})
		}
	}
	if changed {
		if err := s.rebuildLocked(s.pol.Load().file); err != nil {
			s.log.Error("rebuilding policy after clamp expiry", "err", err)
		}
		_ = s.persistLocked()
	}
}

// clampOf returns the tenant's clamp in force at now, if any.
func (p *policy) clampOf(tenant string, now time.Time) (Clamp, bool) {
	c, ok := p.clamps[tenant]
	if !ok || !now.Before(c.ExpiresAt) {
		return Clamp{}, false
	}
	return c, true
}
