package scheduler

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A background loop that ends early fails readiness, naming itself; one
// that ends because its context did is a clean stop.
func TestSuperviseFailsReadiness(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, testConfig(t, "", ""), newFakeLedger(t), &fakeUpstream{})
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
	cfg, _ := outboxTestConfig(t)
	led := newFakeLedger(t)
	s := newTestServer(t, cfg, led, &fakeUpstream{out: 3})
	s.reps.List()[0].Obs.Store(&fleet.Obs{OK: true})
	var running atomic.Bool
	led.set(func() {
		led.settle = func(context.Context, ledger.Ref) (ledger.Settlement, error, bool) {
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
	_, err := serve(ctx, s, admission{body: chatBody("")})
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
	assert.Equal(t, int64(1), committed(u, ledger.Requests, time.Hour))
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}
