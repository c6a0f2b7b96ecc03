package queue

import (
	"fmt"
	"math"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type inflight struct {
	tenant          string
	band            int
	predicted, used int64
}

// TestFairnessBoundTwoTenants runs 100,000 dispatch decisions for two
// continuously backlogged, equal-weight tenants with mixed request sizes on
// a fleet of `slots` concurrent requests, completing random in-flight
// requests in between. After every event the charged-service difference
// D = S_a/w_a − S_b/w_b must satisfy the doc.go bound, both cumulatively and
// over every interval (max D − min D).
func TestFairnessBoundTwoTenants(t *testing.T) {
	t.Parallel()
	const decisions, slots, backlog = 100_000, 4, 8
	tests := []struct {
		name string
		// cost returns one request's predicted and actual cost.
		cost func(r *rand.Rand, tenant int) (pred, used int64)
		// cmax is the largest charge C of one request; refunds says
		// whether predictions overestimate (H = slots·C) or are exact (H = 0).
		cmax    int64
		refunds bool
	}{
		{
			name: "fixed lengths",
			cost: func(*rand.Rand, int) (int64, int64) { return 1000, 1000 },
			cmax: 1000,
		},
		{
			name: "mixed sizes exact",
			cost: func(r *rand.Rand, tenant int) (int64, int64) {
				// a sends short and long, b sends medium.
				if tenant == 0 {
					c := []int64{50, 4000}[r.IntN(2)]
					return c, c
				}
				c := 500 + r.Int64N(1500)
				return c, c
			},
			cmax: 4000,
		},
		{
			name: "mixed sizes with refunds",
			cost: func(r *rand.Rand, _ int) (int64, int64) {
				in := 1 + r.Int64N(2000)
				maxTok := int64(1000)
				used := r.Int64N(maxTok + 1)
				return in + 2*maxTok, in + 2*used
			},
			cmax:    2000 + 2*1000,
			refunds: true,
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(42, uint64(len(tc.name))))
			clk := newManualClock()
			q := newTestQueue(t, Config{MaxWait: 1000 * time.Hour, Tenants: tenants("a", "b")}, clk)
			names := []string{"a", "b"}
			used := map[int64]int64{} // payload → actual cost
			var id int64
			enqueue := func(ti int) {
				p, u := tc.cost(r, ti)
				id++
				used[id] = u
				mustEnqueue(t, q, Request[int]{Tenant: names[ti], Cost: p, Payload: int(id)})
			}
			for range backlog {
				enqueue(0)
				enqueue(1)
			}
			var running []inflight
			room := func(Item[int]) Verdict {
				if len(running) < slots {
					return Dispatch
				}
				return Block
			}
			h := 0.0
			if tc.refunds {
				h = float64(slots * tc.cmax)
			}
			bound := 2 * (float64(tc.cmax) + h) // (C_a+H_a)/w_a + (C_b+H_b)/w_b
			maxD, minD := 0.0, 0.0
			for n := 0; n < decisions; {
				switch {
				case len(running) < slots && r.IntN(3) != 0:
					it, ok := q.Next(room)
					require.True(t, ok)
					require.True(t, q.Release(it.Handle))
					running = append(running, inflight{it.Tenant, it.Band, it.Cost, used[int64(it.Payload)]})
					delete(used, int64(it.Payload))
					if it.Tenant == "a" {
						enqueue(0)
					} else {
						enqueue(1)
					}
					n++
				case len(running) > 0:
					k := r.IntN(len(running))
					f := running[k]
					running[k] = running[len(running)-1]
					running = running[:len(running)-1]
					require.True(t, q.Reconcile(f.tenant, f.band, f.predicted, f.used))
				default:
					continue
				}
				sa, _ := q.Stats("a")
				sb, _ := q.Stats("b")
				d := float64(sa.Charged - sb.Charged)
				maxD, minD = math.Max(maxD, d), math.Min(minD, d)
				if math.Abs(d) > bound || maxD-minD > bound {
					require.Failf(t, "fairness bound broken", "after %d decisions: D=%v max−min=%v bound=%v", n, d, maxD-minD, bound)
				}
			}
			t.Logf("max |D| = %.0f, max−min = %.0f, bound %.0f (C_max %d)", math.Max(maxD, -minD), maxD-minD, bound, tc.cmax)
			if !tc.refunds {
				// With exact predictions the cumulative difference stays within one C_max.
				assert.LessOrEqual(t, math.Max(maxD, -minD), float64(tc.cmax))
			}
			checkInvariants(t, q)
		})
	}
}

// TestWeightedShares: four backlogged tenants with weights 1:2:3:4 and mixed
// sizes get charged-service shares within 2% of 10/20/30/40%.
func TestWeightedShares(t *testing.T) {
	t.Parallel()
	const decisions = 100_000
	r := rand.New(rand.NewPCG(7, 7))
	cfg := Config{MaxWait: 1000 * time.Hour}
	for i := range 4 {
		cfg.Tenants = append(cfg.Tenants, TenantConfig{Name: fmt.Sprintf("w%d", i+1), Weight: float64(i + 1)})
	}
	q := newTestQueue(t, cfg, newManualClock())
	cost := func() int64 { return 10 + r.Int64N(3000) }
	for _, tc := range cfg.Tenants {
		for range 4 {
			mustEnqueue(t, q, Request[int]{Tenant: tc.Name, Cost: cost()})
		}
	}
	for range decisions {
		it := next(t, q, always)
		mustEnqueue(t, q, Request[int]{Tenant: it.Tenant, Cost: cost()})
	}
	stats := q.AppendStats(nil)
	require.Len(t, stats, 4)
	var total float64
	for _, s := range stats {
		total += float64(s.Charged)
	}
	for i, s := range stats {
		want := float64(i+1) / 10
		got := float64(s.Charged) / total
		assert.InEpsilon(t, want, got, 0.02, "tenant %s share got %.4f want %.2f", s.Name, got, want)
	}
}

// TestLiftNoIdleCredit: a tenant idle for an hour comes back at the band
// minimum, not with an hour of credit; a short absence keeps a deficit.
func TestLiftNoIdleCredit(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{MaxWait: 10 * time.Hour, LIFOAfter: -1, Tenants: tenants("a", "b")}, clk) // strict FIFO: the idle times here are hours
	for range 200 {
		mustEnqueue(t, q, Request[int]{Tenant: "b", Cost: 10})
	}
	for range 100 {
		next(t, q, always)
		clk.Advance(36 * time.Second)
	}
	vb, _ := q.Counter("b", 0)
	require.InDelta(t, 1000.0, vb, 0)

	for range 10 {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 10})
	}
	va, _ := q.Counter("a", 0)
	assert.InDelta(t, vb, va, 0, "lifted to the band minimum")
	var seq string
	for range 20 {
		seq += next(t, q, always).Tenant
	}
	// Ties go to b (eligible first); then strict alternation, no burst.
	assert.Equal(t, "babababababababababa", seq)

	// A deficit survives a short absence: b is served alone while a is idle
	// for a minute, then a comes back with its over-service intact.
	for range 9 {
		next(t, q, always)
	}
	// a has drained; charge it 500 extra (an overrun), then let b catch up.
	require.True(t, q.Reconcile("a", 0, 0, 500))
	va, _ = q.Counter("a", 0)
	clk.Advance(time.Minute)
	mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 10})
	va2, _ := q.Counter("a", 0)
	assert.InDelta(t, va, va2, 0, "deficit kept below the idle TTL")
	vb, _ = q.Counter("b", 0)
	require.Less(t, vb, va2)
	// b goes until it passes a.
	seq = ""
	for range 52 {
		seq += next(t, q, always).Tenant
	}
	assert.Equal(t, 51, countRune(seq, 'b'), "seq %s", seq)

	// After the idle TTL the deficit is forgotten.
	require.True(t, q.Reconcile("a", 0, 0, 5000))
	clk.Advance(DefaultIdleTTL + time.Second)
	mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 10})
	va, _ = q.Counter("a", 0)
	vb, _ = q.Counter("b", 0)
	assert.InDelta(t, vb, va, 0, "idle past the TTL: re-enters at the minimum")
}

func countRune(s string, c rune) int {
	n := 0
	for _, r := range s {
		if r == c {
			n++
		}
	}
	return n
}

// TestParkSkipsAndResumesInOrder: a tenant at its in-flight cap is skipped
// without spinning or losing its place; after Unpark its entries resume in
// FIFO order and the other tenant was never starved.
func TestParkSkipsAndResumesInOrder(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{ParkBackoff: -1, Tenants: tenants("a", "b")}, clk)
	for i := 1; i <= 6; i++ {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 1, Payload: i})
		mustEnqueue(t, q, Request[int]{Tenant: "b", Cost: 1, Payload: 100 + i})
	}
	const capA = 2
	inflightA := 0
	asked := map[string]int{}
	pred := func(it Item[int]) Verdict {
		asked[it.Tenant]++
		if it.Tenant == "a" && inflightA >= capA {
			return Park
		}
		return Dispatch
	}
	dispatch := func() string {
		it, ok := q.Next(pred)
		if !ok {
			return "-"
		}
		require.True(t, q.Release(it.Handle))
		if it.Tenant == "a" {
			inflightA++
		}
		return fmt.Sprint(it.Payload)
	}
	var got []string
	for range 6 {
		got = append(got, dispatch())
	}
	assert.Equal(t, []string{"1", "101", "2", "102", "103", "104"}, got)
	assert.Equal(t, 3, asked["a"], "a asked once while at its cap, then skipped")
	st, _ := q.Stats("a")
	assert.True(t, st.Parked)
	assert.Equal(t, 4, st.Depth, "nothing lost")

	// b drains; with a parked and b empty, Next returns at once.
	got = got[:0]
	for range 3 {
		got = append(got, dispatch())
	}
	assert.Equal(t, []string{"105", "106", "-"}, got)
	assert.Equal(t, 3, asked["a"], "parked tenant not consulted again")

	// A completion frees a slot: a resumes in order.
	inflightA--
	q.Unpark("a")
	got = got[:0]
	for range 3 {
		got = append(got, dispatch())
	}
	assert.Equal(t, []string{"3", "-", "-"}, got)
	inflightA = 0
	q.Unpark("a")
	got = got[:0]
	for range 3 {
		got = append(got, dispatch())
	}
	assert.Equal(t, []string{"4", "5", "-"}, got, "a at its cap again")
	inflightA = 0
	q.Unpark("a")
	assert.Equal(t, "6", dispatch())
	checkInvariants(t, q)
}

// TestParkLiftNoCredit: time parked earns no credit: on unpark the tenant
// rejoins at the band minimum and alternates with the other tenant.
func TestParkLiftNoCredit(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{ParkBackoff: -1, Tenants: tenants("a", "b")}, clk)
	for range 50 {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 1})
		mustEnqueue(t, q, Request[int]{Tenant: "b", Cost: 1})
	}
	parkA := func(it Item[int]) Verdict {
		if it.Tenant == "a" {
			return Park
		}
		return Dispatch
	}
	for range 20 {
		assert.Equal(t, "b", next(t, q, parkA).Tenant)
	}
	q.Unpark("a")
	var seq string
	for range 10 {
		seq += next(t, q, always).Tenant
	}
	assert.Equal(t, "babababababa"[:10], seq)
}

// TestPriorityStrict: random enqueues, parks, unparks and cancels across
// three bands; whenever Next dispatches from band b, no band above b has an
// eligible (queued, unparked) flow.
func TestPriorityStrict(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(3, 9))
	clk := newManualClock()
	cfg := Config{ParkBackoff: -1, MaxWait: time.Hour}
	for i := range 9 {
		cfg.Tenants = append(cfg.Tenants, TenantConfig{Name: fmt.Sprintf("t%d", i), Band: i % 3, Weight: float64(1 + i%4)})
	}
	q := newTestQueue(t, cfg, clk)
	var handles []Handle[int]
	dispatched := 0
	for step := range 20_000 {
		switch k := r.IntN(10); {
		case k < 4:
			tc := cfg.Tenants[r.IntN(len(cfg.Tenants))]
			it := mustEnqueue(t, q, Request[int]{Tenant: tc.Name, Band: tc.Band + r.IntN(2), Cost: 1 + r.Int64N(100)})
			handles = append(handles, it.Handle)
		case k < 5:
			q.Unpark(cfg.Tenants[r.IntN(len(cfg.Tenants))].Name)
		case k < 6 && len(handles) > 0:
			q.Cancel(handles[r.IntN(len(handles))])
		default:
			parked := map[string]bool{}
			it, ok := q.Next(func(it Item[int]) Verdict {
				if r.IntN(5) == 0 {
					parked[it.Tenant] = true
					return Park
				}
				return Dispatch
			})
			if !ok {
				continue
			}
			dispatched++
			require.True(t, q.Release(it.Handle))
			q.mu.Lock()
			for b := 0; b < it.Band; b++ {
				if q.bands[b].heap.len() > 0 {
					q.mu.Unlock()
					require.Failf(t, "priority inversion", "step %d: dispatched band %d while band %d has %d eligible flows", step, it.Band, b, q.bands[b].heap.len())
				}
				for _, tn := range q.tenants {
					if f := tn.flows[b]; f != nil && f.entries.len() > 0 && !tn.parked {
						q.mu.Unlock()
						require.Failf(t, "priority inversion", "step %d: tenant %s band %d queued and unparked", step, tn.cfg.Name, b)
					}
				}
			}
			q.mu.Unlock()
		}
	}
	assert.Greater(t, dispatched, 5000)
	checkInvariants(t, q)
}

// TestBlockStopsDispatch: a blocked head stops dispatch; a lower band or a
// smaller request of another tenant is not tried instead.
func TestBlockStopsDispatch(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{Tenants: []TenantConfig{{Name: "hi"}, {Name: "small"}, {Name: "lo", Band: 1}}}, clk)
	mustEnqueue(t, q, Request[int]{Tenant: "hi", Cost: 5000})
	mustEnqueue(t, q, Request[int]{Tenant: "small", Cost: 10})
	mustEnqueue(t, q, Request[int]{Tenant: "lo", Cost: 10})
	var seen []string
	_, ok := q.Next(func(it Item[int]) Verdict {
		seen = append(seen, it.Tenant)
		if it.Cost > 1000 {
			return Block
		}
		return Dispatch
	})
	assert.False(t, ok)
	assert.Equal(t, []string{"hi"}, seen)
	d, _ := q.Len()
	assert.Equal(t, 3, d)
}
