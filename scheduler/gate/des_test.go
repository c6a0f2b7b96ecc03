package gate_test

import (
	"container/heap"
	"fmt"
	"hash/fnv"
	"math"
	"math/rand/v2"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/gate"
)

// The dispatch gate is tested as a discrete-event simulation on a manual
// clock: the real queue and the real gate (Gate.Assess, FitsBeyond)
// against a fake replica of `slots` batch slots whose requests run for
// their output length times a 20 ms step, like `sluice sim --decode-step
// 20ms`. Nothing sleeps; a minute of traffic runs in milliseconds. The
// clock, the event queue, the tenants' random streams and pct are the
// harness of fairgen_test.go as well.

type desClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *desClock) Now() time.Time  { c.mu.Lock(); defer c.mu.Unlock(); return c.now }
func (c *desClock) set(t time.Time) { c.mu.Lock(); c.now = t; c.mu.Unlock() }

// An event's kind.
const (
	desArrival = iota
	desCompletion
	desTick   // the queue's next deadline or wake-up
	desScrape // fairgen: the replica's metrics are read
)

// desEvent is one event of a run; T is the run's tenant.
type desEvent[T any] struct {
	at   time.Duration
	kind int
	t    T
	seq  int
	svc  time.Duration // of a completion
	kv   int64         // a completion's KV tokens (fairgen)
	rep  int           // a completion's replica (fairgen)
	e2e  time.Duration // a completion's time from its dispatch to the replica (fairgen)
	slot int           // the slot a preemption freed (fairgen's fgFree)
}

// desEvents is a run's event queue: earliest first, events of one instant
// in the order they were pushed, so a seed replays exactly.
type desEvents[T any] struct {
	h        desHeap[T]
	seq      int
	ticking  bool          // a tick is pushed and not yet popped
	nextTick time.Duration // its time
}

func (q *desEvents[T]) push(e desEvent[T]) { q.seq++; e.seq = q.seq; heap.Push(&q.h, e) }

func (q *desEvents[T]) pop() desEvent[T] {
	e := heap.Pop(&q.h).(desEvent[T])
	if e.kind == desTick && e.at == q.nextTick {
		q.ticking = false
	}
	return e
}

// next pops the next event and sets clk to its time (t0 + at); false when
// none is left or the next falls after end.
func (q *desEvents[T]) next(end time.Duration, clk *desClock, t0 time.Time) (desEvent[T], bool) {
	if len(q.h) == 0 {
		return desEvent[T]{}, false
	}
	e := q.pop()
	if e.at > end {
		return e, false
	}
	clk.set(t0.Add(e.at))
	return e, true
}

// tickAt pushes a tick for the queue's next due time (queue.Queue.Tick,
// as the time since t0) unless one is pushed for no later.
func (q *desEvents[T]) tickAt(due time.Time, ok bool, t0 time.Time) {
	if !ok {
		return
	}
	d := due.Sub(t0)
	if !q.ticking || d < q.nextTick {
		q.ticking, q.nextTick = true, d
		q.push(desEvent[T]{at: d, kind: desTick})
	}
}

type desHeap[T any] []desEvent[T]

func (h desHeap[T]) Len() int { return len(h) }
func (h desHeap[T]) Less(i, j int) bool {
	if h[i].at != h[j].at {
		return h[i].at < h[j].at
	}
	return h[i].seq < h[j].seq
}
func (h desHeap[T]) Swap(i, j int) { h[i], h[j] = h[j], h[i] }
func (h *desHeap[T]) Push(x any)   { *h = append(*h, x.(desEvent[T])) }
func (h *desHeap[T]) Pop() any     { o := *h; e := o[len(o)-1]; *h = o[:len(o)-1]; return e }

// tenantRNG is a tenant's random stream: one per tenant, seeded by its
// name, so its arrivals are the same with or without the others.
func tenantRNG(seed uint64, name string) *rand.Rand {
	h := fnv.New64a()
	h.Write([]byte(name))
	return rand.New(rand.NewPCG(seed, h.Sum64()))
}

func pct(ds []time.Duration, p float64) time.Duration {
	if len(ds) == 0 {
		return 0
	}
	s := slices.Clone(ds)
	slices.Sort(s)
	return s[min(len(s)-1, int(math.Ceil(p*float64(len(s))))-1)]
}

type desTenant struct {
	name   string
	weight float64
	rate   float64 // arrivals per second (Poisson)
	from   time.Duration
	until  time.Duration // 0: the whole run
	pool   int           // index into desRun.pools
	// surge is its rate from surgeAt on (0: rate throughout).
	surge   float64
	surgeAt time.Duration

	rng     *rand.Rand
	held    int64
	waits   []time.Duration // measured arrivals only
	served  int64           // completions in the measured span
	expired int
	full    int
	peak    int64
	// outcome, when not nil, records each measured arrival's wait until
	// dispatch, or -1 when it expired (keyed by arrival time: a tenant's
	// arrivals are the same in every run of one seed).
	outcome map[time.Duration]time.Duration
	// Cumulative, as the gate reads them (TenantLoad).
	arrived, done int64
	doneSec       float64
}

type desRun struct {
	slots      int64
	step       time.Duration
	duration   time.Duration
	warmup     time.Duration
	maxWait    time.Duration
	headroom   float64
	seed       uint64
	tau, peakW time.Duration // 0: the gate's defaults
	k          float64
	noFloor    bool // no one-request floor for heavy tenants
	noBacklog  bool // no reserve for light tenants with a backlog
	noSticky   bool // no heavy hysteresis; idle light tenants' peaks unreserved
	noForecast bool // reserve from the light tenants' peaks alone
	// noGate dispatches whenever a slot is free (the work-conserving
	// baseline: what vLLM alone would run).
	noGate bool
	// shedAfter and lifoAfter set queue.Config's opt-in standing-queue
	// policies (0: off, the default).
	shedAfter, lifoAfter time.Duration
	// pools are the slots of each pool (model); nil: one pool of slots.
	// A tenant's requests go to its pool. fleetWide runs the gate as it
	// was before pools (one share computation and reserve over the fleet,
	// Block whenever the pick's pool is full), for comparison.
	pools     []int64
	fleetWide bool

	// observe, when set, sees the clock after every event's dispatch round.
	observe func(now time.Duration)

	busy     time.Duration // slot-time used in the measured span
	peakBusy int64
	poolBusy []time.Duration // busy per pool
	poolPeak []int64
}

type desReq struct {
	t       *desTenant
	arrival time.Duration
	out     int
}

func (r *desRun) run(t *testing.T, tenants []*desTenant) {
	t.Helper()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &desClock{now: t0}
	cfg := queue.Config{MaxWait: r.maxWait, ShedAfter: r.shedAfter, LIFOAfter: r.lifoAfter}
	for _, tn := range tenants {
		cfg.Tenants = append(cfg.Tenants, queue.TenantConfig{Name: tn.name, Weight: tn.weight, MaxDepth: 256})
	}
	q, err := queue.New[desReq](cfg, queue.Deps[desReq]{Clock: clk, OnExpire: func(it queue.Item[desReq]) {
		if it.Payload.arrival >= r.warmup {
			it.Payload.t.expired++ // deadline, or shed from a standing queue
			if o := it.Payload.t.outcome; o != nil && it.Payload.arrival < r.duration {
				o[it.Payload.arrival] = -1
			}
		}
	}})
	require.NoError(t, err)
	for _, tn := range tenants {
		tn.rng = tenantRNG(r.seed, tn.name)
	}
	var ev desEvents[*desTenant]
	push := ev.push
	for _, tn := range tenants {
		push(desEvent[*desTenant]{at: tn.from + time.Duration(tn.rng.ExpFloat64()/tn.rate*float64(time.Second)), t: tn})
	}
	if r.pools == nil {
		r.pools = []int64{r.slots}
	}
	r.slots = 0
	for _, n := range r.pools {
		r.slots += n
	}
	np := len(r.pools)
	gates := make([]gate.Gate, np)
	for i := range gates {
		gates[i] = gate.Gate{Options: gate.Options{Window: r.tau, PeakWindow: r.peakW, NoFloor: r.noFloor, NoBacklog: r.noBacklog, NoSticky: r.noSticky, NoForecast: r.noForecast}, Margin: r.k}
	}
	r.poolBusy, r.poolPeak = make([]time.Duration, np), make([]int64, np)
	pooled := make([]int64, np)
	parkedFull := make([][]string, np)
	var running int64
	byName := map[string]*desTenant{}
	for _, tn := range tenants {
		byName[tn.name] = tn
	}
	loads := make([]gate.TenantLoad, 0, len(tenants))
	var now, lastBusy time.Duration
	account := func(to time.Duration) {
		from := max(lastBusy, r.warmup)
		span := time.Duration(0)
		if to > from && to <= r.duration {
			span = to - from
		} else if to > r.duration && r.duration > from {
			span = r.duration - from
		}
		r.busy += time.Duration(running) * span
		for i := range pooled {
			r.poolBusy[i] += time.Duration(pooled[i]) * span
		}
		lastBusy = to
	}
	pred := func(it queue.Item[desReq], v queue.View[desReq]) queue.Verdict {
		pl := it.Payload.t.pool
		// full mirrors package scheduler's Server.full: park a heavy tenant whose pool is full
		// while another pool has room (its pool's next completion unparks
		// it); anything else blocks until a completion.
		full := func(heavy bool) queue.Verdict {
			for i := range pooled {
				if heavy && !r.fleetWide && i != pl && pooled[i] < r.pools[i] {
					if !slices.Contains(parkedFull[pl], it.Tenant) {
						parkedFull[pl] = append(parkedFull[pl], it.Tenant)
					}
					return queue.Park
				}
			}
			return queue.Block
		}
		if r.noGate {
			if pooled[pl] >= r.pools[pl] {
				return full(false)
			}
			return queue.Dispatch
		}
		cand := -1
		loads = loads[:0]
		for _, tn := range tenants {
			if tn.pool != pl && !r.fleetWide {
				continue
			}
			if tn.name == it.Tenant {
				cand = len(loads)
			}
			loads = append(loads, gate.TenantLoad{Name: tn.name, Weight: tn.weight, Held: tn.held + int64(v.Pending(tn.name)), Queued: int64(v.Queued(tn.name)),
				Arrived: tn.arrived, Served: tn.done, ServedSec: tn.doneSec})
		}
		f := gate.FleetLoad{Seqs: pooled[pl], SeqsCap: r.pools[pl], Tokens: 0, TokensCap: 1 << 40}
		g := &gates[pl]
		if r.fleetWide {
			f.Seqs, f.SeqsCap, g = running, r.slots, &gates[0]
		}
		light, reserve := g.Assess(clk.Now().UnixNano(), loads, cand, f, r.headroom)
		if !light && !f.FitsBeyond(1, reserve) {
			if pooled[pl] < r.pools[pl] {
				return queue.Park // room, but the light tenants need it
			}
			return full(true)
		}
		if pooled[pl] >= r.pools[pl] {
			return full(!g.WithinShare(it.Tenant, it.Payload.t.weight))
		}
		return queue.Dispatch
	}
	dispatch := func() {
		for {
			it, ok := q.NextView(pred)
			if !ok {
				return
			}
			require.True(t, q.Release(it.Handle))
			tn := it.Payload.t
			account(now)
			running++
			pooled[tn.pool]++
			tn.held++
			tn.peak = max(tn.peak, tn.held)
			r.peakBusy = max(r.peakBusy, running)
			r.poolPeak[tn.pool] = max(r.poolPeak[tn.pool], pooled[tn.pool])
			if it.Payload.arrival >= r.warmup && it.Payload.arrival < r.duration {
				tn.waits = append(tn.waits, now-it.Payload.arrival)
				if tn.outcome != nil {
					tn.outcome[it.Payload.arrival] = now - it.Payload.arrival
				}
			}
			svc := time.Duration(it.Payload.out) * r.step
			push(desEvent[*desTenant]{at: now + svc, kind: desCompletion, t: tn, svc: svc})
		}
	}
	for {
		e, ok := ev.next(r.duration+r.maxWait+time.Minute, clk, t0)
		if !ok {
			break
		}
		now = e.at
		switch e.kind {
		case desArrival:
			tn := e.t
			if tn.until == 0 || now < tn.until {
				if now < r.duration {
					out := 96 + tn.rng.IntN(65) // the presets' 128 ± 25 %
					_, err := q.Enqueue(queue.Request[desReq]{Tenant: tn.name, Cost: int64(512 + 2*out), Payload: desReq{t: tn, arrival: now, out: out}})
					if err != nil && now >= r.warmup {
						tn.full++
					}
					// Arrived even if the queue refused it: Sluice counts a
					// request in its pool before Enqueue (gate.Pools.MoveLocked).
					tn.arrived++
					next := now + time.Duration(tn.rng.ExpFloat64()/tn.rate*float64(time.Second))
					if tn.surge > 0 && next >= tn.surgeAt {
						// Poisson at the surge's rate from surgeAt on.
						next = max(now, tn.surgeAt) + time.Duration(tn.rng.ExpFloat64()/tn.surge*float64(time.Second))
					}
					push(desEvent[*desTenant]{at: next, t: tn})
				}
			}
		case desCompletion:
			account(now)
			running--
			pooled[e.t.pool]--
			e.t.held--
			e.t.done++
			e.t.doneSec += e.svc.Seconds()
			if now >= r.warmup && now < r.duration {
				e.t.served++
			}
			q.Unpark(e.t.name)
			for _, n := range parkedFull[e.t.pool] {
				q.Unpark(n)
			}
			parkedFull[e.t.pool] = parkedFull[e.t.pool][:0]
		}
		q.Tick()
		dispatch()
		if r.observe != nil {
			r.observe(now)
		}
		due, ok := q.Tick()
		ev.tickAt(due, ok, t0)
	}
	account(r.duration)
}

func (r *desRun) utilization() float64 {
	return float64(r.busy) / float64(time.Duration(r.slots)*(r.duration-r.warmup))
}

func (r *desRun) poolUtilization(i int) float64 {
	return float64(r.poolBusy[i]) / float64(time.Duration(r.pools[i])*(r.duration-r.warmup))
}

func (tn *desTenant) String() string {
	return fmt.Sprintf("%s: p50 %v p99 %v max %v served %d expired %d full %d peak %d", tn.name,
		pct(tn.waits, 0.5), pct(tn.waits, 0.99), pct(tn.waits, 1), tn.served, tn.expired, tn.full, tn.peak)
}

// The presets' replica: 32 slots, 20 ms steps, 96–160 output tokens, so a
// request runs 1.9–3.2 s and capacity is 32 / 2.56 s = 12.5 requests/s.
func presetRun(seed uint64) *desRun {
	return &desRun{slots: 32, step: 20 * time.Millisecond, duration: 90 * time.Second, warmup: 30 * time.Second,
		maxWait: 10 * time.Second, headroom: 0.1, seed: seed} // the defaults: queue.max_wait 10s, server.headroom 0.1
}

func victims() []*desTenant {
	return []*desTenant{{name: "chat-a", weight: 1, rate: 2.5}, {name: "chat-b", weight: 1, rate: 2.5}, {name: "chat-c", weight: 1, rate: 2.5}}
}

// TestGateFloodGivesWay: three light tenants at 0.2× capacity each and a
// flood at 2× (the flood preset). Flooded, no victim request is lost and
// none waits longer than one request's longest service time (3.2 s); the
// median victim does not wait at all, the p99 wait is within 100 ms (5
// decode steps) of the same arrivals' alone, and the flood keeps its
// floor: it completes at least 10 requests a minute and the fleet stays
// busier than the victims alone keep it.
func TestGateFloodGivesWay(t *testing.T) {
	for seed := uint64(1); seed <= 4; seed++ {
		alone := presetRun(seed)
		va := victims()
		alone.run(t, va)
		flooded := presetRun(seed)
		vf := victims()
		flood := &desTenant{name: "flood", weight: 1, rate: 25}
		flooded.run(t, append(vf, flood))
		for i := range vf {
			t.Logf("seed %d alone   %v", seed, va[i])
			t.Logf("seed %d flooded %v", seed, vf[i])
			assert.Zero(t, vf[i].expired+vf[i].full, "a victim lost requests")
			assert.Zero(t, pct(vf[i].waits, 0.5), "the median victim request waited")
			// Same arrivals alone and flooded (one random stream per tenant).
			assert.LessOrEqual(t, pct(vf[i].waits, 0.99), pct(va[i].waits, 0.99)+100*time.Millisecond, "%s p99 wait", vf[i].name)
			assert.LessOrEqual(t, pct(vf[i].waits, 1), 3200*time.Millisecond, "%s waited more than one service time", vf[i].name)
		}
		t.Logf("seed %d flood   %v; utilization alone %.3f flooded %.3f", seed, flood, alone.utilization(), flooded.utilization())
		assert.Greater(t, flooded.utilization(), alone.utilization()+0.01, "the flood was starved")
		assert.GreaterOrEqual(t, flood.served, int64(10))
	}
}

// TestGateFloodOnset: a tenant that has sent a request every few seconds
// for 40 s starts flooding at 2× capacity beside the three light tenants.
// Its first arrivals find it light (its load rises over about a second and
// its forecast is bounded by its long-run rate, so that one burst of a
// light tenant is not read as a flood) until its last eight arrivals read
// as a surge (gate.surgeRate), and it takes the free sequences before
// then: victim requests arriving then wait for a completion. Over the 20 s
// from the onset, on 20 seeds, no victim request is lost, the median one
// does not wait and none waits longer than a second (up to 1.9 s before
// the surge was read, one request's longest service time being 3.2 s);
// from 5 s after the onset the p99 wait is within 100 ms of the same
// arrivals' alone, as for a flood that was there from the start
// (TestGateFloodGivesWay). The onset's p99 ratios are logged: they are
// the cost of work conservation at a flood's start (SCHEDULING §6).
func TestGateFloodOnset(t *testing.T) {
	var worst []time.Duration
	var ratios []float64 // the worst victim's p99 TTFT flooded ÷ alone, TTFT = wait + 46 ms
	for seed := uint64(1); seed <= 20; seed++ {
		for _, from := range []time.Duration{40 * time.Second, 45 * time.Second} {
			mk := func() *desRun {
				r := presetRun(seed)
				r.warmup, r.duration = from, 60*time.Second
				return r
			}
			alone, flooded := mk(), mk()
			va, vf := victims(), victims()
			alone.run(t, va)
			flooded.run(t, append(vf, &desTenant{name: "flood", weight: 1, rate: 0.3, surge: 25, surgeAt: 40 * time.Second}))
			var most, pa, pf time.Duration
			for i := range vf {
				assert.Zero(t, vf[i].expired+vf[i].full, "seed %d: %s lost requests", seed, vf[i].name)
				assert.Zero(t, pct(vf[i].waits, 0.5), "seed %d: the median %s request waited", seed, vf[i].name)
				assert.LessOrEqual(t, pct(vf[i].waits, 1), time.Second, "seed %d: %s waited more than a second", seed, vf[i].name)
				if from > 40*time.Second {
					assert.LessOrEqual(t, pct(vf[i].waits, 0.99), pct(va[i].waits, 0.99)+100*time.Millisecond, "seed %d: %s p99 wait 5 s after the onset", seed, vf[i].name)
				}
				most = max(most, pct(vf[i].waits, 1))
				pa, pf = max(pa, pct(va[i].waits, 0.99)), max(pf, pct(vf[i].waits, 0.99))
			}
			if from == 40*time.Second {
				worst = append(worst, most.Round(time.Millisecond))
				ratios = append(ratios, math.Round(float64(pf+46*time.Millisecond)/float64(pa+46*time.Millisecond)*100)/100)
			}
		}
	}
	t.Logf("longest victim wait in the 20 s from the onset, per seed: %v", worst)
	t.Logf("victims' p99 TTFT in the 20 s from the onset, flooded ÷ alone, per seed: %v", ratios)
}

// TestGateFloodRampUp is the flood preset as `make bench` measures it:
// victims and flood start together, and the victims' p99 is read over
// 5–17 s. Per seed, the ratio is the worst victim's p99 TTFT flooded over
// alone, with TTFT = wait + 46 ms (the unqueued TTFT of the bench's
// simulator). Over 20 seeds at most 3 exceed 1.5 (the must-show), and the
// gate without the offered-load forecast, the heavy hysteresis and the
// backlog reserve does worse (that is what `make bench` had: 2.88 in one
// of two runs). The seeds still above 1.5 are the start-up: the flood fills
// the idle pool in its first second, before anything can be heavy, and
// the victims that arrive then wait for those requests to finish.
func TestGateFloodRampUp(t *testing.T) {
	bad := func(old bool) (n int, ratios []float64) {
		for seed := uint64(1); seed <= 20; seed++ {
			mk := func() *desRun {
				r := presetRun(seed)
				r.warmup, r.duration = 5*time.Second, 17*time.Second
				r.noForecast, r.noSticky, r.noBacklog = old, old, old
				return r
			}
			alone, flooded := mk(), mk()
			va, vf := victims(), victims()
			alone.run(t, va)
			flooded.run(t, append(vf, &desTenant{name: "flood", weight: 1, rate: 25}))
			var wa, wf time.Duration
			for i := range vf {
				wa, wf = max(wa, pct(va[i].waits, 0.99)), max(wf, pct(vf[i].waits, 0.99))
				assert.Zero(t, vf[i].expired+vf[i].full, "seed %d %s", seed, vf[i].name)
			}
			ratio := float64(wf+46*time.Millisecond) / float64(wa+46*time.Millisecond)
			ratios = append(ratios, math.Round(ratio*100)/100)
			if ratio > 1.5 {
				n++
			}
		}
		return n, ratios
	}
	n, ratios := bad(false)
	nOld, ratiosOld := bad(true)
	t.Logf("victims flooded ÷ alone per seed: %v (%d above 1.5); without forecast, hysteresis, backlog reserve: %v (%d)", ratios, n, ratiosOld, nOld)
	assert.LessOrEqual(t, n, 3)
	assert.Greater(t, nOld, n)
}

// TestGateLoneTenantGetsTheFleet: one tenant at 1.5× capacity with no cap
// fills every slot, exactly like dispatching whenever a slot is free.
func TestGateLoneTenantGetsTheFleet(t *testing.T) {
	gated, direct := presetRun(1), presetRun(1)
	direct.noGate = true
	a, b := &desTenant{name: "solo", weight: 1, rate: 18.75}, &desTenant{name: "solo", weight: 1, rate: 18.75}
	gated.run(t, []*desTenant{a})
	direct.run(t, []*desTenant{b})
	assert.Equal(t, int64(32), gated.peakBusy)
	assert.Equal(t, direct.peakBusy, gated.peakBusy)
	assert.InEpsilon(t, b.served, a.served, 0.01, "as many completions as dispatching whenever a slot is free")
	assert.InDelta(t, direct.utilization(), gated.utilization(), 0.005)
}

// TestGatePeersShareByWeight: two backlogged tenants (each offering 1×
// capacity) split the fleet by weight within 5 points, and the fleet stays
// as busy as without the gate (work conservation under contention).
func TestGatePeersShareByWeight(t *testing.T) {
	for _, w := range []float64{1, 2} {
		r, base := presetRun(3), presetRun(3)
		base.noGate = true
		a, b := &desTenant{name: "a", weight: w, rate: 12.5}, &desTenant{name: "b", weight: 1, rate: 12.5}
		r.run(t, []*desTenant{a, b})
		base.run(t, []*desTenant{{name: "a", weight: w, rate: 12.5}, {name: "b", weight: 1, rate: 12.5}})
		share := float64(a.served) / float64(a.served+b.served)
		t.Logf("weight %v: a %v, b %v, share %.3f utilization %.3f (ungated %.3f)", w, a, b, share, r.utilization(), base.utilization())
		assert.InDelta(t, w/(w+1), share, 0.05)
		assert.GreaterOrEqual(t, r.utilization(), 0.98*base.utilization())
	}
}

// TestGateOverloadStaysBusy: three equal tenants at 1/3 of capacity each
// (the overload preset at 1×): nobody is far above its share, so the gate
// keeps the fleet as busy as dispatching whenever a slot is free.
func TestGateOverloadStaysBusy(t *testing.T) {
	for seed := uint64(1); seed <= 3; seed++ {
		r, base := presetRun(seed), presetRun(seed)
		base.noGate = true
		mk := func() []*desTenant {
			return []*desTenant{{name: "t1", weight: 1, rate: 12.5 / 3}, {name: "t2", weight: 1, rate: 12.5 / 3}, {name: "t3", weight: 1, rate: 12.5 / 3}}
		}
		ts, bs := mk(), mk()
		r.run(t, ts)
		base.run(t, bs)
		var got, want, exp, bexp int
		for i := range ts {
			got += int(ts[i].served)
			want += int(bs[i].served)
			exp += ts[i].expired
			bexp += bs[i].expired
		}
		t.Logf("seed %d: served %d (ungated %d), expired %d (%d), utilization %.3f (%.3f)", seed, got, want, exp, bexp, r.utilization(), base.utilization())
		// At exactly 1× a free-slot dispatcher itself is on the edge; the
		// gate may expire a few more (logged), never lose throughput.
		assert.GreaterOrEqual(t, float64(got), 0.98*float64(want))
	}
}

// TestGateLendsAndReclaims: a flood alone holds every slot (nothing is
// reserved for tenants that are not there); three light tenants arrive at
// 30 s and leave at 60 s. Their first requests wait at most one service
// time, and the median not at all: the flood stops starting work
// while they need room. Within ten seconds after they leave (their peaks
// are reserved while they might only be pausing: idleGaps of their 0.4 s
// mean gaps, then the last requests' service time) the flood holds every
// slot again, not a peak window (30 s) later.
func TestGateLendsAndReclaims(t *testing.T) {
	r := presetRun(5)
	r.duration, r.warmup = 120*time.Second, 30*time.Second
	flood := &desTenant{name: "flood", weight: 1, rate: 25}
	vs := victims()
	for _, v := range vs {
		v.from, v.until = 30*time.Second, 60*time.Second
	}
	var before, during, after, soon int64
	r.observe = func(now time.Duration) {
		switch {
		case now > 10*time.Second && now < 30*time.Second:
			before = max(before, flood.held)
		case now > 45*time.Second && now < 60*time.Second:
			during = max(during, flood.held)
		case now > 70*time.Second && now < 80*time.Second:
			soon = max(soon, flood.held)
		case now > 95*time.Second && now < 120*time.Second:
			after = max(after, flood.held)
		}
	}
	r.run(t, append(vs, flood))
	for _, v := range vs {
		t.Logf("%v", v)
		assert.Zero(t, v.expired+v.full, v.name)
		assert.LessOrEqual(t, pct(v.waits, 1), 3200*time.Millisecond, v.name)
		assert.Zero(t, pct(v.waits, 0.5), v.name)
	}
	t.Logf("flood held at most %d before, %d during, %d 10-20 s after, %d after", before, during, soon, after)
	assert.Equal(t, int64(32), before, "lent: the flood alone gets the fleet")
	assert.Less(t, during, int64(16), "reclaimed: the flood is squeezed while the light tenants are active")
	assert.Equal(t, int64(32), soon, "lent again once they are gone")
	assert.Equal(t, int64(32), after, "lent again once their peaks age out")
}

// TestGatePerPool: two pools (models A and B) of 32 slots each; shares
// and reserves are per pool.
//
//   - A flood on A beside A's three victims, B idle: the victims get what
//     they get on a pool of their own (median wait 0, p99 within 300 ms of
//     alone, none lost, none waits a service time), and the flood holds A
//     to its floor and no further. The fleet-wide gate counts B's free
//     slots as the victims' reserve, so the flood fills A and the victims
//     wait (logged and asserted worse, so this test can fail).
//   - A flood at 4× alone on A, B's victims near B's capacity: the flood
//     gets all of A (utilization within 2 points of ungated) and B's
//     victims wait as they do alone (p99 within 100 ms); the fleet-wide
//     gate held the flood back to leave B's victims a reserve on A.
func TestGatePerPool(t *testing.T) {
	mk := func(fleetWide bool, victimPool int) (*desRun, []*desTenant, *desTenant) {
		r := presetRun(7)
		r.pools, r.fleetWide = []int64{32, 32}, fleetWide
		vs := victims()
		for _, v := range vs {
			v.pool = victimPool
		}
		flood := &desTenant{name: "flood", weight: 1, rate: 25}
		r.run(t, append(vs, flood))
		return r, vs, flood
	}
	alone := presetRun(7)
	va := victims()
	alone.run(t, va)

	// Victims beside the flood on A.
	r, vs, flood := mk(false, 0)
	rw, vw, _ := mk(true, 0)
	var worstPer, worstWide time.Duration
	for i := range vs {
		t.Logf("per-pool   %v", vs[i])
		t.Logf("fleet-wide %v", vw[i])
		assert.Zero(t, vs[i].expired+vs[i].full, vs[i].name)
		assert.Zero(t, pct(vs[i].waits, 0.5), vs[i].name)
		assert.LessOrEqual(t, pct(vs[i].waits, 0.99), pct(va[i].waits, 0.99)+300*time.Millisecond, vs[i].name)
		assert.LessOrEqual(t, pct(vs[i].waits, 1), 3200*time.Millisecond, vs[i].name)
		worstPer = max(worstPer, pct(vs[i].waits, 0.99))
		worstWide = max(worstWide, pct(vw[i].waits, 0.99))
	}
	t.Logf("flood on A %v; A utilization %.3f (fleet-wide %.3f); victims' worst p99 wait %v (fleet-wide %v)",
		flood, r.poolUtilization(0), rw.poolUtilization(0), worstPer, worstWide)
	assert.Greater(t, worstWide, worstPer+time.Second, "the fleet-wide gate lent B's slots as A's reserve")
	assert.Positive(t, flood.served, "squeezed, not starved")
	assert.Zero(t, r.poolPeak[1], "nothing runs on B")

	// B's victims near B's capacity (3 × 3.3 rps of 12.5), a flood at 4×
	// A's capacity alone on A.
	busyB := func(r *desRun) ([]*desTenant, *desTenant) {
		vs := victims()
		for _, v := range vs {
			v.pool, v.rate = 1, 3.3
		}
		flood := &desTenant{name: "flood", weight: 1, rate: 50}
		r.pools = []int64{32, 32}
		r.run(t, append(vs, flood))
		return vs, flood
	}
	r = presetRun(7)
	vs, flood = busyB(r)
	rw = presetRun(7)
	rw.fleetWide = true
	_, floodW := busyB(rw)
	base := presetRun(7) // the flood on a pool of its own, ungated
	base.noGate = true
	floodB := &desTenant{name: "flood", weight: 1, rate: 50}
	base.run(t, []*desTenant{floodB})
	aloneB := presetRun(7)
	vb := victims()
	for _, v := range vb {
		v.rate = 3.3
	}
	aloneB.run(t, vb)
	t.Logf("flood alone on A: served %d (fleet-wide %d, ungated %d), A utilization %.3f (fleet-wide %.3f, ungated %.3f), peak %d (fleet-wide %d)",
		flood.served, floodW.served, floodB.served, r.poolUtilization(0), rw.poolUtilization(0), base.utilization(), r.poolPeak[0], rw.poolPeak[0])
	assert.Equal(t, int64(32), r.poolPeak[0])
	assert.InDelta(t, base.utilization(), r.poolUtilization(0), 0.02, "the flood is alone on A: all of A")
	assert.InEpsilon(t, floodB.served, flood.served, 0.02)
	assert.Less(t, rw.poolUtilization(0), r.poolUtilization(0)-0.05, "the fleet-wide gate held the flood back for B's victims")
	for i := range vs {
		t.Logf("B %v (alone %v)", vs[i], vb[i])
		assert.InDelta(t, vb[i].served, vs[i].served, 1, "B's victims are alone on B")
		assert.Equal(t, vb[i].expired+vb[i].full, vs[i].expired+vs[i].full, vs[i].name)
		assert.LessOrEqual(t, pct(vs[i].waits, 0.99), pct(vb[i].waits, 0.99)+100*time.Millisecond, vs[i].name)
	}
}

// TestShedAtCapacity prices the opt-in standing-queue policy
// (`queue.lifo_after: 1s`, `queue.shed_after: 2s`) at exactly 1× capacity over the
// overload preset's full length (180 s after a 15 s warm-up, ten seeds),
// against FIFO with no limit, which is what vLLM alone does. The queue
// random-walks: both targets stand for seconds at a time. Pairing each
// arrival across the two runs (same seeds), the policy starts far more
// requests within 1.95 s (the bench's 2 s TTFT SLO less the unqueued
// TTFT), but some requests it sheds would have started in time in FIFO:
// the newer ones it served first pushed them past 2 s. That share is the
// price of the policy, logged and bounded here so that it cannot grow
// unnoticed (measured: 389 of 22,442 arrivals, 1.7 %; a later LIFO switch
// cuts it, 24 at 1.9 s, but loses half the starts within 1.5 s at 2×,
// where the SLO is tighter than the shed).
func TestShedAtCapacity(t *testing.T) {
	var n, directInTime, gateInTime, shed, shedDirectInTime int
	const inTime = 1950 * time.Millisecond
	for seed := uint64(1); seed <= 10; seed++ {
		mk := func() []*desTenant {
			ts := []*desTenant{{name: "t1", weight: 1, rate: 12.5 / 3}, {name: "t2", weight: 1, rate: 12.5 / 3}, {name: "t3", weight: 1, rate: 12.5 / 3}}
			for _, tn := range ts {
				tn.outcome = map[time.Duration]time.Duration{}
			}
			return ts
		}
		g, d := presetRun(seed), presetRun(seed)
		g.duration, g.warmup = 195*time.Second, 15*time.Second
		g.shedAfter, g.lifoAfter = 2*time.Second, time.Second // the opt-in policy priced here
		d.duration, d.warmup = 195*time.Second, 15*time.Second
		d.noGate, d.shedAfter, d.lifoAfter, d.maxWait = true, -1, -1, time.Hour
		gt, dt := mk(), mk()
		g.run(t, gt)
		d.run(t, dt)
		for i := range gt {
			for at, w := range gt[i].outcome {
				dw, ok := dt[i].outcome[at]
				if !ok {
					continue
				}
				n++
				direct := dw >= 0 && dw <= inTime
				if direct {
					directInTime++
				}
				if w >= 0 && w <= inTime {
					gateInTime++
				}
				if w < 0 {
					shed++
					if direct {
						shedDirectInTime++
					}
				}
			}
		}
	}
	t.Logf("%d arrivals: started in time direct %d, Sluice %d; Sluice shed %d, of which direct started in time %d (%.2f %%)",
		n, directInTime, gateInTime, shed, shedDirectInTime, 100*float64(shedDirectInTime)/float64(n))
	require.Greater(t, n, 20000)
	assert.Greater(t, gateInTime, directInTime*13/10, "the standing-queue policy starts more requests in time")
	assert.LessOrEqual(t, float64(shedDirectInTime), 0.02*float64(n), "shed what FIFO would have started in time")
}
