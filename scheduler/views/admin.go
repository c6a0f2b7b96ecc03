// Package views builds what the admin listener shows: the rows of the
// admin API (GET /admin/replicas, /admin/tenants, /admin/tenants/{name}/usage,
// /admin/budgets, /admin/reservations, /admin/usage) and the status page's
// report, as pure functions over plain copies of the server's state, and
// the status page's operations sampler and refusal log, which the server
// feeds.
//
// It is a package of its own, below both package scheduler and package
// scheduler/adminapi, because both need it and adminapi already imports
// scheduler: the server fills the input values (ReplicaIn, TenantIn,
// StatusIn, ...) with a thin gatherer each and records into the sampler,
// adminapi turns them into the JSON it writes. It imports neither, so the
// views are tested on hand-made inputs, without a server or a listener,
// and the server's internals never reach the HTTP side.
package views

import (
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// LedgerUse is one ledger snapshot of a scope, or why it failed.
type LedgerUse struct {
	Usage ledger.Usage
	Err   error
}

// ReplicaIn is a replica's state as the server copies it.
type ReplicaIn struct {
	Name, URL                string // URL as configured: the views redact it
	InflightTokens, Inflight int64
	AbortsHeld               bool
	Peers, SeqShare          int64
	SeqBound, SeqCut         []string // fleet.Replica.Bound
	MaxNumSeqs, LearnedBatch int64
	BatchLimit, Seqs         int64
	GPU                      gpu.ReplicaView // the monitor's view, when Known
	Known                    bool
	Obs                      *fleet.Obs // the last scrape; nil before the first
	LastScrapeError          *fleet.ScrapeErrorReport
}

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
	// while they do, its fair share of max_num_seqs (0: none; -1: a cap of
	// none, fleet.NoSeqs; SCHEDULING §9).
	Peers    int64 `json:"peers"`
	SeqShare int64 `json:"seq_share"`
	// SeqShareBinds is this instance's tenants the cap binds, from the
	// last split: those it holds heavy, and those of them in SeqShareCut,
	// light tenants it gives less than their claim while a light tenant
	// at another instance waits, or whose own gate lets them through as
	// no flood with a standing queue where their part is a request or
	// more (SCHEDULING §9). Light tenants not listed compete for any room.
	SeqShareBinds []string `json:"seq_share_binds,omitempty"`
	SeqShareCut   []string `json:"seq_share_cut,omitempty"`
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
	// BatchLimit is the most sequences Sluice lets the replica run now:
	// the learned batch (else max_num_seqs, within upstream.learn_ramp
	// while none is learned), lowered to the running count until the
	// next scrape after one showed requests waiting for room. Seqs is
	// the sequences Sluice counts in the replica's batch against it:
	// its own in flight, what the last scrape showed beyond them
	// (another instance's, ignored aborts) and aborts held (SCHEDULING
	// §7). Dispatch to the replica waits while Seqs is at BatchLimit.
	BatchLimit int64 `json:"batch_limit"`
	Seqs       int64 `json:"seqs"`
}

// replicaRow is one replica as GET /admin/replicas and the status page
// show it: what the monitor and the last scrape know of it, and this
// instance's account of its batch.
func replicaRow(r ReplicaIn) ReplicaStatus {
	st := ReplicaStatus{Name: r.Name, URL: vllm.RedactURL(r.URL), InflightTokens: r.InflightTokens, Inflight: r.Inflight, State: "unknown",
		AbortsHeld: r.AbortsHeld, Peers: r.Peers, SeqShare: r.SeqShare, SeqShareBinds: r.SeqBound, SeqShareCut: r.SeqCut, MaxNumSeqs: r.MaxNumSeqs, LearnedBatch: r.LearnedBatch,
		BatchLimit: r.BatchLimit, Seqs: r.Seqs}
	if v := r.GPU; r.Known {
		st.State, st.Reason, st.CapacityTokens, st.Overcommit, st.Sizing = v.State.String(), v.Reason, v.CapacityTokens, v.Overcommit, v.Sizing
	}
	if o := r.Obs; o != nil {
		st.Running, st.Waiting, st.WaitingDeferred, st.LoRAResident = o.Running, o.Waiting, o.Deferred, o.LoRAs
	}
	return st
}

// ReplicaStatuses lists the replicas as GET /admin/replicas shows them.
func ReplicaStatuses(in []ReplicaIn) []ReplicaStatus {
	out := make([]ReplicaStatus, 0, len(in))
	for _, r := range in {
		out = append(out, replicaRow(r))
	}
	return out
}

// TenantIn is a tenant's state as the server copies it.
type TenantIn struct {
	Name                          string
	Weight, Priority, Concurrency int
	Inflight, InflightTokens      int64
	Queued                        int   // this instance's queue depth
	Charged                       int64 // the queue's fair-share charge
	Keys                          int   // API keys: the config's and the run-time ones
	Clamp                         *policy.Clamp
	MaxDepth                      int           // queue.max_depth in force
	MaxWait                       time.Duration // queue.max_wait in force
	// Limits are the tenant's limits in force (budgets and slots), Use
	// the ledger's use of its scope (zero where the view reads none).
	Limits []ledger.Limit
	Use    LedgerUse
}

// TenantStatus is one row of GET /admin/tenants.
type TenantStatus struct {
	Name        string        `json:"name"`
	Weight      int           `json:"weight"`
	Priority    int           `json:"priority"`
	Concurrency int           `json:"concurrency"`
	Inflight    int64         `json:"inflight_requests"`
	Queued      int           `json:"queued"`
	Charged     int64         `json:"charged_cost"`
	Clamp       *policy.Clamp `json:"clamp"`
}

// TenantStatuses lists the tenants as GET /admin/tenants shows them.
func TenantStatuses(in []TenantIn) []TenantStatus {
	out := make([]TenantStatus, 0, len(in))
	for _, t := range in {
		out = append(out, TenantStatus{Name: t.Name, Weight: t.Weight, Priority: t.Priority, Concurrency: t.Concurrency,
			Inflight: t.Inflight, Queued: t.Queued, Charged: t.Charged, Clamp: t.Clamp})
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
	Clamp      *policy.Clamp    `json:"clamp"`
}

// TenantUsageOf is a tenant's use of its limits, from its copy with the
// ledger's snapshot. The limits are those in force (the policy's), not
// only those the ledger has seen a request under: a tenant is listed
// before its first request, and a reloaded limit shows at once.
func TenantUsageOf(t TenantIn) TenantUsage {
	u := t.Use.Usage
	return TenantUsage{Tenant: t.Name, Reserved: Windowed(u.Reserved, true), SlotsInUse: u.SlotsInUse, Unresolved: u.Unresolved,
		Limits: BudgetRows(t.Limits, u), Clamp: t.Clamp}
}

// BudgetRows lists the configured budgets with the ledger's use; a window
// the ledger has not seen yet shows zero use.
func BudgetRows(limits []ledger.Limit, u ledger.Usage) []UsageRow {
	rows := []UsageRow{}
	for _, l := range limits {
		if l.Dim == ledger.Slots || l == policy.ResolutionLimit {
			continue
		}
		// The limit and mode are the policy's: the ledger's copy is the
		// one of the last request, stale after a reload.
		row := UsageRow{Dimension: l.Dim.String(), Window: ledger.FormatWindow(l.Window), Limit: l.Max, Mode: l.Mode.String(), Remaining: l.Max}
		if iu, ok := budgetUse(l.Dim.String(), l.Window, l.Max, u); ok {
			row.Committed, row.Reserved, row.Remaining, row.ResetsAt = iu.Committed, iu.Reserved, iu.Remaining, iu.ResetsAt
		}
		rows = append(rows, row)
	}
	return rows
}

// InUse is a budget's use in its current window.
type InUse struct {
	Committed, Reserved, Remaining int64
	ResetsAt                       string // RFC 3339; "" when the ledger has no window yet
}

// BudgetInUse is the use in u of the budget of dimension dim over window
// (as time.Duration formats it) with limit; false when the window does
// not parse. A window the ledger has not seen yet shows zero use.
func BudgetInUse(dim, window string, limit int64, u ledger.Usage) (InUse, bool) {
	w, err := time.ParseDuration(window)
	if err != nil {
		return InUse{}, false
	}
	iu, ok := budgetUse(dim, w, limit, u)
	if !ok {
		iu.Remaining = max(limit, 0)
	}
	return iu, true
}

// budgetUse finds the ledger's use of one budget; false when the ledger
// has not seen it.
func budgetUse(dim string, w time.Duration, limit int64, u ledger.Usage) (InUse, bool) {
	var iu InUse
	found := false
	for _, ul := range u.Limits {
		if ul.Limit.Dim.String() == dim && ul.Limit.Window == w {
			found = true
			iu.Committed, iu.Reserved = ul.Committed, ul.Reserved
			iu.Remaining = max(limit-ul.Committed-ul.Reserved, 0)
			if !ul.ResetsAt.IsZero() {
				iu.ResetsAt = ul.ResetsAt.UTC().Format(time.RFC3339)
			}
		}
	}
	return iu, found
}

// Windowed names the windowed dimensions of a (all, or only the non-zero).
func Windowed(a ledger.Amounts, zeros bool) map[string]int64 {
	out := map[string]int64{}
	for d := range ledger.NumDims {
		if d.Windowed() && (zeros || a[d] != 0) {
			out[d.String()] = a[d]
		}
	}
	return out
}

// ReservationsIn are one tenant's reservations as the ledger lists them.
type ReservationsIn struct {
	Tenant string
	List   []ledger.ReservationInfo
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

// Reservations lists the reservations as GET /admin/reservations shows them.
func Reservations(in []ReservationsIn) []Reservation {
	out := []Reservation{}
	for _, t := range in {
		for _, r := range t.List {
			out = append(out, Reservation{ID: r.Ref.ID.String(), Tenant: t.Tenant, State: r.State.String(), Held: Windowed(r.Held, false),
				LeaseExpiry: r.LeaseExpiry.UTC().Format(time.RFC3339), AdmittedAt: r.AdmittedAt.UTC().Format(time.RFC3339)})
		}
	}
	return out
}

// UsageIn is the server's cumulative usage counters, copied: per tenant,
// key and model, since the process started or (Window > 0) over the hours
// from [FirstHour].
type UsageIn struct {
	Now, Started time.Time
	Window       time.Duration
	Dims         []string // the names of each count's values, in order
	Counts       []UsageCount
}

// UsageCount is one tenant, key and model's usage, a value per Dims.
type UsageCount struct {
	Tenant, Key, Model string
	Values             []int64
}

// FirstHour is the first Unix hour counted over window at now: the hours
// that overlap the last window, rounded up to whole hours.
func FirstHour(now time.Time, window time.Duration) int64 {
	hours := int64((window + time.Hour - 1) / time.Hour)
	return now.Unix()/3600 - hours + 1
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

// UsageFilter selects rows of [Usage]; empty fields match all.
type UsageFilter struct {
	Tenant, Key, Model, Dimension string
}

// Usage reports the counted usage under f, rows sorted by tenant, key and
// model (the values behind sluice_usage_total: a fleet's usage is the sum
// over its instances, as with the counters).
func Usage(in UsageIn, f UsageFilter) UsageReport {
	r := UsageReport{Since: in.Started.UTC(), Until: in.Now.UTC(), Rows: []UsageTotalRow{}}
	if in.Window > 0 {
		r.Window = in.Window.String()
		r.Since = time.Unix(FirstHour(in.Now, in.Window)*3600, 0).UTC()
	}
	for _, c := range in.Counts {
		if (f.Tenant != "" && c.Tenant != f.Tenant) || (f.Key != "" && c.Key != f.Key) || (f.Model != "" && c.Model != f.Model) {
			continue
		}
		row := UsageTotalRow{Tenant: c.Tenant, Key: c.Key, Model: c.Model, Usage: map[string]int64{}}
		for i, n := range in.Dims {
			if f.Dimension == "" || f.Dimension == n {
				row.Usage[n] = c.Values[i]
			}
		}
		r.Rows = append(r.Rows, row)
	}
	slices.SortFunc(r.Rows, func(a, b UsageTotalRow) int {
		return strings.Compare(a.Tenant+"\x00"+a.Key+"\x00"+a.Model, b.Tenant+"\x00"+b.Key+"\x00"+b.Model)
	})
	return r
}
