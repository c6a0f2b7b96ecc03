package gate_test

import (
	"flag"
	"fmt"
	"hash/fnv"
	"maps"
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
	"github.com/sluicehq/sluice/scheduler/peers"
	"github.com/sluicehq/sluice/vllm"
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
// well, and a third two instances of a Redis fleet in front of the
// replica (fgInst), each tenant sending to one of them: each instance has
// its own queue, gate and view of the replica, learns from the same
// scrapes, and every fleet.ShareInterval both report their demand and
// take their shares as the share loop does (fleet.Split, with the batch
// as fleet.Replica.ShareBatch reads it). Not modelled: a tenant sending
// to both instances (the fleet-wide fair-share counters: TestFleetBound,
// TestFleetFairShareTwoInstances), the reports' staleness between the
// two instances' exchanges (both exchange at the same instant),
// preemption (the replica admits by each request's whole KV use), prefill
// time.
//
// `go test -run TestFairnessScenarios ./scheduler/gate/` runs fairgenSeeds
// with one instance and fairgenTwoSeeds with two; `-fairgen.seeds=N
// -fairgen.base=B` runs N from B (make fairness-sweep), `-fairgen.learn=on`
// or `off` sets the learning scrape of every seed instead of drawing it,
// `-fairgen.instances=1` or `2` the instances, `-fairgen.onset=late` (or
// `trickle`) starts every heavy tenant late (fgScenario.lateOnset), and
// `-fairgen.fleetoff`
// turns off mechanisms of the split across instances (fgFleetOff),
// `-fairgen.cap` sets server.reserve_cap, and `-fairgen.preempt=resume` (or
// `restart`, or `fleet`) adds what Sluice does not do: taking a running
// sequence back for a light tenant (fgScenario.preempt). Each line of the
// log is one seed.

var (
	fairgenN     = flag.Int("fairgen.seeds", 0, "fairness scenarios to run (0: the make test set)")
	fairgenBase  = flag.Uint64("fairgen.base", 1, "first fairness scenario seed")
	fairgenWarn  = flag.Bool("fairgen.report", false, "log violations instead of failing (for sweeps recorded in BENCHMARKS.md)")
	fairgenLearn = flag.String("fairgen.learn", "", "the learning scrape of every seed: on or off (empty: drawn per seed)")
	// fairgenInstances sets every seed's instance count instead of drawing it.
	fairgenInstances = flag.String("fairgen.instances", "", "instances in front of the replica for every seed: 1 or 2 (empty: drawn per seed)")
	fairgenLoops     = flag.String("fairgen.loops", "", "heavy tenants as closed loops for every seed: on or off (empty: drawn per tenant)")
	// fairgenLightLoops makes every light tenant a closed loop of the
	// clients that offer its drawn rate (at least one): steady tenants,
	// whose demand is their clients (gate's steadyVar). Off by default, so
	// that a seed draws what it always has.
	fairgenLightLoops = flag.Bool("fairgen.lightloops", false, "every light tenant a closed loop offering its drawn rate")
	fairgenReplicas   = flag.String("fairgen.replicas", "", "replicas the batch is split over for every seed: 1 or 2 (empty: drawn per seed)")
	// fairgenOnset starts every heavy tenant late (fgScenario.lateOnset),
	// trickling first with trickle.
	fairgenOnset = flag.String("fairgen.onset", "", "heavy tenants' start for every seed: late (known to the gate, silent, then flooding), trickle (sending a request every few seconds before) or empty (from the start)")
	// fairgenSamples lengthens each scenario until every light tenant
	// expects that many measured requests (fgScenario.lengthen).
	fairgenSamples  = flag.Int("fairgen.samples", 0, "measured requests every light tenant should expect, lengthening the scenario to at most an hour (0: as drawn; a p99 of fewer than 100 is the slowest request)")
	fairgenFleetOff = flag.String("fairgen.fleetoff", "", "the split's mechanisms to turn off, comma-separated: kv, light, park, unreported, peerweight, parkqueued, slivers, heldpark, queued, floor, cut, stands, steady (fgFleetOff)")
	// fairgenPreempt and fairgenCap measure what Sluice does not do: take
	// a running sequence back for a light tenant (fgScenario.preempt,
	// SCHEDULING §11), with the reserve capped so that heavy tenants fill
	// the room it would otherwise keep idle.
	fairgenPreempt = flag.String("fairgen.preempt", "", "what-if, not built: a tenant its gate holds light that finds no room takes a running sequence of a heavy tenant back, which resumes from its output so far (resume) or starts again (restart), at its own instance, or resumes and at either instance (fleet) (fgScenario.preempt); empty: none, as Sluice does")
	fairgenCap     = flag.Float64("fairgen.cap", 0, "server.reserve_cap of every seed and row (0: the default; negative: none kept)")
	// fairgenTakeable is the part of heavy requests -fairgen.preempt may
	// take: a restart is for a request whose client has seen nothing (a
	// non-streamed one), so where half stream, half may be taken.
	fairgenTakeable = flag.Float64("fairgen.takeable", 1, "the part of requests -fairgen.preempt may take back (by a hash of each request's arrival; 1: all)")
)

// fgLearn is upstream.learn_scrape_interval as the scenarios draw it on.
const fgLearn = config.DefaultLearnScrapeInterval

// fgTrace (FG_TRACE=1 with one seed) prints each light arrival with the
// gate's view of every tenant, each light request that waited, and each
// instance's split of the batch where there are two.
var fgTrace = os.Getenv("FG_TRACE") != ""

// fgRows (FG_ROWS=1) prints each isolation row draw that misses an
// invariant, without fgTrace's trace.
var fgRows = os.Getenv("FG_ROWS") != ""

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
// burst held as a flood (NoSustain). 692 (light tenants alone, two of
// them sending bursts of four on a four-sequence pool: 9.12 s pooled p99
// against 4.51 s direct) fails with a bursty tenant held as a flood
// (NoBursty).
var fairgenSeeds = []uint64{1, 3, 4, 8, 9, 10, 11, 16, 17, 19, 415, 43, 97, 98, 134, 36, 188, 494, 692}

// fairgenTwoSeeds run in make test with two instances in front of the
// replica (they run with one instance above): 150 and 475 (a KV cache that
// binds long before max_num_seqs) lose light requests to their max_wait
// with the batch split counted in sequences (fgFleetOff.kvBatch); 21 and
// 93 (light tenants at both instances) wait for completions where the
// share binds the tenants the split holds light (lightFree); 9 (a light
// tenant at the instance of a heavy one the share binds) waits where that
// heavy tenant blocks the queue instead of parking (park); 35 (a light
// tenant's first requests at an instance, before its first report) and 69
// (a burst) wait where the share binds a tenant the split has not
// classified yet (unreported); 330 (a flood beside one light tenant at its instance, the
// other flood at the other) waits where the gate weighs the flood's share
// among its own instance's tenants alone (peerWeight); 44 and 151 (a
// light tenant at a flood's instance, not yet reported or not light in
// the split) wait behind the flood where a tenant the share binds parks
// only for tenants the split already holds light (parkQueued); 97 and
// 322 (a light tenant behind a flood its gate holds and its share binds)
// wait where the held flood blocks the queue rather than parking
// (heldPark).
// TestFairgenTwoInstances checks each.
var fairgenTwoSeeds = []uint64{9, 21, 35, 44, 69, 93, 97, 150, 151, 322, 330, 475}

// fairgenTwoReplicaSeeds run in make test with the batch split over two
// replicas (one instance): seeds whose invariants hold so, of the shapes
// above.
var fairgenTwoReplicaSeeds = []uint64{1, 4, 9, 10, 17, 98}

// fairgenLateSeeds run in make test with every heavy tenant starting
// late (fgScenario.lateOnset), the other dimensions drawn: seeds whose
// invariants hold so, each of which fails without the young rate
// (TestFairgenLateOnset).
var fairgenLateSeeds = []uint64{1, 8, 9, 19, 35}

// fairgenTrickleSeeds run in make test with every open-loop heavy tenant
// trickling before it floods late (lateOnset with trickle), the other
// dimensions drawn: seeds whose invariants hold so, each of which fails
// without the surge (TestFairgenTrickleOnset).
var fairgenTrickleSeeds = []uint64{9, 19}

// fairgenLoopSeeds run in make test with every heavy tenant a closed
// loop: seeds whose invariants hold so, of the shapes above.
var fairgenLoopSeeds = []uint64{1, 9, 10, 16, 19, 188}

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

// fgIsolationRowX is row x of scripts/isolation-rows.sh: row b's shape
// (configured 32) in front of two instances of a Redis fleet, the three
// light tenants at one, the flood at the other.
func fgIsolationRowX(seed uint64, learn time.Duration) *fgScenario {
	sc := fgIsolationRow(seed, 32, learn)
	sc.instances = 2
	for i := range sc.tenants {
		if sc.tenants[i].light {
			sc.tenants[i].inst = 1
		}
	}
	return sc
}

// fgLightAtAnotherInstance is the shape of node's
// TestLightTenantsAtAnotherInstance: a replica whose batch is 8 (4 ms
// steps, requests of 40 tokens) in front of two instances of a Redis
// fleet, three light tenants of equal weight at 10 requests a second
// each at one, a closed-loop flood of 24 clients at the other. Reported
// by the sweep, not held: the light tenants' p99 TTFT reads 0.4–3.1 s
// against about 50 ms alone on every one of the first 20 draws. At the
// flood's own instance it reads 0.18–0.24 s, failing too: together they
// ask 60 % of a batch of 8, and their Poisson peaks wait for completions
// of a non-preemptive batch (the kind "a wait for a completion"). The
// real test bounds only their p50 and p90 (p99 about 650 ms there).
func fgLightAtAnotherInstance(seed uint64) *fgScenario {
	sc := &fgScenario{seed: seed, batch: 8, configured: 8, step: 4 * time.Millisecond, outLo: 40, outHi: 40,
		scrape: time.Second, learn: fgLearn, maxWait: 10 * time.Second, duration: 20 * time.Second, warmup: 3 * time.Second, instances: 2}
	for _, n := range []string{"v1", "v2", "v3"} {
		sc.tenants = append(sc.tenants, fgTenant{name: n, weight: 1, rate: 10, burst: 1, light: true, inst: 1})
	}
	sc.tenants = append(sc.tenants, fgTenant{name: "flood", weight: 1, loop: 24, burst: 1})
	return sc
}

type fgTenant struct {
	name   string
	weight float64
	// loop is the clients of a closed loop, each sending its next request
	// when its last ends; 0: Poisson arrivals at rate, in bursts.
	loop  int
	rate  float64 // arrivals per second
	burst int     // requests per arrival event (1: Poisson)
	cap   int64   // concurrency; 0: none
	light bool
	inst  int           // the instance it sends to (0 with one)
	onset time.Duration // when its arrivals start (its clients, for a loop)
	pre   float64       // its Poisson arrivals per second before onset (open loops; 0: none)

	rng                   *rand.Rand
	held                  int64 // dispatched by Sluice, not completed
	heldTokens            int64 // their KV tokens
	arrived, done         int64
	doneSec               float64
	ttft                  []time.Duration // measured arrivals
	lent                  []bool          // fgReq.lent of each
	first                 []bool          // fgReq.first of each
	served, expired, full int
	busy                  time.Duration // its sequences' time in the measured window (fgResult.busy)
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
	reserveCap float64      // the gate's Cap (server.reserve_cap; 0: its default)
	// instances is how many Sluice instances of a Redis fleet share the
	// replica (0 or 1: one), each tenant sending to its fgTenant.inst.
	instances int
	// replicas is how many replicas the batch and KV cache are split over
	// (0 or 1: one), Sluice choosing among them as fleet.Set.Take does.
	replicas int
	fleetOff fgFleetOff // the split's mechanisms turned off, to show what each is for
	// preempt is a what-if Sluice does not do (SCHEDULING §11): where a
	// tenant its gate holds light has a request queued and no replica has
	// room for it, the instance aborts the newest running sequence of a
	// tenant its gate holds heavy, holds the slot and its KV tokens for the
	// light tenants (vLLM frees them at its next step, a step later here),
	// and queues the aborted request again at its place: to resume from
	// what it generated (its prompt and output so far prefilled again,
	// which the model, having no prefill time, does not charge), or with
	// restart to start again, the tokens it generated lost. Only an
	// instance's own requests, unless fleet: then the other instance's
	// too, as if told at once that a light tenant waits, its view of the
	// replica counting the slot as freed for light tenants as well.
	preempt, restart, fleet bool
	// takeable is the part of requests preempt may take (0 or 1: all).
	takeable float64
}

// fgFleetOff turns off one mechanism of the split across instances.
type fgFleetOff struct {
	kvBatch   bool // split max_num_seqs even where the KV cache binds first (fleet.Replica.ShareBatch)
	lightFree bool // the share binds the tenants the split holds light too (fleet.ShareOf.Light)
	park      bool // a tenant the share binds blocks the queue instead of parking (lifecycle's predicate, fleet.Route.NoShare)
	// unreported: the share binds a tenant the split has not classified
	// yet even where the gate holds it light (fleet.Route.Light).
	unreported bool
	// peerWeight: the gate's weighted share counts this instance's
	// tenants alone (gate.FleetLoad.PeerWeight).
	peerWeight bool
	// parkQueued: a tenant the share binds parks only where the split
	// holds a tenant of this instance light, not wherever another queued
	// here may use the room (lifecycle's othersMayUse).
	parkQueued bool
	// slivers: token room below one request on a replica counts as room
	// in the gate's sum (fleet.Set.FleetOf).
	slivers bool
	// heldPark: a tenant the gate holds blocks the queue where only room
	// its share keeps from it is free, though another tenant queued there
	// may use that room (lifecycle's admissible).
	heldPark bool
	// queued: the reports carry no tenant's queued part, so a light
	// tenant waiting does not take a flood's instance's floor (fleet.Split).
	queued bool
	// floorEach: the heavy tenants' floor and an instance's floor of one
	// request on every replica of the pool, not once (fleet.SplitPool,
	// fleet.FloorOnce).
	floorEach bool
	// cut: the share does not bind a tenant the split holds light and
	// gives less than its claim while a light tenant at the other
	// instance waits (fleet.ShareOf.Cut).
	cut bool
	// stands: the reports do not say which tenants the gate lets through
	// as no flood with a standing queue, so the share binds such a cut
	// tenant only while a light tenant at the other instance waits
	// (peers.TenantDemand.Stands).
	stands bool
	// steady: the reports say no tenant is steady, so the split keeps a
	// closed loop's claim a Poisson margin (peers.TenantDemand.Steady).
	steady bool
}

// whatIf sets what -fairgen.preempt and -fairgen.cap ask of every seed
// and row.
func (sc *fgScenario) whatIf() {
	sc.preempt = *fairgenPreempt != ""
	sc.restart = *fairgenPreempt == "restart"
	sc.fleet = *fairgenPreempt == "fleet"
	sc.takeable = *fairgenTakeable
	if *fairgenCap != 0 {
		sc.reserveCap = *fairgenCap
	}
}

// mayTake reports whether preempt may take r back: all requests, or the
// part sc.takeable by a hash of r's tenant and arrival (a stand-in for
// which of them are sent non-streamed).
func (sc *fgScenario) mayTake(r fgReq) bool {
	if sc.takeable <= 0 || sc.takeable >= 1 {
		return true
	}
	h := fnv.New64a()
	fmt.Fprintf(h, "%s/%d", r.t.name, r.arrival)
	return float64(h.Sum64()%1000) < sc.takeable*1000
}

// repConfigured is each replica's max_num_seqs as configured: its part
// of the batch, or 256 where it is left out (every replica's default).
func (sc *fgScenario) repConfigured() int64 {
	if sc.configured == 256 {
		return 256
	}
	return sc.configured / int64(max(sc.replicas, 1))
}

// switches names each of o's mechanisms as -fairgen.fleetoff takes it.
func (o *fgFleetOff) switches() map[string]*bool {
	return map[string]*bool{"kv": &o.kvBatch, "light": &o.lightFree, "park": &o.park, "unreported": &o.unreported,
		"peerweight": &o.peerWeight, "parkqueued": &o.parkQueued, "slivers": &o.slivers, "heldpark": &o.heldPark, "queued": &o.queued, "floor": &o.floorEach, "cut": &o.cut, "stands": &o.stands, "steady": &o.steady}
}

func (sc *fgScenario) meanSvc() time.Duration {
	return time.Duration(float64(sc.outLo+sc.outHi) / 2 * float64(sc.step))
}

// aboveShare reports whether tn, drawn light, asks more of the batch on
// average than its weighted share: its bursts' requests at its rate of
// bursts, each for the mean service time. The draw keeps a light tenant's
// rate of bursts within half its share, so one sending bursts of several
// may ask up to 2.5 times its share in requests. The invariants are for a
// tenant whose demand is below its weighted share: beside floods, a fair
// dequeue serves such a tenant at about its share, less than it sends,
// and its queue grows until its requests reach their max_wait, as they
// would behind any weighted-fair scheduler. Its figures are printed, not
// checked.
func (sc *fgScenario) aboveShare(tn fgTenant) bool {
	if !tn.light || tn.loop > 0 {
		return false
	}
	var sumW float64
	for _, o := range sc.tenants {
		sumW += o.weight
	}
	return float64(tn.burst)*tn.rate*sc.meanSvc().Seconds() > float64(sc.batch)*tn.weight/sumW
}

// lengthen runs sc long enough that each Poisson light tenant expects n
// measured requests (after the warm-up), at most an hour; the sweep's
// seeds only, not its rows. A p99 of fewer than 100 requests is the
// slowest one, and as drawn the light tenant that misses its bound
// typically sends about a dozen. Longer runs find more violations, not
// fewer (BENCHMARKS, the sweep row).
func (sc *fgScenario) lengthen(n int) {
	if n <= 0 {
		return
	}
	for _, tn := range sc.tenants {
		if !tn.light || tn.loop > 0 || tn.rate <= 0 {
			continue
		}
		need := time.Duration(float64(n) / (tn.rate * float64(max(tn.burst, 1))) * float64(time.Second))
		sc.duration = min(max(sc.duration, sc.warmup+need), time.Hour)
	}
}

func (sc *fgScenario) String() string {
	var b strings.Builder
	fmt.Fprintf(&b, "seed %d: batch %d max_num_seqs %d kv %d step %v out %d–%d scrape %v learn %v;", sc.seed, sc.batch, sc.configured, sc.kv, sc.step, sc.outLo, sc.outHi, sc.scrape, sc.learn)
	if sc.instances > 1 {
		fmt.Fprintf(&b, " %d instances;", sc.instances)
	}
	if sc.replicas > 1 {
		fmt.Fprintf(&b, " %d replicas;", sc.replicas)
	}
	for _, t := range sc.tenants {
		kind := "heavy"
		if t.light {
			kind = "light"
		}
		if t.loop > 0 {
			fmt.Fprintf(&b, " %s(%s w%g loop %d cap %d", t.name, kind, t.weight, t.loop, t.cap)
		} else {
			fmt.Fprintf(&b, " %s(%s w%g %.2f/s burst %d cap %d", t.name, kind, t.weight, t.rate, t.burst, t.cap)
		}
		if t.onset > 0 {
			fmt.Fprintf(&b, " from %v", t.onset.Round(time.Millisecond))
		}
		if t.pre > 0 {
			fmt.Fprintf(&b, " after %g/s", t.pre)
		}
		if sc.instances > 1 {
			fmt.Fprintf(&b, " at %d", t.inst)
		}
		b.WriteString(")")
	}
	return b.String()
}

// fgDraw sets dimensions a seed would otherwise draw: instances and
// replicas "1" or "2", loops "on" or "off" (every heavy tenant a closed
// loop, or none); empty: as the -fairgen flags say, else drawn.
type fgDraw struct{ instances, replicas, loops string }

// fgMakeTest is the draw of the make test seed lists' first shapes: one
// instance, one replica, open-loop tenants.
var fgMakeTest = fgDraw{"1", "1", "off"}

// genScenarioAt draws one scenario from seed, with d's dimensions set.
func genScenarioAt(seed uint64, d fgDraw) *fgScenario {
	instances, replicas, loops := d.instances, d.replicas, d.loops
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
	// Drawn after the learning scrape, for the same reason: a third of
	// the seeds run two instances of a Redis fleet in front of the
	// replica, each tenant sending to one of them.
	two := rng.IntN(3) == 0
	for i := range sc.tenants {
		sc.tenants[i].inst = rng.IntN(2)
	}
	// Drawn after the instances, for the same reason: a third of the
	// seeds split the batch and the KV cache over two replicas, which
	// Sluice chooses between as fleet.Set.Take does.
	if rng.IntN(3) == 0 {
		sc.replicas = 2
	}
	// Drawn after the replicas, for the same reason: a third of the
	// heavy tenants are closed loops, each of its clients sending its next
	// request when the last ends (its answer, its deadline, or one second
	// after a refusal), enough of them to offer the rate drawn above.
	svc = sc.meanSvc().Seconds()
	for i := range sc.tenants {
		if t := &sc.tenants[i]; !t.light && rng.IntN(3) == 0 {
			t.loop = max(2, int(math.Round(t.rate*svc)))
		}
	}
	if loops == "" {
		loops = *fairgenLoops
	}
	for i := range sc.tenants {
		if t := &sc.tenants[i]; !t.light {
			switch loops {
			case "on":
				t.loop = max(2, int(math.Round(t.rate*svc)))
			case "off":
				t.loop = 0
			}
		}
	}
	for i := range sc.tenants {
		if t := &sc.tenants[i]; t.light && *fairgenLightLoops {
			t.loop = max(1, int(math.Round(t.rate*svc)))
		}
	}
	if replicas == "" {
		replicas = *fairgenReplicas
	}
	switch replicas {
	case "1":
		sc.replicas = 0
	case "2":
		sc.replicas = 2
	}
	switch *fairgenLearn {
	case "on":
		sc.learn = fgLearn
	case "off":
		sc.learn = 0
	}
	for _, off := range strings.Split(*fairgenFleetOff, ",") {
		if sw := sc.fleetOff.switches()[off]; sw != nil {
			*sw = true
		}
	}
	switch instances {
	case "1":
		two = false
	case "2":
		two = true
	}
	if two {
		sc.instances = 2
	} else {
		for i := range sc.tenants {
			sc.tenants[i].inst = 0
		}
	}
	return sc
}

// lateOnset starts each heavy tenant at a time drawn from seed between
// the warm-up and the middle of the measured run: known to the gate from
// its first assessment (every configured tenant is, as Pool.Assess reads
// the policy's tenants), idle, then flooding. A flood that starts with
// the run meets the gate at once; one that starts after a minute idle
// has a long-run rate diluted by that minute, which a rule reading it
// may take for a light tenant's (TestFloodAfterIdleIsHeld).
// With trickle, an open-loop heavy tenant sends fgTrickle requests a
// second, one at a time, until its onset: a tenant the gate knows as an
// occasional sender whose rate jumps (a batch job starting).
func (sc *fgScenario) lateOnset(trickle bool) {
	rng := rand.New(rand.NewPCG(sc.seed, 0x0115e7))
	for i := range sc.tenants {
		if t := &sc.tenants[i]; !t.light {
			t.onset = sc.warmup + time.Duration(rng.Float64()*float64(sc.duration-sc.warmup)/2)
			if trickle && t.loop == 0 {
				t.pre = fgTrickle
			}
		}
	}
}

// fgTrickle is a trickling heavy tenant's rate before its onset
// (lateOnset): a request every few seconds.
const fgTrickle = 0.3

// fgPrompt is every request's prompt in tokens.
const fgPrompt = 512

// kvNeed is a request's KV cache use in tokens (all of its output, as
// vLLM's blocks hold by its end).
func (r fgReq) kvNeed() int64 { return int64(fgPrompt + r.prior + r.out) }

type fgReq struct {
	t       *fgTenant
	arrival time.Duration
	out     int
	place   uint64 // its queue place (queue.Item.Place), for a take-back
	rep     int    // the replica it was sent to
	sentAt  time.Duration
	// lent: when it arrived no tenant the gate held as heavy (heavy and
	// sustained) held room, so whatever held the batch was let through as
	// light.
	lent bool
	// first: one of the tenant's first arrival (a burst is one), before
	// the gate has seen it ask for anything: no reserve can be its.
	first bool
	// prior is the output it generated before it was taken back to resume
	// (fgScenario.preempt), and resumed that it was: its first token was
	// measured at its first start.
	prior   int
	resumed bool
}

// fgResult is one run's outcome.
type fgResult struct {
	tenants   []fgTenant
	served    int   // completions of measured arrivals
	earlyShed int   // expiries before their deadline
	learned   int64 // the learned batch at the end (0: none)
	maxInside int   // most requests waiting inside a replica
	takenBack int   // requests taken back from inside the replica
	preempted int   // running sequences taken back for a light tenant (fgScenario.preempt)
	// preemptedOut is the output those had generated (lost with
	// fgScenario.restart, and not counted in busy then).
	preemptedOut int
	// busy is the replicas' sequence time within the measured window
	// (warm-up to duration): each running sequence decodes a token a step,
	// so it is what they generated, whoever it was for.
	busy      time.Duration
	scrapes   []time.Duration
	fullAt    time.Duration // the first scrape that showed requests waiting; 0: none
	learnedAt time.Duration // the scrape that first learned a batch; 0: none
}

// fgInst is one Sluice instance of a run: its queue, dispatch gate and
// view of each replica, for the tenants that send to it. With two, they
// share each replica's batch by the exchange's split (fleet.SeqShare).
type fgInst struct {
	q     *queue.Queue[fgReq]
	g     gate.Gate
	v     []*fgView // by replica
	ts    []*fgTenant
	loads []gate.TenantLoad
	pick  int  // the replica the predicate's last Dispatch chose
	claim bool // and whether that tenant may take a slot freed for it (fgScenario.preempt)
	// cursor is where the replica choice starts, turning at each pick.
	cursor int
}

// fgView is one instance's view of one replica.
type fgView struct {
	rep *fleet.Replica
	// sent and sentTokens are its requests given the replica's room and
	// not completed (running or waiting inside), and their KV tokens.
	sent, sentTokens int64
	// foreign and foreignTokens are what the last scrape showed beyond
	// its own (fleet.Replica.Seqs): the other instance's requests.
	foreign, foreignTokens int64
	// share is its cap on its requests there while the other instance
	// reports demand (fleet.Replica.Share); 0: none, fleet.NoSeqs: a cap
	// of none. It does not bind the tenants the split holds light
	// (fleet.ShareOf.Light).
	share int64
	light []string
	heavy []string // its tenants the split holds heavy (fleet.ShareOf.Heavy)
	// peerWeight is the weight of the tenants only the other instance
	// reports (fleet.Replica.PeerWeight).
	peerWeight float64
	// freed are the slots preemption freed on the replica for a light
	// tenant (fgScenario.preempt), until one of its requests is sent there
	// or the slot frees: room, and KV tokens, no other tenant may take.
	freed []fgSlot
}

// fgRep is one replica as the model runs it: the sequences it runs and
// their KV tokens, what waits in its own FCFS queue, and its last scrape.
type fgRep struct {
	running, kvUsed int64
	inside          []fgReq
	run             []fgRun // its running sequences (fgScenario.preempt)
	scraped         fleet.Obs
	// e2eSum and e2eN are vllm:e2e_request_latency_seconds' _sum and
	// _count: its completions' times from their dispatch to it.
	e2eSum float64
	e2eN   int64
}

// fgRun is a running sequence: its request, its start and its completion
// event's seq (cancelled where it is taken back).
type fgRun struct {
	r   fgReq
	at  time.Duration
	seq int
}

// fgSlot is a slot preemption freed for a light tenant, and its KV tokens.
type fgSlot struct {
	id int
	kv int64
}

// freedKV is the KV tokens of the slots freed for light tenants.
func (v *fgView) freedKV() (n int64) {
	for _, s := range v.freed {
		n += s.kv
	}
	return n
}

// fgFree is the event at which vLLM frees a sequence preemption aborted.
const fgFree = desScrape + 2

// shareReserve is what the split keeps light tenants (fleet.Reserve): the
// gate's margin, and its Cap as server.reserve_cap reaches the split (0:
// the default, negative: none kept).
func (sc *fgScenario) shareReserve() fleet.Reserve {
	rs := fleet.DefaultReserve
	switch {
	case sc.reserveCap < 0:
		rs.Cap = 0
	case sc.reserveCap > 0:
		rs.Cap = sc.reserveCap
	}
	return rs
}

// fgExchange is the share exchange's event (every fleet.ShareInterval,
// with two instances).
const fgExchange = desScrape + 1

// report is in's demand on replica r as fleet.DemandReports and
// gate.Pools.DemandOn make it: its requests in flight there, queued and
// the room its gate keeps for light tenants' peaks, in total and by
// tenant with each tenant's queued part, the pool's spread evenly over its
// replicas.
func (in *fgInst) report(name string, r int, nowN int64) peers.Entry {
	e := peers.Entry{Instance: name, InFlight: in.v[r].sent}
	n := float64(len(in.v))
	milli := func(v float64) int64 { return int64(math.Ceil(v*1000 - 1e-6)) }
	for _, tn := range in.ts {
		st, _ := in.q.Stats(tn.name)
		queued := int64(st.Depth)
		kept := in.g.Kept(nowN, tn.name, tn.held)
		e.Queued += queued + kept
		claim := tn.held + queued + kept
		if claim == 0 {
			continue
		}
		// Waiting for room: what its cap lets start (the scheduler's tenantsOn).
		waiting := float64(queued)
		if tn.cap > 0 {
			waiting = min(waiting, float64(max(tn.cap-tn.held, 0)))
		}
		asked, ok := in.g.Asked(tn.name)
		if !ok {
			asked = float64(tn.held + queued)
		}
		c := milli(float64(claim) / n)
		e.Tenants = append(e.Tenants, peers.TenantDemand{Tenant: tn.name, Weight: int64(max(tn.weight, 1)), Load: milli(asked / n), Claim: c, Queued: milli(min(waiting, float64(claim)) / n),
			Held: min(milli(float64(tn.held)/n), c), Steady: in.g.Steady(tn.name, nowN), Stands: in.g.Stands(tn.name)})
	}
	return e
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
	if fgTrace {
		names := make([]string, len(ts))
		for i, tn := range ts {
			names[i] = tn.name
		}
		fmt.Printf("RUN %v direct %v\n", names, direct)
	}
	var ev desEvents[*fgTenant]
	push := ev.push
	// again is a closed-loop client's next request, after its last ended.
	again := func(tn *fgTenant, after time.Duration) {
		if tn.loop > 0 && now+after < sc.duration {
			push(desEvent[*fgTenant]{at: now + after, t: tn})
		}
	}
	insts := make([]*fgInst, max(sc.instances, 1))
	nReps := max(sc.replicas, 1)
	// Each replica runs its part of the batch and of the KV cache: two
	// replicas stand for the same capacity as one, so the tenants' rates
	// drawn against it mean the same.
	repBatch, repKV := sc.batch/int64(nReps), sc.kv/int64(nReps)
	for i := range insts {
		in := &fgInst{g: gate.Gate{Options: sc.gateOpts, Cap: sc.reserveCap}, loads: make([]gate.TenantLoad, 0, len(ts))}
		cfg := queue.Config{MaxWait: sc.maxWait}
		for _, tn := range ts {
			if tn.inst == i {
				in.ts = append(in.ts, tn)
				cfg.Tenants = append(cfg.Tenants, queue.TenantConfig{Name: tn.name, Weight: tn.weight, MaxDepth: 256})
			}
		}
		q, err := queue.New[fgReq](cfg, queue.Deps[fgReq]{Clock: clk, OnExpire: func(it queue.Item[fgReq]) {
			if now-it.Payload.arrival < sc.maxWait {
				res.earlyShed++
			}
			if it.Payload.arrival >= sc.warmup && it.Payload.arrival < sc.duration {
				it.Payload.t.expired++
			}
			again(it.Payload.t, 0)
		}})
		require.NoError(t, err)
		in.q = q
		// Each replica as this instance sizes it: the ramp while its batch
		// is unlearned (upstream.learn_ramp), with the learning scrape only.
		for r := range nReps {
			v := &fgView{rep: &fleet.Replica{Name: fmt.Sprintf("r%d", r), MaxSeqs: sc.repConfigured()}}
			if sc.learn > 0 && sc.learn < sc.scrape {
				v.rep.Ramp = config.DefaultLearnRamp
			}
			in.v = append(in.v, v)
		}
		insts[i] = in
	}
	gateOf := func(tn *fgTenant) *gate.Gate { return &insts[tn.inst].g }
	gap := func(tn *fgTenant) time.Duration {
		return time.Duration(tn.rng.ExpFloat64() / (tn.rate / float64(tn.burst)) * float64(time.Second))
	}
	// next is an open-loop tenant's next arrival event after at: at its
	// trickle's rate before its onset, at its rate from then.
	next := func(tn *fgTenant, at time.Duration) time.Duration {
		if at < tn.onset && tn.pre > 0 {
			if n := at + time.Duration(tn.rng.ExpFloat64()/tn.pre*float64(time.Second)); n < tn.onset {
				return n
			}
		}
		return max(at, tn.onset) + gap(tn)
	}
	for _, tn := range ts {
		if tn.loop > 0 {
			for c := range tn.loop { // its clients start 10 ms apart
				push(desEvent[*fgTenant]{at: tn.onset + time.Duration(c)*10*time.Millisecond, t: tn})
			}
			continue
		}
		push(desEvent[*fgTenant]{at: next(tn, 0), t: tn})
	}
	// The scrapes, as vllm.Poller (Run, pollDue) schedules them: with a
	// learning interval below the scrape interval it wakes every learning
	// interval and reads the replica once its interval has passed, within
	// half a wake: the learning interval while rep.LearningBatch() (its
	// batch unknown, more in flight than a scrape has shown it run), else
	// the scrape interval. Without one it reads every scrape interval. It
	// reads at once on start, which finds nothing in flight (lastScrape 0).
	// Two instances read the replicas at the same moments, each learning
	// from what they show; every replica is read at once.
	fast := sc.learn > 0 && sc.learn < sc.scrape
	wake := sc.scrape
	if fast {
		wake = sc.learn
	}
	var lastScrape time.Duration
	push(desEvent[*fgTenant]{at: wake, kind: desScrape})
	if len(insts) > 1 && !direct {
		push(desEvent[*fgTenant]{at: fleet.ShareInterval, kind: fgExchange})
	}
	shareBatch := func(limit int64, o fleet.Obs) int64 {
		r := fleet.Replica{MaxSeqs: limit}
		r.Obs.Store(&o)
		return r.ShareBatch()
	}
	reps := make([]*fgRep, nReps)
	for r := range reps {
		reps[r] = &fgRep{}
	}
	fits := func(rp *fgRep, r fgReq) bool {
		return rp.running < repBatch && (repKV == 0 || rp.kvUsed+r.kvNeed() <= repKV)
	}
	start := func(r fgReq) {
		rp := reps[r.rep]
		rp.running++
		rp.kvUsed += r.kvNeed()
		if fgTrace && r.t.light && !direct && len(ts) > 1 && now-r.arrival > 0 {
			fmt.Printf("%8.3f START %s waited %v\n", now.Seconds(), r.t.name, now-r.arrival)
		}
		if r.arrival >= sc.warmup && r.arrival < sc.duration && !r.resumed {
			r.t.ttft = append(r.t.ttft, now-r.arrival+sc.step) // first token after one step
			r.t.lent = append(r.t.lent, r.lent)
			r.t.first = append(r.t.first, r.first)
		}
		svc := time.Duration(r.out) * sc.step
		push(desEvent[*fgTenant]{at: now + svc, kind: desCompletion, t: r.t, svc: svc, kv: r.kvNeed(), rep: r.rep, e2e: now + svc - r.sentAt})
		if sc.preempt {
			rp.run = append(rp.run, fgRun{r: r, at: now, seq: ev.seq})
		}
	}
	// freed is a sequence of rp ending: what waits inside starts in FCFS
	// order, as vLLM's waiting queue, and every parked tenant may try
	// again.
	freed := func(rp *fgRep) {
		for len(rp.inside) > 0 && fits(rp, rp.inside[0]) {
			r := rp.inside[0]
			rp.inside = rp.inside[1:]
			start(r)
		}
		for _, o := range ts {
			insts[o.inst].q.Unpark(o.name)
		}
	}
	// gone are the completions of sequences taken back (fgScenario.preempt).
	gone := map[int]bool{}
	slots := 0
	// lightNow is whether in's gate holds tn light: preemption serves it,
	// and a slot freed for it no other tenant may take.
	lightNow := func(in *fgInst, tn *fgTenant) bool {
		st, ok := in.g.State(tn.name)
		return sc.preempt && !(ok && st.Heavy)
	}
	predOf := func(in *fgInst) func(queue.Item[fgReq], queue.View[fgReq]) queue.Verdict {
		g := &in.g
		limits := make([]int64, nReps)
		return func(it queue.Item[fgReq], v queue.View[fgReq]) queue.Verdict {
			tn := it.Payload.t
			if tn.cap > 0 && tn.held+int64(v.Pending(tn.name)) >= tn.cap {
				return queue.Park
			}
			if direct {
				// vLLM alone behind a least-requests balancer.
				in.pick = 0
				for r, rp := range reps {
					if rp.running+int64(len(rp.inside)) < reps[in.pick].running+int64(len(reps[in.pick].inside)) {
						in.pick = r
					}
				}
				return queue.Dispatch
			}
			alone := g.Alone(tn.name)
			// The batch estimate (fleet.Replica.Seqs); the gate reads the
			// pool's batch (fleet.Set.FleetOf), and this instance's cap on
			// its own requests within a replica (its share,
			// fleet.Replica.SeqLimit) bounds the room of a tenant the split
			// does not hold light.
			f := gate.FleetLoad{TokensCap: 1 << 40}
			timed := 0
			if repKV > 0 {
				f.TokensCap = repKV * int64(nReps)
			}
			for r, vw := range in.v {
				limits[r] = vw.rep.BatchLimit()
				if alone {
					limits[r] = vw.rep.BatchLimitAlone()
				}
				f.Seqs += vw.sent + vw.foreign
				f.SeqsCap += limits[r]
				f.Tokens += vw.sentTokens + vw.foreignTokens
				if repKV > 0 && !sc.fleetOff.slivers {
					// A sliver below one request of this size is no room
					// (fleet.Set.FleetOf).
					f.Tokens += max(repKV-vw.sentTokens-vw.foreignTokens, 0) % it.Payload.kvNeed()
				}
				f.Probe += vw.rep.ProbeExcess()
				f.PeerWeight += vw.peerWeight / float64(nReps)
				if svc := vw.rep.ServiceTime(); svc > 0 {
					f.Svc += svc
					timed++
				}
			}
			if timed > 0 {
				f.Svc /= float64(timed) // the replicas' mean where known (fleet.Set.FleetOf)
			}
			in.loads = in.loads[:0]
			cand := -1
			for _, o := range in.ts {
				if o == tn {
					cand = len(in.loads)
				}
				in.loads = append(in.loads, gate.TenantLoad{Name: o.name, Weight: o.weight, Held: o.held + int64(v.Pending(o.name)), Queued: int64(v.Queued(o.name)), Tokens: o.heldTokens,
					Arrived: o.arrived, Served: o.done, ServedSec: o.doneSec})
			}
			need := it.Payload.kvNeed()
			light, reserve := g.Assess(clk.Now().UnixNano(), in.loads, cand, f, 0.1)
			// The replica choice (fleet.Set.Take): the least loaded replica
			// with room for this tenant; room the share alone keeps from it
			// is counted apart (the park probe, Route.NoShare).
			fits, beyondShare, freedOnly := false, false, false
			best, bestScore := -1, int64(0)
			forLight := lightNow(in, tn)
			for i := range in.v {
				r := (in.cursor + i) % nReps
				vw := in.v[r]
				seqs := vw.sent + vw.foreign
				raw := seqs < limits[r] && (repKV == 0 || vw.sentTokens+vw.foreignTokens+need <= repKV)
				if !forLight && raw && (seqs+int64(len(vw.freed)) >= limits[r] || (repKV > 0 && vw.sentTokens+vw.foreignTokens+vw.freedKV()+need > repKV)) {
					freedOnly = true // the room is a light tenant's
					continue
				}
				ok := raw
				// The share binds a tenant the split holds heavy, or one it has
				// not classified yet that the gate holds heavy (fleet.Replica.unshared).
				unclassified := light && !slices.Contains(vw.heavy, tn.name) && !sc.fleetOff.unreported && !sc.fleetOff.lightFree
				if vw.share != 0 && !slices.Contains(vw.light, tn.name) && !unclassified {
					ok = ok && seqs < min(limits[r], vw.foreign+max(vw.share, 0))
				}
				beyondShare = beyondShare || (raw && !ok)
				if !ok {
					continue
				}
				fits = true
				// Least load in tokens over equal capacities, ties in turn.
				if score := vw.sentTokens + vw.foreignTokens; best < 0 || score < bestScore {
					best, bestScore = r, score
				}
			}
			if fgTrace && tn.light && len(ts) > 1 && (!fits || (!light && !f.FitsBeyond(need, reserve))) {
				fmt.Printf("%8.3f WAIT %s light %v reserve %.2f fits %v seqs %d cap %d\n", now.Seconds(), tn.name, light, reserve, fits, f.Seqs, f.SeqsCap)
			}
			// Room the share alone keeps from this tenant is of use where
			// another tenant queued here may use it: one the split does not
			// hold heavy on every replica (lifecycle's othersMayUse).
			mayUse := beyondShare && !sc.fleetOff.park && slices.ContainsFunc(in.ts, func(o *fgTenant) bool {
				return o != tn && v.Queued(o.name) > 0 && slices.ContainsFunc(in.v, func(vw *fgView) bool {
					return vw.share == 0 || !slices.Contains(vw.heavy, o.name)
				})
			})
			if beyondShare && !sc.fleetOff.park && sc.fleetOff.parkQueued {
				mayUse = slices.ContainsFunc(in.v, func(vw *fgView) bool { return len(vw.light) > 0 })
			}
			if !light && !f.FitsBeyond(need, reserve) {
				if fgTrace && fits && tn.light {
					st, _ := g.State(tn.name)
					fmt.Printf("%8.3f HOLD %s reserve %.2f load %.2f sent %d lim %d\n", now.Seconds(), tn.name, reserve, st.Load, f.Seqs, f.SeqsCap)
				}
				if fits || (mayUse && !sc.fleetOff.heldPark) {
					return queue.Park // room exists, and the light tenants need it
				}
				return queue.Block
			}
			if !fits && mayUse {
				return queue.Park // the tenants the share may not bind may use the room
			}
			if !fits && freedOnly {
				return queue.Park // the freed room is the light tenant's it was freed for
			}
			if !fits {
				return queue.Block
			}
			if fgTrace && !tn.light && len(ts) > 1 {
				st, _ := g.State(tn.name)
				fmt.Printf("%8.3f PRED %s light %v reserve %.3f seqs %d cap %d probe %d heavy %v sus %v to r%d\n", now.Seconds(), tn.name, light, reserve, f.Seqs, f.SeqsCap, f.Probe, st.Heavy, st.Sustained, best)
			}
			in.pick, in.claim = best, forLight
			in.cursor = (in.cursor + 1) % nReps
			return queue.Dispatch
		}
	}
	preds := make([]func(queue.Item[fgReq], queue.View[fgReq]) queue.Verdict, len(insts))
	for i, in := range insts {
		preds[i] = predOf(in)
	}
	dispatch := func() {
		for i, in := range insts {
			for {
				it, ok := in.q.NextView(preds[i])
				if !ok {
					break
				}
				in.q.Release(it.Handle)
				it.Payload.place = it.Place
				it.Payload.rep, it.Payload.sentAt = in.pick, now
				tn := it.Payload.t
				vw, rp := in.v[in.pick], reps[in.pick]
				if fgTrace && len(ts) > 1 && !direct {
					fmt.Printf("%8.3f DISP %s at %d to r%d held %d sent %d foreign %d running %d share %d\n", now.Seconds(), tn.name, tn.inst, in.pick, tn.held, vw.sent, vw.foreign, rp.running, vw.share)
				}
				if len(vw.freed) > 0 && in.claim {
					vw.freed = vw.freed[1:]
				}
				tn.held++
				tn.heldTokens += it.Payload.kvNeed()
				vw.sent++
				vw.sentTokens += it.Payload.kvNeed()
				vw.rep.Count.Add(1) // this instance's requests in flight there (LearningBatch)
				if len(rp.inside) == 0 && fits(rp, it.Payload) {
					start(it.Payload)
				} else {
					rp.inside = append(rp.inside, it.Payload)
					res.maxInside = max(res.maxInside, len(rp.inside))
				}
			}
		}
	}
	// takeBack is upstream.take_back_waiting (lifecycle/takeback.go) at a
	// scrape of the learned replica r: the requests of in's tenants
	// waiting inside it, of tenants above their fair share, go back to
	// their place in its queue.
	takeBack := func(in *fgInst, r int) {
		rp, vw := reps[r], in.v[r]
		kept := rp.inside[:0]
		for _, x := range rp.inside {
			if x.t.inst != slices.Index(insts, in) || in.g.WithinShare(x.t.name, x.t.weight) {
				kept = append(kept, x)
				continue
			}
			tn := x.t
			tn.held--
			tn.heldTokens -= x.kvNeed()
			vw.sent--
			vw.sentTokens -= x.kvNeed()
			vw.rep.Count.Add(-1)
			_, err := in.q.TakeBack(queue.Request[fgReq]{Tenant: tn.name, Cost: int64(512 + 2*x.out), Arrival: t0.Add(x.arrival), Payload: x}, x.place)
			require.NoError(t, err)
			res.takenBack++
		}
		rp.inside = kept
	}
	// preemptOne is fgScenario.preempt at instance ii: true where it took
	// a sequence back for a light tenant's queued request.
	preemptOne := func(ii int) bool {
		in := insts[ii]
		waiting := false
		for _, tn := range in.ts {
			if !lightNow(in, tn) || (tn.cap > 0 && tn.held >= tn.cap) {
				continue
			}
			st, _ := in.q.Stats(tn.name)
			waiting = waiting || st.Depth > 0
		}
		if !waiting {
			return false
		}
		// Room for a light request of the longest output, slots freed for
		// light tenants included: it waits for something else.
		need := int64(fgPrompt + sc.outHi)
		for _, vw := range in.v {
			if vw.sent+vw.foreign < vw.rep.BatchLimit() && (repKV == 0 || vw.sentTokens+vw.foreignTokens+need <= repKV) {
				return false
			}
		}
		// The newest running sequence of a tenant the gate holds heavy: the
		// least work to prefill again.
		vr, vk := -1, -1
		for r, rp := range reps {
			for k, x := range rp.run {
				o := x.r.t
				if st, ok := insts[o.inst].g.State(o.name); (o.inst != ii && !sc.fleet) || !ok || !st.Heavy || !sc.mayTake(x.r) {
					continue
				}
				if vr < 0 || x.at > reps[vr].run[vk].at {
					vr, vk = r, k
				}
			}
		}
		if vr < 0 {
			return false
		}
		rp := reps[vr]
		x := rp.run[vk]
		vi := x.r.t.inst
		vw := insts[vi].v[vr]
		rp.run = slices.Delete(rp.run, vk, vk+1)
		gone[x.seq] = true
		tn := x.r.t
		if lo, hi := max(x.at, sc.warmup), min(now, sc.duration); hi > lo && !sc.restart {
			res.busy += hi - lo
			tn.busy += hi - lo
		}
		kv := x.r.kvNeed()
		tn.held--
		tn.heldTokens -= kv
		vw.sent--
		vw.sentTokens -= kv
		vw.rep.Count.Add(-1)
		slots++
		vw.freed = append(vw.freed, fgSlot{slots, kv})
		if vi != ii {
			// Told at once: the light tenant's instance counts the slot as
			// no longer the other's, and as freed for light tenants.
			lv := in.v[vr]
			lv.foreign = max(lv.foreign-1, 0)
			lv.foreignTokens = max(lv.foreignTokens-kv, 0)
			lv.freed = append(lv.freed, fgSlot{slots, kv})
		}
		push(desEvent[*fgTenant]{at: now + sc.step, kind: fgFree, t: tn, rep: vr, kv: kv, slot: slots})
		rest := x.r
		done := min(int((now-x.at)/sc.step), rest.out-1)
		res.preemptedOut += done
		if !sc.restart {
			rest.out -= done
			rest.prior += done
		}
		rest.resumed = true
		_, err := insts[vi].q.TakeBack(queue.Request[fgReq]{Tenant: tn.name, Cost: int64(512 + 2*rest.out), Arrival: t0.Add(rest.arrival), Payload: rest}, rest.place)
		require.NoError(t, err)
		res.preempted++
		if fgTrace {
			fmt.Printf("%8.3f PREEMPT %s on r%d after %d tokens\n", now.Seconds(), tn.name, vr, done)
		}
		return true
	}
	qd := func(tn *fgTenant) int {
		st, _ := insts[tn.inst].q.Stats(tn.name)
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
				burst := tn.burst
				if tn.loop > 0 || now < tn.onset {
					burst = 1 // one client's request, or the trickle's
				}
				for range burst {
					out := sc.outLo + tn.rng.IntN(sc.outHi-sc.outLo+1)
					lent := !slices.ContainsFunc(ts, func(o *fgTenant) bool {
						st, ok := gateOf(o).State(o.name)
						return ok && st.Heavy && st.Sustained && o.held > 0
					})
					_, err := insts[tn.inst].q.Enqueue(queue.Request[fgReq]{Tenant: tn.name, Cost: int64(512 + 2*out), Payload: fgReq{t: tn, arrival: now, out: out, lent: lent, first: first}})
					// Arrived even if the queue refused it: Sluice counts a
					// request in its pool before Enqueue (gate.Pools.MoveLocked).
					tn.arrived++
					if err == nil {
						if fgTrace && tn.light && !direct && len(ts) > 1 {
							var hs []string
							for _, o := range ts {
								if m, ok := gateOf(o).State(o.name); ok {
									hs = append(hs, fmt.Sprintf("%s h%d q%d heavy=%v sus=%v load=%.2f pk=%.2f/%.2f gone=%.1f lr=%.2f ps=%.1f", o.name, o.held, qd(o), m.Heavy, m.Sustained, m.Load, m.PeakCur, m.PeakPrev, float64(m.GoneAfter)/1e9, m.LongRate, float64(m.PeakStart)/1e9-1767225600))
								}
							}
							in := insts[tn.inst]
							for r, vw := range in.v {
								fmt.Printf("%8.3f ARR %s at %d r%d sent %d running %d inside %d lim %d learned %d share %d\n", now.Seconds(), tn.name, tn.inst, r, vw.sent+vw.foreign, reps[r].running, len(reps[r].inside), vw.rep.BatchLimit(), vw.rep.Learned(), vw.share)
							}
							fmt.Printf("%8.3f GATE %s\n", now.Seconds(), strings.Join(hs, "; "))
						}
					} else {
						if now >= sc.warmup {
							tn.full++
						}
						again(tn, time.Second) // refused: it retries after Retry-After's floor
					}
				}
				if tn.loop == 0 {
					push(desEvent[*fgTenant]{at: next(tn, now), t: tn})
				}
			}
		case desCompletion:
			if gone[e.seq] {
				delete(gone, e.seq)
				break
			}
			tn := e.t
			if rp := reps[e.rep]; sc.preempt {
				rp.run = slices.DeleteFunc(rp.run, func(x fgRun) bool { return x.seq == e.seq })
			}
			if lo, hi := max(e.at-e.svc, sc.warmup), min(e.at, sc.duration); hi > lo {
				res.busy += hi - lo
				tn.busy += hi - lo
			}
			in := insts[tn.inst]
			rp, vw := reps[e.rep], in.v[e.rep]
			rp.running--
			rp.kvUsed -= e.kv
			rp.e2eSum += e.e2e.Seconds()
			rp.e2eN++
			vw.sent--
			vw.sentTokens -= e.kv
			vw.rep.Count.Add(-1)
			tn.held--
			tn.heldTokens -= e.kv
			tn.done++
			tn.doneSec += e.svc.Seconds()
			tn.served++
			again(tn, 0)
			freed(rp)
		case fgFree:
			rp := reps[e.rep]
			rp.running--
			rp.kvUsed -= e.kv
			for _, in := range insts {
				in.v[e.rep].freed = slices.DeleteFunc(in.v[e.rep].freed, func(s fgSlot) bool { return s.id == e.slot })
			}
			freed(rp)
		case desScrape:
			iv := sc.scrape
			if fast && slices.ContainsFunc(insts, func(in *fgInst) bool {
				return slices.ContainsFunc(in.v, func(vw *fgView) bool { return vw.rep.LearningBatch() })
			}) {
				iv = sc.learn // one scrape schedule for all: the fastest one's
			}
			if !fast || now-lastScrape >= iv-sc.learn/2 {
				lastScrape = now
				for r, rp := range reps {
					var insideTokens int64
					for _, x := range rp.inside {
						insideTokens += x.kvNeed()
					}
					// Every instance reads the same scrape: one instance taking
					// back what waits inside does not change what the other read.
					waiting := int64(len(rp.inside))
					confirmed := make([]bool, len(insts))
					for i, in := range insts {
						vw := in.v[r]
						confirmed[i] = vw.rep.LearnBatch(rp.running, waiting, clk.Now())
						vw.rep.NoteLatency(vllm.Value{V: rp.e2eSum, OK: true}, vllm.Value{V: float64(rp.e2eN), OK: true}, false)
						if len(insts) > 1 {
							vw.foreign = max(rp.running+waiting-vw.sent, 0)
							vw.foreignTokens = max(rp.kvUsed+insideTokens-vw.sentTokens, 0)
						}
					}
					for i, in := range insts {
						if !direct && confirmed[i] {
							takeBack(in, r)
						}
					}
					rp.scraped = fleet.Obs{OK: true, Running: rp.running, Waiting: int64(len(rp.inside))}
					if repKV > 0 {
						rp.scraped.KVUsage = float64(rp.kvUsed) / float64(repKV)
					}
					if res.fullAt == 0 && len(rp.inside) > 0 {
						res.fullAt = now
					}
				}
				res.scrapes = append(res.scrapes, now)
				if res.learnedAt == 0 && slices.ContainsFunc(insts, func(in *fgInst) bool {
					return slices.ContainsFunc(in.v, func(vw *fgView) bool { return vw.rep.Learned() > 0 })
				}) {
					res.learnedAt = now
				}
			}
			if now < sc.duration+sc.maxWait {
				push(desEvent[*fgTenant]{at: now + wake, kind: desScrape})
			}
		case fgExchange:
			// Each instance reports, and takes its share of each replica's
			// batch from the other's report where it has demand
			// (fleet.ApplyShares).
			nowN := clk.Now().UnixNano()
			splits := make([][]*fleet.ShareOf, len(insts))
			for i := range insts {
				splits[i] = make([]*fleet.ShareOf, len(reps))
			}
			for r, rp := range reps {
				entries := make([]peers.Entry, len(insts))
				for i, in := range insts {
					entries[i] = in.report(fmt.Sprint(i), r, nowN)
					for j := range entries[i].Tenants {
						if sc.fleetOff.queued {
							entries[i].Tenants[j].Queued = 0
						}
						if sc.fleetOff.stands {
							entries[i].Tenants[j].Stands = false
						}
						if sc.fleetOff.steady {
							entries[i].Tenants[j].Steady = false
						}
					}
				}
				for i, in := range insts {
					vw := in.v[r]
					var others []peers.Entry
					for j, o := range entries {
						if j != i && (o.InFlight > 0 || o.Queued > 0 || len(o.Tenants) > 0) {
							others = append(others, o)
						}
					}
					vw.share, vw.light, vw.heavy = 0, nil, nil
					vw.peerWeight = 0
					if !sc.fleetOff.peerWeight {
						vw.peerWeight = float64(fleet.PeerWeight(entries[i], others))
					}
					if len(others) > 0 {
						batch := shareBatch(vw.rep.BatchLimit(), rp.scraped)
						if sc.fleetOff.kvBatch {
							batch = vw.rep.BatchLimit()
						}
						pool := len(reps)
						if sc.fleetOff.floorEach {
							pool = 1
						}
						sh := fleet.SplitPool(batch, pool, sc.shareReserve(), entries[i], others)
						splits[i][r] = &sh
						if fgTrace && len(ts) > 1 {
							fmt.Printf("%8.3f SPLIT inst %d r%d batch %d cap %d light %v mine %+v others %+v\n", now.Seconds(), i, r, batch, sh.Cap, sh.Light, entries[i].Tenants, others[0].Tenants)
						}
					}
				}
			}
			// Every replica serves the one model: one pool.
			for i, in := range insts {
				if !sc.fleetOff.floorEach {
					fleet.FloorOnce(splits[i])
				}
				for r, sh := range splits[i] {
					if sh == nil {
						continue
					}
					vw := in.v[r]
					vw.share, vw.light, vw.heavy = sh.Cap, sh.Light, sh.Heavy
					if sc.fleetOff.cut {
						vw.light = append(slices.Clone(vw.light), sh.Cut...)
						vw.heavy = slices.DeleteFunc(slices.Clone(vw.heavy), func(n string) bool { return slices.Contains(sh.Cut, n) })
					}
					if sc.fleetOff.lightFree {
						vw.light = nil
					}
				}
			}
			if now < sc.duration+sc.maxWait {
				push(desEvent[*fgTenant]{at: now + fleet.ShareInterval, kind: fgExchange})
			}
		}
		var due time.Time
		dueOK := false
		for _, in := range insts {
			in.q.Tick()
		}
		dispatch()
		for ii := range insts {
			for sc.preempt && !direct && preemptOne(ii) {
				dispatch()
			}
		}
		for _, in := range insts {
			if d, ok := in.q.Tick(); ok && (!dueOK || d.Before(due)) {
				due, dueOK = d, true
			}
		}
		ev.tickAt(due, dueOK, t0)
	}
	for _, tn := range ts {
		res.tenants = append(res.tenants, *tn)
		res.served += len(tn.ttft)
	}
	for _, in := range insts {
		for _, vw := range in.v {
			res.learned = max(res.learned, vw.rep.Learned())
		}
	}
	return res
}

// fgKindsOf is the kind of each of v.
func fgKindsOf(v []fgViolation) []fgKind {
	kinds := make([]fgKind, len(v))
	for i, x := range v {
		kinds[i] = x.kind
	}
	return kinds
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
	if sc.preempt {
		fmt.Fprintf(&b, " taken back running %d after %d tokens;", flooded.preempted, flooded.preemptedOut)
	}
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
	// it, as configured. Pooled are those within their weighted shares, as
	// the isolation invariant checks only those: a tenant whose bursts ask
	// more is served at its share where vLLM serves it first come first
	// served, which is the fair order's purpose (fgDirectAll reports it).
	direct := sc.run(t, light, true)
	var pooled, pooledDirect []time.Duration
	for i, tn := range alone.tenants {
		if tn.cap > 0 {
			continue
		}
		if !sc.aboveLightShare(tn) {
			pooled = append(pooled, tn.ttft...)
			pooledDirect = append(pooledDirect, direct.tenants[i].ttft...)
		}
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
		if sc.aboveShare(tn) {
			fmt.Fprintf(&b, " %s above its share, not checked: p99 TTFT %v alone %v lost %d (alone %d);", tn.name, pf, pa, tn.expired+tn.full, a.expired+a.full)
			continue
		}
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

// aboveLightShare is aboveShare among the light tenants alone: the share
// tn has where the heavy tenants are not sending.
func (sc *fgScenario) aboveLightShare(tn fgTenant) bool {
	light := *sc
	light.tenants = slices.DeleteFunc(slices.Clone(sc.tenants), func(o fgTenant) bool { return !o.light })
	return light.aboveShare(tn)
}

// fgDirectAll reports whether the light tenants without caps, those above
// their shares too, are slower together through Sluice without the heavy
// tenants than sent to the replica directly (fgCheckScenario's pooled
// check over every such tenant): the sweep reports it, since fair order
// serving a tenant at its share where vLLM serves it first come first
// served is no fault.
func fgDirectAll(t *testing.T, sc *fgScenario) bool {
	light := func(tn *fgTenant) bool { return tn.light }
	var s, d []time.Duration
	for _, tn := range sc.run(t, light, false).tenants {
		if tn.cap == 0 {
			s = append(s, tn.ttft...)
		}
	}
	for _, tn := range sc.run(t, light, true).tenants {
		if tn.cap == 0 {
			d = append(d, tn.ttft...)
		}
	}
	pa, pd := pct(s, 0.99), pct(d, 0.99)
	return pa > max(time.Duration(1.25*float64(pd)), pd+sc.step)
}

// fgBusy is the replicas' time spent decoding beside heavy tenants, as a
// part of what vLLM alone spends with the same arrivals (every tenant sent
// straight to it, its FCFS queue unbounded), and the heavy tenants' part
// of the room the light tenants leave (vLLM alone's time less the light
// tenants' through Sluice), the isolation goal's "the flooder gets ≥ 90 %
// of the capacity the victims leave" (SCHEDULING §11). Both are what the
// light tenants' reserve and the heavy tenants' bounds cost, which none of
// the invariants (checked for light tenants) sees. ok is false without a
// heavy tenant, where the goodput check covers it.
func fgBusy(t *testing.T, sc *fgScenario) (busy, heavy float64, ok bool) {
	t.Helper()
	if !slices.ContainsFunc(sc.tenants, func(tn fgTenant) bool { return !tn.light }) {
		return 0, 0, false
	}
	all := func(*fgTenant) bool { return true }
	s, d := sc.run(t, all, false), sc.run(t, all, true).busy
	if d <= 0 {
		return 0, 0, false
	}
	var light, hv time.Duration
	for _, tn := range s.tenants {
		if tn.light {
			light += tn.busy
		} else {
			hv += tn.busy
		}
	}
	heavy = 1
	if left := d - light; left > 0 {
		heavy = min(float64(hv)/float64(left), 1)
	}
	return float64(s.busy) / float64(d), heavy, true
}

// fgBusyLine summarises fgBusy's ratios over a sweep.
func fgBusyLine(rs []float64) string {
	if len(rs) == 0 {
		return "no draw has a heavy tenant"
	}
	s := slices.Sorted(slices.Values(rs))
	below := 0
	for _, r := range s {
		if r < 0.9 {
			below++
		}
	}
	return fmt.Sprintf("median %.2f, p10 %.2f, lowest %.2f; below 0.9 on %d of %d", s[len(s)/2], s[len(s)/10], s[0], below, len(s))
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
	require.Contains(t, []string{"", "1", "2"}, *fairgenInstances, "-fairgen.instances")
	require.Contains(t, []string{"", "1", "2"}, *fairgenReplicas, "-fairgen.replicas")
	require.Contains(t, []string{"", "on", "off"}, *fairgenLoops, "-fairgen.loops")
	require.Contains(t, []string{"", "late", "trickle"}, *fairgenOnset, "-fairgen.onset")
	require.Contains(t, []string{"", "resume", "restart", "fleet"}, *fairgenPreempt, "-fairgen.preempt")
	require.True(t, *fairgenTakeable > 0 && *fairgenTakeable <= 1, "-fairgen.takeable is a part of the requests: (0, 1]")
	type run struct {
		seed    uint64
		d       fgDraw
		late    bool // fgScenario.lateOnset
		trickle bool // and trickling before it
	}
	var seeds []run
	if *fairgenN > 0 {
		for i := range uint64(*fairgenN) {
			seeds = append(seeds, run{*fairgenBase + i, fgDraw{*fairgenInstances, *fairgenReplicas, *fairgenLoops}, *fairgenOnset != "", *fairgenOnset == "trickle"})
		}
	} else {
		for _, seed := range fairgenSeeds {
			seeds = append(seeds, run{seed, fgMakeTest, false, false})
		}
		for _, seed := range fairgenTwoSeeds {
			seeds = append(seeds, run{seed, fgDraw{"2", "1", "off"}, false, false})
		}
		for _, seed := range fairgenTwoReplicaSeeds {
			seeds = append(seeds, run{seed, fgDraw{"1", "2", "off"}, false, false})
		}
		for _, seed := range fairgenLoopSeeds {
			seeds = append(seeds, run{seed, fgDraw{"1", "1", "on"}, false, false})
		}
		for _, seed := range fairgenLateSeeds {
			seeds = append(seeds, run{seed, fgDraw{}, true, false})
		}
		for _, seed := range fairgenTrickleSeeds {
			seeds = append(seeds, run{seed, fgDraw{}, true, true})
		}
	}
	failed, above, directAll := 0, 0, 0
	byKind := map[fgKind]int{}             // seeds with a violation of the kind
	overBy := map[fgKind][]time.Duration{} // per such seed, its largest p99 TTFT overshoot
	byBatch := map[int64][2]int{}          // per batch: seeds, failing seeds
	var busy, heavy []float64              // fgBusy of each seed with heavy tenants
	byBatchBusy := map[int64][]float64{}
	for _, r := range seeds {
		sc := genScenarioAt(r.seed, r.d)
		sc.whatIf()
		sc.lengthen(*fairgenSamples)
		if r.late {
			sc.lateOnset(r.trickle)
		}
		sum, v := fgCheckScenario(t, sc)
		if r, h, ok := fgBusy(t, sc); ok {
			busy, heavy = append(busy, r), append(heavy, h)
			byBatchBusy[sc.batch] = append(byBatchBusy[sc.batch], r)
			sum += fmt.Sprintf("\n   replicas busy %.2f of vLLM alone's; the heavy tenants took %.2f of the room the light tenants left", r, h)
		}
		if slices.ContainsFunc(sc.tenants, sc.aboveShare) {
			above++
		}
		if fgDirectAll(t, sc) {
			directAll++
		}
		nb := byBatch[sc.batch]
		nb[0]++
		if len(v) > 0 {
			nb[1]++
		}
		byBatch[sc.batch] = nb
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
		var kinds []string
		for _, k := range fgKinds {
			if _, ok := most[k]; ok {
				kinds = append(kinds, string(k))
			}
		}
		if *fairgenWarn {
			t.Logf("FAIL %s\n   violations: %s\n   kinds: %s", sum, fgJoin(v), strings.Join(kinds, "; "))
		} else {
			t.Errorf("FAIL %s\n   violations: %s\n   kinds: %s", sum, fgJoin(v), strings.Join(kinds, "; "))
		}
	}
	t.Logf("%d of %d seeds hold every invariant", len(seeds)-failed, len(seeds))
	t.Logf("%d of %d seeds draw a light tenant whose bursts ask more than its weighted share (fgScenario.aboveShare: printed, not checked)", above, len(seeds))
	t.Logf("%d of %d seeds have the light tenants without the heavy ones, those above their shares too, slower together than direct (fgDirectAll: reported, not checked)", directAll, len(seeds))
	t.Logf("replicas busy beside heavy tenants, Sluice ÷ vLLM alone (fgBusy: reported, not checked): %s", fgBusyLine(busy))
	t.Logf("the heavy tenants' part of the room the light tenants leave (goal ≥ 0.9, reported, not checked): %s", fgBusyLine(heavy))
	for _, b := range slices.Sorted(maps.Keys(byBatchBusy)) {
		t.Logf("   batch %d: %s", b, fgBusyLine(byBatchBusy[b]))
	}
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
		var batches []string
		for _, b := range slices.Sorted(maps.Keys(byBatch)) {
			batches = append(batches, fmt.Sprintf("%d: %d of %d", b, byBatch[b][1], byBatch[b][0]))
		}
		t.Logf("failing seeds by the pool's batch: %s", strings.Join(batches, ", "))
	}
	if *fairgenN > 0 {
		rowOf := func(configured int64, learn time.Duration) func(uint64) *fgScenario {
			return func(seed uint64) *fgScenario { return fgIsolationRow(seed, configured, learn) }
		}
		for _, row := range []struct {
			name string
			mk   func(seed uint64) *fgScenario
		}{
			{"isolation row b", rowOf(32, 0)}, {"isolation row c", rowOf(256, 0)},
			{"isolation row b, learning scrape", rowOf(32, fgLearn)}, {"isolation row c, learning scrape", rowOf(256, fgLearn)},
			{"isolation row x (b across two instances), learning scrape", func(seed uint64) *fgScenario { return fgIsolationRowX(seed, fgLearn) }},
			{"light tenants at another instance than a closed-loop flood", fgLightAtAnotherInstance},
		} {
			held := 0
			var busy, heavy []float64
			for seed := range uint64(fgIsolationDraws) {
				sc := row.mk(seed + 1)
				sc.whatIf()
				if *fairgenOnset != "" {
					sc.lateOnset(*fairgenOnset == "trickle")
				}
				sum, v := fgCheckScenario(t, sc)
				if r, h, ok := fgBusy(t, sc); ok {
					busy, heavy = append(busy, r), append(heavy, h)
				}
				if len(v) == 0 {
					held++
				} else if fgTrace || fgRows {
					t.Logf("%s: %s\n   violations: %s", row.name, sum, fgJoin(v))
				}
			}
			t.Logf("%s: %d of %d draws hold every invariant; replicas busy %s; the heavy tenants' part of the room left %s", row.name, held, fgIsolationDraws, fgBusyLine(busy), fgBusyLine(heavy))
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
	sc := genScenarioAt(494, fgMakeTest)
	require.Equal(t, int64(3252), sc.kv, "the draw")
	direct := pooled(sc.run(t, light, true))
	sluice := pooled(sc.run(t, light, false))
	sc.gateOpts.NoSustain = true
	held := pooled(sc.run(t, light, false))
	t.Logf("p99 TTFT of the light tenants together: direct %v, Sluice %v, held by the reserve %v", direct, sluice, held)
	assert.LessOrEqual(t, sluice, max(direct*5/4, direct+sc.step))
	assert.Greater(t, held, 10*direct)
}

// TestFairgenLateOnset: a flood whose tenant the gate has known, silent,
// since the run started, and which starts beside light tenants holding
// most of the pool, is held from its first arrivals (gate.youngRate, and
// gate.surgeRate from its eighth). Read from the averaged rates alone
// (NoYoung, NoSurge) it took the room the light tenants' next peaks
// needed before it read as heavy: each of fairgenLateSeeds fails so, and
// so do the first isolation row b draws (0 of 100 draws of the row held
// with its flood starting late).
func TestFairgenLateOnset(t *testing.T) {
	without := gate.Options{NoYoung: true, NoSurge: true}
	for _, seed := range fairgenLateSeeds {
		fgCheckOnset(t, genScenarioAt(seed, fgDraw{}), false, without)
	}
	for seed := uint64(1); seed <= 3; seed++ {
		fgCheckOnset(t, fgIsolationRow(seed, 32, fgLearn), false, without)
	}
}

// fgCheckOnset checks that sc, its heavy tenants starting late (and
// trickling first, with trickle), holds every invariant, and misses one
// with the gate's options set to without.
func fgCheckOnset(t *testing.T, sc *fgScenario, trickle bool, without gate.Options) {
	t.Helper()
	sc.lateOnset(trickle)
	sum, v := fgCheckScenario(t, sc)
	assert.Empty(t, v, "%s\n   violations: %s", sum, fgJoin(v))
	sc.gateOpts = without
	sum, v = fgCheckScenario(t, sc)
	assert.NotEmpty(t, v, "with %+v: %s", without, sum)
}

// TestFairgenTrickleOnset: a flood whose tenant sent a request every few
// seconds before it (never young), starting beside light tenants holding
// most of the pool, is held once its last eight arrivals read as a surge
// (gate.surgeRate). Without it (NoSurge) each of fairgenTrickleSeeds
// fails, and so do isolation row b's draws 1, 3 and 6 (8 of 100 draws of
// the row held with its flood trickling first, 50 now).
func TestFairgenTrickleOnset(t *testing.T) {
	without := gate.Options{NoSurge: true}
	for _, seed := range fairgenTrickleSeeds {
		fgCheckOnset(t, genScenarioAt(seed, fgDraw{}), true, without)
	}
	for _, seed := range []uint64{1, 3, 6} {
		fgCheckOnset(t, fgIsolationRow(seed, 32, fgLearn), true, without)
	}
}

// TestFairgenFleetServiceTime: isolation row x's flood is the only tenant
// of its instance, which has completed nothing when the flood starts
// beside the other instance's light tenants; it reads the flood at the
// replicas' own service time (gate.FleetLoad.Svc, from vLLM's latency
// histogram). Without it (NoFleetSvc) its gate forecasts the flood at
// nothing until the first completion there, a service time in which the
// flood takes the room the light tenants' peaks need: 4 of 100 draws of
// the row held with the flood starting late (43 now), 8 with it
// trickling first (15 now). Draws 1, 4 and 8 late and 5 and 13
// trickling fail so.
func TestFairgenFleetServiceTime(t *testing.T) {
	without := gate.Options{NoFleetSvc: true}
	for _, seed := range []uint64{1, 4, 8} {
		fgCheckOnset(t, fgIsolationRowX(seed, fgLearn), false, without)
	}
	for _, seed := range []uint64{5, 13} {
		fgCheckOnset(t, fgIsolationRowX(seed, fgLearn), true, without)
	}
}

// TestFairgenSurgeLatch: a flood that trickled first reads as a surge
// from its eighth arrival, before its averaged load passes three times its
// claim; its last eight arrivals then read below the surge's bound now and
// then (a Poisson lull), and heavy only while they read so, it turned
// light for those moments and sent its queue into the light tenants' room
// at once (row b, trickling, draw 4: eleven requests in one instant, the
// light tenants' p99 0.5–1.3 s against 20 ms alone). Kept heavy for
// attackWindow after its last surge reading while its load is above its
// claim, it holds; without (NoLatch) isolation row b's draws 4, 27 and 28
// and seed 35 fail, trickling first.
func TestFairgenSurgeLatch(t *testing.T) {
	without := gate.Options{NoLatch: true}
	for _, seed := range []uint64{4, 27, 28} {
		fgCheckOnset(t, fgIsolationRow(seed, 32, fgLearn), true, without)
	}
	fgCheckOnset(t, genScenarioAt(35, fgDraw{}), true, without)
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

// TestFairgenTwoInstances: what each mechanism of the batch split across
// instances is for, on the seeds of fairgenTwoSeeds (whose comment says
// what each seed shows). With it, the seed holds every invariant; without
// it, a light tenant loses requests to its max_wait (the split counted in
// sequences where the KV cache binds: the flood's instance refills the
// cache's slots first) or waits for completions.
func TestFairgenTwoInstances(t *testing.T) {
	for _, c := range []struct {
		seed uint64
		off  fgFleetOff
		kind fgKind
	}{
		{150, fgFleetOff{kvBatch: true}, fgLost},
		{475, fgFleetOff{kvBatch: true}, fgLost},
		{21, fgFleetOff{lightFree: true}, fgCompletion},
		{93, fgFleetOff{lightFree: true}, fgCompletion},
		{9, fgFleetOff{park: true}, fgCompletion},
		{35, fgFleetOff{unreported: true}, fgFirst},
		{69, fgFleetOff{unreported: true}, fgBurst},
		{330, fgFleetOff{peerWeight: true}, fgCompletion},
		{44, fgFleetOff{parkQueued: true}, fgFirst},
		{97, fgFleetOff{heldPark: true}, fgLentShare},
		{322, fgFleetOff{heldPark: true}, fgCompletion},
		{151, fgFleetOff{parkQueued: true}, fgCompletion},
	} {
		sc := genScenarioAt(c.seed, fgDraw{"2", "1", "off"})
		sum, v := fgCheckScenario(t, sc)
		assert.Empty(t, v, "seed %d: %s\n   violations: %s", c.seed, sum, fgJoin(v))
		sc = genScenarioAt(c.seed, fgDraw{"2", "1", "off"})
		sc.fleetOff = c.off
		sum, v = fgCheckScenario(t, sc)
		kinds := fgKindsOf(v)
		assert.Contains(t, kinds, c.kind, "seed %d without %+v: %s\n   violations: %s", c.seed, c.off, sum, fgJoin(v))
	}
}

// TestFairgenLightWaitTakesTheFloor: seed 444 with two instances runs two
// replicas whose KV cache holds one request each, a light tenant at one
// instance and a flood at the other. With the flood's instance's floor of
// one sequence on each replica whatever the light tenant's queue (its
// queued part not reported), the flood's instance refilled each slot it
// freed before the light tenant's instance saw it free, and the light
// tenant lost its requests to its max_wait. Taking the floor while it
// waits, or keeping the floor to one replica of the pool
// (fleet.FloorOnce), each alone, it loses none.
func TestFairgenLightWaitTakesTheFloor(t *testing.T) {
	d := fgDraw{"2", "", ""} // two replicas drawn, the flood an open loop
	for _, off := range []fgFleetOff{{}, {queued: true}, {floorEach: true}} {
		sc := genScenarioAt(444, d)
		sc.fleetOff = off
		sum, v := fgCheckScenario(t, sc)
		assert.NotContains(t, fgKindsOf(v), fgLost, "without %+v: %s\n   violations: %s", off, sum, fgJoin(v))
	}
	sc := genScenarioAt(444, d)
	sc.fleetOff.queued, sc.fleetOff.floorEach = true, true
	sum, v := fgCheckScenario(t, sc)
	assert.Contains(t, fgKindsOf(v), fgLost, "without either: %s\n   violations: %s", sum, fgJoin(v))
}

// TestFairgenSlivers: token room below one request on a replica is no
// room for it (fleet.Set.FleetOf). Counted as room, the gate let a flood
// take the light tenant's reserve that no replica could hold, and the
// light tenant waited for a completion: on one KV-limited replica, its
// first request (seeds 444 and 465, 3.2 s and 0.53 s against 20 ms
// alone), and on two whose slivers add up to a request (seed 372).
func TestFairgenSlivers(t *testing.T) {
	for _, c := range []struct {
		seed     uint64
		replicas string
	}{{444, "1"}, {465, "1"}, {372, "2"}} {
		sum, v := fgCheckScenario(t, genScenarioAt(c.seed, fgDraw{"1", c.replicas, "off"}))
		assert.Empty(t, v, "%s\n   violations: %s", sum, fgJoin(v))
		sc := genScenarioAt(c.seed, fgDraw{"1", c.replicas, "off"})
		sc.fleetOff.slivers = true
		sum, v = fgCheckScenario(t, sc)
		kinds := fgKindsOf(v)
		assert.True(t, slices.Contains(kinds, fgCompletion) || slices.Contains(kinds, fgFirst), "seed %d without: %s\n   violations: %s", c.seed, sum, fgJoin(v))
	}
}

// TestFairgenClosedLoopFlood: with every heavy tenant a closed loop (its
// clients send their next request as their last ends), the flood's
// arrivals are its completions, so held near its share it reads as no
// flood. Let through past its share then (NoStanding), it took the light
// tenants' reserve: seeds 9 and 10's light tenants waited 0.4–2.4 s
// where alone they wait 20 ms.
func TestFairgenClosedLoopFlood(t *testing.T) {
	for _, seed := range []uint64{9, 10} {
		d := fgDraw{"1", "1", "on"}
		sum, v := fgCheckScenario(t, genScenarioAt(seed, d))
		assert.Empty(t, v, "%s\n   violations: %s", sum, fgJoin(v))
		sc := genScenarioAt(seed, d)
		sc.gateOpts.NoStanding = true
		sum, v = fgCheckScenario(t, sc)
		kinds := fgKindsOf(v)
		assert.Contains(t, kinds, fgCompletion, "seed %d without: %s\n   violations: %s", seed, sum, fgJoin(v))
	}
}

// TestFairgenHeavyFloorPerPool: with two instances and the batch split
// over two replicas, a flood's instance the split gives nothing may start
// one request in the pool while no light tenant waits, and none while one
// does, as the gate on one instance lets heavy tenants keep one per pool
// (fleet.SplitPool, fleet.FloorOnce). With a floor on each replica, the
// light tenant at the other instance waited for the flood's completions:
// a request it never waits for alone (seed 28), or one of a burst (498).
// Seed 217 showed it too; since the gate reads a young tenant's rate
// directly (gate.youngRate) it misses by 7 ms with the floor once, its
// light tenant's own bursts of four queueing it (1.013 s against a bound
// of 1.006 s).
func TestFairgenHeavyFloorPerPool(t *testing.T) {
	for _, c := range []struct {
		seed uint64
		kind fgKind
	}{{28, fgCompletion}, {498, fgBurst}} {
		d := fgDraw{"2", "2", ""}
		sum, v := fgCheckScenario(t, genScenarioAt(c.seed, d))
		assert.Empty(t, v, "seed %d: %s\n   violations: %s", c.seed, sum, fgJoin(v))
		sc := genScenarioAt(c.seed, d)
		sc.fleetOff.floorEach = true
		sum, v = fgCheckScenario(t, sc)
		assert.Contains(t, fgKindsOf(v), c.kind, "seed %d with a floor on each replica: %s\n   violations: %s", c.seed, sum, fgJoin(v))
	}
}

// TestFairgenLengthen pins -fairgen.samples: the scenario runs until its
// slowest light Poisson tenant expects n measured requests, heavy tenants
// and closed loops aside, at most an hour.
func TestFairgenLengthen(t *testing.T) {
	mk := func() *fgScenario {
		return &fgScenario{warmup: 5 * time.Second, duration: 70 * time.Second, tenants: []fgTenant{
			{name: "slow", rate: 0.5, burst: 2, light: true}, // 1 request a second
			{name: "fast", rate: 4, burst: 1, light: true},
			{name: "flood", rate: 0.01, burst: 1},
			{name: "loop", loop: 3, light: true},
		}}
	}
	sc := mk()
	sc.lengthen(0)
	assert.Equal(t, 70*time.Second, sc.duration, "as drawn")
	sc.lengthen(50)
	assert.Equal(t, 70*time.Second, sc.duration, "65 s measured already expect 65 of the slowest's")
	sc.lengthen(100)
	assert.Equal(t, 105*time.Second, sc.duration, "the warm-up and 100 s of the slowest light tenant")
	sc = mk()
	sc.lengthen(10000)
	assert.Equal(t, time.Hour, sc.duration)
}

// TestFairgenCutLightBound: seed 726 (two instances, two KV-bound
// replicas) over 100 requests of its light tenant. t0, alone at one
// instance, queues behind closed loops at the other, and the loop of 11
// of weight 3 is light to the split (three times its share is the whole
// batch): uncapped, it refilled every slot its completions freed while t0
// waited, and t0 lost requests to its max_wait. Bound where the split
// cuts its claim while t0 waits (fleet.ShareOf.Cut), t0 loses none; it
// still waits seconds where alone it waits 20 ms (the seed fails).
func TestFairgenCutLightBound(t *testing.T) {
	mk := func() *fgScenario {
		sc := genScenarioAt(726, fgDraw{})
		sc.lengthen(100)
		return sc
	}
	sc := mk()
	require.Equal(t, 2, sc.instances, "the draw")
	sum, v := fgCheckScenario(t, sc)
	assert.NotContains(t, fgKindsOf(v), fgLost, "%s\n   violations: %s", sum, fgJoin(v))
	sc = mk()
	sc.fleetOff.cut = true
	sum, v = fgCheckScenario(t, sc)
	assert.Contains(t, fgKindsOf(v), fgLost, "with cut light tenants unbound: %s\n   violations: %s", sum, fgJoin(v))
}

// TestFairgenStandsBound: node's TestLightTenantsAtAnotherInstance in the
// model, 20 draws. The closed-loop flood at one instance, held near its
// floor by the split, reads as no flood to its gate (its arrivals are its
// few completions) and light to the split, and with no light tenant at
// its instance no reserve holds it. Bound at its part only while a light
// tenant at the other instance waited, it refilled every slot between
// their queues; bound while its gate lets it through with a standing
// queue (peers.TenantDemand.Stands), the light tenants' pooled p99 TTFT
// halves on the median draw (0.23 s against 0.53 s; alone it is
// about 50 ms, and with the flood at their own instance 0.18–0.24 s).
func TestFairgenStandsBound(t *testing.T) {
	median := func(off bool) time.Duration {
		var p99s []time.Duration
		for seed := range uint64(20) {
			sc := fgLightAtAnotherInstance(seed + 1)
			sc.fleetOff.stands = off
			res := sc.run(t, func(*fgTenant) bool { return true }, false)
			var light []time.Duration
			for _, tn := range res.tenants {
				if tn.light {
					light = append(light, tn.ttft...)
				}
			}
			p99s = append(p99s, pct(light, 0.99))
		}
		slices.Sort(p99s)
		return p99s[len(p99s)/2]
	}
	on, off := median(false), median(true)
	t.Logf("the median draw's light p99 TTFT %v, without Stands %v", on, off)
	assert.Less(t, on, 300*time.Millisecond, "the median draw's light p99 TTFT (without: %v)", off)
	assert.Greater(t, off, 400*time.Millisecond, "without Stands")
}

// TestFairgenBusy pins fgBusy, the throughput the light tenants' reserve
// costs beside heavy tenants:
//   - Two floods on a batch of eight and nothing light: nothing is
//     reserved, and the replica is as busy as vLLM alone keeps it, on one
//     instance and on two.
//   - A closed loop of three clients on that batch (under its share, so
//     light) beside a flood: a steady tenant has no Poisson noise to
//     reserve (steadyVar); reserved as a Poisson count's, it kept the flood
//     from even its floor request and the replica decoded 0.48 of vLLM
//     alone's. Across two instances the split still reserves its claim's
//     Poisson margin (0.63).
//   - Isolation row b: three Poisson tenants asking 0.6 of a batch of 32
//     between them, each under its share, beside a flood. Their reserve
//     (their pooled forecast and peaks, two deviations over) covers about
//     the pool, so the flood runs at its floor of one request: about 0.6
//     of vLLM alone's on every draw, the price of their p99 TTFT within
//     1.5× of alone, and the flood takes about 0.06 of the room they leave
//     (SCHEDULING §11's goal is 0.9). A change that idles more fails.
func TestFairgenBusy(t *testing.T) {
	busy := func(sc *fgScenario) (float64, float64) {
		r, h, ok := fgBusy(t, sc)
		require.True(t, ok)
		return r, h
	}
	mk := func(instances int, opts gate.Options, second fgTenant) *fgScenario {
		second.inst = instances - 1
		return &fgScenario{seed: 1, batch: 8, configured: 8, step: 20 * time.Millisecond, outLo: 50, outHi: 150,
			scrape: time.Second, maxWait: 60 * time.Second, duration: 40 * time.Second, warmup: 5 * time.Second,
			instances: instances, gateOpts: opts, tenants: []fgTenant{{name: "flood", weight: 1, rate: 20, burst: 1}, second}}
	}
	for _, n := range []int{1, 2} {
		r, _ := busy(mk(n, gate.Options{}, fgTenant{name: "flood2", weight: 2, rate: 10, burst: 1}))
		t.Logf("two floods, %d instance(s): busy %.3f of vLLM alone's", n, r)
		assert.GreaterOrEqual(t, r, 0.99)
	}
	loop := fgTenant{name: "loop", weight: 1, loop: 3}
	with, _ := busy(mk(1, gate.Options{}, loop))
	without, _ := busy(mk(1, gate.Options{NoSteady: true}, loop))
	two, _ := busy(mk(2, gate.Options{}, loop))
	sc := mk(2, gate.Options{}, loop)
	sc.fleetOff.steady = true
	twoWithout, _ := busy(sc)
	t.Logf("a closed loop of three beside a flood: busy %.3f of vLLM alone's, %.3f reserving its Poisson noise; across two instances %.3f, %.3f with the split keeping its noise", with, without, two, twoWithout)
	assert.GreaterOrEqual(t, with, 0.8)
	assert.Less(t, without, 0.6)
	// Across instances the split reads the loop steady once its gate
	// does and its demand has stood within two requests over the peak
	// window (gate.Gate.Steady), and keeps it server.headroom as the gate
	// does: about the same as on one instance.
	assert.GreaterOrEqual(t, two, 0.8)
	assert.Less(t, twoWithout, 0.65)
	for seed := range uint64(5) {
		r, h := busy(fgIsolationRow(seed+1, 32, fgLearn))
		t.Logf("isolation row b, draw %d: busy %.3f of vLLM alone's, the flood %.3f of the room left", seed+1, r, h)
		assert.InDelta(t, 0.62, r, 0.07)
		assert.Greater(t, h, 0.03)
	}
}

// TestFairgenReserveCap: server.reserve_cap trades the light tenants'
// tails for the heavy tenants' throughput, on isolation row b's shape
// (draws 1–5), where the victims' reserve covers the pool and the flood
// runs at its floor. Capped at 0.05 of the pool the flood takes nine
// tenths of the room the victims leave (the isolation goal's second
// half), the replica is nearly as busy as vLLM alone keeps it, and the
// victims' median TTFT is unchanged while their p99 grows to a wait for
// a completion or two. Across two instances (row x: the victims at one,
// the flood at the other) the cap binds the share split as it binds the
// gate (fleet.Reserve): at 0.1 the flood takes about eight tenths of the
// room left, where the split's own margin left it 0.09.
func TestFairgenReserveCap(t *testing.T) {
	victims := func(r fgResult) (p50, p99 time.Duration) {
		var all []time.Duration
		for _, tn := range r.tenants {
			if tn.light {
				all = append(all, tn.ttft...)
			}
		}
		return pct(all, 0.5), pct(all, 0.99)
	}
	everyone := func(*fgTenant) bool { return true }
	for seed := range uint64(5) {
		for _, c := range []struct {
			cap                 float64
			busy, heavy         float64 // at least
			heavyBelow, p99Over float64 // at most, and p99 at least (s)
		}{
			{cap: 0, busy: 0.55, heavy: 0.03, heavyBelow: 0.15},
			{cap: 0.05, busy: 0.95, heavy: 0.85, heavyBelow: 1, p99Over: 0.1},
		} {
			sc := fgIsolationRow(seed+1, 32, fgLearn)
			sc.reserveCap = c.cap
			busy, heavy, ok := fgBusy(t, sc)
			require.True(t, ok)
			p50, p99 := victims(sc.run(t, everyone, false))
			t.Logf("draw %d, cap %v: busy %.3f of vLLM alone's, the flood %.3f of the room left; victims p50 %v p99 %v", seed+1, c.cap, busy, heavy, p50, p99)
			assert.GreaterOrEqual(t, busy, c.busy)
			assert.GreaterOrEqual(t, heavy, c.heavy)
			assert.LessOrEqual(t, heavy, c.heavyBelow)
			assert.Equal(t, sc.step, p50, "a victim's median request never waits")
			assert.GreaterOrEqual(t, p99.Seconds(), c.p99Over)
		}
		for _, c := range []struct{ cap, heavy, heavyBelow float64 }{{0, 0.05, 0.15}, {0.1, 0.75, 1}} {
			sc := fgIsolationRowX(seed+1, fgLearn)
			sc.reserveCap = c.cap
			busy, heavy, ok := fgBusy(t, sc)
			require.True(t, ok)
			t.Logf("row x, draw %d, cap %v: busy %.3f of vLLM alone's, the flood %.3f of the room left", seed+1, c.cap, busy, heavy)
			assert.GreaterOrEqual(t, heavy, c.heavy)
			assert.LessOrEqual(t, heavy, c.heavyBelow)
		}
	}
}

// TestFairgenPreemptWhatIf pins what taking a running sequence back would
// give on the isolation rows' shape (fgScenario.preempt, a what-if Sluice
// does not do; SCHEDULING §11): with nothing kept free for the victims
// (reserve_cap none) the flood takes nearly all the room they leave, and
// each victim request that finds the batch full waits one step for the
// slot it freed, within the bound; without preemption, the same cap leaves
// them waiting for completions. Resuming keeps what the taken-back
// sequence generated; starting it again loses it, which the busy time
// shows. On row x, with the reserve as it is, only taking back at the
// flood's instance (fleet) reaches the flood.
func TestFairgenPreemptWhatIf(t *testing.T) {
	held := map[string]int{}
	for seed := range uint64(5) {
		var resumed float64
		for _, c := range []struct {
			name             string
			preempt, restart bool
		}{{"none", false, false}, {"resume", true, false}, {"restart", true, true}} {
			sc := fgIsolationRow(seed+1, 32, 0)
			sc.reserveCap = -1
			sc.preempt, sc.restart = c.preempt, c.restart
			_, v := fgCheckScenario(t, sc)
			busy, heavy, ok := fgBusy(t, sc)
			require.True(t, ok)
			t.Logf("draw %d, %s: busy %.3f of vLLM alone's, the flood %.3f of the room left, %d violations", seed+1, c.name, busy, heavy, len(v))
			if len(v) == 0 {
				held[c.name]++
			}
			switch c.name {
			case "none":
				assert.GreaterOrEqual(t, heavy, 0.95, "nothing kept free: the flood fills the room")
			case "resume":
				assert.GreaterOrEqual(t, heavy, 0.95, "what it takes back it resumes")
				resumed = busy
			case "restart":
				assert.Less(t, busy, resumed, "a sequence started again loses what it generated")
			}
		}
	}
	t.Logf("draws holding every invariant: %v", held)
	assert.Zero(t, held["none"], "without preemption or a reserve the victims wait for completions")
	assert.GreaterOrEqual(t, held["resume"], 4)
	// Row x, the reserve as it is: the flood is at the other instance,
	// which only the fleet variant reaches.
	heldX := map[bool]int{}
	for seed := range uint64(10) {
		for _, fleet := range []bool{false, true} {
			sc := fgIsolationRowX(seed+1, fgLearn)
			sc.preempt, sc.fleet = true, fleet
			if _, v := fgCheckScenario(t, sc); len(v) == 0 {
				heldX[fleet]++
			}
		}
	}
	t.Logf("row x, draws 1-10 holding every invariant, own instance / either: %d / %d", heldX[false], heldX[true])
	assert.Greater(t, heldX[true], heldX[false], "taking back at the flood's instance keeps row x's victims")
	assert.GreaterOrEqual(t, heldX[true], 7)
}
