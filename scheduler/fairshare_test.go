package scheduler

import (
	"context"
	"errors"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/queue/fleet"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
)

// fakeFairExchange is a fairExchange whose answers the test sets.
type fakeFairExchange struct {
	mu      sync.Mutex
	answer  map[string][]fleet.Flow
	err     error
	hang    bool // block until the exchange's context ends
	reports [][]fleet.Flow
	left    bool
}

func (f *fakeFairExchange) ExchangeFlows(ctx context.Context, r []fleet.Flow) (map[string][]fleet.Flow, error) {
	f.mu.Lock()
	f.reports = append(f.reports, r)
	hang, answer, err := f.hang, f.answer, f.err
	f.mu.Unlock()
	if hang {
		<-ctx.Done()
		return nil, ctx.Err()
	}
	if err != nil {
		return nil, err
	}
	return answer, nil
}

func (f *fakeFairExchange) LeaveFlows(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.left = true
	return nil
}

func (f *fakeFairExchange) set(answer map[string][]fleet.Flow, err error, hang bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer, f.err, f.hang = answer, err, hang
}

// TestFairShareLoop: the loop adds the others' service to the counters
// (only its growth after the first answer), says so in
// sluice_fair_share_fleet, falls back to local fair share 2 s after the
// last exchange that answered, whether the exchange fails at once or
// hangs, and withdraws its report at the end.
func TestFairShareLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
		gauge := func() float64 {
			var m dto.Metric
			require.NoError(t, s.m.FairShareFleet.Write(&m))
			return m.GetGauge().GetValue()
		}
		counter := func() float64 {
			v, ok := s.Queue().Counter("acme", 0)
			require.True(t, ok)
			return v
		}
		ex := &fakeFairExchange{}
		ex.set(map[string][]fleet.Flow{"other": {{Tenant: "acme", Service: 1000, Backlogged: true}, {Tenant: "unknown", Service: 5}}}, nil, false)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		assert.Zero(t, gauge(), "local until an exchange answers")
		go func() { done <- s.FairShareLoop(ctx, ex) }()

		time.Sleep(shareInterval)
		synctest.Wait()
		assert.Equal(t, 1.0, gauge())
		assert.Equal(t, 1000.0, counter(), "the other instance's service, over weight 1")

		ex.set(map[string][]fleet.Flow{"other": {{Tenant: "acme", Service: 1500, Backlogged: true}}}, nil, false)
		time.Sleep(shareInterval)
		synctest.Wait()
		assert.Equal(t, 1500.0, counter(), "only the growth is added")
		lastOK := time.Now()

		ex.set(nil, errors.New("store down"), false)
		time.Sleep(FairStale - time.Millisecond)
		synctest.Wait()
		assert.Equal(t, 1.0, gauge(), "fleet-wide while the last answer is under 2 s old")
		time.Sleep(time.Millisecond)
		synctest.Wait()
		assert.Zero(t, gauge(), "local 2 s after the last answer")
		assert.Equal(t, FairStale, time.Since(lastOK))

		ex.set(map[string][]fleet.Flow{"other": {{Tenant: "acme", Service: 1600}}}, nil, false)
		time.Sleep(shareInterval)
		synctest.Wait()
		assert.Equal(t, 1.0, gauge(), "fleet-wide again")
		assert.Equal(t, 1600.0, counter())
		lastOK = time.Now()

		ex.set(nil, nil, true)
		time.Sleep(FairStale)
		synctest.Wait()
		assert.Zero(t, gauge(), "a hanging exchange falls back as soon")

		cancel()
		require.NoError(t, <-done)
		ex.mu.Lock()
		defer ex.mu.Unlock()
		assert.True(t, ex.left)
		require.NotEmpty(t, ex.reports)
		assert.Equal(t, []fleet.Flow{{Tenant: "acme", Service: 0}}, ex.reports[1], "this instance's own service only")
	})
}
