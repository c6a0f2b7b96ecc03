package scheduler

import (
	"context"
	"slices"
	"time"

	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/scheduler/views"
)

// StatusState copies what the status page shows of the server (package
// scheduler/views builds the page from it); ctx bounds the ledger reads.
func (s *Server) StatusState(ctx context.Context) views.StatusIn {
	pol, now := s.pol.Load(), s.now()
	ready, why := s.Ready()
	in := views.StatusIn{At: now, PolicyVersion: pol.Version, Ready: ready, ReadyReason: why, Ledger: pol.Cfg.Ledger.Backend,
		GPUSource: s.gpu.Snapshot().Source, StartedAt: s.started, Replicas: s.Replicas(), Ops: s.ops.Snapshot(), Refusals: s.m.RecentRefusals()}
	rtKeys := map[string][]*policy.Key{}
	if idx := s.keys.Index(); idx != nil {
		for _, k := range idx.ByKey {
			rtKeys[k.Tenant] = append(rtKeys[k.Tenant], k)
		}
	}
	for _, t := range pol.Order {
		ti := s.tenantIn(pol, t, now)
		ti.Keys += len(rtKeys[t.Name])
		if len(t.Limits) > 1 { // more than the slots limit
			ti.Use.Usage, ti.Use.Err = s.led.Snapshot(ctx, t.ScopeKey, t.ScopeKey)
		}
		in.Tenants = append(in.Tenants, ti)
		for _, k := range slices.Concat(t.Keys, rtKeys[t.Name]) {
			if len(k.Scope.Limits) > 0 { // limits of its own
				ki := views.KeyIn{Tenant: k.Tenant, Label: k.Label, Runtime: k.Runtime, Slots: k.Slots, Inflight: k.RT.Inflight.Load(), ExpiresAt: k.ExpiresAt, Limits: k.Scope.Limits}
				ki.Use.Usage, ki.Use.Err = s.led.Snapshot(ctx, t.ScopeKey, k.Scope.Key)
				in.Keys = append(in.Keys, ki)
			}
		}
	}
	return in
}

// sampleOps records one sample of the counters the status page's rates,
// percentiles and peaks come from (readyLoop, once a second).
func (s *Server) sampleOps(now time.Time) {
	pol, snap := s.pol.Load(), s.gpu.Snapshot()
	smp := views.OpsSample{At: now, Usage: s.UsageCounts(0), Tenants: make(map[string]views.TenantSample, len(pol.Order)), Replicas: map[string]string{}}
	for _, t := range pol.Order {
		ts := views.TenantSample{TTFT: views.HistOf(s.m.TTFT, t.Name), Wait: views.HistOf(s.m.QueueWait, t.Name), Inflight: t.RT.Inflight.Load()}
		if qs, ok := s.Queue().Stats(t.Name); ok {
			ts.Queued = int64(qs.Depth)
		}
		smp.Tenants[t.Name] = ts
	}
	for _, r := range s.reps.List() {
		smp.Replicas[r.Name] = "unknown"
		if v, ok := snap.Replica(r.Name); ok {
			smp.Replicas[r.Name] = v.State.String()
		}
	}
	s.ops.Record(smp, s.started)
}
