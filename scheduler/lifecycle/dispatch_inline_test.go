package lifecycle

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
)

// With room free, a call is dispatched by its own admit (no dispatch loop
// runs here), exactly once, and settles once.
func TestInlineDispatchWithoutLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 2}
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
		s.loopOnly = false
		body, err := serve(context.Background(), s, admission{body: lifecycletest.ChatBody("")})
		require.NoError(t, err)
		assert.NotEmpty(t, body)
		assert.Equal(t, int64(1), up.Runs.Load())
		assert.Equal(t, 1, led.N("dispatch"))
		assert.Equal(t, 1, led.N("settle"))
		assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
	})
}

// The inline pass asks the loop's predicate: a tenant at its concurrency
// stays queued until a completion lets the loop dispatch it.
func TestInlineDispatchKeepsTheGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		gate := make(chan struct{})
		up := &lifecycletest.Upstream{Out: 2, Gate: gate}
		s := newTestEngine(t, lifecycletest.Config(t, "", "    concurrency: 1\n"), led, up)
		s.loopOnly = false
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		errs := make(chan error, 2)
		for range 2 {
			go func() {
				_, err := serve(context.Background(), s, admission{body: lifecycletest.ChatBody("")})
				errs <- err
			}()
			synctest.Wait()
		}
		assert.Equal(t, int64(1), up.Runs.Load(), "one running, at the tenant's concurrency")
		st, ok := s.q.Stats("acme")
		require.True(t, ok)
		assert.Equal(t, 1, st.Depth, "the second waits in the queue")
		close(gate)
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)
		assert.Equal(t, int64(2), up.Runs.Load())
		assert.Equal(t, 2, led.N("settle"))
	})
}

// A call dispatched by its own admit is counted in its pool as holding
// room, not as queued: the pool count is made before the queue can hand
// the call out (inline or by the loop), so the gate sees what runs.
func TestInlineDispatchCountsHeldInPool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		gate := make(chan struct{})
		up := &lifecycletest.Upstream{Out: 2, Gate: gate}
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
		s.loopOnly = false
		done := make(chan error, 1)
		go func() {
			_, err := serve(context.Background(), s, admission{body: lifecycletest.ChatBody("")})
			done <- err
		}()
		synctest.Wait()
		k := s.reps.PoolKeyOf("m")
		running := s.pools.Load(k, "acme")
		assert.Equal(t, int64(1), running.Held, "running: holds room")
		assert.Equal(t, int64(0), running.Queued, "running: not queued")
		assert.Equal(t, int64(1), running.Arrived)
		close(gate)
		require.NoError(t, <-done)
		ended := s.pools.Load(k, "acme")
		assert.Equal(t, int64(0), ended.Held)
		assert.Equal(t, int64(0), ended.Queued)
		assert.Equal(t, int64(1), ended.Served)
	})
}

// A client that leaves while its call is dispatched inline (here: during
// the mark-dispatched round trip) gets nothing sent upstream and is charged
// nothing: the dispatch does not outrun the cancellation.
func TestInlineDispatchClientGoneSendsNothing(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 2}
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
		s.loopOnly = false
		ctx, cancel := context.WithCancelCause(context.Background())
		led.Set(func() {
			led.OnDispatch = func(context.Context, ledger.Ref) (error, bool) {
				cancel(apierr.ErrClientGone)
				return nil, false
			}
		})
		_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody("")})
		require.ErrorIs(t, err, apierr.ErrClientGone)
		assert.Equal(t, int64(0), up.Runs.Load())
		assert.Equal(t, 1, led.N("dispatch"))
		u := tenantUsage(t, s, led.Memory)
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
		assert.Equal(t, int64(0), lifecycletest.Committed(u, ledger.Requests, time.Hour), "not charged")
	})
}

// TestExpiredAtDispatchRecheckCounts: a call whose deadline passes while
// its MarkDispatched is in flight is caught by the re-check after it:
// never sent upstream, counted in sluice_expired_dispatch_total, and its
// hold settled at zero.
func TestExpiredAtDispatchRecheckCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 1}
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.q.Run(ctx) }()
		led.Set(func() {
			led.OnDispatch = func(context.Context, ledger.Ref) (error, bool) {
				time.Sleep(2 * time.Second) // a slow slot round trip, in fake time
				return nil, false
			}
		})
		_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), timeout: time.Second})
		require.ErrorIs(t, err, queue.ErrExpired)
		var m dto.Metric
		require.NoError(t, s.m.ExpiredDispatch.Write(&m))
		assert.InDelta(t, 1.0, m.GetCounter().GetValue(), 0, "sluice_expired_dispatch_total")
		assert.Equal(t, int64(0), up.Runs.Load(), "never sent upstream")
		assert.Equal(t, 1, led.N("dispatch"))
		u := tenantUsage(t, s, led.Memory)
		assert.Equal(t, ledger.Amounts{}, u.Reserved, "nothing left held")
		assert.Equal(t, 0, u.Unresolved)
	})
}

// TestQueuedCallFollowsItsPool: a call queued for a pool whose replicas
// left is counted, gated and woken in the pool its model has now.
func TestQueuedCallFollowsItsPool(t *testing.T) {
	t.Parallel()
	s := newTestEngine(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
	pol := s.pol.Load()
	c, err := s.admit(t.Context(), pol.Tenants["acme"], pol, admission{ep: 1, body: lifecycletest.ChatBody(""), reqID: "q"})
	require.NoError(t, err)
	defer func() { s.release(c); s.forget(c) }()
	if c.place.Spot == gate.SpotNone {
		s.movePool(c, gate.SpotQueued)
	}
	old := c.place.Pool
	// r0 leaves for r1 (scheduler's membership does this to the set).
	s.reps.SetMembers([]*fleet.Replica{{Name: "r1", URL: "http://r1.invalid", MaxSeqs: 8, Slot: 1}})

	s.repool(c)
	assert.NotEqual(t, old, c.place.Pool)
	assert.Equal(t, s.reps.PoolKeyOf("m"), c.place.Pool)
	assert.Equal(t, int64(0), s.pools.Load(old, "acme").Queued, "out of the pool it was admitted to")
	assert.Equal(t, int64(1), s.pools.Load(c.place.Pool, "acme").Queued, "queued in its model's pool")
	s.movePool(c, gate.SpotNone)
}

// server.reserve_margin and server.reserve_cap reach the pool's gate at
// each assessment, a reload's values from the next dispatch, 0 as none
// (not the gate's default), and the margin's default is the gate's.
func TestReserveMarginReachesTheGate(t *testing.T) {
	assert.Equal(t, gate.BurstK, config.DefaultReserveMargin)
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 2}
		s := newTestEngine(t, lifecycletest.Config(t, "server: {reserve_margin: 0.5, reserve_cap: 0.3}\n", ""), led, up)
		s.loopOnly = false
		gateOf := func() (margin, maxReserve float64) {
			s.pools.Lock()
			defer s.pools.Unlock()
			g := &s.pools.PoolLocked(s.reps.PoolKeyOf("m")).Gate
			return g.Margin, g.Cap
		}
		_, err := serve(context.Background(), s, admission{body: lifecycletest.ChatBody("")})
		require.NoError(t, err)
		margin, maxReserve := gateOf()
		assert.Equal(t, 0.5, margin)
		assert.Equal(t, 0.3, maxReserve)
		reloadPolicy(t, s, lifecycletest.Config(t, "server: {reserve_margin: 0, reserve_cap: 0}\n", ""))
		time.Sleep(time.Second) // past the gate's reuse of its last assessment (assessEvery)
		_, err = serve(context.Background(), s, admission{body: lifecycletest.ChatBody("")})
		require.NoError(t, err)
		margin, maxReserve = gateOf()
		assert.Equal(t, -1.0, margin, "0: the peak alone")
		assert.Equal(t, -1.0, maxReserve, "0: nothing kept free")
	})
}
