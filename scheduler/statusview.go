package scheduler

import (
	"context"
	"sort"
	"time"

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
	LastScrapeError *ScrapeErrorReport `json:"last_scrape_error"`
}

// StatusSnapshot copies what the status page shows of the server; ctx
// bounds the ledger reads.
func (s *Server) StatusSnapshot(ctx context.Context) StatusSnapshot {
	pol := s.pol.Load()
	now := s.now()
	ready, why := s.Ready()
	snap := s.gpu.Snapshot()
	r := StatusSnapshot{At: now.UTC(), PolicyVersion: pol.version, Ready: ready, ReadyReason: why,
		Ledger: pol.cfg.Ledger.Backend, GPUSource: snap.Source, Tenants: []TenantState{}, Replicas: []ReplicaReport{},
		StartedAt: s.started.UTC(), Refusals: s.m.recent.recent()}
	fail := func(what string, err error) {
		if r.Errors == nil {
			r.Errors = map[string]string{}
		}
		r.Errors[what] = oneLine(err)
	}
	rtKeys := map[string]int{}
	if idx := s.rtKeys.Load(); idx != nil {
		for _, k := range idx.byKey {
			rtKeys[k.tenant]++
		}
	}
	for _, t := range pol.order {
		tr := TenantState{Name: t.name, Weight: t.cfg.Weight, Concurrency: t.cfg.Concurrency,
			Inflight: t.rt.inflight.Load(), InflightTokens: t.rt.inflightTokens.Load(), Keys: len(t.keys) + rtKeys[t.name],
			Budgets: []UsageRow{}, MaxDepth: t.cfg.Queue.MaxDepth, MaxWait: t.cfg.Queue.MaxWait.String(), TenantOps: s.tenantOps(t.name)}
		if qs, ok := s.q.Stats(t.name); ok {
			tr.Queued = qs.Depth
		}
		if c, ok := pol.clampOf(t.name, now); ok {
			tr.Clamp = &c
		}
		if len(t.limits) > 1 { // more than the slots limit
			u, err := s.led.Snapshot(ctx, t.key, t.key)
			if err != nil {
				fail("budgets "+t.name, err)
			}
			tr.Budgets = budgetRows(t.limits, u)
		}
		r.Tenants = append(r.Tenants, tr)
	}
	r.Keys = s.keyReports(ctx, pol, fail)
	for _, rep := range s.reps.list() {
		rr := ReplicaReport{ReplicaStatus: ReplicaStatus{Name: rep.name, URL: vllm.RedactURL(rep.url), InflightTokens: rep.load.Load(), Inflight: rep.count.Load(), State: "unknown"}}
		v, ok := snap.Replica(rep.name)
		fillReplica(&rr.ReplicaStatus, rep, v, ok)
		if ok {
			rr.HealthFactor, rr.Utilization, rr.GPUCount, rr.KVUsage, rr.Stale = v.HealthFactor, v.Utilization, v.GPUCount, v.KVUsage, v.ScrapeStale
		}
		if since, ok := s.replicaSince(rep.name); ok {
			since = since.UTC()
			rr.StateSince, rr.StateForS = &since, int64(now.Sub(since)/time.Second)
		}
		rr.LastScrapeError = rep.lastScrapeError(now)
		r.Replicas = append(r.Replicas, rr)
	}
	sort.SliceStable(r.Replicas, func(i, j int) bool { return r.Replicas[i].Name < r.Replicas[j].Name })
	return r
}

// keyReports lists the keys that have limits of their own, config keys
// first, with their ledger use.
func (s *Server) keyReports(ctx context.Context, pol *policy, fail func(string, error)) []KeyReport {
	keys := []*apiKey{}
	for _, t := range pol.order {
		keys = append(keys, t.keys...)
	}
	if idx := s.rtKeys.Load(); idx != nil {
		var rt []*apiKey
		for _, k := range idx.byKey {
			if pol.tenants[k.tenant] != nil {
				rt = append(rt, k)
			}
		}
		sort.Slice(rt, func(i, j int) bool { return rt[i].tenant+rt[i].label < rt[j].tenant+rt[j].label })
		keys = append(keys, rt...)
	}
	out := []KeyReport{}
	for _, k := range keys {
		if len(k.scope.Limits) == 0 {
			continue
		}
		kr := KeyReport{Tenant: k.tenant, Label: k.label, Source: "config", Concurrency: k.slots, Inflight: k.rt.inflight.Load(), Budgets: []UsageRow{}}
		if k.runtime {
			kr.Source = "admin"
		}
		if !k.expiresAt.IsZero() {
			e := k.expiresAt.UTC()
			kr.ExpiresAt = &e
		}
		t := pol.tenants[k.tenant]
		u, err := s.led.Snapshot(ctx, t.key, k.scope.Key)
		if err != nil {
			fail("key budgets "+k.tenant+"/"+k.label, err)
		}
		kr.Budgets = budgetRows(k.scope.Limits, u)
		out = append(out, kr)
	}
	return out
}
