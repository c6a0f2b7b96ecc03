package scheduler

import (
	"context"
	"encoding/hex"
	"errors"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// The admin API (package scheduler/adminapi) reads and changes the server
// through these methods and values only: it never holds a *fleet.Replica, a
// *policy or a ledger, so what it shows is a copy taken under the server's
// own rules, and the server's internals can change without the HTTP side.

// ErrNotSupported marks an operation the configured backend cannot do.
var ErrNotSupported = errors.New("not supported")

// AdminInputField returns the field path and message of a bad admin
// request (an error that matches [ErrAdminInput]).
func AdminInputField(err error) (param, msg string, ok bool) {
	var ai *adminInputError
	if !errors.As(err, &ai) {
		return "", "", false
	}
	return ai.Param, ai.Msg, true
}

// AdminInputError is a bad admin request naming its field.
func AdminInputError(param, format string, a ...any) error { return inputErr(param, format, a...) }

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// Now is the server's clock.
func (s *Server) Now() time.Time { return s.now() }

// PolicyVersion is the version of the policy in force.
func (s *Server) PolicyVersion() uint64 { return s.pol.Load().Version }

// StatusToken is admin.status_token in force ("sha256:<hex>", "" none).
func (s *Server) StatusToken() string { return s.pol.Load().File.Admin.StatusToken }

// HasTenant reports whether name is a configured tenant.
func (s *Server) HasTenant(name string) bool { return s.pol.Load().Tenants[name] != nil }

// ReplicaStatus is one row of GET /admin/replicas.
type ReplicaStatus struct {
	Name           string  `json:"name"`
	URL            string  `json:"url"`
	State          string  `json:"state"`
	Reason         string  `json:"reason,omitempty"`
	CapacityTokens int64   `json:"capacity_tokens"`
	InflightTokens int64   `json:"inflight_tokens"`
	Inflight       int64   `json:"inflight_requests"`
	Overcommit     float64 `json:"overcommit"`
	Running        int64   `json:"vllm_running"`
	Waiting        int64   `json:"vllm_waiting"`
	// AbortsHeld: a scrape showed sequences this instance cannot account
	// for (another instance's, or aborts the replica ignored), so aborted
	// requests keep their slot there until a scrape (SCHEDULING §7).
	AbortsHeld bool `json:"aborts_held"`
	// Peers is how many other instances report demand on this replica (a
	// Redis fleet); SeqShare is this instance's cap on its requests here
	// while they do, its fair share of max_num_seqs (0: none; SCHEDULING §9).
	Peers    int64 `json:"peers"`
	SeqShare int64 `json:"seq_share"`
	// Sizing is where capacity_tokens comes from: "kv" (the replica's
	// vllm:cache_config_info), "batch" (its metrics lack that: it is sized
	// on max_num_seqs and capacity_tokens is only a bound), "config"
	// (capacity_tokens in the config), or "" before the first scrape.
	Sizing string `json:"sizing"`
	// WaitingDeferred is the part of vllm_waiting held back by a
	// transient constraint (LoRA budget, KV transfer, grammar), not room.
	WaitingDeferred int64 `json:"vllm_waiting_deferred"`
	// LoRAResident is the LoRA adapters of the replica's running requests
	// (vllm:lora_requests_info); requests for them prefer this replica.
	LoRAResident []string `json:"lora_resident,omitempty"`
	// MaxNumSeqs is the configured bound (default 256); LearnedBatch is
	// the batch learned from the replica's scrapes, which Sluice fills
	// instead while it is set (0: none learned; SCHEDULING §7).
	MaxNumSeqs   int64 `json:"max_num_seqs"`
	LearnedBatch int64 `json:"learned_batch"`
}

// fillReplica adds what the monitor and the last scrape know of r.
func fillReplica(st *ReplicaStatus, r *fleet.Replica, v gpu.ReplicaView, known bool) {
	if known {
		st.State, st.Reason, st.CapacityTokens, st.Overcommit, st.Sizing = v.State.String(), v.Reason, v.CapacityTokens, v.Overcommit, v.Sizing
	}
	if o := r.Obs.Load(); o != nil {
		st.Running, st.Waiting, st.WaitingDeferred, st.LoRAResident = o.Running, o.Waiting, o.Deferred, o.LoRAs
	}
}

// ReplicaStatuses lists the replicas as GET /admin/replicas shows them.
func (s *Server) ReplicaStatuses() []ReplicaStatus {
	snap := s.gpu.Snapshot()
	now := s.now()
	out := []ReplicaStatus{}
	for _, r := range s.reps.List() {
		st := ReplicaStatus{Name: r.Name, URL: vllm.RedactURL(r.URL), InflightTokens: r.Load.Load(), Inflight: r.Count.Load(), State: "unknown",
			AbortsHeld: r.Distrusted(now), Peers: r.Peers.Load(), SeqShare: r.Share.Load(),
			MaxNumSeqs: r.MaxSeqs, LearnedBatch: r.Learned()}
		v, ok := snap.Replica(r.Name)
		fillReplica(&st, r, v, ok)
		out = append(out, st)
	}
	return out
}

// DrainReplica drains the replica (reason != "": it finishes what it
// runs and gets nothing new) or undrains it (reason == "").
func (s *Server) DrainReplica(name, reason string) error {
	if err := s.gpu.Drain(name, reason); err != nil {
		return err
	}
	s.log.Info("replica drain changed by admin", "replica", name, "drained", reason != "", "reason", reason)
	s.signal(s.wake)
	return nil
}

// TenantStatus is one row of GET /admin/tenants.
type TenantStatus struct {
	Name        string `json:"name"`
	Weight      int    `json:"weight"`
	Priority    int    `json:"priority"`
	Concurrency int    `json:"concurrency"`
	Inflight    int64  `json:"inflight_requests"`
	Queued      int    `json:"queued"`
	Charged     int64  `json:"charged_cost"`
	Clamp       *Clamp `json:"clamp"`
}

// TenantStatuses lists the tenants as GET /admin/tenants shows them.
func (s *Server) TenantStatuses() []TenantStatus {
	pol := s.pol.Load()
	out := []TenantStatus{}
	for _, t := range pol.Order {
		ts := TenantStatus{Name: t.Name, Weight: t.Cfg.Weight, Priority: t.Cfg.Priority, Concurrency: t.Cfg.Concurrency, Inflight: t.RT.Inflight.Load()}
		if qs, ok := s.q.Stats(t.Name); ok {
			ts.Queued, ts.Charged = qs.Depth, qs.Charged
		}
		if c, ok := pol.ClampOf(t.Name, s.now()); ok {
			ts.Clamp = &c
		}
		out = append(out, ts)
	}
	return out
}

// UsageRow is one limit of GET /admin/tenants/{name}/usage.
type UsageRow struct {
	Dimension string `json:"dimension"`
	Window    string `json:"window"`
	Limit     int64  `json:"limit"`
	Mode      string `json:"mode"`
	Committed int64  `json:"committed"`
	Reserved  int64  `json:"reserved"`
	Remaining int64  `json:"remaining"`
	ResetsAt  string `json:"resets_at,omitempty"`
}

// TenantUsage is GET /admin/tenants/{name}/usage.
type TenantUsage struct {
	Tenant     string           `json:"tenant"`
	Reserved   map[string]int64 `json:"reserved"`
	SlotsInUse int64            `json:"slots_in_use"`
	Unresolved int              `json:"unresolved"`
	Limits     []UsageRow       `json:"limits"`
	Clamp      *Clamp           `json:"clamp"`
}

// TenantUsage reads a configured tenant's use of its limits from the
// ledger ([ErrNotFound] for another name).
func (s *Server) TenantUsage(ctx context.Context, name string) (TenantUsage, error) {
	pol := s.pol.Load()
	t := pol.Tenants[name]
	if t == nil {
		return TenantUsage{}, ErrNotFound
	}
	u, err := s.led.Snapshot(ctx, t.ScopeKey, t.ScopeKey)
	if err != nil {
		return TenantUsage{}, err
	}
	out := TenantUsage{Tenant: name, Reserved: map[string]int64{}, SlotsInUse: u.SlotsInUse, Unresolved: u.Unresolved}
	for d := range ledger.NumDims {
		if d.Windowed() {
			out.Reserved[d.String()] = u.Reserved[d]
		}
	}
	// The limits in force (the policy's), not only those the ledger has
	// seen a request under: a tenant is listed before its first request,
	// and a reloaded limit shows at once.
	out.Limits = budgetRows(t.Limits, u)
	if c, ok := pol.ClampOf(name, s.now()); ok {
		out.Clamp = &c
	}
	return out, nil
}

// budgetRows lists the tenant's configured budgets with the ledger's use;
// a window the ledger has not seen yet shows zero use.
func budgetRows(limits []ledger.Limit, u ledger.Usage) []UsageRow {
	rows := []UsageRow{}
	for _, l := range limits {
		if l.Dim == ledger.Slots || l == policy.ResolutionLimit {
			continue
		}
		// The limit and mode are the policy's: the ledger's copy is the
		// one of the last request, stale after a reload.
		row := UsageRow{Dimension: l.Dim.String(), Window: ledger.FormatWindow(l.Window), Limit: l.Max, Mode: l.Mode.String(), Remaining: l.Max}
		for _, ul := range u.Limits {
			if ul.Limit.Dim == l.Dim && ul.Limit.Window == l.Window {
				row.Committed, row.Reserved = ul.Committed, ul.Reserved
				row.Remaining = max(l.Max-ul.Committed-ul.Reserved, 0)
				if !ul.ResetsAt.IsZero() {
					row.ResetsAt = ul.ResetsAt.UTC().Format(time.RFC3339)
				}
			}
		}
		rows = append(rows, row)
	}
	return rows
}

// BudgetsInUse is [Server.Budgets] with each row's use in its current
// window from the ledger (one snapshot per tenant). A tenant whose
// snapshot fails keeps its rows without use and names the error.
func (s *Server) BudgetsInUse(ctx context.Context, tenant string) []BudgetRow {
	rows := s.Budgets(tenant)
	pol := s.pol.Load()
	snaps := map[string]*ledger.Usage{}
	errs := map[string]string{}
	for i := range rows {
		r := &rows[i]
		u, ok := snaps[r.Tenant]
		if !ok {
			var key ledger.ScopeKey
			if r.Tenant == GlobalTenant {
				key = s.keyer.GlobalKey()
			} else if t := pol.Tenants[r.Tenant]; t != nil {
				key = t.ScopeKey
			} else {
				continue
			}
			got, err := s.led.Snapshot(ctx, key, key)
			if err != nil {
				errs[r.Tenant] = oneLine(err)
			} else {
				u = &got
			}
			snaps[r.Tenant] = u
		}
		if u == nil {
			r.UsageError = errs[r.Tenant]
			continue
		}
		w, err := time.ParseDuration(r.Window)
		if err != nil {
			continue
		}
		var committed, reserved int64
		for _, ul := range u.Limits {
			if ul.Limit.Dim.String() == r.Dimension && ul.Limit.Window == w {
				committed, reserved = ul.Committed, ul.Reserved
				if !ul.ResetsAt.IsZero() {
					r.ResetsAt = ul.ResetsAt.UTC().Format(time.RFC3339)
				}
			}
		}
		r.Committed, r.Reserved = &committed, &reserved
		rem := max(r.Limit-committed-reserved, 0)
		r.Remaining = &rem
	}
	return rows
}

// Resolution is an operator's ending of a reservation the server could
// not settle: Charge is "held" (at its held amount), "actual" (at Actual,
// by dimension name) or "zero".
type Resolution struct {
	Tenant string
	ID     string // the ledger request id, 32 hex digits
	Charge string
	Actual map[string]int64
	Reason string
}

// Resolved is a resolution's outcome: the reservation's state and what was
// charged, by dimension name.
type Resolved struct {
	State   string
	Charged map[string]int64
}

// ResolveReservation ends an UNRESOLVED (or dispatched, abandoned) hold
// as r says, logs it and records it in the audit trail.
func (s *Server) ResolveReservation(ctx context.Context, r Resolution) (Resolved, error) {
	t := s.pol.Load().Tenants[r.Tenant]
	switch {
	case t == nil:
		return Resolved{}, inputErr("tenant", "unknown tenant %q", r.Tenant)
	case r.Reason == "":
		return Resolved{}, inputErr("reason", "required")
	}
	var id ledger.RequestID
	if b, err := hex.DecodeString(r.ID); err != nil || len(b) != len(id) {
		return Resolved{}, inputErr("id", "must be a 32-hex-digit ledger request id")
	}
	_, _ = hex.Decode(id[:], []byte(r.ID))
	ref := ledger.Ref{Tenant: t.ScopeKey, ID: id}
	var st ledger.Settlement
	var err error
	switch r.Charge {
	case "held":
		st, err = s.led.Resolve(ctx, ref)
	case "zero", "actual":
		var amt ledger.Amounts
		for k, v := range r.Actual {
			if r.Charge == "zero" {
				break
			}
			d, perr := ledger.ParseDim(k)
			if perr != nil || d == ledger.Slots {
				return Resolved{}, inputErr("actual."+k, "unknown dimension")
			}
			amt[d] = v
		}
		if r.Charge == "actual" && amt[ledger.Tokens] == 0 {
			amt[ledger.Tokens] = amt[ledger.InputTokens] + amt[ledger.OutputTokens]
		}
		if verr := amt.Validate(); verr != nil {
			return Resolved{}, inputErr("actual", "%v", verr)
		}
		st, err = s.led.Settle(ctx, ref, amt, ledger.SourceResolved)
	default:
		return Resolved{}, inputErr("charge", "must be held, actual or zero (got %q)", r.Charge)
	}
	if err != nil {
		return Resolved{}, err
	}
	s.log.Warn("reservation resolved by admin", "tenant", r.Tenant, "id", r.ID, "charge", r.Charge, "reason", r.Reason)
	s.record(audit.Record{Kind: audit.KindResolve, Tenant: r.Tenant, RequestID: r.ID, Source: "operator", State: st.State.String(),
		Reason: r.Charge + ": " + r.Reason, TokensCharged: st.Charged[ledger.Tokens], GPUMs: st.Charged[ledger.GPUMs], USDMicros: st.Charged[ledger.USDMicros]})
	return Resolved{State: st.State.String(), Charged: windowed(st.Charged, true)}, nil
}

// windowed names the windowed dimensions of a (all, or only the non-zero).
func windowed(a ledger.Amounts, zeros bool) map[string]int64 {
	out := map[string]int64{}
	for d := range ledger.NumDims {
		if d.Windowed() && (zeros || a[d] != 0) {
			out[d.String()] = a[d]
		}
	}
	return out
}

// ReservationLister is the optional ledger capability behind
// [Server.Reservations].
type ReservationLister interface {
	List(ctx context.Context, tenant ledger.ScopeKey, state ledger.State, limit int) ([]ledger.ReservationInfo, error)
}

// ListsReservations reports whether the ledger can list reservations.
func (s *Server) ListsReservations() bool {
	_, ok := s.led.(ReservationLister)
	return ok
}

// Reservation is one row of GET /admin/reservations.
type Reservation struct {
	ID          string           `json:"id"`
	Tenant      string           `json:"tenant"`
	State       string           `json:"state"`
	Held        map[string]int64 `json:"held"`
	LeaseExpiry string           `json:"lease_expiry"`
	AdmittedAt  string           `json:"admitted_at"`
}

// Reservations lists up to 1000 reservations per tenant in state (of the
// one tenant, if named); [ErrNotSupported] when the ledger cannot list.
func (s *Server) Reservations(ctx context.Context, tenant string, state ledger.State) ([]Reservation, error) {
	lister, ok := s.led.(ReservationLister)
	if !ok {
		return nil, ErrNotSupported
	}
	out := []Reservation{}
	for _, t := range s.pol.Load().Order {
		if tenant != "" && tenant != t.Name {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		refs, err := lister.List(lctx, t.ScopeKey, state, 1000)
		cancel()
		if err != nil {
			return nil, err
		}
		for _, r := range refs {
			out = append(out, Reservation{ID: r.Ref.ID.String(), Tenant: t.Name, State: r.State.String(), Held: windowed(r.Held, false),
				LeaseExpiry: r.LeaseExpiry.UTC().Format(time.RFC3339), AdmittedAt: r.AdmittedAt.UTC().Format(time.RFC3339)})
		}
	}
	return out, nil
}

// UsageReport is the answer of GET /admin/usage.
type UsageReport struct {
	// Since is when this process started counting (its start); with a
	// window, the start of the first hour counted.
	Since  time.Time       `json:"since"`
	Until  time.Time       `json:"until"`
	Window string          `json:"window,omitempty"`
	Rows   []UsageTotalRow `json:"rows"`
}

// UsageTotalRow is one tenant, key and model's usage; Usage maps each
// dimension (requests, input_tokens, cached_input_tokens, output_tokens,
// gpu_ms, gpu_joules in millijoules, usd_micros) to its amount.
type UsageTotalRow struct {
	Tenant string           `json:"tenant"`
	Key    string           `json:"key"`
	Model  string           `json:"model"`
	Usage  map[string]int64 `json:"usage"`
}

// UsageDimensions are the dimension names of [UsageTotalRow.Usage], in
// the order of the CSV columns.
func UsageDimensions() []string {
	out := make([]string, 0, numUsage)
	for _, d := range usageDims {
		out = append(out, d.String())
	}
	return append(out, usageCachedInput)
}

// UsageWindowMax is the longest window [Server.Usage] counts over.
const UsageWindowMax = usageHours * time.Hour

// UsageFilter selects rows of [Server.Usage]; empty fields match all.
type UsageFilter struct {
	Tenant, Key, Model, Dimension string
	// Window > 0 counts only the hours that overlap the last Window
	// (rounded up to whole hours); 0 counts since the process started.
	Window time.Duration
}

// Usage reports this process's cumulative usage per tenant, key, model and
// dimension under f (the values behind sluice_usage_total). A fleet's
// usage is the sum over its instances, as with the counters.
func (s *Server) Usage(f UsageFilter) UsageReport {
	now := s.now()
	names := UsageDimensions()
	r := UsageReport{Since: s.started.UTC(), Until: now.UTC(), Rows: []UsageTotalRow{}}
	var fromHour int64
	if f.Window > 0 {
		hours := int64((f.Window + time.Hour - 1) / time.Hour)
		fromHour = now.Unix()/3600 - hours + 1
		r.Window = f.Window.String()
		r.Since = time.Unix(fromHour*3600, 0).UTC()
	}
	s.usage.Range(func(k, v any) bool {
		uk, uc := k.(usageKey), v.(*usageCounters)
		if (f.Tenant != "" && uk.tenant != f.Tenant) || (f.Key != "" && uk.key != f.Key) || (f.Model != "" && uk.model != f.Model) {
			return true
		}
		var vals [numUsage]int64
		uc.mu.Lock()
		if f.Window > 0 {
			for _, b := range uc.hours {
				if b.hour >= fromHour && b.hour > 0 {
					for i, x := range b.v {
						vals[i] += x
					}
				}
			}
		} else {
			vals = uc.total
		}
		uc.mu.Unlock()
		row := UsageTotalRow{Tenant: uk.tenant, Key: uk.key, Model: uk.model, Usage: map[string]int64{}}
		for i, n := range names {
			if f.Dimension == "" || f.Dimension == n {
				row.Usage[n] = vals[i]
			}
		}
		r.Rows = append(r.Rows, row)
		return true
	})
	slices.SortFunc(r.Rows, func(a, b UsageTotalRow) int {
		return strings.Compare(a.Tenant+"\x00"+a.Key+"\x00"+a.Model, b.Tenant+"\x00"+b.Key+"\x00"+b.Model)
	})
	return r
}
