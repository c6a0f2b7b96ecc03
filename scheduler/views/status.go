package views

import (
	"slices"
	"sort"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/policy"
)

// StatusIn is what the server copies of itself for the status page.
type StatusIn struct {
	At            time.Time
	PolicyVersion uint64
	Ready         bool
	ReadyReason   string
	Ledger        string // ledger.backend
	GPUSource     string
	StartedAt     time.Time
	// Tenants carry the ledger's use of their scope when they have
	// budgets; Keys are the API keys with limits of their own, in any
	// order.
	Tenants  []TenantIn
	Keys     []KeyIn
	Replicas []ReplicaIn
	Ops      Ops
	Refusals []Refusal // newest first
}

// KeyIn is an API key with limits of its own as the server copies it.
type KeyIn struct {
	Tenant, Label string // the label: name or short hash, never the key
	Runtime       bool   // created through the admin API
	Slots         int64  // its concurrency; 0: none of its own
	Inflight      int64
	ExpiresAt     time.Time // zero: never
	Limits        []ledger.Limit
	Use           LedgerUse
}

// StatusSnapshot is the server's part of the status page (package
// scheduler/adminapi adds the metrics registry's counters): the
// instantaneous state, the sampled rates and peaks and the ledger's use.
type StatusSnapshot struct {
	At            time.Time
	PolicyVersion uint64
	Ready         bool
	ReadyReason   string
	Ledger        string // ledger.backend
	GPUSource     string
	StartedAt     time.Time
	Tenants       []TenantState
	Keys          []KeyReport // keys with budgets or a concurrency of their own
	Replicas      []ReplicaReport
	// Errors names what could not be read, e.g. a ledger snapshot.
	Errors map[string]string
	// Refusals are the last 20 refused or expired requests, newest first.
	Refusals []Refusal
}

// TenantState is one tenant's row of the status page, less the counters
// the page reads from the metrics registry.
type TenantState struct {
	Name           string        `json:"name"`
	Weight         int           `json:"weight"`
	Concurrency    int           `json:"concurrency"`
	Queued         int           `json:"queued"`
	Inflight       int64         `json:"inflight"`
	InflightTokens int64         `json:"inflight_tokens"`
	Keys           int           `json:"keys"`
	Clamp          *policy.Clamp `json:"clamp"`
	Budgets        []UsageRow    `json:"budgets"`
	// The queue's bounds next to its depth: queue.max_depth and
	// queue.max_wait in force (a clamp included).
	MaxDepth int    `json:"max_depth"`
	MaxWait  string `json:"max_wait"`
	TenantOps
}

// KeyReport is one API key with limits of its own: its label (name or
// short hash, never the key), in flight on this instance and budget use.
type KeyReport struct {
	Tenant      string     `json:"tenant"`
	Label       string     `json:"label"`
	Source      string     `json:"source"` // config | admin
	Concurrency int64      `json:"concurrency,omitempty"`
	Inflight    int64      `json:"inflight"`
	ExpiresAt   *time.Time `json:"expires_at,omitempty"`
	Budgets     []UsageRow `json:"budgets"`
}

// ReplicaReport is one replica's row of the status page.
type ReplicaReport struct {
	ReplicaStatus
	HealthFactor float64 `json:"health_factor"`
	Utilization  float64 `json:"gpu_utilization"`
	GPUCount     int     `json:"gpus"`
	KVUsage      float64 `json:"kv_usage"`
	Stale        bool    `json:"scrape_stale"`
	// StateSince is when this process saw the replica enter its state
	// (sampled each second; the process start for the first state).
	StateSince *time.Time `json:"state_since,omitempty"`
	StateForS  int64      `json:"state_for_s"`
	// LastScrapeError is the last failed poll or /v1/models read (null:
	// none since the process started).
	LastScrapeError *fleet.ScrapeErrorReport `json:"last_scrape_error"`
}

// Status builds the server's part of the status page from its copy.
func Status(in StatusIn) StatusSnapshot {
	r := StatusSnapshot{At: in.At.UTC(), PolicyVersion: in.PolicyVersion, Ready: in.Ready, ReadyReason: in.ReadyReason,
		Ledger: in.Ledger, GPUSource: in.GPUSource, Tenants: []TenantState{}, Keys: []KeyReport{}, Replicas: []ReplicaReport{},
		StartedAt: in.StartedAt.UTC(), Refusals: in.Refusals}
	if r.Refusals == nil {
		r.Refusals = []Refusal{}
	}
	fail := func(what string, err error) {
		if err == nil {
			return
		}
		if r.Errors == nil {
			r.Errors = map[string]string{}
		}
		r.Errors[what] = strings.ReplaceAll(err.Error(), "\n", "; ")
	}
	for _, t := range in.Tenants {
		fail("budgets "+t.Name, t.Use.Err)
		r.Tenants = append(r.Tenants, TenantState{Name: t.Name, Weight: t.Weight, Concurrency: t.Concurrency, Queued: t.Queued,
			Inflight: t.Inflight, InflightTokens: t.InflightTokens, Keys: t.Keys, Clamp: t.Clamp, Budgets: BudgetRows(t.Limits, t.Use.Usage),
			MaxDepth: t.MaxDepth, MaxWait: t.MaxWait.String(), TenantOps: in.Ops.Tenant(t.Name)})
	}
	// The config's keys first, in its order; then the run-time ones.
	keys := slices.Clone(in.Keys)
	slices.SortStableFunc(keys, func(a, b KeyIn) int {
		switch {
		case a.Runtime && b.Runtime:
			return strings.Compare(a.Tenant+a.Label, b.Tenant+b.Label)
		case a.Runtime == b.Runtime:
			return 0
		case a.Runtime:
			return 1
		}
		return -1
	})
	for _, k := range keys {
		fail("key budgets "+k.Tenant+"/"+k.Label, k.Use.Err)
		kr := KeyReport{Tenant: k.Tenant, Label: k.Label, Source: "config", Concurrency: k.Slots, Inflight: k.Inflight, Budgets: BudgetRows(k.Limits, k.Use.Usage)}
		if k.Runtime {
			kr.Source = "admin"
		}
		if !k.ExpiresAt.IsZero() {
			e := k.ExpiresAt.UTC()
			kr.ExpiresAt = &e
		}
		r.Keys = append(r.Keys, kr)
	}
	for _, rep := range in.Replicas {
		rr := ReplicaReport{ReplicaStatus: replicaRow(rep), LastScrapeError: rep.LastScrapeError}
		if v := rep.GPU; rep.Known {
			rr.HealthFactor, rr.Utilization, rr.GPUCount, rr.KVUsage, rr.Stale = v.HealthFactor, v.Utilization, v.GPUCount, v.KVUsage, v.ScrapeStale
		}
		if since, ok := in.Ops.ReplicaSince(rep.Name); ok {
			since = since.UTC()
			rr.StateSince, rr.StateForS = &since, int64(in.At.Sub(since)/time.Second)
		}
		r.Replicas = append(r.Replicas, rr)
	}
	sort.SliceStable(r.Replicas, func(i, j int) bool { return r.Replicas[i].Name < r.Replicas[j].Name })
	return r
}
