package queue

import (
	"fmt"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestRandomOperations applies long random sequences of every operation
// (enqueue, cancel, next with random verdicts, release, requeue, reconcile,
// unpark, clock steps with Tick, reconfiguration that adds, removes,
// re-weights and re-orders tenants) and checks after each step the internal
// invariants and that every entry has at most one owner, and at the end
// exactly one.
func TestRandomOperations(t *testing.T) {
	t.Parallel()
	for seed := range uint64(4) {
		t.Run(fmt.Sprintf("seed=%d", seed), func(t *testing.T) {
			t.Parallel()
			r := rand.New(rand.NewPCG(seed, 77))
			clk := newManualClock()
			owner := map[int]string{} // payload → "queued", "dispatched", "expired", "cancelled", "released"
			q, err := New[int](Config{}, Deps[int]{Clock: clk, OnExpire: func(it Item[int]) {
				if owner[it.Payload] != "queued" {
					t.Errorf("entry %d expired while %s", it.Payload, owner[it.Payload])
				}
				if clk.Now().Before(it.Deadline) {
					t.Errorf("entry %d expired before its deadline", it.Payload)
				}
				owner[it.Payload] = "expired"
			}})
			require.NoError(t, err)
			names := []string{"a", "b", "c", "d", "e"}
			randomConfig := func() Config {
				c := Config{
					MaxDepth:    r.IntN(80),
					MaxBytes:    int64(r.IntN(8000)),
					ParkBackoff: []time.Duration{-1, time.Millisecond, 20 * time.Millisecond}[r.IntN(3)],
					IdleTTL:     []time.Duration{-1, 0, 50 * time.Millisecond}[r.IntN(3)],
					MaxWait:     time.Duration(1+r.IntN(500)) * time.Millisecond,
				}
				for _, n := range names {
					if r.IntN(5) == 0 {
						continue // removed this round
					}
					c.Tenants = append(c.Tenants, TenantConfig{
						Name: n, Weight: float64(1 + r.IntN(4)), Band: r.IntN(3),
						MaxDepth: r.IntN(30), MaxBytes: int64(r.IntN(3000)),
						MaxWait: time.Duration(r.IntN(300)) * time.Millisecond,
						Order:   Order(r.IntN(2)),
					})
				}
				return c
			}
			require.NoError(t, q.Reconfigure(randomConfig()))
			handles := map[int]Handle[int]{}
			var dispatched []Item[int]
			id := 0
			for step := range 6000 {
				switch k := r.IntN(100); {
				case k < 35:
					id++
					it, err := q.Enqueue(Request[int]{
						Tenant: names[r.IntN(len(names))], Band: r.IntN(NumBands + 1),
						Cost: r.Int64N(100), BodyBytes: r.Int64N(200), Payload: id,
						Deadline: clk.Now().Add(time.Duration(r.IntN(400)) * time.Millisecond),
					})
					if err == nil {
						owner[id] = "queued"
						handles[id] = it.Handle
					}
				case k < 45 && id > 0:
					p := 1 + r.IntN(id)
					if h, ok := handles[p]; ok {
						won := q.Cancel(h)
						assert.Equal(t, owner[p] == "queued", won, "step %d: cancel of %d while %s", step, p, owner[p])
						if won {
							owner[p] = "cancelled"
						}
					}
				case k < 70:
					it, ok := q.Next(func(Item[int]) Verdict {
						return []Verdict{Dispatch, Dispatch, Dispatch, Park, Block}[r.IntN(5)]
					})
					if ok {
						require.Equal(t, "queued", owner[it.Payload], "step %d", step)
						require.True(t, clk.Now().Before(it.Deadline), "dispatched at or after deadline")
						owner[it.Payload] = "dispatched"
						dispatched = append(dispatched, it)
					}
				case k < 80 && len(dispatched) > 0:
					i := r.IntN(len(dispatched))
					it := dispatched[i]
					dispatched[i] = dispatched[len(dispatched)-1]
					dispatched = dispatched[:len(dispatched)-1]
					if r.IntN(3) == 0 {
						require.True(t, q.Requeue(it.Handle))
						owner[it.Payload] = "queued"
					} else {
						require.True(t, q.Release(it.Handle))
						owner[it.Payload] = "released"
						q.Reconcile(it.Tenant, it.Band, it.Cost, r.Int64N(it.Cost+1))
					}
				case k < 85:
					q.Unpark(names[r.IntN(len(names))])
				case k < 97:
					clk.Advance(time.Duration(r.IntN(20)) * time.Millisecond)
					q.Tick()
				default:
					require.NoError(t, q.Reconfigure(randomConfig()))
				}
				checkInvariants(t, q)
			}
			// Drain: release what is dispatched, then let everything expire.
			for _, it := range dispatched {
				require.True(t, q.Release(it.Handle))
				owner[it.Payload] = "released"
			}
			clk.Advance(time.Second)
			q.Tick()
			d, b := q.Len()
			assert.Equal(t, 0, d)
			assert.Equal(t, int64(0), b)
			for p, o := range owner {
				if o == "queued" || o == "dispatched" {
					t.Errorf("entry %d left %s", p, o)
				}
			}
			counts := map[string]int{}
			for _, o := range owner {
				counts[o]++
			}
			for _, o := range []string{"released", "expired", "cancelled"} {
				assert.Positive(t, counts[o], "no entry ended %s: %v", o, counts)
			}
			for _, s := range q.AppendStats(nil) {
				assert.Zero(t, s.Pending, "tenant %s", s.Name)
			}
		})
	}
}
