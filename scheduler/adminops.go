package scheduler

import (
	"context"
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
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

// The admin API's operations on budgets and clamps, and the admin state's
// life in this server: applied to the policy snapshot, persisted in
// admin.state_file, shared through the state store (policy.AdminDoc).

// Clamp is a temporary restriction of a tenant (policy.Clamp).
type Clamp = policy.Clamp

// BudgetOverride is a budget set or removed through the admin API.
type BudgetOverride = policy.BudgetOverride

// GlobalTenant is the name under which fleet-wide budgets appear in the
// admin API and in metrics' tenant label.
const GlobalTenant = policy.GlobalTenant

// ErrAdminInput marks a bad admin request (400 with a field path).
var ErrAdminInput = policy.ErrAdminInput

// adminInputError is an admin input error naming its field.
type adminInputError = policy.InputError

// inputErr is an admin input error of param with a formatted message.
var inputErr = policy.InputErr

// rebuildLocked builds and commits a policy from the file config plus the
// admin state (s.polMu held). Queued and running requests keep the policy
// they were admitted under.
func (s *Server) rebuildLocked(file *config.File) error {
	eff := policy.EffectiveConfig(file, &s.admin, s.now())
	if err := eff.Validate(); err != nil {
		return err
	}
	s.configureAbuse(eff)
	old := s.pol.Load()
	pol, err := policy.Build(eff, old.Version+1, s.keyer, s.runtimes)
	if err != nil {
		return err
	}
	pol.File = file
	pol.Clamps = policy.ClampsInForce(&s.admin, s.now())
	commit, err := s.q.Prepare(queueConfig(eff))
	if err != nil {
		return fmt.Errorf("queue config: %w", err)
	}
	commit()
	s.pol.Store(pol)
	if pol.LeaseTTL < old.LeaseTTL {
		s.settler.Rearm() // the heartbeat period follows a shorter lease_ttl now
	}
	s.signal(s.wake)
	return nil
}

// persistLocked writes the admin state atomically (s.polMu held).
func (s *Server) persistLocked() error {
	path := s.pol.Load().File.Admin.StateFile
	if path == "" {
		return nil
	}
	b, err := s.admin.EncodeFile()
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
	err := s.changeAdmin(func(st *policy.AdminState) error {
		st.Budgets[id] = BudgetOverride{Tenant: tenant, Budget: b}
		return nil
	})
	var ae *adminInputError
	if errors.As(err, &ae) || errors.Is(err, policy.ErrInvalidAdmin) {
		return BudgetRow{}, &adminInputError{Param: "budget", Msg: oneLine(err)}
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
func NormalizeBudgetID(id string) (string, error) { return policy.NormalizeBudgetID(id) }

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
	err = s.changeAdmin(func(st *policy.AdminState) error {
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
	if err := s.changeAdmin(func(st *policy.AdminState) error {
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
	err := s.changeAdmin(func(st *policy.AdminState) error {
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
	err := s.changeAdmin(func(st *policy.AdminState) error {
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

// changeAdmin applies change to the admin state and rebuilds the policy:
// through the shared store when there is one (compare-and-set, re-applied
// on conflict, so changes on two instances never lose one), else locally.
// A change the policy refuses is errInvalidAdmin and changes nothing.
// change may return statestore.ErrUnchanged.
func (s *Server) changeAdmin(change func(st *policy.AdminState) error) error {
	s.polMu.Lock()
	defer s.polMu.Unlock()
	file := s.pol.Load().File
	validate := func(st *policy.AdminState) error { return policy.Check(file, st, s.now(), s.keyer) }
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
	var next *policy.AdminState
	doc, err := statestore.Update(ctx, s.state, policy.AdminDoc, func(old []byte) ([]byte, error) {
		next = nil
		st, err := policy.DecodeAdmin(old)
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
func (s *Server) installAdminLocked(st policy.AdminState, doc statestore.Doc) error {
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
	doc, err := s.state.Get(ctx, policy.AdminDoc)
	if err != nil {
		s.log.Warn("shared admin state unreachable at start; using admin.state_file until it answers", "err", err)
		return nil
	}
	if doc.Rev == 0 {
		return nil
	}
	st, err := policy.DecodeAdmin(doc.Data)
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
	err := statestore.Watch(ctx, s.state, policy.AdminDoc, policy.AdminPoll, s.applySharedAdmin, func(err error) {
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
	d2, err := s.state.Get(ctx, policy.AdminDoc)
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
	nd, err := s.state.CompareAndSet(ctx, policy.AdminDoc, d2.Rev, b)
	if err != nil {
		s.log.Info("shared admin state repair not written; reading it again at the next poll", "err", err)
		return
	}
	s.log.Info("shared admin state rewritten with this instance's", "rev", nd.Rev, "epoch", nd.Epoch)
	s.adoptSharedAdmin(nd, applied)
}

// adoptSharedAdmin installs d if the applied revision is still expect.
func (s *Server) adoptSharedAdmin(d statestore.Doc, expect statestore.Doc) {
	st, err := policy.DecodeAdmin(d.Data)
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
