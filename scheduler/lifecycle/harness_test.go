package lifecycle

import (
	"bytes"
	"context"
	"io"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/scheduler/settle"
	"github.com/sluicehq/sluice/vllm"
)

func init() { queueExpirySpin = 0 }

// testLedger is what a test engine needs of its ledger: the lifecycle's
// calls and the settlement room's.
type testLedger interface {
	Ledger
	settle.Ledger
}

// testDeps are what a test may set beyond the fakes.
type testDeps struct {
	Responses settle.ResponseStore
	Tracer    trace.Tracer
	Audit     func(audit.Record)
	Now       func() time.Time
	// WriteAhead: Settles are written to the pending-writes log before
	// they go out, as with a networked ledger.
	WriteAhead bool
}

// newTestEngine builds the lifecycle on the fakes as the composition root
// does (scheduler.New), with a fixed-size replica per configured replica
// and an empty admin state; opts set further collaborators.
func newTestEngine(t testing.TB, cfg *config.File, led testLedger, up Upstream, opts ...func(*testDeps)) *Engine {
	t.Helper()
	var td testDeps
	for _, o := range opts {
		o(&td)
	}
	if td.Now == nil {
		td.Now = time.Now
	}
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	var gr []gpu.Replica
	for _, rc := range cfg.Upstream.Replicas {
		gr = append(gr, gpu.Replica{Name: rc.Name, CapacityTokens: 1 << 20})
	}
	mon, err := gpu.NewMonitor(gpu.Config{Telemetry: gpu.ModeOff, Replicas: gr}, gpu.Deps{})
	require.NoError(t, err)
	m, err := NewMetrics(prometheus.NewRegistry())
	require.NoError(t, err)
	pol := new(atomic.Pointer[policy.Snapshot])
	owner := ledger.NewOwner()
	st, err := settle.New(settle.Deps{Ledger: led, Owner: owner, LeaseTTL: func() time.Duration { return pol.Load().LeaseTTL },
		Now: td.Now, Record: td.Audit, Responses: td.Responses, Retention: cfg.Ledger.Retention()}, cfg.Paths(), td.WriteAhead || cfg.Ledger.Backend != "memory")
	require.NoError(t, err)
	sizes := map[string]int64{}
	for _, r := range gr {
		sizes[r.Name] = r.CapacityTokens
	}
	reps := fleet.NewSet(lifecycletest.FixedCapacity(sizes))
	var members []*fleet.Replica
	for i, rc := range cfg.Upstream.Replicas {
		r := &fleet.Replica{Name: rc.Name, URL: rc.URL, MaxSeqs: 1 << 20, Clock: mon.Clock(rc.Name), Pinned: rc.Models,
			UpLatency: m.UpstreamLatency.WithLabelValues(rc.Name), PrioritySched: rc.PriorityScheduling, Slot: i}
		r.MaxModelLen.Store(rc.MaxModelLen)
		members = append(members, r)
	}
	reps.SetMembers(members)
	var draining atomic.Bool
	runtimes := policy.NewRuntimes(NewTenantLocal)
	snap, err := policy.Build(cfg, 1, keyer, runtimes)
	require.NoError(t, err)
	snap.File = cfg
	pol.Store(snap)
	s, err := New(Deps{Ledger: led, Upstream: up, Keyer: keyer, GPU: mon, Audit: td.Audit, Tracer: td.Tracer, Metrics: m,
		Now: td.Now, Owner: owner, Queue: QueueConfig(cfg), Fleet: reps, Settler: st, Policy: pol, Draining: &draining,
		Authenticate: func(p *policy.Snapshot, authz []byte) (*policy.Tenant, *policy.Key, error) {
			return p.Authenticate(authz, time.Now(), nil)
		}})
	require.NoError(t, err)
	s.loopOnly = true // tests hold calls queued by not running the loop
	rebuilds.Store(s, func(cfg *config.File) (*policy.Snapshot, error) {
		p, err := policy.Build(cfg, pol.Load().Version+1, keyer, runtimes)
		if p != nil {
			p.File = cfg
		}
		return p, err
	})
	return s
}

// rebuilds holds each test engine's policy builder (its keyer and the
// tenants' live state), for reloadPolicy.
var rebuilds sync.Map // *Engine → func(*config.File) (*policy.Snapshot, error)

// reloadPolicy puts cfg in force on s as the composition root's Reload
// does for the policy: a new snapshot over the same tenants' live state
// (the queue's config is left as it was).
func reloadPolicy(t testing.TB, s *Engine, cfg *config.File) {
	t.Helper()
	build, _ := rebuilds.Load(s)
	p, err := build.(func(*config.File) (*policy.Snapshot, error))(cfg)
	require.NoError(t, err)
	s.pol.Store(p)
}

// serve runs one non-streamed request through the pipeline, as the edge
// does, and returns its outcome.
func serve(ctx context.Context, s *Engine, a admission) ([]byte, error) {
	pol := s.pol.Load()
	t := pol.Tenants["acme"]
	if a.ep == 0 {
		a.ep = vllm.EndpointChat
	}
	if a.reqID == "" {
		a.reqID = "req"
	}
	c, body, err := s.start(ctx, t, pol, a)
	if c != nil {
		c.end()
	}
	return body, err
}

// start runs a call as the edge does: Start, then, unless the call
// streams, Finish into a recordingSink. It returns the call (nil: nothing
// was admitted), the answer's body and the error that ended it. A
// streaming call is returned with its answer open, for the test to finish
// and end (tests of the streamed delivery: stream_test.go).
func (e *Engine) start(ctx context.Context, t *policy.Tenant, pol *policy.Snapshot, a admission) (*call, []byte, error) {
	tk, err := e.begin(ctx, t, pol, a)
	if tk == nil {
		return nil, nil, err
	}
	if tk.Streaming() {
		return tk.c, nil, nil
	}
	var out recordingSink
	tk.Finish(&out)
	return tk.c, out.body, out.err
}

// recordingSink keeps what Finish delivered: the body, or the error it
// answered, or the streamed bytes.
type recordingSink struct {
	body     []byte
	err      error
	refusals int
	streamed bytes.Buffer
}

func (r *recordingSink) Whole(_ Meta, body []byte) { r.body = body }

func (r *recordingSink) Refuse(err error, _ *apierr.Error, _ Meta) {
	r.err = err
	r.refusals++
}

func (r *recordingSink) Stream() (io.Writer, WriteDeadliner) { return &r.streamed, nil }

// tenantUsage reads acme's tenant scope from the Memory.
func tenantUsage(t testing.TB, s *Engine, m *ledger.Memory) ledger.Usage {
	t.Helper()
	return lifecycletest.Usage(t, m, s.pol.Load().Tenants["acme"].ScopeKey)
}
