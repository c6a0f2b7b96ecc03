package lifecycle

import (
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/policy"
)

// tenantLocal is the server's own state of a tenant, kept beside the
// policy's counters (policy.TenantRuntime.Local) so that it survives
// reloads with them.
type tenantLocal struct {
	series atomic.Pointer[tenantSeries]
	// pred is the tenant's recent outputs, for predicted holds (predict.go).
	pred predictor
}

// NewTenantLocal is a tenant's state kept across reloads
// (policy.NewRuntimes' factory).
func NewTenantLocal() any { return &tenantLocal{} }

// localOf is t's server state; every runtime of the server's
// policy.Runtimes has one.
func localOf(t *policy.Tenant) *tenantLocal { return t.RT.Local.(*tenantLocal) }

// tenantSeries holds a tenant's per-request metric children, resolved once
// (label hashing and the vector's map lookup cost on every request
// otherwise). Children are never deleted from the vectors, so a cached one
// stays the exported one.
type tenantSeries struct {
	m          *Metrics
	requestsOK prometheus.Counter
	ttft       prometheus.Observer
	inflight   prometheus.Gauge
	queueWait  prometheus.Observer
}

// seriesOf returns t's cached metric children on m, resolving them on
// first use (and again should the server's Metrics ever change).
func seriesOf(t *policy.Tenant, m *Metrics) *tenantSeries {
	l := localOf(t)
	if ts := l.series.Load(); ts != nil && ts.m == m {
		return ts
	}
	ts := &tenantSeries{
		m:          m,
		requestsOK: m.Requests.WithLabelValues(t.Name, "ok"),
		ttft:       m.TTFT.WithLabelValues(t.Name),
		inflight:   m.Inflight.WithLabelValues(t.Name),
		queueWait:  m.QueueWait.WithLabelValues(t.Name),
	}
	l.series.Store(ts)
	return ts
}

// keyScope is the call's api_key scope for the Reserve, if its key has
// limits of its own.
func (c *call) keyScope() (ledger.Scope, bool) {
	if c.key == nil || len(c.key.Scope.Limits) == 0 {
		return ledger.Scope{}, false
	}
	return c.key.Scope, true
}

// keyAtCap reports whether the call's key has its concurrency in flight on
// this instance (the dispatch predicate parks the tenant then; the ledger
// slot enforces the cap fleet-wide).
func (c *call) keyAtCap() bool {
	k := c.key
	return k != nil && k.Slots > 0 && k.RT.Inflight.Load() >= k.Slots
}

// keyInflight moves the call's key in-flight count by d.
func (c *call) keyInflight(d int64) {
	if c.key != nil {
		c.key.RT.Inflight.Add(d)
	}
}
