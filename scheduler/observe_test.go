package scheduler

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/vllm"
)

// snapSource serves one replica's poll snapshot, set by the test.
type snapSource struct{ snap *vllm.Replica }

func (s *snapSource) Get(string) (*vllm.Replica, bool) { return s.snap, true }

// TestObserveCountsEachFailedPollOnce: down_after counts polls that are
// evidence against the replica. The same failed poll seen on two Observe
// ticks counts once, and polls that only timed out while the replica kept
// completing requests (a slow /metrics under load) do not count; three
// timeouts with nothing completing, or three refusals, mark it down.
func TestObserveCountsEachFailedPollOnce(t *testing.T) {
	synctest.Test(t, testObserveCountsEachFailedPollOnce)
}

func testObserveCountsEachFailedPollOnce(t *testing.T) {
	s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
	// The monitor judges health on its own ticks: run it on the bubble's
	// clock and let one tick pass after each Observe.
	ctx, cancel := context.WithCancel(t.Context())
	defer cancel()
	go func() { _ = s.gpu.(*gpu.Monitor).Run(ctx) }()
	tick := func() {
		time.Sleep(s.gpu.Config().PollInterval)
		synctest.Wait()
	}
	r := s.reps.List()[0]
	src := &snapSource{}
	at := time.Unix(1_800_000_000, 0)
	poll := func(ok, timedOut bool) {
		at = at.Add(time.Second)
		src.snap = &vllm.Replica{Name: "r0", Up: ok, Healthy: ok, CheckedAt: at, ScrapedAt: at, TimedOut: timedOut,
			Metrics: vllm.Metrics{Running: vllm.Value{OK: true}, Waiting: vllm.Value{OK: true}}}
		if !ok {
			src.snap.LastError = "health: context deadline exceeded"
		}
	}
	state := func() gpu.State {
		tick()
		v, _ := s.gpu.Snapshot().Replica("r0")
		return v.State
	}
	poll(true, false)
	s.Observe(t.Context(), src, nil)
	assert.Less(t, state(), gpu.StateDown)

	// A definite failure, observed five times: one failed poll.
	poll(false, false)
	for range 5 {
		s.Observe(t.Context(), src, nil)
	}
	assert.Less(t, state(), gpu.StateDown, "one failed poll seen five times")

	// Timeouts while requests complete: slow, not dead.
	for range 5 {
		r.Finished.Add(1)
		poll(false, true)
		s.Observe(t.Context(), src, nil)
	}
	assert.Less(t, state(), gpu.StateDown, "timeouts while the replica completes requests")

	// Timeouts with nothing completing: the first plus two more make three.
	for range 2 {
		poll(false, true)
		s.Observe(t.Context(), src, nil)
	}
	assert.Equal(t, gpu.StateDown, state(), "three polls of evidence in a row")
}

// TestObserveLoopRunsAsPollsLand: a round of polls reaches dispatch as it
// lands (the poller's Polled), not at the loop's next tick an interval on.
func TestObserveLoopRunsAsPollsLand(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
		r := s.reps.List()[0]
		src := &snapSource{}
		at := time.Unix(1_800_000_000, 0)
		poll := func(running float64) {
			at = at.Add(time.Second)
			src.snap = &vllm.Replica{Name: "r0", Up: true, Healthy: true, CheckedAt: at, ScrapedAt: at,
				Metrics: vllm.Metrics{Running: vllm.Value{V: running, OK: true}, Waiting: vllm.Value{OK: true}}}
		}
		poll(1)
		polled := make(chan struct{}, 1)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- s.ObserveLoop(ctx, src, nil, time.Hour, polled) }()
		synctest.Wait() // the first round, observed at start
		assert.Equal(t, int64(1), r.Obs.Load().Running)

		poll(3)
		synctest.Wait()
		assert.Equal(t, int64(1), r.Obs.Load().Running, "not observed before it is signalled")
		polled <- struct{}{}
		synctest.Wait() // no time passes: the hour's tick is not what ran it
		assert.Equal(t, int64(3), r.Obs.Load().Running)

		cancel()
		assert.NoError(t, <-done)
	})
}

// TestRampNeedsTheLearningScrape: replicas ramp (upstream.learn_ramp) only
// while the learning scrape runs: at the scrape interval the climb would
// take seconds.
func TestRampNeedsTheLearningScrape(t *testing.T) {
	for _, c := range []struct {
		ramp, want float64
		learn      time.Duration
	}{
		{0.5, 0.5, 200 * time.Millisecond}, // the defaults
		{0.25, 0.25, 200 * time.Millisecond},
		{0.5, 0, time.Second}, // the learning scrape off: no ramp
	} {
		cfg := lifecycletest.Config(t, "", "")
		*cfg.Upstream.LearnRamp, cfg.Upstream.LearnScrapeInterval = c.ramp, c.learn
		s := newTestServer(t, cfg, lifecycletest.NewLedger(t), &lifecycletest.Upstream{Out: 1})
		assert.Equal(t, c.want, s.reps.Get("r0").Ramp, "learn_ramp %v, learn_scrape_interval %v", c.ramp, c.learn)
	}
}
