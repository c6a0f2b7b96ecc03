package scheduler

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/queue"
)

// TestExpiredAtDispatchRecheckCounts: a call whose deadline passes while
// its MarkDispatched is in flight is caught by the re-check after it:
// never sent upstream, counted in sluice_expired_dispatch_total, and its
// hold settled at zero.
func TestExpiredAtDispatchRecheckCounts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newFakeLedger(t)
		up := &fakeUpstream{out: 1}
		s := newTestServer(t, testConfig(t, "", ""), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.q.Run(ctx) }()
		led.set(func() {
			led.dispatch = func(context.Context, ledger.Ref) (error, bool) {
				time.Sleep(2 * time.Second) // a slow slot round trip, in fake time
				return nil, false
			}
		})
		_, err := serve(ctx, s, admission{body: chatBody(""), timeout: time.Second})
		require.ErrorIs(t, err, queue.ErrExpired)
		var m dto.Metric
		require.NoError(t, s.m.ExpiredDispatch.Write(&m))
		assert.InDelta(t, 1.0, m.GetCounter().GetValue(), 0, "sluice_expired_dispatch_total")
		assert.Equal(t, int64(0), up.runs.Load(), "never sent upstream")
		assert.Equal(t, 1, led.n("dispatch"))
		u := tenantUsage(t, s, led.Memory)
		assert.Equal(t, ledger.Amounts{}, u.Reserved, "nothing left held")
		assert.Equal(t, 0, u.Unresolved)
	})
}

// failingSource is GPU telemetry whose every poll fails.
type failingSource struct{}

func (failingSource) Poll(context.Context) (gpu.Sample, error) {
	return gpu.Sample{}, errors.New("nvml: GPU is lost")
}

// TestReadyFailsWhileGPUTelemetryFails: a GPU telemetry loop whose polls
// keep failing past stale_after reaches /readyz's answer, and recovers
// from it when polls succeed again.
func TestReadyFailsWhileGPUTelemetryFails(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		var src atomic.Pointer[gpu.Source]
		set := func(s gpu.Source) { src.Store(&s) }
		set(failingSource{})
		mon, err := gpu.NewMonitor(gpu.Config{Telemetry: gpu.ModeOff, StaleAfter: time.Second,
			Replicas: []gpu.Replica{{Name: "r0", CapacityTokens: 1 << 20}}},
			gpu.Deps{Source: sourceFunc(func(ctx context.Context) (gpu.Sample, error) { return (*src.Load()).Poll(ctx) })})
		require.NoError(t, err)
		keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
		require.NoError(t, err)
		s, err := New(testConfig(t, "", ""), Deps{Ledger: newFakeLedger(t), Upstream: &fakeUpstream{}, Keyer: keyer, GPU: mon})
		require.NoError(t, err)
		s.reps.Capacity = fixedCapacity(map[string]int64{"r0": 1 << 20})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		done := make(chan error, 1)
		go func() { done <- mon.Run(ctx) }()
		synctest.Wait()
		ok, why := s.Ready()
		assert.True(t, ok, "one failed poll is not yet a failure: %s", why)
		time.Sleep(1500 * time.Millisecond)
		synctest.Wait()
		ok, why = s.Ready()
		assert.False(t, ok)
		assert.Regexp(t, `^gpu telemetry failing for 1\.[0-9]+s: nvml: GPU is lost$`, why)
		set(gpu.NewOff(nil))
		time.Sleep(200 * time.Millisecond)
		synctest.Wait()
		ok, why = s.Ready()
		assert.True(t, ok, why)
		cancel()
		require.NoError(t, <-done)
	})
}

type sourceFunc func(ctx context.Context) (gpu.Sample, error)

func (f sourceFunc) Poll(ctx context.Context) (gpu.Sample, error) { return f(ctx) }
