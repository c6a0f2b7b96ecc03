package scheduler

import (
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
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
// admin state st (s.polMu held). Queued and running requests keep the
// policy they were admitted under.
func (s *Server) rebuildLocked(file *config.File, st *policy.AdminState) error {
	eff := policy.EffectiveConfig(file, st, s.now())
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
	pol.Clamps = policy.ClampsInForce(st, s.now())
	commit, err := s.Queue().Prepare(lifecycle.QueueConfig(eff))
	if err != nil {
		return fmt.Errorf("queue config: %w", err)
	}
	commit()
	s.pol.Store(pol)
	if pol.LeaseTTL < old.LeaseTTL {
		s.settler.Rearm() // the heartbeat period follows a shorter lease_ttl now
	}
	s.Wake()
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
	admin := s.admin.State()
	rows := []BudgetRow{}
	if tenant == "" || tenant == GlobalTenant {
		for _, b := range pol.Cfg.Global.Budgets {
			id := config.BudgetID(GlobalTenant, b)
			src := "config"
			if _, ok := admin.Budgets[id]; ok {
				src = "admin"
			}
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
			if _, ok := admin.Budgets[id]; ok {
				src = "admin"
			}
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
	err := s.admin.Change(func(st *policy.AdminState) error {
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
	err = s.admin.Change(func(st *policy.AdminState) error {
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
		return BudgetRemoval{}, fmt.Errorf("budget %q: %w", id, apierr.ErrNotFound)
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
		return c, fmt.Errorf("tenant %q: %w", c.Tenant, apierr.ErrNotFound)
	}
	if err := s.admin.Change(func(st *policy.AdminState) error {
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
	err := s.admin.Change(func(st *policy.AdminState) error {
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

// newSharedAdmin follows the admin state st (admin.state_file's content)
// and, with a store, the shared admin document.
func (s *Server) newSharedAdmin(st policy.AdminState, store statestore.Store) *policy.SharedAdmin {
	return policy.NewSharedAdmin(st, policy.SharedAdminDeps{
		Store: store,
		Lock:  &s.polMu,
		File:  func() *config.File { return s.pol.Load().File },
		Keyer: s.keyer,
		Rebuild: func(st *policy.AdminState) error {
			return s.rebuildLocked(s.pol.Load().File, st)
		},
		Clamped: func(tenant string, until time.Time) { s.abuse.Clamped(tenant, until) },
		Lifted:  func(tenant string) { s.abuse.Lifted(tenant) },
		Log:     s.log,
		Now:     s.now,
	})
}

// expireClamps drops the clamps whose time has come (policy.SharedAdmin)
// and records each.
func (s *Server) expireClamps() {
	for _, c := range s.admin.ExpireClamps() {
		s.log.Info("tenant clamp expired", "tenant", c.Tenant, "reason", c.Reason)
		s.record(audit.Record{Kind: audit.KindUnclamp, Tenant: c.Tenant, Source: c.Source, Reason: "expired: " + c.Reason})
	}
}
