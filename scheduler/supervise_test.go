package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A background loop that ends early fails readiness, naming itself; one
// that ends because its context did is a clean stop.
func TestSuperviseFailsReadiness(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
	s.reps.List()[0].Obs.Store(&fleet.Obs{OK: true})
	ctx, cancel := context.WithCancel(context.Background())
	stopped := s.Supervise(ctx, "quiet", func(ctx context.Context) error { cancel(); return ctx.Err() })
	require.NoError(t, stopped())
	ok, _ := s.Ready()
	assert.True(t, ok, "a loop stopped by its context is not a failure")

	failed := s.Supervise(context.Background(), "poller", func(context.Context) error { return errors.New("scrape client gone") })
	err := failed()
	require.ErrorContains(t, err, "poller loop: scrape client gone")
	ok, why := s.Ready()
	assert.False(t, ok)
	assert.Contains(t, why, "poller loop")
}

// TestRunSupervisesAttachedLoops: a loop the process attaches runs under
// Run's supervisor: its failure fails readiness, naming it, and Run
// returns it; a healthy one stops only after the pending-writes log's
// last pass, which needs it (here: the store answers Settles only while
// the attached loop runs and the server drains).
func TestRunSupervisesAttachedLoops(t *testing.T) {
	cfg, _ := lifecycletest.PendingLogConfig(t)
	led := lifecycletest.NewLedger(t)
	s := newTestServer(t, cfg, led, &lifecycletest.Upstream{Out: 3})
	s.reps.List()[0].Obs.Store(&fleet.Obs{OK: true})
	var running atomic.Bool
	led.Set(func() {
		led.OnSettle = func(context.Context, ledger.Ref) (ledger.Settlement, error, bool) {
			if !running.Load() || !s.draining.Load() {
				return ledger.Settlement{}, ledger.ErrUnavailable, true
			}
			return ledger.Settlement{}, nil, false
		}
	})
	started := make(chan struct{})
	s.Attach("steady", func(ctx context.Context) error {
		running.Store(true)
		close(started)
		<-ctx.Done()
		running.Store(false)
		return nil
	})
	s.Attach("boom", func(context.Context) error { return errors.New("scrape client gone") })

	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- s.Run(ctx) }()
	<-started
	_, err := serve(ctx, s, lifecycle.Admission{Body: lifecycletest.ChatBody("")})
	require.NoError(t, err)
	require.Equal(t, 1, s.settler.Unacked(), "the Settle waits for the store")
	require.Eventually(t, func() bool { ok, _ := s.Ready(); return !ok }, 10*time.Second, time.Millisecond, "the failed loop fails readiness")
	_, why := s.Ready()
	assert.Contains(t, why, "boom loop: scrape client gone")
	assert.Panics(t, func() { s.Attach("late", func(context.Context) error { return nil }) }, "a loop attached after Run would never start")

	cancel()
	err = <-done
	require.ErrorContains(t, err, "boom loop: scrape client gone")
	assert.False(t, running.Load())
	assert.Zero(t, s.settler.Unacked(), "the last pass ran while the attached loop still did")
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, int64(1), lifecycletest.Committed(u, ledger.Requests, time.Hour))
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}

// TestDrainTimeoutAborts: calls still running at the drain timeout are
// aborted and settled from what they streamed; nothing stays held.
func TestDrainTimeoutAborts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 1, Gate: make(chan struct{})}
		s := newTestServer(t, lifecycletest.Config(t, "server: {drain_timeout: 5s}\n", ""), led, up)
		ctx, stop := context.WithCancel(context.Background())
		ran := make(chan error, 1)
		go func() { ran <- s.Run(ctx) }()
		errs := make(chan error, 3)
		for i := range 3 {
			go func() {
				_, err := serve(context.Background(), s, lifecycle.Admission{Body: lifecycletest.ChatBody(""), RequestID: fmt.Sprint(i)})
				errs <- err
			}()
		}
		synctest.Wait()
		start := time.Now()
		stop()
		for range 3 {
			require.ErrorIs(t, <-errs, apierr.ErrDraining)
		}
		assert.Equal(t, 5*time.Second, time.Since(start).Round(time.Second))
		require.NoError(t, <-ran)
		u := tenantUsage(t, s, led.Memory)
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
		assert.Equal(t, int64(3), lifecycletest.Committed(u, ledger.Requests, time.Hour), "three aborted calls charged")
		_ = queue.ErrExpired
	})
}
