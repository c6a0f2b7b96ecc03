package scheduler

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
)

// With room free, a call is dispatched by its own admit (no dispatch loop
// runs here), exactly once, and settles once.
func TestInlineDispatchWithoutLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 2}
		s := newTestServer(t, testConfig(t, "", ""), led, up)
		s.loopOnly = false
		body, err := serve(context.Background(), s, admission{body: chatBody("")})
		require.NoError(t, err)
		assert.NotEmpty(t, body)
		assert.Equal(t, int64(1), up.runs.Load())
		assert.Equal(t, 1, led.n("dispatch"))
		assert.Equal(t, 1, led.n("settle"))
		assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s, led.Memory).Reserved)
	})
}

// The inline pass asks the loop's predicate: a tenant at its concurrency
// stays queued until a completion lets the loop dispatch it.
func TestInlineDispatchKeepsTheGate(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		gate := make(chan struct{})
		up := &fakeUpstream{out: 2, gate: gate}
		s := newTestServer(t, testConfig(t, "", "    concurrency: 1\n"), led, up)
		s.loopOnly = false
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		errs := make(chan error, 2)
		for range 2 {
			go func() { _, err := serve(context.Background(), s, admission{body: chatBody("")}); errs <- err }()
			synctest.Wait()
		}
		assert.Equal(t, int64(1), up.runs.Load(), "one running, at the tenant's concurrency")
		st, ok := s.q.Stats("acme")
		require.True(t, ok)
		assert.Equal(t, 1, st.Depth, "the second waits in the queue")
		close(gate)
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)
		assert.Equal(t, int64(2), up.runs.Load())
		assert.Equal(t, 2, led.n("settle"))
	})
}

// A call dispatched by its own admit is counted in its pool as holding
// room, not as queued: the pool count is made before the queue can hand
// the call out (inline or by the loop), so the gate sees what runs.
func TestInlineDispatchCountsHeldInPool(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		gate := make(chan struct{})
		up := &fakeUpstream{out: 2, gate: gate}
		s := newTestServer(t, testConfig(t, "", ""), led, up)
		s.loopOnly = false
		done := make(chan error, 1)
		go func() { _, err := serve(context.Background(), s, admission{body: chatBody("")}); done <- err }()
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
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 2}
		s := newTestServer(t, testConfig(t, "", ""), led, up)
		s.loopOnly = false
		ctx, cancel := context.WithCancelCause(context.Background())
		led.set(func() {
			led.dispatch = func(context.Context, ledger.Ref) (error, bool) {
				cancel(apierr.ErrClientGone)
				return nil, false
			}
		})
		_, err := serve(ctx, s, admission{body: chatBody("")})
		require.ErrorIs(t, err, apierr.ErrClientGone)
		assert.Equal(t, int64(0), up.runs.Load())
		assert.Equal(t, 1, led.n("dispatch"))
		u := tenantUsage(t, s, led.Memory)
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
		assert.Equal(t, int64(0), committed(u, ledger.Requests, time.Hour), "not charged")
	})
}
