package fleet_test

import (
	"fmt"
	"math"
	"math/rand/v2"
	"os"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/fleet"
)

type stepClock struct{ now time.Time }

func (c *stepClock) Now() time.Time { return c.now }

// sim is a fleet of real queues that exchange reports as the driver does
// (scheduler/fairshare.go): instance k publishes its report and merges
// the others' latest ones every period steps, at its own phase. Time is
// counted in steps; each step one instance dispatches one request.
type sim struct {
	t        *testing.T
	rng      *rand.Rand
	clk      *stepClock
	qs       []*queue.Queue[int]
	ms       []fleet.Merger
	store    [][]fleet.Flow // latest published report per instance (nil: none yet)
	sends    []map[string]bool
	queued   []map[string]int
	weight   map[string]float64
	exchange bool
	period   int
	phase    []int
	cmax     int64
	fixed    bool // every request costs cmax

	refunds  bool
	inflight []flight // dispatched, not yet reconciled (refunds only)
	maxIn    int      // fleet-wide in-flight cap per tenant (refunds only)

	served map[string]float64   // fleet-wide net charged service
	log    []map[string][]event // per instance, per tenant: charges and refunds
	step   int
}

type flight struct {
	inst   int
	tenant string
	cost   int64
}

type event struct {
	step int
	amt  float64
}

func newSim(t *testing.T, rng *rand.Rand, n int, weights map[string]float64) *sim {
	s := &sim{t: t, rng: rng, clk: &stepClock{now: time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)},
		weight: weights, exchange: true, period: 1, cmax: 10, served: map[string]float64{}}
	names := slices.Sorted(func(yield func(string) bool) {
		for k := range weights {
			if !yield(k) {
				return
			}
		}
	})
	var ts []queue.TenantConfig
	for _, name := range names {
		ts = append(ts, queue.TenantConfig{Name: name, Weight: weights[name]})
	}
	for range n {
		q, err := queue.New[int](queue.Config{Tenants: ts, MaxWait: 1000 * time.Hour, IdleTTL: -1}, queue.Deps[int]{Clock: s.clk})
		require.NoError(t, err)
		s.qs = append(s.qs, q)
		s.sends = append(s.sends, map[string]bool{})
		s.queued = append(s.queued, map[string]int{})
		s.log = append(s.log, map[string][]event{})
		s.phase = append(s.phase, rng.IntN(1<<20))
	}
	s.ms = make([]fleet.Merger, n)
	s.store = make([][]fleet.Flow, n)
	return s
}

func (s *sim) cost() int64 {
	if s.fixed {
		return s.cmax
	}
	return 1 + s.rng.Int64N(s.cmax)
}

func (s *sim) enqueue(k int, tenant string) {
	_, err := s.qs[k].Enqueue(queue.Request[int]{Tenant: tenant, Cost: s.cost()})
	require.NoError(s.t, err)
	s.queued[k][tenant]++
}

// refill keeps every tenant that sends to an instance backlogged there.
func (s *sim) refill() {
	for k := range s.qs {
		for tn := range s.sends[k] {
			for s.queued[k][tn] < 2 {
				s.enqueue(k, tn)
			}
		}
	}
}

func (s *sim) charge(k int, tenant string, amt float64) {
	s.served[tenant] += amt
	s.log[k][tenant] = append(s.log[k][tenant], event{s.step, math.Abs(amt)})
}

// dispatch lets instance k dispatch one request (if it has one).
func (s *sim) dispatch(k int) {
	it, ok := s.qs[k].Next(func(queue.Item[int]) queue.Verdict { return queue.Dispatch })
	if !ok {
		return
	}
	require.True(s.t, s.qs[k].Release(it.Handle))
	s.queued[k][it.Tenant]--
	s.charge(k, it.Tenant, float64(it.Cost))
	if !s.refunds {
		return
	}
	s.inflight = append(s.inflight, flight{k, it.Tenant, it.Cost})
	n := 0
	for _, f := range s.inflight {
		if f.tenant == it.Tenant {
			n++
		}
	}
	// A completion: of a random request, or of the tenant's oldest when
	// it is at its cap (the bound's H is maxIn·cmax).
	i := -1
	if n > s.maxIn {
		i = slices.IndexFunc(s.inflight, func(f flight) bool { return f.tenant == it.Tenant })
	} else if s.rng.IntN(2) == 0 {
		i = s.rng.IntN(len(s.inflight))
	}
	if i >= 0 {
		f := s.inflight[i]
		s.inflight = slices.Delete(s.inflight, i, i+1)
		actual := s.rng.Int64N(f.cost + 1)
		require.True(s.t, s.qs[f.inst].Reconcile(f.tenant, 0, f.cost, actual))
		s.charge(f.inst, f.tenant, float64(actual-f.cost))
	}
}

// exchangeDue runs instance k's exchange when its period comes round:
// publish its report, merge the others' latest, apply.
func (s *sim) exchangeDue(k int) {
	if !s.exchange || (s.step+s.phase[k])%s.period != 0 {
		return
	}
	q := s.qs[k]
	local := q.AppendFlows(nil)
	s.store[k] = fleet.Report(local)
	others := map[string][]fleet.Flow{}
	for m, r := range s.store {
		if m != k && r != nil {
			others[strconv.Itoa(m)] = r
		}
	}
	res := s.ms[k].Merge(s.clk.now, local, q.Weight, others)
	for _, a := range res.Adjust {
		require.True(s.t, q.AdjustFleet(a.Tenant, a.Band, a.Service, a.Lifted))
	}
	q.SetFleetFloors(res.Floor, res.HasFloor)
}

// run advances steps; pick chooses the instance that dispatches.
func (s *sim) run(steps int, pick func() int, each func()) {
	for range steps {
		s.refill()
		for k := range s.qs {
			s.exchangeDue(k)
		}
		s.dispatch(pick())
		if each != nil {
			each()
		}
		s.step++
		s.clk.now = s.clk.now.Add(time.Millisecond)
	}
}

// windowMax is the most one instance charged (or refunded) tenant within
// any d consecutive steps: the bound's U.
func (s *sim) windowMax(tenant string, d int) float64 {
	best := 0.0
	for k := range s.qs {
		evs := s.log[k][tenant]
		sum, lo := 0.0, 0
		for _, e := range evs {
			sum += e.amt
			for evs[lo].step <= e.step-d {
				sum -= evs[lo].amt
				lo++
			}
			best = max(best, sum)
		}
	}
	return best
}

// TestFleetBound checks the fleet fairness bound (package doc, "Fleet
// fairness bound") over every interval of seeded runs of many shapes: 2
// to 5 instances, 2 or 3 tenants backlogged at every instance with random
// weights, costs fixed or random up to 1, 10 or 100, exchange periods of 1
// to 40 steps, with and without refunds, and up to three tenants that
// come and go at random instances (lifted on every return, which moves
// the floors). Each step one random instance dispatches.
func TestFleetBound(t *testing.T) {
	seeds := 40
	if testing.Short() || raceEnabled {
		seeds = 10
	}
	if n, err := strconv.Atoi(os.Getenv("FLEET_SEEDS")); err == nil && n > 0 {
		seeds = n // the sweep: FLEET_SEEDS=1000 go test -run TestFleetBound ./queue/fleet/
	}
	worst := 0.0
	for seed := range seeds {
		rng := rand.New(rand.NewPCG(uint64(seed), 39))
		n := 2 + rng.IntN(4)
		steady := 2 + rng.IntN(2)
		transient := rng.IntN(4)
		weights := map[string]float64{}
		var always []string
		for i := range steady {
			name := fmt.Sprintf("s%d", i)
			always = append(always, name)
			weights[name] = float64(1 + rng.IntN(4))
		}
		for i := range transient {
			weights[fmt.Sprintf("x%d", i)] = float64(1 + rng.IntN(4))
		}
		s := newSim(t, rng, n, weights)
		s.period = []int{1, 3, 10, 40}[rng.IntN(4)]
		s.cmax = []int64{1, 10, 100}[rng.IntN(3)]
		s.fixed = rng.IntN(3) == 0
		s.refunds = rng.IntN(2) == 0
		s.maxIn = 1 + rng.IntN(4)
		for k := range n {
			for _, name := range always {
				s.sends[k][name] = true
			}
		}
		d := 2 * s.period
		steps := 3000
		// The bound holds over [t1, t2] when both flows were eligible
		// everywhere since t1 − D; they are from the first step on.
		start := d + 1
		type pairTrace struct {
			i, j  string
			trace []float64 // S_i/w_i − S_j/w_j from step start on
		}
		var pairs []*pairTrace
		for a := range always {
			for b := a + 1; b < len(always); b++ {
				pairs = append(pairs, &pairTrace{i: always[a], j: always[b]})
			}
		}
		var base map[string]float64
		s.run(steps, func() int { return rng.IntN(n) }, func() {
			// Tenants that come and go: a burst at a random instance.
			if transient > 0 && rng.IntN(20) == 0 {
				s.enqueue(rng.IntN(n), fmt.Sprintf("x%d", rng.IntN(transient)))
			}
			if s.step == start {
				base = maps(s.served)
			}
			if s.step < start {
				return
			}
			for _, p := range pairs {
				p.trace = append(p.trace, (s.served[p.i]-base[p.i])/weights[p.i]-(s.served[p.j]-base[p.j])/weights[p.j])
			}
		})
		var h float64
		if s.refunds {
			h = float64(s.maxIn) * float64(s.cmax)
		}
		for _, p := range pairs {
			ui, uj := s.windowMax(p.i, d), s.windowMax(p.j, d)
			bound := (float64(s.cmax)+h+2*float64(n-1)*ui)/weights[p.i] + (float64(s.cmax)+h+2*float64(n-1)*uj)/weights[p.j]
			lo, hi := p.trace[0], p.trace[0]
			most := 0.0
			for _, x := range p.trace {
				lo, hi = min(lo, x), max(hi, x)
				most = max(most, x-lo, hi-x)
			}
			require.LessOrEqualf(t, most, bound, "seed %d: %d instances, period %d, cmax %d, refunds %v: %s−%s", seed, n, s.period, s.cmax, s.refunds, p.i, p.j)
			worst = max(worst, most/bound)
		}
	}
	t.Logf("largest interval difference: %.2f of the bound", worst)
}

func maps(m map[string]float64) map[string]float64 {
	out := make(map[string]float64, len(m))
	for k, v := range m {
		out[k] = v
	}
	return out
}

// shares runs a fleet whose instances dispatch in turn (each gets an
// equal part of the replica, as §9's split gives instances that all want
// more than an equal split) and returns each tenant's weight-normalised
// service over the second half, relative to the least.
func shares(t *testing.T, exchange bool, weights map[string]float64, sends [][]string) map[string]float64 {
	rng := rand.New(rand.NewPCG(1, 2))
	s := newSim(t, rng, len(sends), weights)
	s.exchange, s.period, s.fixed = exchange, 5, true
	for k, ts := range sends {
		for _, tn := range ts {
			s.sends[k][tn] = true
		}
	}
	turn := 0
	next := func() int { turn++; return turn % len(sends) }
	s.run(6000, next, nil)
	half := maps(s.served)
	s.run(6000, next, nil)
	out := map[string]float64{}
	least := math.Inf(1)
	for tn, w := range weights {
		out[tn] = (s.served[tn] - half[tn]) / w
		least = min(least, out[tn])
	}
	for tn := range out {
		out[tn] /= least
	}
	return out
}

// TestFleetSharesAcrossTopologies: a tenant that reaches more instances
// gets no more. Two instances split a replica; x sends to both, y to one:
// per-instance fairness serves x three times y, the fleet's counters
// serve them equally. Three instances, weights 1:2:4 reaching one, two
// and three instances: per-instance fairness is far off, the fleet's
// counters hold the weights.
func TestFleetSharesAcrossTopologies(t *testing.T) {
	two := map[string]float64{"x": 1, "y": 1}
	twoSends := [][]string{{"x", "y"}, {"x"}}
	local := shares(t, false, two, twoSends)
	require.InDelta(t, 3, local["x"], 0.05, "per instance: x gets A's half and half of B's")
	fleetWide := shares(t, true, two, twoSends)
	require.InDelta(t, 1, fleetWide["x"], 0.02, "fleet-wide")
	require.InDelta(t, 1, fleetWide["y"], 0.02, "fleet-wide")

	three := map[string]float64{"a": 1, "b": 2, "c": 4}
	threeSends := [][]string{{"a", "b", "c"}, {"b", "c"}, {"c"}}
	local = shares(t, false, three, threeSends)
	t.Logf("per instance, normalised by weight: %v", local)
	require.Greater(t, max(local["a"], local["b"], local["c"]), 1.5)
	fleetWide = shares(t, true, three, threeSends)
	t.Logf("fleet-wide, normalised by weight: %v", fleetWide)
	for tn, x := range fleetWide {
		require.InDeltaf(t, 1, x, 0.05, "tenant %s", tn)
	}
}
