package lifecycle

import (
	"context"
	"errors"
	"log/slog"
	"net/http"
	"sync"
	"sync/atomic"
	"time"

	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/abuse"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/scheduler/settle"
	"github.com/sluicehq/sluice/vllm"
)

// Ledger is what a call needs of the budget ledger: its reservation, its
// dispatch, its ending, and a tenant's usage for a refusal's details.
type Ledger interface {
	Reserve(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error)
	MarkDispatched(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error
	Settle(ctx context.Context, ref ledger.Ref, actual ledger.Amounts, src ledger.Source) (ledger.Settlement, error)
	Release(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error
	Snapshot(ctx context.Context, tenant, scope ledger.ScopeKey) (ledger.Usage, error)
}

// Upstream is what a call needs of the vLLM client (vllm.Client): Stream
// for chat and completions, Post and ReadBody for the rest of vLLM's
// surface (an answer read whole, or as the SSE events of /v1/responses and
// /v1/messages), Tokenize and CountText for exact counts.
type Upstream interface {
	Stream(ctx context.Context, baseURL, path string, body []byte, requestID string) (*vllm.Stream, error)
	Post(ctx context.Context, baseURL, path string, body []byte, requestID string) (*http.Response, error)
	ReadBody(resp *http.Response) ([]byte, error)
	Tokenize(ctx context.Context, baseURL, model string, r *vllm.Request) ([]int, int, error)
	CountText(ctx context.Context, baseURL, model, text string) (int, error)
}

var _ Upstream = (*vllm.Client)(nil)

// GPU is what a call needs of the GPU monitor (gpu.Monitor): what the
// fleet sizes a hold from (fleet.Holds), the GPU-ms hold of an energy
// budget, and the replica clocks its ending is charged from.
type GPU interface {
	Config() gpu.Config
	Estimator(name string) *gpu.Estimator
	Hold(in, out int64) int64
	HoldEnergy(gpuMs int64) int64
	Clock(name string) *gpu.Clock
}

// Queue is the per-tenant queue of calls, as the composition root sees it
// (its config on reload, its flows for the fleet-wide fair share).
type Queue = queue.Queue[*call]

// Deps are the lifecycle's collaborators, built by the composition root.
// Every field is required but Attribution, Audit, Tracer, Logger, Now,
// NoteLedger and ObserveAbuse.
type Deps struct {
	Ledger   Ledger
	Upstream Upstream
	Keyer    *ledger.Keyer
	GPU      GPU
	// Attribution records per-tenant GPU-ms.
	Attribution *gpu.AttributionMetrics
	// Audit appends to the audit trail; nil keeps none.
	Audit   func(audit.Record)
	Tracer  trace.Tracer // nil: tracing off
	Metrics *Metrics
	Logger  *slog.Logger
	Now     func() time.Time
	Owner   ledger.Owner
	// Queue is the queue's config at start.
	Queue queue.Config
	// Fleet is the replica set dispatched to; Settler the settlement room.
	Fleet   *fleet.Set
	Settler *settle.Settler
	// Policy is the snapshot in force (the root stores it on a reload);
	// Draining is set while the process drains.
	Policy   *atomic.Pointer[policy.Snapshot]
	Draining *atomic.Bool
	// Authenticate maps an Authorization header to its tenant and key under
	// pol, run-time keys included.
	Authenticate func(pol *policy.Snapshot, authz []byte) (*policy.Tenant, *policy.Key, error)
	// NoteLedger hears every ledger call's error (nil included), for
	// metrics and readiness.
	NoteLedger func(op string, err error)
	// ObserveAbuse hears every admission, denial and settlement for the
	// automatic-clamp detectors. Optional.
	ObserveAbuse func(tenant string, ev abuse.Event)
}

// Engine is the call lifecycle and its dispatch loop.
type Engine struct {
	// loopOnly: only the dispatch loop dispatches (unit tests that hold a
	// call queued by not running it); see call.go dispatchInline.
	loopOnly bool

	// onIllegal hears of every illegal lifecycle move (lifecycle.go).
	onIllegal func(error)

	led     Ledger
	up      Upstream
	keyer   *ledger.Keyer
	gpu     GPU
	attr    *gpu.AttributionMetrics
	trail   func(audit.Record) // nil: no audit trail
	tracer  trace.Tracer       // nil: tracing off
	m       *Metrics
	log     *slog.Logger
	now     func() time.Time
	owner   ledger.Owner
	q       *Queue
	reps    *fleet.Set
	pools   gate.Pools[fleet.PoolKey] // per-pool loads and the dispatch gate's memory
	pol     *atomic.Pointer[policy.Snapshot]
	settler *settle.Settler
	wfs     workflows

	authenticate func(pol *policy.Snapshot, authz []byte) (*policy.Tenant, *policy.Key, error)
	noteLedger   func(op string, err error)
	observeAbuse func(tenant string, ev abuse.Event)

	draining *atomic.Bool
	wake     chan struct{} // size 1: room freed, dispatch may proceed

	mu      sync.Mutex // guards running, queued, unstarted
	running map[*call]struct{}
	queued  map[*call]struct{}
	// unstarted: streams sent whose first event has not come, with the
	// cancel that takes each back (takeback.go).
	unstarted map[*call]context.CancelCauseFunc
	idle      *sync.Cond // signalled when running and queued both empty

	usage   sync.Map  // usageKey → *usageCounters (usage.go)
	started time.Time // when New ran: usage counts start
}

// New builds the lifecycle on its collaborators.
func New(d Deps) (*Engine, error) {
	if d.Ledger == nil || d.Upstream == nil || d.Keyer == nil || d.GPU == nil || d.Metrics == nil ||
		d.Fleet == nil || d.Settler == nil || d.Policy == nil || d.Draining == nil || d.Authenticate == nil {
		return nil, errors.New("lifecycle: Ledger, Upstream, Keyer, GPU, Metrics, Fleet, Settler, Policy, Draining and Authenticate are required")
	}
	e := &Engine{
		led: d.Ledger, up: d.Upstream, keyer: d.Keyer, gpu: d.GPU, attr: d.Attribution, trail: d.Audit,
		tracer: d.Tracer, m: d.Metrics, log: d.Logger, now: d.Now, owner: d.Owner,
		reps: d.Fleet, settler: d.Settler, pol: d.Policy, draining: d.Draining,
		authenticate: d.Authenticate, noteLedger: d.NoteLedger, observeAbuse: d.ObserveAbuse,
		wake:      make(chan struct{}, 1),
		running:   map[*call]struct{}{},
		queued:    map[*call]struct{}{},
		unstarted: map[*call]context.CancelCauseFunc{},
		wfs:       workflows{m: map[string]*workflow{}},
		onIllegal: panicInTests(),
	}
	e.idle = sync.NewCond(&e.mu)
	if e.log == nil {
		e.log = slog.New(slog.DiscardHandler)
	}
	if e.now == nil {
		e.now = time.Now
	}
	if e.noteLedger == nil {
		e.noteLedger = func(string, error) {}
	}
	if e.observeAbuse == nil {
		e.observeAbuse = func(string, abuse.Event) {}
	}
	e.m.now = e.now
	e.started = e.now()
	e.pools.Now = e.now
	q, err := queue.New(d.Queue, queue.Deps[*call]{Clock: clockFunc(e.now), OnExpire: e.onExpire})
	if err != nil {
		return nil, err
	}
	e.q = q
	return e, nil
}

type clockFunc func() time.Time

func (f clockFunc) Now() time.Time { return f() }

// queueExpirySpin is the queue's expiry poll. Unit tests under synctest
// set it to 0: a polling goroutine never lets a bubble go idle.
var queueExpirySpin = time.Millisecond

// QueueConfig is the queue's config under cfg.
func QueueConfig(cfg *config.File) queue.Config {
	// ExpirySpin: Linux timers sleep in whole milliseconds; waking 1ms early
	// and polling keeps expiry within the 1ms the design promises.
	qc := queue.Config{MaxDepth: cfg.Server.MaxDepth, MaxBytes: cfg.Server.MaxBytes, MaxWait: cfg.Server.MaxWait,
		ExpirySpin: queueExpirySpin}
	for _, t := range cfg.Tenants {
		// The config's validation refused any other order (fifo or edf).
		order, _ := queue.ParseOrder(t.Queue.Order)
		qc.Tenants = append(qc.Tenants, queue.TenantConfig{
			Name: t.Name, Weight: float64(t.Weight), Band: t.Priority,
			MaxDepth: t.Queue.MaxDepth, MaxBytes: t.Queue.MaxBytes, MaxWait: t.Queue.MaxWait, Order: order,
			LIFOAfter: t.Queue.LIFOAfter, ShedAfter: t.Queue.ShedAfter,
		})
	}
	return qc
}

// Queue is the queue of calls.
func (e *Engine) Queue() *Queue { return e.q }

// Pools is the per-pool load table the dispatch gate reads.
func (e *Engine) Pools() *gate.Pools[fleet.PoolKey] { return &e.pools }

// Wake tells the dispatch loop that room may have freed or the gate's
// inputs changed.
func (e *Engine) Wake() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// DispatchLoop dispatches queued calls as room frees until ctx ends.
func (e *Engine) DispatchLoop(ctx context.Context) error {
	e.dispatchLoop(ctx)
	return nil
}

// record appends rec to the audit trail, when one is kept.
func (e *Engine) record(rec audit.Record) {
	if e.trail != nil {
		e.trail(rec)
	}
}

// Drain waits for queued and running calls up to timeout, then aborts
// whatever is left (cause apierr.ErrDraining) and waits for it to end.
func (e *Engine) Drain(timeout time.Duration) {
	done := make(chan struct{})
	go func() {
		e.mu.Lock()
		for len(e.running) > 0 || len(e.queued) > 0 {
			e.idle.Wait()
		}
		e.mu.Unlock()
		close(done)
	}()
	t := time.NewTimer(timeout)
	defer t.Stop()
	select {
	case <-done:
		return
	case <-t.C:
	}
	e.mu.Lock()
	n := len(e.running) + len(e.queued)
	for c := range e.running {
		c.cancel(apierr.ErrDraining)
	}
	for c := range e.queued {
		c.cancel(apierr.ErrDraining)
	}
	e.mu.Unlock()
	e.log.Warn("drain timeout: aborting remaining requests", "requests", n)
	<-done
}
