package lifecycle

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
)

// queuedBehind runs one request that holds the tenant's only slot for
// hold (fake time) and a second queued behind it; it returns the second's
// outcome and how long it took.
func queuedBehind(t *testing.T, tenantExtra string, hold time.Duration) (error, time.Duration) {
	led := lifecycletest.NewLedger(t)
	gate := make(chan struct{})
	up := &lifecycletest.Upstream{Out: 2, Gate: gate}
	s := newTestEngine(t, lifecycletest.Config(t, "", "    concurrency: 1\n"+tenantExtra), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	go func() { _ = s.q.Run(ctx) }()
	first := make(chan error, 1)
	go func() {
		_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), reqID: "first"})
		first <- err
	}()
	synctest.Wait()
	require.Equal(t, int64(1), up.Runs.Load(), "the first holds the slot")
	time.AfterFunc(hold, func() { close(gate) })
	start := time.Now()
	_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), reqID: "second"})
	took := time.Since(start)
	require.NoError(t, <-first)
	return err, took
}

// TestQueuedWaitsToItsMaxWait: the operator's deadline is the queue's. A
// request with queue.max_wait 30s queued behind another that runs 10 s is
// served after those 10 s, not shed at 2 s by a rule nobody configured.
func TestQueuedWaitsToItsMaxWait(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		err, took := queuedBehind(t, "    queue: {max_wait: 30s}\n", 10*time.Second)
		require.NoError(t, err, "served, not shed")
		assert.Equal(t, 10*time.Second, took)
	})
}

// TestShedAfterIsNamed: a tenant that opts into queue.shed_after has a
// queued request shed once it waited that long, before its max_wait, with
// 503 queue_shed naming the rule and a Retry-After.
func TestShedAfterIsNamed(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		err, took := queuedBehind(t, "    queue: {max_wait: 30s, shed_after: 2s}\n", 10*time.Second)
		require.ErrorIs(t, err, ErrShed)
		assert.NotErrorIs(t, err, queue.ErrExpired, "a shed is not a deadline")
		// Shed when dispatch reaches it: the tenant's park backoff (100ms)
		// brings it back to the pick after it has waited 2 s.
		assert.GreaterOrEqual(t, took, 2*time.Second)
		assert.Less(t, took, 2200*time.Millisecond)
		ae := apierr.For(err)
		assert.Equal(t, 503, ae.Status)
		assert.Equal(t, "queue_shed", ae.Code)
		assert.Equal(t, "shed_after", ae.Details["reason"])
		assert.Equal(t, int64(2000), ae.Details["shed_after_ms"])
		assert.GreaterOrEqual(t, ae.RetryAfter, time.Second)
		o, _ := outcomeFor(err)
		assert.Equal(t, outcomeRejected, o)
	})
}

// TestDeadlineNamesItsBound: a request that waits out its tenant's
// max_wait gets 504 deadline_exceeded at exactly that deadline, naming
// the bound and carrying a Retry-After.
func TestDeadlineNamesItsBound(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		err, took := queuedBehind(t, "    queue: {max_wait: 3s}\n", 10*time.Second)
		require.ErrorIs(t, err, queue.ErrExpired)
		assert.Equal(t, 3*time.Second, took)
		ae := apierr.For(err)
		assert.Equal(t, 504, ae.Status)
		assert.Equal(t, "deadline_exceeded", ae.Code)
		assert.Equal(t, "max_wait", ae.Details["reason"])
		assert.Equal(t, int64(3000), ae.Details["limit_ms"])
		assert.Equal(t, int64(3000), ae.Details["waited_ms"])
		assert.GreaterOrEqual(t, ae.RetryAfter, time.Second)
	})
}
