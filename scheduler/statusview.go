package scheduler

import (
	"context"
	"sort"
	"time"

	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// StatusSnapshot is the server's part of the status page (package
// scheduler/adminapi renders it): the instantaneous state, the sampled
// rates and peaks (statusops.go) and the ledger's use, copied.
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
	Name           string     `json:"name"`
	Weight         int        `json:"weight"`
	Concurrency    int        `json:"concurrency"`
	Queued         int        `json:"queued"`
	Inflight       int64      `json:"inflight"`
	InflightTokens int64      `json:"inflight_tokens"`
	Keys           int        `json:"keys"`
	Clamp          *Clamp     `json:"clamp"`
	Budgets        []UsageRow `json:"budgets"`
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

// StatusSnapshot copies what the status page shows of the server; ctx
// bounds the ledger reads.
func (s *Server) StatusSnapshot(ctx context.Context) StatusSnapshot {
	pol := s.pol.Load()
	now := s.now()
	ready, why := s.Ready()
	snap := s.gpu.Snapshot()
	r := StatusSnapshot{At: now.UTC(), PolicyVersion: pol.Version, Ready: ready, ReadyReason: why,
		Ledger: pol.Cfg.Ledger.Backend, GPUSource: snap.Source, Tenants: []TenantState{}, Replicas: []ReplicaReport{},
		StartedAt: s.started.UTC(), Refusals: s.m.recent.recent()}
	fail := func(what string, err error) {
		if r.Errors == nil {
			r.Errors = map[string]string{}
		}
		r.Errors[what] = oneLine(err)
	}
	rtKeys := map[string]int{}
	if idx := s.keys.Index(); idx != nil {
		for _, k := range idx.ByKey {
			rtKeys[k.Tenant]++
		}
	}
	for _, t := range pol.Order {
		tr := TenantState{Name: t.Name, Weight: t.Cfg.Weight, Concurrency: t.Cfg.Concurrency,
			Inflight: t.RT.Inflight.Load(), InflightTokens: t.RT.InflightTokens.Load(), Keys: len(t.Keys) + rtKeys[t.Name],
			Budgets: []UsageRow{}, MaxDepth: t.Cfg.Queue.MaxDepth, MaxWait: t.Cfg.Queue.MaxWait.String(), TenantOps: s.tenantOps(t.Name)}
		if qs, ok := s.q.Stats(t.Name); ok {
			tr.Queued = qs.Depth
		}
		if c, ok := pol.ClampOf(t.Name, now); ok {
			tr.Clamp = &c
		}
		if len(t.Limits) > 1 { // more than the slots limit
			u, err := s.led.Snapshot(ctx, t.ScopeKey, t.ScopeKey)
			if err != nil {
				fail("budgets "+t.Name, err)
			}
			tr.Budgets = budgetRows(t.Limits, u)
		}
		r.Tenants = append(r.Tenants, tr)
	}
	r.Keys = s.keyReports(ctx, pol, fail)
	for _, rep := range s.reps.List() {
		rr := ReplicaReport{ReplicaStatus: ReplicaStatus{Name: rep.Name, URL: vllm.RedactURL(rep.URL), InflightTokens: rep.Load.Load(), Inflight: rep.Count.Load(), State: "unknown"}}
		v, ok := snap.Replica(rep.Name)
		fillReplica(&rr.ReplicaStatus, rep, v, ok)
		if ok {
			rr.HealthFactor, rr.Utilization, rr.GPUCount, rr.KVUsage, rr.Stale = v.HealthFactor, v.Utilization, v.GPUCount, v.KVUsage, v.ScrapeStale
		}
		if since, ok := s.replicaSince(rep.Name); ok {
			since = since.UTC()
			rr.StateSince, rr.StateForS = &since, int64(now.Sub(since)/time.Second)
		}
		rr.LastScrapeError = rep.LastScrapeError(now)
		r.Replicas = append(r.Replicas, rr)
	}
	sort.SliceStable(r.Replicas, func(i, j int) bool { return r.Replicas[i].Name < r.Replicas[j].Name })
	return r
}

// keyReports lists the keys that have limits of their own, config keys
// first, with their ledger use.
func (s *Server) keyReports(ctx context.Context, pol *policy.Snapshot, fail func(string, error)) []KeyReport {
	keys := []*policy.Key{}
	for _, t := range pol.Order {
		keys = append(keys, t.Keys...)
	}
	if idx := s.keys.Index(); idx != nil {
		var rt []*policy.Key
		for _, k := range idx.ByKey {
			if pol.Tenants[k.Tenant] != nil {
				rt = append(rt, k)
			}
		}
		sort.Slice(rt, func(i, j int) bool { return rt[i].Tenant+rt[i].Label < rt[j].Tenant+rt[j].Label })
		keys = append(keys, rt...)
	}
	out := []KeyReport{}
	for _, k := range keys {
		if len(k.Scope.Limits) == 0 {
			continue
		}
		kr := KeyReport{Tenant: k.Tenant, Label: k.Label, Source: "config", Concurrency: k.Slots, Inflight: k.RT.Inflight.Load(), Budgets: []UsageRow{}}
		if k.Runtime {
			kr.Source = "admin"
		}
		if !k.ExpiresAt.IsZero() {
			e := k.ExpiresAt.UTC()
			kr.ExpiresAt = &e
		}
		t := pol.Tenants[k.Tenant]
		u, err := s.led.Snapshot(ctx, t.ScopeKey, k.Scope.Key)
		if err != nil {
			fail("key budgets "+k.Tenant+"/"+k.Label, err)
		}
		kr.Budgets = budgetRows(k.Scope.Limits, u)
		out = append(out, kr)
	}
	return out
}
