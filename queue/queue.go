package queue

import (
	"fmt"
	"sync"
	"time"
)

// Clock tells the time. Time must advance like the runtime's clock (or the
// fake clock of testing/synctest) for [Queue.Run]; a manual clock can drive
// the queue through [Queue.Tick] instead.
type Clock interface {
	Now() time.Time
}

type realClock struct{}

func (realClock) Now() time.Time { return time.Now() }

// Deps are the fixed collaborators of a [Queue].
type Deps[T any] struct {
	// Clock defaults to the real clock when nil.
	Clock Clock
	// OnExpire receives every entry whose deadline passed while queued,
	// exactly once, after the entry has left the queue (Cancel on it then
	// reports false). It is called synchronously with the queue's mutex
	// held, from [Queue.Tick] (so from [Queue.Run]'s goroutine) or from
	// [Queue.Next] when dispatch meets an expired head. It must not block
	// and must not call back into the Queue: hand the item off (for example
	// a non-blocking send on the waiter's own channel) and answer 504
	// elsewhere. Nothing is buffered, so there is no overload drop; a slow
	// callback only delays the queue. Optional; nil drops expired entries.
	OnExpire func(Item[T])
}

// Request is what [Queue.Enqueue] queues.
type Request[T any] struct {
	// Tenant names a configured tenant.
	Tenant string
	// Band is the requested priority band; it is raised to the tenant's
	// default band (a request may lower its priority, never raise it) and
	// clamped to NumBands-1.
	Band int
	// Cost is the predicted cost in cost units, charged at dispatch.
	Cost int64
	// BodyBytes is the size of the held request body.
	BodyBytes int64
	// Arrival is when the request arrived; zero means now.
	Arrival time.Time
	// Deadline is the client's own deadline (from X-Request-Timeout); zero
	// means none. The effective deadline is the earliest of it,
	// Arrival+tenant MaxWait and Arrival+server MaxWait.
	Deadline time.Time
	// Payload is handed back untouched with the [Item].
	Payload T
	// Deferred: the caller runs a dispatch pass itself right after Enqueue
	// returns, then calls [Queue.Wake] with the handle. Enqueue then wakes
	// neither the Ready waiter nor the expiry loop (Run): when the pass
	// dispatches the entry, as it does whenever there is room, those were
	// two goroutine wake-ups per arrival for nothing; Wake gives both their
	// signal when the entry is still queued.
	Deferred bool
}

// Item is a queued, dispatched, expired or candidate request.
type Item[T any] struct {
	Handle    Handle[T]
	Tenant    string
	Band      int
	Cost      int64
	BodyBytes int64
	Arrival   time.Time
	// Deadline is the effective deadline.
	Deadline time.Time
	// Reason names the bound that set Deadline or, for an entry reported
	// to Deps.OnExpire, the rule that removed it: a deadline's bound, or
	// [ReasonShed].
	Reason Reason
	// Place is the entry's place among its tenant's entries (arrival
	// order): [Queue.TakeBack] puts an entry back there.
	Place uint64
	// RetryAfter is set on expired and shed entries: when the tenant's
	// queued work ahead could be served at its recent rate, clamped like
	// a [FullError]'s.
	RetryAfter time.Duration
	Payload    T
}

// Handle names one queued entry for [Queue.Cancel], [Queue.Requeue] and
// [Queue.Release]. It stays valid until the entry leaves the Queue's
// ownership (cancelled, expired or released); a stale handle is refused.
// The zero Handle is never valid.
type Handle[T any] struct {
	n   *node[T]
	gen uint64
}

// Verdict is a dispatch predicate's answer about a candidate.
type Verdict uint8

const (
	// Dispatch hands the candidate out.
	Dispatch Verdict = iota
	// Park skips the candidate's tenant (for example at its in-flight cap):
	// it leaves the pick without losing its place and rejoins, lifted, on
	// [Queue.Unpark] or after [Config.ParkBackoff].
	Park
	// Block stops dispatch and returns nothing (no replica has room for the
	// chosen request; smaller requests of others are not tried instead).
	Block
)

const (
	stateFree uint8 = iota
	stateQueued
	stateDispatched
)

type node[T any] struct {
	gen   uint64
	state uint8
	band  uint8
	f     *flow[T]
	fidx  int   // position in f.entries
	id    int32 // slot in Queue.dpos
	seq   uint64
	dl    int64 // effective deadline, Unix nanoseconds
	cost  int64
	bytes int64
	arr   time.Time
	dlt   time.Time
	why   Reason // which bound set dl; ReasonShed once shed
	pay   T
}

// flow is one (tenant, band) pair. The fields a pick touches come first,
// within one cache line.
type flow[T any] struct {
	id      int32                  // slot in Queue.fpos
	entries dheap[int64, *node[T]] // key: deadline under EDF, else 0; then seq
	v       float64                // virtual counter, cost units per unit weight
	t       *tenant[T]
	band    uint8
	eseq    uint64  // when it last became eligible, for ties
	last    int64   // last time it had or lost a queued entry, Unix ns
	lifted  float64 // every raise of v that was not service: lifts, fleet lifts (fleet.go)
	charged int64
}

// tenant is one configured tenant. The fields dispatch touches come first.
type tenant[T any] struct {
	cfg        TenantConfig
	depth      int
	bytes      int64
	cost       int64 // queued predicted cost
	pending    int   // dispatched, neither released nor requeued
	charged    int64
	dispatched uint64
	rate       rateRing
	flows      [NumBands]*flow[T]
	parked     bool
	removed    bool
	dropped    bool
	until      int64 // park backoff end, Unix ns
	pidx       int   // position in Queue.parks, -1 when none
	counters   TenantStats
}

type band[T any] struct {
	heap  dheap[float64, *flow[T]] // key: v, then eseq
	lastV float64
	// rebased is the sum of every shift of this band's counters, so that
	// v + rebased is comparable with another instance's (fleet.go).
	rebased float64
	// floor, when hasFloor, caps the lift: the fleet's least counter of a
	// backlogged flow (fleet.go), in v + rebased units.
	floor    float64
	hasFloor bool
}

// Queue holds per-tenant bounded queues in priority bands, dispatches them
// by weighted virtual token counters and expires them at their deadlines.
// See the package documentation for the model. All methods are safe for
// concurrent use; they serialize on one mutex.
type Queue[T any] struct {
	clock    Clock
	onExpire func(Item[T])
	ready    chan struct{}
	rearm    chan struct{}
	muted    bool // a Deferred Enqueue holds its signals back (mu held)

	// mu guards everything below: the configuration, tenants and flows,
	// band heaps, the deadline and park heaps, the node pool, the global
	// counters and the sequence numbers.
	mu        sync.Mutex
	cfg       Config
	tenants   map[string]*tenant[T]
	bands     [NumBands]band[T]
	deadlines dheap[int64, *node[T]]   // key: deadline, then seq
	parks     dheap[int64, *tenant[T]] // key: park end
	free      []*node[T]
	fpos      []int32 // band-heap position of each flow by flow.id, -1 when not eligible
	dpos      []int32 // deadline-heap position of each node by node.id, -1 when not queued
	depth     int
	bytes     int64
	cost      int64
	seq       uint64
	eseq      uint64
	rate      rateRing
}

// New validates cfg and returns an empty Queue. Start [Queue.Run] (once) to
// get active expiry, or drive it with [Queue.Tick].
func New[T any](cfg Config, deps Deps[T]) (*Queue[T], error) {
	if err := cfg.Validate(); err != nil {
		return nil, fmt.Errorf("queue config: %w", err)
	}
	q := &Queue[T]{
		clock:    deps.Clock,
		onExpire: deps.OnExpire,
		ready:    make(chan struct{}, 1),
		rearm:    make(chan struct{}, 1),
		tenants:  make(map[string]*tenant[T], len(cfg.Tenants)),
	}
	if q.clock == nil {
		q.clock = realClock{}
	}
	for i := range q.bands {
		q.bands[i].heap = dheap[float64, *flow[T]]{setIdx: func(_ *flow[T], x int32, i int) { q.fpos[x] = int32(i) }}
	}
	q.deadlines = dheap[int64, *node[T]]{setIdx: func(_ *node[T], x int32, i int) { q.dpos[x] = int32(i) }}
	q.parks = dheap[int64, *tenant[T]]{setIdx: tenantSetPidx[T]}
	q.applyLocked(cfg.withDefaults())
	return q, nil
}

// entryKey is a node's primary key in its flow: the deadline under EDF,
// else 0 (so arrival order decides).
func entryKey[T any](n *node[T]) int64 {
	if n.f.t.cfg.Order == OrderEDF {
		return n.dl
	}
	return 0
}

func nodeSetFidx[T any](n *node[T], _ int32, i int)     { n.fidx = i }
func tenantSetPidx[T any](t *tenant[T], _ int32, i int) { t.pidx = i }

// Ready returns a channel (capacity 1) that receives a value whenever
// something may have become dispatchable: an enqueue to an unparked
// tenant, an unpark, a requeue or a reconfiguration. A dispatch loop calls
// [Queue.Next] until it returns false, then waits on Ready (and on its own
// "room freed" signal). Wake-ups may be spurious; none is lost.
func (q *Queue[T]) Ready() <-chan struct{} { return q.ready }

func (q *Queue[T]) signalReady() {
	if q.muted {
		return
	}
	select {
	case q.ready <- struct{}{}:
	default:
	}
}

func (q *Queue[T]) signalRearm() {
	if q.muted {
		return
	}
	select {
	case q.rearm <- struct{}{}:
	default:
	}
}

// Enqueue queues r, or refuses it at once: a [*FullError] wrapping [ErrFull]
// when a bound is reached (the newest arrival is refused, queued ones keep
// their place), [ErrUnknownTenant] or [ErrInvalidRequest]. The returned
// Item carries the Handle and the effective band and deadline. Enqueue does
// not allocate in steady state.
func (q *Queue[T]) Enqueue(r Request[T]) (Item[T], error) {
	if r.Cost < 0 || r.BodyBytes < 0 {
		return Item[T]{}, fmt.Errorf("enqueue tenant %q: %w", r.Tenant, ErrInvalidRequest)
	}
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	nowN := now.UnixNano()
	t := q.tenants[r.Tenant]
	if t == nil || t.removed {
		return Item[T]{}, fmt.Errorf("enqueue tenant %q: %w", r.Tenant, ErrUnknownTenant)
	}
	if b := q.boundLocked(t, r.BodyBytes); b != 0 {
		t.counters.Rejected++
		return Item[T]{}, &FullError{Tenant: t.cfg.Name, Bound: b, RetryAfter: q.retryAfterLocked(t, b, nowN)}
	}
	q.seq++
	n := q.nodeLocked(t, r, now, q.seq)
	q.muted = r.Deferred
	q.insertLocked(n, nowN, true)
	q.muted = false
	t.counters.Enqueued++
	return q.itemOf(n), nil
}

// nodeLocked builds t's queued entry for r at place seq: its band, and its
// deadline from its arrival, the maximum waits and its own.
func (q *Queue[T]) nodeLocked(t *tenant[T], r Request[T], now time.Time, seq uint64) *node[T] {
	bi := r.Band
	if bi < t.cfg.Band {
		bi = t.cfg.Band
	}
	if bi >= NumBands {
		bi = NumBands - 1
	}
	arr := r.Arrival
	if arr.IsZero() {
		arr = now
	}
	dl, why := arr.Add(q.cfg.MaxWait), ReasonServerMaxWait
	if t.cfg.MaxWait > 0 {
		if d := arr.Add(t.cfg.MaxWait); !d.After(dl) {
			dl, why = d, ReasonMaxWait
		}
	}
	if !r.Deadline.IsZero() && r.Deadline.Before(dl) {
		dl, why = r.Deadline, ReasonClientDeadline
	}
	n := q.allocLocked()
	n.state = stateQueued
	n.band = uint8(bi)
	n.seq = seq
	n.dl = dl.UnixNano()
	n.cost = r.Cost
	n.bytes = r.BodyBytes
	n.arr = arr
	n.dlt = dl
	n.why = why
	n.pay = r.Payload
	n.f = q.flowLocked(t, bi)
	return n
}

// TakeBack queues again an entry that was dispatched and released but
// never started: its caller took it back from a replica that kept it
// waiting. It goes back to its place among its tenant's entries (place:
// the [Item.Place] it was dispatched with) with the deadline r gives, and
// its dispatch charge is undone, as [Queue.Requeue] does. Bounds are not
// checked (it held its place before) and the tenant is not parked (it was
// not refused a slot). A tenant removed meanwhile is [ErrUnknownTenant].
func (q *Queue[T]) TakeBack(r Request[T], place uint64) (Item[T], error) {
	q.mu.Lock()
	defer q.mu.Unlock()
	now := q.clock.Now()
	t := q.tenants[r.Tenant]
	if t == nil || t.removed {
		return Item[T]{}, fmt.Errorf("take back tenant %q: %w", r.Tenant, ErrUnknownTenant)
	}
	n := q.nodeLocked(t, r, now, place)
	q.undoDispatchLocked(n)
	t.counters.TakenBack++
	q.insertLocked(n, now.UnixNano(), false)
	return q.itemOf(n), nil
}

// Wake gives a [Request.Deferred] arrival the signals Enqueue held back,
// if it is still queued (its caller's dispatch pass did not take it).
func (q *Queue[T]) Wake(h Handle[T]) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if n := h.n; n != nil && n.gen == h.gen && n.state == stateQueued {
		q.signalRearm()
		q.signalReady()
	}
}

func (q *Queue[T]) boundLocked(t *tenant[T], bytes int64) Bound {
	switch {
	case t.cfg.MaxDepth > 0 && t.depth+1 > t.cfg.MaxDepth:
		return BoundTenantDepth
	case t.cfg.MaxBytes > 0 && t.bytes+bytes > t.cfg.MaxBytes:
		return BoundTenantBytes
	case q.cfg.MaxDepth > 0 && q.depth+1 > q.cfg.MaxDepth:
		return BoundGlobalDepth
	case q.cfg.MaxBytes > 0 && q.bytes+bytes > q.cfg.MaxBytes:
		return BoundGlobalBytes
	}
	return 0
}

func (q *Queue[T]) retryAfterLocked(t *tenant[T], b Bound, nowN int64) time.Duration {
	queued, served := t.cost, t.rate.recent(nowN)
	if b.Global() {
		queued, served = q.cost, q.rate.recent(nowN)
	} else if served == 0 {
		served = q.rate.recent(nowN) // not served lately: at best the instance's rate
	}
	d := MinRetryAfter
	if served > 0 {
		d = time.Duration(float64(queued) / float64(served) * float64(rateWindowSeconds*time.Second))
	}
	return min(max(d, MinRetryAfter), MaxRetryAfter)
}

func (q *Queue[T]) allocLocked() *node[T] {
	if k := len(q.free); k > 0 {
		n := q.free[k-1]
		q.free[k-1] = nil
		q.free = q.free[:k-1]
		return n
	}
	n := &node[T]{fidx: -1, id: int32(len(q.dpos))}
	q.dpos = append(q.dpos, -1)
	return n
}

func (q *Queue[T]) freeLocked(n *node[T]) {
	var zero T
	n.gen++
	n.state = stateFree
	n.f = nil
	n.pay = zero
	q.free = append(q.free, n)
}

func (q *Queue[T]) flowLocked(t *tenant[T], b int) *flow[T] {
	f := t.flows[b]
	if f == nil {
		f = &flow[T]{t: t, band: uint8(b), id: int32(len(q.fpos))}
		q.fpos = append(q.fpos, -1)
		f.entries = dheap[int64, *node[T]]{setIdx: nodeSetFidx[T]}
		t.flows[b] = f
	}
	return f
}

// insertLocked puts a queued node into its flow and the deadline heap and
// makes the flow eligible when it had no backlog. fresh marks a new arrival
// (as opposed to a requeue), which may reset an idle flow's counter.
func (q *Queue[T]) insertLocked(n *node[T], nowN int64, fresh bool) {
	f := n.f
	t := f.t
	wasEmpty := f.entries.len() == 0
	f.entries.push(entryKey(n), n.seq, n, 0)
	q.deadlines.push(n.dl, n.seq, n, n.id)
	if q.dpos[n.id] == 0 {
		q.signalRearm()
	}
	t.depth++
	t.bytes += n.bytes
	t.cost += n.cost
	q.depth++
	q.bytes += n.bytes
	q.cost += n.cost
	if wasEmpty && !t.parked {
		q.joinLocked(f, nowN, fresh)
	}
	f.last = nowN
	if !t.parked {
		q.signalReady()
	}
}

// joinLocked makes a backlogged flow eligible with the lift rule.
func (q *Queue[T]) joinLocked(f *flow[T], nowN int64, fresh bool) {
	bd := &q.bands[f.band]
	lift := bd.lastV
	if bd.heap.len() > 0 {
		lift = bd.heap.top().k
	}
	if bd.hasFloor {
		// A tenant backlogged at another instance is not idle: the fleet's
		// floor is at most its counter, so it is not lifted.
		lift = min(lift, bd.floor-bd.rebased)
	}
	if fresh && q.cfg.IdleTTL > 0 && f.entries.len() == 1 && nowN-f.last > int64(q.cfg.IdleTTL) {
		f.lifted += lift - f.v
		f.v = lift // idle past the TTL: the flow re-enters fresh, deficit dropped
	} else if f.v < lift {
		f.lifted += lift - f.v
		f.v = lift
	}
	q.eseq++
	f.eseq = q.eseq
	bd.heap.push(f.v, f.eseq, f, f.id)
}

// unlinkLocked removes a queued node from its flow and the deadline heap
// and updates the counters; the flow leaves its band heap once empty.
func (q *Queue[T]) unlinkLocked(n *node[T], nowN int64) {
	f := n.f
	t := f.t
	f.entries.remove(n.fidx)
	q.deadlines.remove(int(q.dpos[n.id]))
	t.depth--
	t.bytes -= n.bytes
	t.cost -= n.cost
	q.depth--
	q.bytes -= n.bytes
	q.cost -= n.cost
	if f.entries.len() == 0 {
		f.last = nowN
		if q.fpos[f.id] >= 0 {
			q.bands[f.band].heap.remove(int(q.fpos[f.id]))
		}
	}
}

func (q *Queue[T]) itemOf(n *node[T]) Item[T] {
	return Item[T]{
		Handle:    Handle[T]{n: n, gen: n.gen},
		Tenant:    n.f.t.cfg.Name,
		Band:      int(n.band),
		Cost:      n.cost,
		BodyBytes: n.bytes,
		Arrival:   n.arr,
		Deadline:  n.dlt,
		Reason:    n.why,
		Place:     n.seq,
		Payload:   n.pay,
	}
}

// maybeDropLocked forgets a removed tenant once nothing refers to it.
func (q *Queue[T]) maybeDropLocked(t *tenant[T]) {
	if !t.removed || t.dropped || t.depth > 0 || t.pending > 0 {
		return
	}
	if t.pidx >= 0 {
		q.parks.remove(t.pidx)
	}
	t.dropped = true
	if q.tenants[t.cfg.Name] == t {
		delete(q.tenants, t.cfg.Name)
	}
}

// Cancel removes a queued entry at once (its client left) and reports
// whether the caller won it: true means the entry was queued and is now
// gone, never charged; false means dispatch, expiry or an earlier Cancel
// owns it (or the handle is stale). Exactly one of dispatch, expiry and
// cancel ever owns an entry.
func (q *Queue[T]) Cancel(h Handle[T]) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := h.n
	if n == nil || n.gen != h.gen || n.state != stateQueued {
		return false
	}
	t := n.f.t
	q.unlinkLocked(n, q.clock.Now().UnixNano())
	t.counters.Cancelled++
	q.freeLocked(n)
	q.maybeDropLocked(t)
	return true
}
