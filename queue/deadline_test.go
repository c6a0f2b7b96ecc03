package queue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type outcomes struct {
	mu         sync.Mutex
	count      map[int]int // payload → outcomes seen
	expired    int
	dispatched int
	cancelled  int
	maxLate    time.Duration // expiry report time − deadline
	lateDisp   []string      // dispatches at or after the deadline
}

func newOutcomes() *outcomes { return &outcomes{count: map[int]int{}} }

func (o *outcomes) add(id int, kind string, late time.Duration) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.count[id]++
	switch kind {
	case "expired":
		o.expired++
		o.maxLate = max(o.maxLate, late)
	case "dispatched":
		o.dispatched++
		if late >= 0 {
			o.lateDisp = append(o.lateDisp, fmt.Sprintf("id %d at deadline%+v", id, late))
		}
	case "cancelled":
		o.cancelled++
	}
}

func (o *outcomes) check(t *testing.T, n int) {
	t.Helper()
	o.mu.Lock()
	defer o.mu.Unlock()
	assert.Equal(t, n, o.expired+o.dispatched+o.cancelled, "every entry has one outcome")
	for id := range n {
		if o.count[id] != 1 {
			assert.Failf(t, "outcome count", "entry %d had %d outcomes, want 1", id, o.count[id])
			break
		}
	}
	assert.Empty(t, o.lateDisp, "dispatched at or after the deadline")
	assert.LessOrEqual(t, o.maxLate, time.Millisecond, "expiry later than 1 ms")
	assert.Positive(t, o.expired)
	assert.Positive(t, o.dispatched)
}

// TestDeadlines10kRun: 10,000 entries with random deadlines under
// testing/synctest with the real Run loop. A dispatcher serves one entry
// every 1–3 ms, a canceller cancels some: no entry is dispatched at or after
// its deadline, every expired one is reported exactly once and within 1 ms
// of its deadline on the (fake) clock.
func TestDeadlines10kRun(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const n = 10_000
		o := newOutcomes()
		r := rand.New(rand.NewPCG(11, 12))
		cfg := Config{MaxWait: 20 * time.Second}
		for i := range 16 {
			order := OrderFIFO
			if i%2 == 1 {
				order = OrderEDF
			}
			cfg.Tenants = append(cfg.Tenants, TenantConfig{Name: fmt.Sprintf("t%d", i), Order: order, Band: i % 3})
		}
		q, err := New[int](cfg, Deps[int]{OnExpire: func(it Item[int]) {
			o.add(it.Payload, "expired", time.Since(it.Deadline))
		}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		var wg sync.WaitGroup
		wg.Go(func() { _ = q.Run(ctx) })

		handles := make([]Handle[int], 0, n)
		for i := range n {
			if i%50 == 0 {
				time.Sleep(time.Duration(r.IntN(3000)) * time.Microsecond)
			}
			d := time.Duration(1+r.Int64N(int64(10*time.Second))) * time.Nanosecond
			it, err := q.Enqueue(Request[int]{
				Tenant:   cfg.Tenants[r.IntN(len(cfg.Tenants))].Name,
				Band:     r.IntN(2),
				Cost:     1 + r.Int64N(100),
				Deadline: time.Now().Add(d),
				Payload:  i,
			})
			require.NoError(t, err)
			handles = append(handles, it.Handle)
		}
		dr := rand.New(rand.NewPCG(5, 6))
		wg.Go(func() { // dispatcher
			for {
				it, ok := q.Next(always)
				if ok {
					o.add(it.Payload, "dispatched", time.Since(it.Deadline))
					q.Release(it.Handle)
				}
				if d, _ := q.Len(); d == 0 {
					return
				}
				time.Sleep(time.Duration(1000+dr.IntN(2000)) * time.Microsecond)
			}
		})
		cr := rand.New(rand.NewPCG(8, 9))
		for range 2000 {
			k := cr.IntN(n)
			if q.Cancel(handles[k]) {
				o.add(k, "cancelled", 0)
			}
			time.Sleep(time.Duration(cr.IntN(5000)) * time.Microsecond)
		}
		time.Sleep(11 * time.Second)
		synctest.Wait()
		cancel()
		wg.Wait()
		d, b := q.Len()
		assert.Equal(t, 0, d)
		assert.Equal(t, int64(0), b)
		o.check(t, n)
		t.Logf("dispatched %d, expired %d, cancelled %d, max expiry lateness %v", o.dispatched, o.expired, o.cancelled, o.maxLate)
	})
}

// TestDeadlinesManualClockTick drives expiry with an injected manual clock
// and Tick alone: the clock jumps straight to each due time Tick reports.
func TestDeadlinesManualClockTick(t *testing.T) {
	t.Parallel()
	const n = 10_000
	clk := newManualClock()
	o := newOutcomes()
	cfg := Config{MaxWait: time.Minute, Tenants: []TenantConfig{{Name: "a"}, {Name: "b", Order: OrderEDF}}}
	q, err := New[int](cfg, Deps[int]{Clock: clk, OnExpire: func(it Item[int]) {
		o.add(it.Payload, "expired", clk.Now().Sub(it.Deadline))
	}})
	require.NoError(t, err)
	r := rand.New(rand.NewPCG(1, 2))
	for i := range n {
		mustEnqueue(t, q, Request[int]{
			Tenant:   []string{"a", "b"}[i%2],
			Deadline: clk.Now().Add(time.Duration(1+r.Int64N(int64(5*time.Second))) * time.Nanosecond),
			Payload:  i,
		})
	}
	for {
		next, ok := q.Tick()
		if !ok {
			break
		}
		clk.Set(next)
		if r.IntN(2) == 0 {
			if it, ok := q.Next(always); ok {
				o.add(it.Payload, "dispatched", clk.Now().Sub(it.Deadline))
				q.Release(it.Handle)
			}
		}
	}
	o.check(t, n)
	d, _ := q.Len()
	assert.Equal(t, 0, d)
}

// TestNextNeverHandsOutExpired: without any Tick, Next expires a head whose
// deadline has passed (reporting it once) and dispatches the next one.
func TestNextNeverHandsOutExpired(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	var expired []int
	q, err := New[int](Config{LIFOAfter: -1, Tenants: tenants("a")}, Deps[int]{Clock: clk, OnExpire: func(it Item[int]) {
		expired = append(expired, it.Payload)
	}})
	require.NoError(t, err)
	a := mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: 1, Deadline: clk.Now().Add(time.Second)})
	mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: 2, Deadline: clk.Now().Add(2 * time.Second)})
	mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: 3, Deadline: clk.Now().Add(time.Hour)})
	clk.Advance(2 * time.Second) // exactly at entry 2's deadline: expired too
	it, ok := q.Next(always)
	require.True(t, ok)
	assert.Equal(t, 3, it.Payload)
	assert.Equal(t, []int{1, 2}, expired)
	assert.False(t, q.Cancel(a.Handle), "expired entry cannot be cancelled")
	q.Tick()
	assert.Equal(t, []int{1, 2}, expired, "reported exactly once")
	st, _ := q.Stats("a")
	assert.Equal(t, uint64(2), st.Expired)
	assert.Equal(t, int64(0), st.Charged-it.Cost, "expired entries were never charged")
}

// TestExactlyOneOwnerUnderConcurrency races enqueuers, cancellers, a
// dispatcher (with requeues) and the expiry loop; every entry ends with
// exactly one of dispatch, expiry or cancel.
func TestExactlyOneOwnerUnderConcurrency(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		const producers, perP = 8, 500
		o := newOutcomes()
		cfg := Config{ParkBackoff: time.Millisecond, Tenants: tenants("a", "b", "c")}
		q, err := New[int](cfg, Deps[int]{OnExpire: func(it Item[int]) {
			o.add(it.Payload, "expired", time.Since(it.Deadline))
		}})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		var loops sync.WaitGroup
		loops.Go(func() { _ = q.Run(ctx) })
		loops.Go(func() { // dispatcher
			r := rand.New(rand.NewPCG(3, 3))
			for ctx.Err() == nil {
				it, ok := q.Next(always)
				if !ok {
					select {
					case <-q.Ready():
					case <-ctx.Done():
					case <-time.After(time.Millisecond):
					}
					continue
				}
				if r.IntN(4) == 0 {
					require.True(t, q.Requeue(it.Handle))
					continue
				}
				o.add(it.Payload, "dispatched", time.Since(it.Deadline))
				q.Release(it.Handle)
				time.Sleep(100 * time.Microsecond)
			}
		})
		var prod sync.WaitGroup
		for p := range producers {
			prod.Go(func() {
				r := rand.New(rand.NewPCG(uint64(p), 1))
				for i := range perP {
					id := p*perP + i
					it, err := q.Enqueue(Request[int]{
						Tenant:   cfg.Tenants[r.IntN(3)].Name,
						Deadline: time.Now().Add(time.Duration(1+r.IntN(50)) * time.Millisecond),
						Payload:  id,
					})
					require.NoError(t, err)
					if r.IntN(3) == 0 {
						time.Sleep(time.Duration(r.IntN(20)) * time.Millisecond)
						if q.Cancel(it.Handle) {
							o.add(id, "cancelled", 0)
						}
					}
				}
			})
		}
		prod.Wait()
		time.Sleep(100 * time.Millisecond)
		synctest.Wait()
		cancel()
		loops.Wait()
		o.check(t, producers*perP)
		checkInvariants(t, q)
	})
}

// TestRunExpirySpinRealClock runs Run on the real clock with ExpirySpin: every
// entry is reported exactly once, never before its deadline, and Run stops
// on cancel. (No upper bound on lateness here: that is measured by
// BenchmarkExpiryLateness, not asserted in a timed unit test.)
func TestRunExpirySpinRealClock(t *testing.T) {
	t.Parallel()
	const n = 200
	var (
		mu    sync.Mutex
		seen  = map[int]int{}
		early []int
	)
	done := make(chan struct{})
	q, err := New[int](Config{ExpirySpin: time.Millisecond, Tenants: tenants("a")}, Deps[int]{OnExpire: func(it Item[int]) {
		mu.Lock()
		defer mu.Unlock()
		if time.Now().Before(it.Deadline) {
			early = append(early, it.Payload)
		}
		seen[it.Payload]++
		if len(seen) == n {
			close(done)
		}
	}})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	var wg sync.WaitGroup
	wg.Go(func() { assert.NoError(t, q.Run(ctx)) })
	now := time.Now()
	for i := range n {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: i, Deadline: now.Add(time.Duration(n-i) * 50 * time.Microsecond)})
	}
	<-done
	cancel()
	wg.Wait()
	assert.Empty(t, early, "expired before the deadline")
	for i := range n {
		assert.Equal(t, 1, seen[i], "entry %d", i)
	}
}
