package scheduler

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"maps"
	"os"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/statestore"
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

// AdminState is what the admin API changed, persisted in admin.state_file.
type AdminState struct {
	Budgets map[string]BudgetOverride `json:"budgets"` // by budget id
	Clamps  map[string]Clamp          `json:"clamps"`  // by tenant
}

// ErrAdminInput marks a bad admin request (400 with a field path).
var ErrAdminInput = errors.New("invalid admin input")

// InputError is an admin input error naming its field.
type InputError struct {
	Param, Msg string
}

func (e *InputError) Error() string        { return e.Param + ": " + e.Msg }
func (e *InputError) Is(target error) bool { return target == ErrAdminInput }

func inputErr(param, format string, a ...any) error {
	return &InputError{Param: param, Msg: fmt.Sprintf(format, a...)}
}

// EffectiveConfig applies the admin state to the file config: budget
// overrides replace or remove file budgets by id; clamps lower concurrency,
// weight and output caps. The result is what the policy is built from.
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

// GlobalTenant is the name under which fleet-wide budgets appear in the
// admin API and in metrics' tenant label.
const GlobalTenant = "_global"

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

// rebuildLocked builds and commits a policy from the file config plus the
// admin state (s.polMu held). Queued and running requests keep the policy
// they were admitted under.
func (s *Server) rebuildLocked(file *config.File) error {
	eff := EffectiveConfig(file, &s.admin, s.now())
	if err := eff.Validate(); err != nil {
		return err
	}
	s.configureAbuse(eff)
	old := s.pol.Load()
	pol, err := Build(eff, old.Version+1, s.keyer, s.runtimes)
	if err != nil {
		return err
	}
	pol.File = file
	pol.Clamps = map[string]Clamp{}
	for k, c := range s.admin.Clamps {
		if s.now().Before(c.ExpiresAt) {
			pol.Clamps[k] = c
		}
	}
	commit, err := s.q.Prepare(queueConfig(eff))
	if err != nil {
		return fmt.Errorf("queue config: %w", err)
	}
	commit()
	s.pol.Store(pol)
	if pol.LeaseTTL < old.LeaseTTL {
		s.leases.rearm() // the heartbeat period follows a shorter lease_ttl now
	}
	s.signal(s.wake)
	return nil
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

// persistLocked writes the admin state atomically (s.polMu held).
func (s *Server) persistLocked() error {
	path := s.pol.Load().File.Admin.StateFile
	if path == "" {
		return nil
	}
	b, err := json.MarshalIndent(s.admin, "", "  ")
	if err != nil {
		return err
	}
	if err := writeFileAtomic(path, b); err != nil {
		return fmt.Errorf("admin state: %w", err)
	}
	return nil
}

// writeFileAtomic replaces path with b: a synced temporary file renamed
// over it, so a crash leaves the old or the new content, never a torn one.
func writeFileAtomic(path string, b []byte) error { return replaceFile(path, b, true) }

// replaceFile writes b to a temporary file beside path and renames it over
// path, fsyncing it first when sync.
func replaceFile(path string, b []byte, sync bool) error {
	tmp, err := os.CreateTemp(filepath.Dir(path), ".sluice-*")
	if err != nil {
		return err
	}
	_, werr := tmp.Write(b)
	var serr error
	if sync {
		serr = tmp.Sync()
	}
	cerr := tmp.Close()
	if err := errors.Join(werr, serr, cerr); err != nil {
		_ = os.Remove(tmp.Name())
		return err
	}
	if err := os.Rename(tmp.Name(), path); err != nil {
		_ = os.Remove(tmp.Name())
		return err
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
	// The budget's use in its current window, from the ledger (GET
	// /admin/budgets); UsageError when the ledger could not say.
	Committed  *int64 `json:"committed,omitempty"`
	Reserved   *int64 `json:"reserved,omitempty"`
	Remaining  *int64 `json:"remaining,omitempty"`
	ResetsAt   string `json:"resets_at,omitempty"`
	UsageError string `json:"usage_error,omitempty"`
}

// Budgets lists the budgets in force, optionally for one tenant.
func (s *Server) Budgets(tenant string) []BudgetRow {
	pol := s.pol.Load()
	rows := []BudgetRow{}
	if tenant == "" || tenant == GlobalTenant {
		for _, b := range pol.Cfg.Global.Budgets {
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
	for _, t := range pol.Order {
		if tenant != "" && t.Name != tenant {
			continue
		}
		for _, b := range t.Cfg.Budgets {
			id := config.BudgetID(t.Name, b)
			src := "config"
			s.polMu.Lock()
			if _, ok := s.admin.Budgets[id]; ok {
				src = "admin"
			}
			s.polMu.Unlock()
			rows = append(rows, BudgetRow{ID: id, Tenant: t.Name, Dimension: b.Dimension, Limit: b.Limit,
				Window: b.Window.String(), Mode: b.Mode, Source: src})
		}
	}
	sort.Slice(rows, func(i, j int) bool { return rows[i].ID < rows[j].ID })
	return rows
}

// SetBudget upserts a tenant budget by its id <tenant>:<dimension>:<window>;
// it applies to new requests only, existing holds stay. With a shared
// state store it applies to the whole fleet.
func (s *Server) SetBudget(tenant string, b config.Budget) (BudgetRow, error) {
	if b.Mode == "" {
		b.Mode = "block"
	}
	if b.WarnRatio == 0 {
		b.WarnRatio = 0.8
	}
	file := s.pol.Load().File
	if tenant != GlobalTenant && !slices.ContainsFunc(file.Tenants, func(t config.Tenant) bool { return t.Name == tenant }) {
		return BudgetRow{}, inputErr("tenant", "unknown tenant %q", tenant)
	}
	id := config.BudgetID(tenant, b)
	err := s.changeAdmin(func(st *AdminState) error {
		st.Budgets[id] = BudgetOverride{Tenant: tenant, Budget: b}
		return nil
	})
	var ae *InputError
	if errors.As(err, &ae) || errors.Is(err, ErrInvalidAdmin) {
		return BudgetRow{}, &InputError{Param: "budget", Msg: oneLine(err)}
	}
	if err != nil {
		return BudgetRow{}, err
	}
	s.record(audit.Record{Kind: audit.KindBudgetSet, Tenant: tenant, Reason: fmt.Sprintf("%s = %d per %s (%s)", id, b.Limit, b.Window, b.Mode)})
	return BudgetRow{ID: id, Tenant: tenant, Dimension: b.Dimension, Limit: b.Limit, Window: b.Window.String(), Mode: b.Mode, Source: "admin"}, nil
}

// ErrConfigBudget refuses to remove a budget that only the config file
// sets: overrides sit on top of the config, and removing one is how an
// operator goes back to the config's limit, never to no limit.
var ErrConfigBudget = errors.New("the budget comes from the config file")

// BudgetRemoval is the answer to RemoveBudget: the override removed and
// the config budget in force again, if the config has one with that id.
type BudgetRemoval struct {
	Deleted  string     `json:"deleted"`
	Restored *BudgetRow `json:"restored,omitempty"`
}

// NormalizeBudgetID writes the window of an id <tenant>:<dimension>:<window>
// the way BudgetID does, so "acme:tokens:24h" and "acme:tokens:1440m" name
// the budget listed as acme:tokens:24h0m0s.
func NormalizeBudgetID(id string) (string, error) {
	i := strings.LastIndexByte(id, ':')
	if i < 0 || !strings.Contains(id[:i], ":") {
		return "", inputErr("id", "a budget id is <tenant>:<dimension>:<window>, like acme:tokens:24h (got %q)", id)
	}
	w, err := time.ParseDuration(id[i+1:])
	if err != nil || w <= 0 {
		return "", inputErr("id", "the window of budget id %q must be a duration such as 24h", id)
	}
	return id[:i+1] + w.String(), nil
}

// RemoveBudget removes the admin override with that id (any spelling of
// its window). A config budget the override replaced applies again; a
// budget only the config sets is not removed (ErrConfigBudget): set an
// override instead, or edit the config and reload.
func (s *Server) RemoveBudget(id string) (BudgetRemoval, error) {
	id, err := NormalizeBudgetID(id)
	if err != nil {
		return BudgetRemoval{}, err
	}
	var tenant string
	errNone := errors.New("no override")
	err = s.changeAdmin(func(st *AdminState) error {
		o, ok := st.Budgets[id]
		if !ok {
			return errNone
		}
		tenant = o.Tenant
		delete(st.Budgets, id)
		return nil
	})
	if errors.Is(err, errNone) {
		for _, r := range s.Budgets("") {
			if r.ID == id {
				return BudgetRemoval{}, fmt.Errorf("budget %s: %w; change its limit with 'sluice budget set' (an override), or edit the config and reload", id, ErrConfigBudget)
			}
		}
		return BudgetRemoval{}, fmt.Errorf("budget %q: %w", id, ErrNotFound)
	}
	if err != nil {
		return BudgetRemoval{}, err
	}
	out := BudgetRemoval{Deleted: id}
	for _, r := range s.Budgets(tenant) {
		if r.ID == id {
			out.Restored = &r
		}
	}
	reason := id + ": override removed, no config budget with this id"
	if r := out.Restored; r != nil {
		reason = fmt.Sprintf("%s: override removed, the config's %d per %s applies", id, r.Limit, r.Window)
	}
	s.record(audit.Record{Kind: audit.KindBudgetRm, Tenant: tenant, Reason: reason})
	return out, nil
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
	file := s.pol.Load().File
	if !slices.ContainsFunc(file.Tenants, func(t config.Tenant) bool { return t.Name == c.Tenant }) {
		return c, fmt.Errorf("tenant %q: %w", c.Tenant, ErrNotFound)
	}
	if err := s.changeAdmin(func(st *AdminState) error {
		st.Clamps[c.Tenant] = c
		return nil
	}); err != nil {
		return c, err
	}
	if c.Source != "auto" {
		s.abuse.Clamped(c.Tenant, c.ExpiresAt)
	}
	s.log.Warn("tenant clamped", "tenant", c.Tenant, "reason", c.Reason, "until", c.ExpiresAt, "source", c.Source)
	s.record(audit.Record{Kind: audit.KindClamp, Tenant: c.Tenant, Source: c.Source, Reason: c.Reason,
		Code: fmt.Sprintf("concurrency=%d weight=%d max_output_tokens=%d models=%v until=%s", c.Concurrency, c.Weight, c.MaxOutputTokens, c.Models, c.ExpiresAt.UTC().Format(time.RFC3339))})
	return c, nil
}

// Unclamp lifts a tenant's clamp; it reports whether there was one.
func (s *Server) Unclamp(tenant string) (bool, error) {
	had := false
	err := s.changeAdmin(func(st *AdminState) error {
		if _, had = st.Clamps[tenant]; !had {
			return statestore.ErrUnchanged
		}
		delete(st.Clamps, tenant)
		return nil
	})
	if err != nil || !had {
		return had, err
	}
	s.abuse.Lifted(tenant)
	s.log.Info("tenant unclamped", "tenant", tenant)
	s.record(audit.Record{Kind: audit.KindUnclamp, Tenant: tenant, Source: "admin", Reason: "lifted by operator"})
	return true, nil
}

// expireClamps drops clamps whose time has come and rebuilds the policy, so
// a clamp ends on time even with no admin call. Every instance does it for
// itself (effective limits ignore an expired clamp anyway); the shared
// document is cleaned by whichever instance gets there first.
func (s *Server) expireClamps() {
	now := s.now()
	var expired []Clamp
	err := s.changeAdmin(func(st *AdminState) error {
		expired = expired[:0]
		for name, c := range st.Clamps {
			if !now.Before(c.ExpiresAt) {
				delete(st.Clamps, name)
				expired = append(expired, c)
			}
		}
		if len(expired) == 0 {
			return statestore.ErrUnchanged
		}
		return nil
	})
	if err != nil {
		// The shared store is unreachable: expire locally all the same.
		s.log.Warn("clamp expiry not written to the shared admin state", "err", err)
		s.polMu.Lock()
		next := s.admin.Clone()
		expired = expired[:0]
		for name, c := range next.Clamps {
			if !now.Before(c.ExpiresAt) {
				delete(next.Clamps, name)
				expired = append(expired, c)
			}
		}
		if len(expired) > 0 {
			if err := s.installAdminLocked(next, s.adminApplied); err != nil {
				s.log.Error("rebuilding policy after clamp expiry", "err", err)
			}
		}
		s.polMu.Unlock()
	}
	for _, c := range expired {
		s.log.Info("tenant clamp expired", "tenant", c.Tenant, "reason", c.Reason)
		s.record(audit.Record{Kind: audit.KindUnclamp, Tenant: c.Tenant, Source: c.Source, Reason: "expired: " + c.Reason})
	}
}

// The admin state's source of truth. Without a shared store it is this
// instance's (persisted in admin.state_file). With one (the Redis layout:
// Redis; the embedded layout: files next to the journal) it is the
// document AdminDoc, written by compare-and-set and polled every
// AdminPoll, so a budget or clamp set through any instance applies on
// every instance; admin.state_file then keeps a local copy.
const (
	AdminDoc  = "admin-state"
	AdminPoll = time.Second
)

// ErrInvalidAdmin marks an admin change the policy refuses.
var ErrInvalidAdmin = errors.New("admin change refused")

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

func DecodeAdmin(b []byte) (AdminState, error) {
	var st AdminState
	if len(b) > 0 {
		if err := json.Unmarshal(b, &st); err != nil {
			return st, fmt.Errorf("shared admin state is corrupt: %w", err)
		}
	}
	return st.Clone(), nil
}

// changeAdmin applies change to the admin state and rebuilds the policy:
// through the shared store when there is one (compare-and-set, re-applied
// on conflict, so changes on two instances never lose one), else locally.
// A change the policy refuses is errInvalidAdmin and changes nothing.
// change may return statestore.ErrUnchanged.
func (s *Server) changeAdmin(change func(st *AdminState) error) error {
	s.polMu.Lock()
	defer s.polMu.Unlock()
	file := s.pol.Load().File
	validate := func(st *AdminState) error {
		eff := EffectiveConfig(file, st, s.now())
		if err := eff.Validate(); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidAdmin, err)
		}
		if _, err := Build(eff, 0, s.keyer, map[string]*TenantRuntime{}); err != nil {
			return fmt.Errorf("%w: %w", ErrInvalidAdmin, err)
		}
		return nil
	}
	if s.state == nil {
		next := s.admin.Clone()
		if err := change(&next); err != nil {
			if errors.Is(err, statestore.ErrUnchanged) {
				return nil
			}
			return err
		}
		if err := validate(&next); err != nil {
			return err
		}
		return s.installAdminLocked(next, statestore.Doc{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var next *AdminState
	doc, err := statestore.Update(ctx, s.state, AdminDoc, func(old []byte) ([]byte, error) {
		next = nil
		st, err := DecodeAdmin(old)
		if err != nil {
			return nil, err
		}
		if old == nil {
			st = s.admin.Clone() // first write seeds the fleet with this instance's state
		}
		if err := change(&st); err != nil {
			return nil, err
		}
		if err := validate(&st); err != nil {
			return nil, err
		}
		next = &st
		return json.Marshal(st)
	})
	if err != nil {
		return err
	}
	if next == nil || s.adminApplied.After(doc) {
		return nil // unchanged, or the poll already installed a later one
	}
	return s.installAdminLocked(*next, doc)
}

// installAdminLocked makes st the admin state of the shared document's
// revision doc (s.polMu held; the zero Doc without a shared store):
// rebuilds the policy and keeps the local copy.
func (s *Server) installAdminLocked(st AdminState, doc statestore.Doc) error {
	prev := s.admin
	s.admin = st
	if err := s.rebuildLocked(s.pol.Load().File); err != nil {
		s.admin = prev
		return err
	}
	s.adminApplied = doc
	if err := s.persistLocked(); err != nil {
		s.log.Error("admin state not written to admin.state_file", "err", err)
	}
	return nil
}

// loadSharedAdmin reads the shared admin state at start-up; an empty store
// keeps (and later seeds it with) admin.state_file's content. An
// unreachable store is not fatal: the instance starts from its local copy
// and the admin loop installs the shared state once it answers (with the
// Redis ledger unreachable too, nothing is admitted meanwhile anyway).
func (s *Server) loadSharedAdmin() error {
	if s.state == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	doc, err := s.state.Get(ctx, AdminDoc)
	if err != nil {
		s.log.Warn("shared admin state unreachable at start; using admin.state_file until it answers", "err", err)
		return nil
	}
	if doc.Rev == 0 {
		return nil
	}
	st, err := DecodeAdmin(doc.Data)
	if err != nil {
		return err
	}
	s.admin, s.adminApplied = st, doc
	return nil
}

// adminLoop installs admin changes other instances wrote to the shared
// store, within adminPoll.
func (s *Server) adminLoop(ctx context.Context) error {
	if s.state == nil {
		<-ctx.Done()
		return nil
	}
	err := statestore.Watch(ctx, s.state, AdminDoc, AdminPoll, s.applySharedAdmin, func(err error) {
		s.log.Warn("shared admin state unreadable; keeping the last one", "err", err)
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// applySharedAdmin installs a read d of the shared admin state when it
// is a later revision than the one applied. A read that is neither that
// nor the applied one is read again (it may have raced this instance's own
// write); when the store really went back, the instance converges on it:
// a document the store forgot, or an older revision of the same history,
// is rewritten with the state this instance applied (a failover or a
// restart without persistence does not silently drop budget overrides and
// clamps), and another history someone already wrote is adopted as is.
func (s *Server) applySharedAdmin(d statestore.Doc) {
	s.polMu.Lock()
	applied := s.adminApplied
	s.polMu.Unlock()
	if d.Same(applied) {
		return
	}
	if d.After(applied) {
		s.adoptSharedAdmin(d, applied)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d2, err := s.state.Get(ctx, AdminDoc)
	if err != nil {
		return // the next poll reads again
	}
	s.polMu.Lock()
	applied = s.adminApplied
	s.polMu.Unlock()
	switch {
	case d2.Same(applied):
		return
	case d2.After(applied):
		s.adoptSharedAdmin(d2, applied)
		return
	}
	s.log.Warn("the shared admin state went back (failover, restart without persistence or a deleted document)",
		"applied_rev", applied.Rev, "applied_epoch", applied.Epoch, "store_rev", d2.Rev, "store_epoch", d2.Epoch)
	if d2.Rev > 0 && (d2.Epoch != applied.Epoch || d2.Rev >= applied.Rev) {
		s.adoptSharedAdmin(d2, applied) // another history, already written by someone: it is the fleet's
		return
	}
	s.polMu.Lock()
	b, err := json.Marshal(s.admin)
	s.polMu.Unlock()
	if err != nil {
		return
	}
	nd, err := s.state.CompareAndSet(ctx, AdminDoc, d2.Rev, b)
	if err != nil {
		s.log.Info("shared admin state repair not written; reading it again at the next poll", "err", err)
		return
	}
	s.log.Info("shared admin state rewritten with this instance's", "rev", nd.Rev, "epoch", nd.Epoch)
	s.adoptSharedAdmin(nd, applied)
}

// adoptSharedAdmin installs d if the applied revision is still expect.
func (s *Server) adoptSharedAdmin(d statestore.Doc, expect statestore.Doc) {
	st, err := DecodeAdmin(d.Data)
	if err != nil {
		s.log.Error("shared admin state refused", "err", err)
		return
	}
	s.polMu.Lock()
	defer s.polMu.Unlock()
	if !s.adminApplied.Same(expect) {
		return // a write or another read installed something meanwhile
	}
	prev := s.admin.Clamps
	if err := s.installAdminLocked(st, d); err != nil {
		s.log.Error("shared admin state refused by this instance's config", "rev", d.Rev, "err", err)
		return
	}
	for name, c := range st.Clamps {
		if old, ok := prev[name]; (!ok || old.ExpiresAt != c.ExpiresAt) && c.Source != "auto" {
			s.abuse.Clamped(name, c.ExpiresAt)
		}
	}
	for name := range prev {
		if _, ok := st.Clamps[name]; !ok {
			s.abuse.Lifted(name)
		}
	}
	s.log.Info("admin state changed by another instance", "rev", d.Rev, "budgets", len(st.Budgets), "clamps", len(st.Clamps))
}

// ClampOf returns the tenant's clamp in force at now, if any.
func (p *Snapshot) ClampOf(tenant string, now time.Time) (Clamp, bool) {
	c, ok := p.Clamps[tenant]
	if !ok || !now.Before(c.ExpiresAt) {
		return Clamp{}, false
	}
	return c, true
}
