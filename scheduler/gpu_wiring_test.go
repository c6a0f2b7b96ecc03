package scheduler

import (
	"context"
	"errors"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
)

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
		s, err := New(lifecycletest.Config(t, "", ""), Deps{Ledger: lifecycletest.NewLedger(t), Upstream: &lifecycletest.Upstream{}, Keyer: keyer, GPU: mon})
		require.NoError(t, err)
		s.reps.Capacity = lifecycletest.FixedCapacity(map[string]int64{"r0": 1 << 20})
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
