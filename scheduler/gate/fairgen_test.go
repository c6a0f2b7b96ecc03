package gate_test

import (
	"flag"
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/gate"
)

// A seeded scenario generator for fairness, as test/chaos is for
// accounting: each seed draws a fleet and its tenants and runs them as a
// discrete-event simulation (virtual time, nothing sleeps) through the
// real queue, the real dispatch gate (gate.Gate) and the real learned
// batch (fleet.Replica.LearnBatch) on the harness of des_test.go, against
// a replica that runs `batch` sequences and keeps whatever it is sent
// beyond them in its own FCFS queue, as vLLM does. What a seed draws: tenant count, weights, rates
// (Poisson or bursts), output sizes, the real batch, whether the config's
// max_num_seqs is correct or left out (256), whether tenants have caps
// (`concurrency`), the scrape interval, and whether a replica learning its
// batch is scraped every upstream.learn_scrape_interval (the learning
// scrape, as vllm.Poller schedules it; off, as with learn_scrape_interval
// at or above the scrape interval). What it checks (the isolation
// invariants):
//
//   - a light tenant (demand below half its weighted share) sees p99 TTFT
//     within 1.5× its p99 without the heavy tenants, or within one
//     full-batch decode step of it;
//   - without the heavy tenants, Sluice is no slower than sending to the
//     replica directly: each light tenant without a cap alone, and those
//     tenants together (their requests pooled: fair ordering may move
//     waits between them where the replica serves first come first
//     served), see p99 TTFT within 1.25× of direct's, or within one step
//     of it (the lone light tenant's dominance figure, on every shape);
//   - no admitted request of a light tenant is lost;
//   - nothing is shed before its deadline (expiries only at max_wait);
//   - where demand fits the replica, goodput is within 5 % of sending to
//     the replica directly.
//
// A third of the seeds also draw a KV-limited replica (its cache below a
// full batch of mean-sized requests), which Sluice sizes by tokens as
// well. Not modelled: two instances (the share exchange is covered by
// TestInstancesSplitASharedReplica and TestLearnedBatchBoundsShare),
// preemption (the replica admits by each request's whole KV use),
// prefill time.
//
// `go test -run TestFairnessScenarios ./scheduler/gate/` runs fairgenSeeds
// seeds; `-fairgen.seeds=N -fairgen.base=B` runs N from B (make
// fairness-sweep), and `-fairgen.learn=on` or `off` sets the learning
// scrape of every seed instead of drawing it. Each line of the log is one
// seed.

var (
	fairgenN     = flag.Int("fairgen.seeds", 0, "fairness scenarios to run (0: the make test set)")
	fairgenBase  = flag.Uint64("fairgen.base", 1, "first fairness scenario seed")
	fairgenWarn  = flag.Bool("fairgen.report", false, "log violations instead of failing (for sweeps recorded in BENCHMARKS.md)")
	fairgenLearn = flag.String("fairgen.learn", "", "the learning scrape of every seed: on or off (empty: drawn per seed)")
)

// fgLearn is upstream.learn_scrape_interval as the scenarios draw it on.
const fgLearn = config.DefaultLearnScrapeInterval

// fgTrace (FG_TRACE=1 with one seed) prints each light arrival with the
// gate's view of every tenant, and each light request that waited.
var fgTrace = os.Getenv("FG_TRACE") != ""

// fairgenSeeds run in make test: seeds whose invariants hold today; 1, 9
// and 10 (max_num_seqs left out over a smaller batch) fail without
// the learned batch, 415 (the same) without the one-scrape stop, 3, 17
// have caps, 4 fits the replica (goodput). 8 and 134 (a light tenant sending bursts, forecast heavy from one burst or its
// reserve lent between bursts), 16 and 43 (a light tenant's peak lent
// after a pause of a few of its gaps), 11 (two floods each keeping one
// request in flight on a batch of four) and 98 (slow light tenants) fail
// without the long-run rate, the burst-aware pause and the per-pool floor
// of the gate; 1 (KV-limited, max_num_seqs left out) fails without a
// queue counted in tokens; 19 and 97 (max_num_seqs left out, the learning
// scrape drawn) fail without the learning scrape (-fairgen.learn=off); 36
// and 188 (one tenant asking 1.3 and 1.1–2.6 pools within 3× a claim of
// nearly the pool, a sporadic light tenant) fail with it light (NoPool).
// 15 (max_num_seqs left out too) is left out: with that bound it fails
// by 8 ms, a light request arriving while the light tenants hold 7 of 8
// and the flood the eighth, started while they held less. 494 (a tenant
// bursting beside a steady one on a KV-limited replica) fails with a
// burst held as a flood (NoSustain).
var fairgenSeeds = []uint64{1, 3, 4, 8, 9, 10, 11, 16, 17, 19, 415, 43, 97, 98, 134, 36, 188, 494}

// fgIsolationRow is the shape of scripts/isolation-rows.sh (row b with
// configured 32, row c with 256: max_num_seqs left out), its two replicas
// of 16 as one of 32: three light tenants at 2.5 rps, a flood at 25 rps
// (2× capacity), equal weights, a 1 s scrape, the bench's 5 s warm-up;
// learn is the learning scrape's interval (0: off).
// The sweep reports it beside the seeds; it does not hold the invariants
// (BENCHMARKS.md, "Goals still missed"): every tenant starts at once, and
// the flood takes most of the batch in its first second, before any
// service time is known (the forecast needs one) and, with max_num_seqs
// left out, while the pool still counts 256 sequences a replica. The
// light tenants' queue that builds behind it holds the batch past the
// warm-up.
// fgIsolationDraws is how many draws of each isolation row the sweep runs.
const fgIsolationDraws = 100

func fgIsolationRow(seed uint64, configured int64, learn time.Duration) *fgScenario {
	sc := &fgScenario{seed: seed, batch: 32, configured: configured, step: 20 * time.Millisecond, outLo: 96, outHi: 160,
		scrape: time.Second, learn: learn, maxWait: 60 * time.Second, duration: 40 * time.Second, warmup: 5 * time.Second}
	for _, n := range []string{"chat-a", "chat-b", "chat-c"} {
		sc.tenants = append(sc.tenants, fgTenant{name: n, weight: 1, rate: 2.5, burst: 1, light: true})
	}
	sc.tenants = append(sc.tenants, fgTenant{name: "flood", weight: 1, rate: 25, burst: 1})
	return sc
}

type fgTenant struct {
	name   string
	weight float64
	rate   float64 // arrivals per second
	burst  int     // requests per arrival event (1: Poisson)
	cap    int64   // concurrency; 0: none
	light  bool

	rng                   *rand.Rand
	held                  int64 // dispatched by Sluice, not completed
	heldTokens            int64 // their KV tokens
	arrived, done         int64
	doneSec               float64
	ttft                  []time.Duration // measured arrivals
	lent                  []bool          // fgReq.lent of each
	first                 []bool          // fgReq.first of each
	served, expired, full int
}

type fgScenario struct {
	seed       uint64
	batch      int64 // what the replica really runs
	kv         int64 // its KV cache in tokens (0: the batch is the only limit)
	configured int64 // max_num_seqs as configured (256: left out)
	step       time.Duration
	outLo      int
	outHi      int
	scrape     time.Duration
	learn      time.Duration // the learning scrape's interval; 0: off
	maxWait    time.Duration
	duration   time.Duration
	warmup     time.Duration
	tenants    []fgTenant
	gateOpts   gate.Options // the gate's switches (zero: the gate Sluice runs)
}

func (sc *fgScenario) meanSvc() time.Duration {
	return time.Duration(float64(sc.outLo+sc.outHi) / 2 * float64(sc.step))
}

func (sc *fgScenario) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: batch %d max_num_seqs %d kv %d step %v out %d–%d scrape %v learn %v;", sc.seed, sc.batch, sc.configured, sc.kv, sc.step, sc.outLo, sc.outHi, sc.scrape, sc.learn)
	for _, t := range sc.tenants {
		kind := "heavy"
		if t.light {
			kind = "light"
		}
		fmt.Fprintf(&b, " %s(%s w%g %.2f/s burst %d cap %d)", t.name, kind, t.weight, t.rate, t.burst, t.cap)
	}
	return b.String()
}

// genScenario draws one scenario from seed.
func genScenario(seed uint64) *fgScenario {
	rng := rand.New(rand.NewPCG(seed, 0x5eed))
	sc := &fgScenario{seed: seed, step: 20 * time.Millisecond, maxWait: 60 * time.Second,
		duration: 70 * time.Second, warmup: 10 * time.Second}
	sc.batch = []int64{4, 8, 16, 32}[rng.IntN(4)]
	sc.configured = sc.batch
	if rng.IntN(2) == 0 {
		sc.configured = 256 // max_num_seqs left out
	}
	sc.outLo = 16 + rng.IntN(113)
	sc.outHi = sc.outLo * (1 + rng.IntN(3))
	sc.scrape = []time.Duration{250 * time.Millisecond, 500 * time.Millisecond, time.Second}[rng.IntN(3)]
	nLight, nHeavy := 1+rng.IntN(4), rng.IntN(3)
	caps := rng.IntN(2) == 0
	var sumW float64
	for i := range nLight + nHeavy {
		t := fgTenant{name: fmt.Sprintf("t%d", i), weight: float64(1 + rng.IntN(4)), burst: 1, light: i < nLight}
		if rng.IntN(4) == 0 {
			t.burst = 2 + rng.IntN(4)
		}
		sumW += t.weight
		sc.tenants = append(sc.tenants, t)
	}
	svc := sc.meanSvc().Seconds()
	capacity := float64(sc.batch) / svc // requests per second
	for i := range sc.tenants {
		t := &sc.tenants[i]
		share := float64(sc.batch) * t.weight / sumW // sequences
		if t.light {
			t.rate = (0.1 + 0.4*rng.Float64()) * share / svc // demand ≤ half its share
		} else {
			t.rate = (1 + 2*rng.Float64()) * capacity / float64(nHeavy)
		}
		if caps {
			t.cap = max(1, int64(math.Round(share)))
		}
	}
	// Drawn last, so the draws above (and the seeds' scenarios without
	// it) are unchanged: a third of the replicas are KV-limited, their
	// cache holding 70–100 % of a full batch of mean-sized requests, so
	// long requests leave the batch short of its sequences (Sluice knows
	// the cache's size, as from vllm:cache_config_info).
	if rng.IntN(3) == 0 {
		mean := float64(fgPrompt) + float64(sc.outLo+sc.outHi)/2
		sc.kv = int64(float64(sc.batch) * mean * (0.7 + 0.3*rng.Float64()))
	}
	// Drawn after the KV cache, for the same reason: half the seeds scrape
	// a replica learning its batch at the learning interval (the default),
	// half at the scrape interval alone.
	if rng.IntN(2) == 0 {
		sc.learn = fgLearn
	}
	switch *fairgenLearn {
	case "on":
		sc.learn = fgLearn
	case "off":
		sc.learn = 0
	}
	return sc
}

// fgPrompt is every request's prompt in tokens.
const fgPrompt = 512

// kvNeed is a request's KV cache use in tokens (all of its output, as
// vLLM's blocks hold by its end).
func (r fgReq) kvNeed() int64 { return int64(fgPrompt + r.out) }

type fgReq struct {
	t       *fgTenant
	arrival time.Duration
	out     int
	place   uint64 // its queue place (queue.Item.Place), for a take-back
	// lent: when it arrived no tenant the gate held as heavy (heavy and
	// sustained) held room, so whatever held the batch was let through as
	// light.
	lent bool
	// first: one of the tenant's first arrival (a burst is one), before
	// the gate has seen it ask for anything: no reserve can be its.
	first bool
}

// fgResult is one run's outcome.
type fgResult struct {
	tenants   []fgTenant
	served    int   // completions of measured arrivals
	earlyShed int   // expiries before their deadline
	learned   int64 // the learned batch at the end (0: none)
	maxInside int   // most requests waiting inside the replica
	takenBack int   // requests taken back from inside the replica
	scrapes   []time.Duration
	fullAt    time.Duration // the first scrape that showed requests waiting; 0: none
	learnedAt time.Duration // the scrape that first learned a batch; 0: none
}

// run simulates sc with the tenants for which keep is true. direct sends
// every request to the replica at once (vLLM alone).
func (sc *fgScenario) run(t *testing.T, keep func(*fgTenant) bool, direct bool) fgResult {
	t.Helper()
	t0 := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	clk := &desClock{now: t0}
	var ts []*fgTenant
	for i := range sc.tenants {
		if keep(&sc.tenants[i]) {
			tn := sc.tenants[i] // a fresh copy per run
			tn.rng = tenantRNG(sc.seed, tn.name)
			ts = append(ts, &tn)
		}
	}
	var res fgResult
	var now time.Duration
	cfg := queue.Config{MaxWait: sc.maxWait}
	for _, tn := range ts {
		cfg.Tenants = append(cfg.Tenants, queue.TenantConfig{Name: tn.name, Weight: tn.weight, MaxDepth: 256})
	}
	q, err := queue.New[fgReq](cfg, queue.Deps[fgReq]{Clock: clk, OnExpire: func(it queue.Item[fgReq]) {
		if now-it.Payload.arrival < sc.maxWait {
			res.earlyShed++
		}
		if it.Payload.arrival >= sc.warmup && it.Payload.arrival < sc.duration {
			it.Payload.t.expired++
		}
	}})
	require.NoError(t, err)
	// The replica as Sluice sizes it: the ramp while its batch is
	// unlearned (upstream.learn_ramp), with the learning scrape only.
	rep := &fleet.Replica{Name: "r", MaxSeqs: sc.configured}
	if sc.learn > 0 && sc.learn < sc.scrape {
		rep.Ramp = config.DefaultLearnRamp
	}
	var ev desEvents[*fgTenant]
	push := ev.push
	gap := func(tn *fgTenant) time.Duration {
		return time.Duration(tn.rng.ExpFloat64() / (tn.rate / float64(tn.burst)) * float64(time.Second))
	}
	for _, tn := range ts {
		push(desEvent[*fgTenant]{at: gap(tn), t: tn})
	}
	// The scrapes, as vllm.Poller (Run, pollDue) schedules them: with a
	// learning interval below the scrape interval it wakes every learning
	// interval and reads the replica once its interval has passed, within
	// half a wake: the learning interval while rep.LearningBatch() (its
	// batch unknown, more in flight than a scrape has shown it run), else
	// the scrape interval. Without one it reads every scrape interval. It
	// reads at once on start, which finds nothing in flight (lastScrape 0).
	fast := sc.learn > 0 && sc.learn < sc.scrape
	wake := sc.scrape
	if fast {
		wake = sc.learn
	}
	var lastScrape time.Duration
	push(desEvent[*fgTenant]{at: wake, kind: desScrape})
	var sent int64       // dispatched to the replica, not completed
	var sentTokens int64 // their KV tokens
	var running int64    // running inside the replica
	var kvUsed int64     // KV tokens of the running requests
	var inside []fgReq   // waiting inside the replica (its FCFS queue)
	g := gate.Gate{Options: sc.gateOpts}
	loads := make([]gate.TenantLoad, 0, len(ts))
	fits := func(r fgReq) bool { return running < sc.batch && (sc.kv == 0 || kvUsed+r.kvNeed() <= sc.kv) }
	start := func(r fgReq) {
		running++
		kvUsed += r.kvNeed()
		if fgTrace && r.t.light && !direct && len(ts) > 1 && now-r.arrival > 0 {
			fmt.Printf("%8.3f START %s waited %v\n", now.Seconds(), r.t.name, now-r.arrival)
		}
		if r.arrival >= sc.warmup && r.arrival < sc.duration {
			r.t.ttft = append(r.t.ttft, now-r.arrival+sc.step) // first token after one step
			r.t.lent = append(r.t.lent, r.lent)
			r.t.first = append(r.t.first, r.first)
		}
		svc := time.Duration(r.out) * sc.step
		push(desEvent[*fgTenant]{at: now + svc, kind: desCompletion, t: r.t, svc: svc, kv: r.kvNeed()})
	}
	pred := func(it queue.Item[fgReq], v queue.View[fgReq]) queue.Verdict {
		tn := it.Payload.t
		if tn.cap > 0 && tn.held+int64(v.Pending(tn.name)) >= tn.cap {
			return queue.Park
		}
		limit := rep.BatchLimit()
		if g.Alone(tn.name) {
			limit = rep.BatchLimitAlone()
		}
		if direct {
			return queue.Dispatch
		}
		cand := -1
		loads = loads[:0]
		for _, o := range ts {
			if o == tn {
				cand = len(loads)
			}
			loads = append(loads, gate.TenantLoad{Name: o.name, Weight: o.weight, Held: o.held + int64(v.Pending(o.name)), Queued: int64(v.Queued(o.name)), Tokens: o.heldTokens,
				Arrived: o.arrived, Served: o.done, ServedSec: o.doneSec})
		}
		f := gate.FleetLoad{Seqs: sent, SeqsCap: limit, Tokens: sentTokens, TokensCap: 1 << 40, Probe: rep.ProbeExcess()}
		if sc.kv > 0 {
			f.TokensCap = sc.kv
		}
		need := it.Payload.kvNeed()
		room := sent < limit && sentTokens+need <= f.TokensCap
		light, reserve := g.Assess(clk.Now().UnixNano(), loads, cand, f, 0.1)
		if !light && !f.FitsBeyond(need, reserve) {
			if fgTrace && room && tn.light {
				st, _ := g.State(tn.name)
				fmt.Printf("%8.3f HOLD %s reserve %.2f load %.2f sent %d lim %d\n", now.Seconds(), tn.name, reserve, st.Load, sent, limit)
			}
			if room {
				return queue.Park
			}
			return queue.Block
		}
		if !room {
			return queue.Block
		}
		return queue.Dispatch
	}
	dispatch := func() {
		for {
			it, ok := q.NextView(pred)
			if !ok {
				return
			}
			q.Release(it.Handle)
			it.Payload.place = it.Place
			tn := it.Payload.t
			tn.held++
			tn.heldTokens += it.Payload.kvNeed()
			sent++
			sentTokens += it.Payload.kvNeed()
			rep.Count.Add(1) // this instance's requests in flight there (LearningBatch)
			if len(inside) == 0 && fits(it.Payload) {
				start(it.Payload)
			} else {
				inside = append(inside, it.Payload)
				res.maxInside = max(res.maxInside, len(inside))
			}
		}
	}
	// takeBack is upstream.take_back_waiting (lifecycle/takeback.go) at a
	// scrape of the learned replica: the requests waiting inside it of
	// tenants above their fair share go back to their place in the queue.
	takeBack := func() {
		kept := inside[:0]
		for _, r := range inside {
			if g.WithinShare(r.t.name, r.t.weight) {
				kept = append(kept, r)
				continue
			}
			tn := r.t
			tn.held--
			tn.heldTokens -= r.kvNeed()
			sent--
			sentTokens -= r.kvNeed()
			rep.Count.Add(-1)
			_, err := q.TakeBack(queue.Request[fgReq]{Tenant: tn.name, Cost: int64(512 + 2*r.out), Arrival: t0.Add(r.arrival), Payload: r}, r.place)
			require.NoError(t, err)
			res.takenBack++
		}
		inside = kept
	}
	qd := func(name string) int {
		st, _ := q.Stats(name)
		return st.Depth
	}
	for {
		e, ok := ev.next(sc.duration+sc.maxWait+time.Minute, clk, t0)
		if !ok {
			break
		}
		now = e.at
		switch e.kind {
		case desArrival:
			tn := e.t
			if now < sc.duration {
				first := tn.arrived == 0
				for range tn.burst {
					out := sc.outLo + tn.rng.IntN(sc.outHi-sc.outLo+1)
					lent := !slices.ContainsFunc(ts, func(o *fgTenant) bool {
						st, ok := g.State(o.name)
						return ok && st.Heavy && st.Sustained && o.held > 0
					})
					_, err := q.Enqueue(queue.Request[fgReq]{Tenant: tn.name, Cost: int64(512 + 2*out), Payload: fgReq{t: tn, arrival: now, out: out, lent: lent, first: first}})
					// Arrived even if the queue refused it: Sluice counts a
					// request in its pool before Enqueue (gate.Pools.MoveLocked).
					tn.arrived++
					if err == nil {
						if fgTrace && tn.light && !direct && len(ts) > 1 {
							var hs []string
							for _, o := range ts {
								if m, ok := g.State(o.name); ok {
									hs = append(hs, fmt.Sprintf("%s h%d q%d heavy=%v sus=%v load=%.2f pk=%.2f/%.2f gone=%.1f lr=%.2f ps=%.1f", o.name, o.held, qd(o.name), m.Heavy, m.Sustained, m.Load, m.PeakCur, m.PeakPrev, float64(m.GoneAfter)/1e9, m.LongRate, float64(m.PeakStart)/1e9-1767225600))
								}
							}
							fmt.Printf("%8.3f ARR %s sent %d running %d lim %d | %s\n", now.Seconds(), tn.name, sent, running, rep.BatchLimit(), strings.Join(hs, "; "))
						}
					} else if now >= sc.warmup {
						tn.full++
					}
				}
				push(desEvent[*fgTenant]{at: now + gap(tn), t: tn})
			}
		case desCompletion:
			tn := e.t
			running--
			kvUsed -= e.kv
			sent--
			sentTokens -= e.kv
			rep.Count.Add(-1)
			tn.held--
			tn.heldTokens -= e.kv
			tn.done++
			tn.doneSec += e.svc.Seconds()
			tn.served++
			for len(inside) > 0 && fits(inside[0]) { // FCFS, as vLLM's waiting queue
				r := inside[0]
				inside = inside[1:]
				start(r)
			}
			for _, o := range ts {
				q.Unpark(o.name)
			}
		case desScrape:
			iv := sc.scrape
			if fast && rep.LearningBatch() {
				iv = sc.learn
			}
			if !fast || now-lastScrape >= iv-sc.learn/2 {
				lastScrape = now
				confirmed := rep.LearnBatch(running, int64(len(inside)), clk.Now())
				res.scrapes = append(res.scrapes, now)
				if res.fullAt == 0 && len(inside) > 0 {
					res.fullAt = now
				}
				if res.learnedAt == 0 && rep.Learned() > 0 {
					res.learnedAt = now
				}
				if !direct && confirmed {
					takeBack()
				}
			}
			if now < sc.duration+sc.maxWait {
				push(desEvent[*fgTenant]{at: now + wake, kind: desScrape})
			}
		}
		q.Tick()
		dispatch()
		due, ok := q.Tick()
		ev.tickAt(due, ok, t0)
	}
	for _, tn := range ts {
		res.tenants = append(res.tenants, *tn)
		res.served += len(tn.ttft)
	}
	res.learned = rep.Learned()
	return res
}

// fgCheck runs one seed and returns its violations.
func fgCheck(t *testing.T, seed uint64) (summary string, violations []fgViolation) {
	return fgCheckScenario(t, genScenario(seed))
}

// fgViolation is one broken invariant and its kind, so that a sweep can
// say which shapes still break it.
type fgViolation struct {
	kind fgKind
	text string
	over time.Duration // how far a p99 TTFT passed its bound (0: not a TTFT bound)
}

// fgKind sorts a violation by what the light tenant did; a sweep counts
// the seeds of each kind.
type fgKind string

const (
	// fgBurst: a light tenant sending bursts (several requests at once)
	// larger than its weighted share of the batch: light on average,
	// above its share while a burst lasts, so beside heavy tenants the
	// burst is served at its share, where alone it ran at once.
	fgBurst fgKind = "a burst above its share"
	// fgCompletion: a light tenant that never waits alone waited for a
	// completion: its request came while others held the whole batch
	// (its first, or its first since its reserved peak was lent), heavy
	// tenants among them.
	fgCompletion fgKind = "a wait for a completion"
	// fgLentShare: the same, but no tenant the gate counted heavy held
	// room when its slow requests came: the batch was held by tenants
	// asking no more than the pool, within the light margin of claims
	// that the others' small demand made nearly the whole pool.
	fgLentShare fgKind = "a wait for a completion, no tenant heavy"
	// fgFirst: the same, for the tenant's first request: the gate had
	// never seen it, so nothing was reserved for it, as for a tenant that
	// comes to a pool a lone flood holds.
	fgFirst fgKind = "a first request waits for a completion"
	// fgQueued: a light tenant that queues alone too (its own Poisson
	// peaks exceed the batch or its cap) queued longer.
	fgQueued fgKind = "queued alone too"
	fgLost   fgKind = "light requests lost"
	fgShed   fgKind = "shed before the deadline"
	fgGood   fgKind = "goodput below direct"
	// fgLone: a light tenant alone is slower through Sluice than sending
	// the same requests to the replica directly (the lone light tenant's
	// dominance figure: p99 TTFT within 1.25×, or one step over).
	fgLone fgKind = "a lone tenant slower than direct"
	// fgDirect: the same for the light tenants together, their requests
	// pooled.
	fgDirect fgKind = "light tenants together slower than direct"
)

var fgKinds = []fgKind{fgBurst, fgCompletion, fgLentShare, fgFirst, fgQueued, fgLost, fgShed, fgGood, fgLone, fgDirect}

// kindOf is the kind of a p99 TTFT violation by light tenant tn, whose
// p99 alone was alone and whose bound was bound.
func (sc *fgScenario) kindOf(tn fgTenant, alone, bound time.Duration) fgKind {
	var sumW float64
	for _, o := range sc.tenants {
		sumW += o.weight
	}
	switch {
	case tn.burst > 1 && float64(tn.burst) > float64(sc.batch)*tn.weight/sumW:
		return fgBurst
	case alone <= sc.step:
		first := false
		for i, d := range tn.ttft {
			switch {
			case d <= bound:
			case tn.first[i]:
				first = true
			case !tn.lent[i]:
				return fgCompletion
			}
		}
		if first {
			return fgFirst
		}
		return fgLentShare
	}
	return fgQueued
}

// fgCheckScenario runs sc without and with its heavy tenants and returns
// its violations.
func fgCheckScenario(t *testing.T, sc *fgScenario) (summary string, violations []fgViolation) {
	light := func(tn *fgTenant) bool { return tn.light }
	all := func(*fgTenant) bool { return true }
	alone := sc.run(t, light, false)
	flooded := sc.run(t, all, false)
	var b strings.Builder
	fmt.Fprintf(&b, "%v\n   learned %d, most inside the replica %d;", sc, flooded.learned, flooded.maxInside)
	if flooded.earlyShed > 0 {
		violations = append(violations, fgViolation{kind: fgShed, text: fmt.Sprintf("%d shed before their deadline", flooded.earlyShed)})
	}
	byName := map[string]fgTenant{}
	for _, tn := range alone.tenants {
		byName[tn.name] = tn
	}
	// Without the heavy tenants, Sluice must not be slower than no Sluice:
	// each light tenant alone, and the light tenants together (their
	// requests pooled, as fair ordering may move waits between them where
	// vLLM serves first come first served). A tenant with a cap waits for
	// it, as configured.
	direct := sc.run(t, light, true)
	var pooled, pooledDirect []time.Duration
	for i, tn := range alone.tenants {
		if tn.cap > 0 {
			continue
		}
		pooled = append(pooled, tn.ttft...)
		pooledDirect = append(pooledDirect, direct.tenants[i].ttft...)
		lone := func(o *fgTenant) bool { return o.name == tn.name }
		pa, pd := pct(sc.run(t, lone, false).tenants[0].ttft, 0.99), pct(sc.run(t, lone, true).tenants[0].ttft, 0.99)
		if bound := max(time.Duration(1.25*float64(pd)), pd+sc.step); pa > bound {
			violations = append(violations, fgViolation{fgLone, fmt.Sprintf("%s alone p99 TTFT %v > %v (direct %v)", tn.name, pa, bound, pd), pa - bound})
		}
	}
	pa, pd := pct(pooled, 0.99), pct(pooledDirect, 0.99)
	if bound := max(time.Duration(1.25*float64(pd)), pd+sc.step); pa > bound {
		violations = append(violations, fgViolation{fgDirect, fmt.Sprintf("light tenants together p99 TTFT %v > %v (direct %v)", pa, bound, pd), pa - bound})
	}
	for _, tn := range flooded.tenants {
		if !tn.light {
			fmt.Fprintf(&b, " %s served %d expired %d full %d;", tn.name, tn.served, tn.expired, tn.full)
			continue
		}
		a := byName[tn.name]
		pa, pf := pct(a.ttft, 0.99), pct(tn.ttft, 0.99)
		bound := max(time.Duration(1.5*float64(pa)), pa+sc.step)
		fmt.Fprintf(&b, " %s p99 TTFT %v alone %v (bound %v) lost %d;", tn.name, pf, pa, bound, tn.expired+tn.full)
		if pf > bound {
			violations = append(violations, fgViolation{sc.kindOf(tn, pa, bound), fmt.Sprintf("%s p99 TTFT %v > %v (alone %v)", tn.name, pf, bound, pa), pf - bound})
		}
		if tn.expired+tn.full > a.expired+a.full {
			violations = append(violations, fgViolation{kind: fgLost, text: fmt.Sprintf("%s lost %d requests (alone %d)", tn.name, tn.expired+tn.full, a.expired+a.full)})
		}
	}
	if !slices.ContainsFunc(sc.tenants, func(tn fgTenant) bool { return !tn.light }) {
		fmt.Fprintf(&b, " goodput %d vs direct %d", flooded.served, direct.served)
		if float64(flooded.served) < 0.95*float64(direct.served) {
			violations = append(violations, fgViolation{kind: fgGood, text: fmt.Sprintf("goodput %d < 95%% of direct %d", flooded.served, direct.served)})
		}
	}
	return b.String(), violations
}

// fgJoin is violations as one line.
func fgJoin(violations []fgViolation) string {
	s := make([]string, len(violations))
	for i, v := range violations {
		s[i] = v.text
	}
	return strings.Join(s, "; ")
}

// TestFairnessScenarios runs the seeded fairness scenarios.
func TestFairnessScenarios(t *testing.T) {
	require.Contains(t, []string{"", "on", "off"}, *fairgenLearn, "-fairgen.learn")
	seeds := fairgenSeeds
	if *fairgenN > 0 {
		seeds = nil
		for i := range uint64(*fairgenN) {
			seeds = append(seeds, *fairgenBase+i)
		}
	}
	failed := 0
	byKind := map[fgKind]int{}             // seeds with a violation of the kind
	overBy := map[fgKind][]time.Duration{} // per such seed, its largest p99 TTFT overshoot
	for _, seed := range seeds {
		sum, v := fgCheck(t, seed)
		if len(v) == 0 {
			t.Logf("ok   %s", sum)
			continue
		}
		failed++
		most := map[fgKind]time.Duration{}
		for _, x := range v {
			if _, ok := most[x.kind]; !ok {
				byKind[x.kind]++
			}
			most[x.kind] = max(most[x.kind], x.over)
		}
		for k, d := range most {
			if d > 0 {
				overBy[k] = append(overBy[k], d)
			}
		}
		if *fairgenWarn {
			t.Logf("FAIL %s\n   violations: %s", sum, fgJoin(v))
		} else {
			t.Errorf("FAIL %s\n   violations: %s", sum, fgJoin(v))
		}
	}
	t.Logf("%d of %d seeds hold every invariant", len(seeds)-failed, len(seeds))
	if failed > 0 {
		var kinds []string
		for _, k := range fgKinds {
			if byKind[k] > 0 {
				kinds = append(kinds, fmt.Sprintf("%s %d", k, byKind[k]))
			}
		}
		t.Logf("seeds failing by kind (a seed may have several): %s", strings.Join(kinds, ", "))
		var overs []string
		for _, k := range fgKinds {
			if ds := overBy[k]; len(ds) > 0 {
				overs = append(overs, fmt.Sprintf("%s median %v, most %v", k, pct(ds, 0.5).Round(time.Millisecond), pct(ds, 1).Round(time.Millisecond)))
			}
		}
		t.Logf("p99 TTFT past its bound, per failing seed: %s", strings.Join(overs, "; "))
	}
	if *fairgenN > 0 {
		for _, row := range []struct {
			name       string
			configured int64
			learn      time.Duration
		}{
			{"isolation row b", 32, 0}, {"isolation row c", 256, 0},
			{"isolation row b, learning scrape", 32, fgLearn}, {"isolation row c, learning scrape", 256, fgLearn},
		} {
			held := 0
			for seed := range uint64(fgIsolationDraws) {
				sum, v := fgCheckScenario(t, fgIsolationRow(seed+1, row.configured, row.learn))
				if len(v) == 0 {
					held++
				} else if fgTrace {
					t.Logf("%s: %s\n   violations: %s", row.name, sum, fgJoin(v))
				}
			}
			t.Logf("%s: %d of %d draws hold every invariant", row.name, held, fgIsolationDraws)
		}
	}
}

// TestFairgenKinds pins how the sweep sorts a light tenant's p99 TTFT
// violation: by its bursts against its weighted share of the batch, then
// by whether it waited at all alone.
func TestFairgenKinds(t *testing.T) {
	sc := &fgScenario{batch: 8, step: 20 * time.Millisecond, tenants: []fgTenant{
		{name: "poisson", weight: 1, burst: 1, light: true},
		{name: "bursts", weight: 1, burst: 5, light: true},
		{name: "flood", weight: 2, burst: 1},
	}}
	// Shares of the batch: 2, 2 and 4 sequences. Each light tenant's
	// slowest request (300 ms, over a bound of 40 ms) came while a heavy
	// tenant held room.
	bound := 2 * sc.step
	for i := range sc.tenants[:2] {
		sc.tenants[i].ttft = []time.Duration{sc.step, 300 * time.Millisecond}
		sc.tenants[i].lent = []bool{true, false}
		sc.tenants[i].first = []bool{false, false}
	}
	assert.Equal(t, fgBurst, sc.kindOf(sc.tenants[1], sc.step, bound), "a burst of 5 over a share of 2")
	assert.Equal(t, fgCompletion, sc.kindOf(sc.tenants[0], sc.step, bound), "never waits alone")
	assert.Equal(t, fgQueued, sc.kindOf(sc.tenants[0], 300*time.Millisecond, 450*time.Millisecond), "waits alone too")
	sc.tenants[1].burst = 2
	assert.Equal(t, fgCompletion, sc.kindOf(sc.tenants[1], sc.step, bound), "a burst within its share")
	sc.batch = 2 // shares of half a sequence: one request is no burst
	assert.Equal(t, fgCompletion, sc.kindOf(sc.tenants[0], sc.step, bound), "a single request above a share below one sequence")
	sc.tenants[0].lent[1] = true
	assert.Equal(t, fgLentShare, sc.kindOf(sc.tenants[0], sc.step, bound), "no heavy tenant held room when it came")
	sc.tenants[0].first[1] = true
	assert.Equal(t, fgFirst, sc.kindOf(sc.tenants[0], sc.step, bound), "its first request")
	sc.tenants[0].lent[1], sc.tenants[0].ttft = false, append(sc.tenants[0].ttft, 200*time.Millisecond)
	sc.tenants[0].lent, sc.tenants[0].first = append(sc.tenants[0].lent, false), append(sc.tenants[0].first, false)
	assert.Equal(t, fgCompletion, sc.kindOf(sc.tenants[0], sc.step, bound), "a later request waited too")
}

// TestFairgenBurstNotHeld pins seed 494 without its heavy tenant: a
// tenant of weight 4 sending bursts of three (1.84 requests in flight on
// average, a KV cache holding six) beside one of weight 2. Its bursts
// queue more than the pool, so it is heavy by its demand; held at the
// reserve kept for the other's peak (NoSustain) it gets one request at a
// time, below what its arrivals need, and its queue grows for the rest of
// the run (the two tenants' p99 TTFT 21 s, against 0.41 s sent to the
// replica directly). Its arrivals offer less than its share, so the
// reserve does not hold it.
func TestFairgenBurstNotHeld(t *testing.T) {
	pooled := func(r fgResult) time.Duration {
		var ds []time.Duration
		for _, tn := range r.tenants {
			ds = append(ds, tn.ttft...)
		}
		return pct(ds, 0.99)
	}
	light := func(tn *fgTenant) bool { return tn.light }
	sc := genScenario(494)
	require.Equal(t, int64(3252), sc.kv, "the draw")
	direct := pooled(sc.run(t, light, true))
	sluice := pooled(sc.run(t, light, false))
	sc.gateOpts.NoSustain = true
	held := pooled(sc.run(t, light, false))
	t.Logf("p99 TTFT of the light tenants together: direct %v, Sluice %v, held by the reserve %v", direct, sluice, held)
	assert.LessOrEqual(t, sluice, max(direct*5/4, direct+sc.step))
	assert.Greater(t, held, 10*direct)
}

// TestFairgenLearningScrape pins the scenarios' scrape schedule to
// vllm.Poller's: on row (c)'s shape (max_num_seqs left out, a flood from
// the start), a replica learning its batch is read every learning
// interval from the first wake that finds it busy, so the pair of full
// scrapes learns its batch one learning interval after the first, and
// every scrape interval once it is learned; without the learning scrape
// it is read every second and the pair takes a second.
func TestFairgenLearningScrape(t *testing.T) {
	all := func(*fgTenant) bool { return true }
	on := fgIsolationRow(1, 256, fgLearn).run(t, all, false)
	off := fgIsolationRow(1, 256, 0).run(t, all, false)
	require.Greater(t, len(on.scrapes), 8)
	require.Greater(t, len(off.scrapes), 4)
	t.Logf("learning scrape: full at %v, learned at %v, first scrapes %v", on.fullAt, on.learnedAt, on.scrapes[:8])
	t.Logf("scrape interval alone: full at %v, learned at %v, first scrapes %v", off.fullAt, off.learnedAt, off.scrapes[:4])
	assert.Equal(t, fgLearn, on.scrapes[0], "read at the first wake with requests in flight")
	for i := 1; i < len(on.scrapes); i++ {
		gap := on.scrapes[i] - on.scrapes[i-1]
		if on.scrapes[i] <= on.learnedAt {
			assert.Equal(t, fgLearn, gap, "learning: every learning interval (scrape at %v)", on.scrapes[i])
		} else {
			assert.Equal(t, time.Second, gap, "learned: every scrape interval (scrape at %v)", on.scrapes[i])
		}
	}
	require.Positive(t, on.fullAt)
	assert.Equal(t, on.fullAt+fgLearn, on.learnedAt)
	for i, at := range off.scrapes {
		assert.Equal(t, time.Duration(i+1)*time.Second, at)
	}
	require.Positive(t, off.fullAt)
	assert.Equal(t, off.fullAt+time.Second, off.learnedAt)
}
