//go:build cgo

package gpu

import (
	"bytes"
	"context"
	"errors"
	"log/slog"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// manualClock is a test clock advanced by hand.
type manualClock struct {
	mu sync.Mutex
	t  time.Time
}

func (c *manualClock) now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.t
}

func (c *manualClock) advance(d time.Duration) {
	c.mu.Lock()
	c.t = c.t.Add(d)
	c.mu.Unlock()
}

// syncBuffer is a bytes.Buffer safe for a logger's concurrent writes.
type syncBuffer struct {
	mu sync.Mutex
	b  bytes.Buffer
}

func (s *syncBuffer) Write(p []byte) (int, error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.Write(p)
}

func (s *syncBuffer) String() string {
	s.mu.Lock()
	defer s.mu.Unlock()
	return s.b.String()
}

type rig struct {
	node *fakeNode
	clk  *manualClock
	mon  *Monitor
	logs *syncBuffer
	reg  *prometheus.Registry
}

// newRig builds a Monitor on the DGX H100 mock with r0 on GPUs 0 (by UUID)
// and 1 (by index), and r1 on GPU 2.
func newRig(t *testing.T, cfg Config) *rig {
	t.Helper()
	node := newFakeNode(t)
	clk := &manualClock{t: t0}
	src, err := NewNVML(node.srv, NVMLOptions{InventoryEvery: 1, Now: clk.now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	if cfg.Replicas == nil {
		cfg.Replicas = []Replica{
			{Name: "r0", GPUs: []string{node.uuid(0), "1"}, CapacityTokens: 10_000},
			{Name: "r1", GPUs: []string{node.uuid(2)}, CapacityTokens: 4_000},
		}
	}
	reg := prometheus.NewRegistry()
	met, err := NewMetrics(reg)
	require.NoError(t, err)
	logs := &syncBuffer{}
	mon, err := NewMonitor(cfg, Deps{Source: src, Now: clk.now, Metrics: met,
		Logger: slog.New(slog.NewTextHandler(logs, nil))})
	require.NoError(t, err)
	return &rig{node: node, clk: clk, mon: mon, logs: logs, reg: reg}
}

// tick advances the clock by d and runs one evaluation.
func (r *rig) tick(d time.Duration) {
	r.clk.advance(d)
	r.mon.step(context.Background())
}

func (r *rig) want(t *testing.T, replica string, tokens int64, state State, msg string) {
	t.Helper()
	k, st, why := r.mon.Capacity(replica)
	assert.Equal(t, tokens, k, "%s: capacity (reason %q)", msg, why)
	assert.Equal(t, state, st, "%s: state (reason %q)", msg, why)
}

func TestMonitorThrottleDegradesWithHysteresisAndRecovers(t *testing.T) {
	t.Parallel()
	r := newRig(t, Config{EnterSamples: 3, RecoverSamples: 5})
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 10_000, StateHealthy, "start")

	r.node.set(1, func(g *fakeGPU) { g.reasons = ReasonHWThermal })
	r.tick(100 * time.Millisecond)
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 10_000, StateHealthy, "2 bad samples < enter_samples 3")
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 5_000, StateDegraded, "3rd bad sample")
	_, _, why := r.mon.Capacity("r0")
	assert.Equal(t, "GPU "+r.node.uuid(1)+" throttled (hw_thermal)", why)
	r.want(t, "r1", 4_000, StateHealthy, "r1 is on another GPU")
	assert.InDelta(t, 1.0, value(t, r.mon.met.repState.WithLabelValues("r0")), 0)
	assert.InDelta(t, 5000.0, value(t, r.mon.met.capacity.WithLabelValues("r0")), 0)

	r.node.set(1, func(g *fakeGPU) { g.reasons = 0 })
	for i := range 4 {
		r.tick(100 * time.Millisecond)
		r.want(t, "r0", 5_000, StateDegraded, "recovering sample "+string(rune('1'+i)))
	}
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 10_000, StateHealthy, "5th good sample")
	logs := r.logs.String()
	assert.Contains(t, logs, `msg="replica health worsened" replica=r0 from=healthy to=degraded reason="GPU `+r.node.uuid(1)+` throttled (hw_thermal)"`)
	assert.Contains(t, logs, `msg="replica health recovered" replica=r0 from=degraded to=healthy`)
}

func TestMonitorBlipBelowHysteresisIsIgnored(t *testing.T) {
	t.Parallel()
	r := newRig(t, Config{EnterSamples: 3, RecoverSamples: 5})
	for i := range 10 {
		// Alternate bad and good samples: never 3 bad in a row.
		r.node.set(0, func(g *fakeGPU) { g.reasons = ReasonSWThermal * uint64(i%2) })
		r.tick(100 * time.Millisecond)
		r.want(t, "r0", 10_000, StateHealthy, "flapping")
	}
	assert.NotContains(t, r.logs.String(), "worsened")
}

func TestMonitorFatalXIDDrainsAtOnceAndRecoversAfterHold(t *testing.T) {
	t.Parallel()
	r := newRig(t, Config{FatalHold: time.Second, RecoverSamples: 5})
	r.tick(100 * time.Millisecond)
	r.node.xid(0, 79)
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 0, StateDraining, "XID 79 drains at once")
	_, _, why := r.mon.Capacity("r0")
	assert.Equal(t, "GPU "+r.node.uuid(0)+" XID 79", why)
	r.want(t, "r1", 4_000, StateHealthy, "other replica")
	assert.InDelta(t, 1.0, value(t, r.mon.met.gpuXID.WithLabelValues(r.node.uuid(0), "79")), 0)

	// Held for fatal_hold (1 s) after the event, then 5 good samples.
	for range 9 {
		r.tick(100 * time.Millisecond)
		r.want(t, "r0", 0, StateDraining, "within fatal_hold")
	}
	for range 4 { // from 1.0 s after the XID the hold is over: good samples 1..4
		r.tick(100 * time.Millisecond)
	}
	r.want(t, "r0", 0, StateDraining, "4 good samples")
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 10_000, StateHealthy, "5th good sample after the hold")
}

func TestMonitorUncorrectedECCDrainsAndCorrectedRisingDegrades(t *testing.T) {
	t.Parallel()
	r := newRig(t, Config{EnterSamples: 1, FatalHold: time.Minute})
	r.tick(100 * time.Millisecond)
	r.node.set(2, func(g *fakeGPU) { g.eccCorr = 3 })
	r.tick(100 * time.Millisecond)
	r.want(t, "r1", 2_000, StateDegraded, "corrected ECC rising")
	r.node.set(2, func(g *fakeGPU) { g.eccUnc = 1 })
	r.tick(100 * time.Millisecond)
	r.want(t, "r1", 0, StateDraining, "uncorrected ECC")
	r.tick(30 * time.Second)
	r.want(t, "r1", 0, StateDraining, "still held: counts stopped rising, hold has not passed")
}

func TestMonitorMissingGPUAndMemoryPressure(t *testing.T) {
	t.Parallel()
	r := newRig(t, Config{EnterSamples: 1, Replicas: []Replica{
		{Name: "ghost", GPUs: []string{"GPU-not-here"}, CapacityTokens: 100},
		{Name: "r1", GPUs: []string{"3"}, CapacityTokens: 100},
	}})
	r.node.set(3, func(g *fakeGPU) { g.usedBytes = 81000 << 20 }) // of 81920 MiB
	r.tick(100 * time.Millisecond)
	r.want(t, "ghost", 0, StateDraining, "configured GPU missing")
	r.want(t, "r1", 50, StateDegraded, "memory nearly full")
	_, _, why := r.mon.Capacity("r1")
	assert.Contains(t, why, "memory 81000 of 81920 MiB used")
}

func TestMonitorScrapeFailuresMarkDownAndRecover(t *testing.T) {
	t.Parallel()
	r := newRig(t, Config{DownAfter: 3, RecoverSamples: 2})
	fail := ReplicaMetrics{OK: false, Reason: "dial tcp 127.0.0.1:8100: connection refused"}
	require.NoError(t, r.mon.ObserveReplica("r0", fail))
	require.NoError(t, r.mon.ObserveReplica("r0", fail))
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 10_000, StateHealthy, "2 failures")
	require.NoError(t, r.mon.ObserveReplica("r0", fail))
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 0, StateDown, "3 failures")
	_, _, why := r.mon.Capacity("r0")
	assert.Equal(t, "3 failed scrapes in a row: dial tcp 127.0.0.1:8100: connection refused", why)

	require.NoError(t, r.mon.ObserveReplica("r0", ReplicaMetrics{OK: true, KVUsage: 0.95}))
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 0, StateDown, "1 good sample")
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 10_000, StateHealthy, "2 good samples")
}

func TestMonitorStaleScrapeDegrades(t *testing.T) {
	t.Parallel()
	r := newRig(t, Config{StaleAfter: time.Second, EnterSamples: 1, RecoverSamples: 1})
	require.NoError(t, r.mon.ObserveReplica("r1", ReplicaMetrics{OK: true, KVUsage: 0.95}))
	r.tick(time.Second)
	r.want(t, "r1", 4_000, StateHealthy, "1 s old: not yet stale")
	r.tick(time.Millisecond)
	r.want(t, "r1", 2_000, StateDegraded, "stale scrape")
	v, _ := r.mon.Snapshot().Replica("r1")
	assert.True(t, v.ScrapeStale)
	assert.Equal(t, "stale scrape (last good 1.001s ago)", v.Reason)
	assert.InDelta(t, 1.0, value(t, r.mon.met.repStale.WithLabelValues("r1")), 0)
	require.NoError(t, r.mon.ObserveReplica("r1", ReplicaMetrics{OK: true, KVUsage: 0.95}))
	r.tick(time.Millisecond)
	r.want(t, "r1", 4_000, StateHealthy, "fresh scrape")
}

// flakySource fails while fail is set.
type flakySource struct {
	inner Source
	mu    sync.Mutex
	fail  bool
}

func (f *flakySource) Poll(ctx context.Context) (Sample, error) {
	f.mu.Lock()
	fail := f.fail
	f.mu.Unlock()
	if fail {
		return Sample{}, errors.New("nvml: ERROR_UNKNOWN")
	}
	return f.inner.Poll(ctx)
}

func TestMonitorStaleTelemetryIsVisibleAndDegrades(t *testing.T) {
	t.Parallel()
	node := newFakeNode(t)
	clk := &manualClock{t: t0}
	nv, err := NewNVML(node.srv, NVMLOptions{Now: clk.now})
	require.NoError(t, err)
	src := &flakySource{inner: nv}
	reg := prometheus.NewRegistry()
	met, err := NewMetrics(reg)
	require.NoError(t, err)
	mon, err := NewMonitor(Config{StaleAfter: time.Second, EnterSamples: 1, RecoverSamples: 1,
		Replicas: []Replica{{Name: "r0", GPUs: []string{"0"}, CapacityTokens: 100}}},
		Deps{Source: src, Now: clk.now, Metrics: met})
	require.NoError(t, err)
	mon.step(context.Background())
	src.mu.Lock()
	src.fail = true
	src.mu.Unlock()
	for range 10 {
		clk.advance(100 * time.Millisecond)
		mon.step(context.Background())
	}
	assert.False(t, mon.Snapshot().TelemetryStale, "exactly stale_after old")
	clk.advance(100 * time.Millisecond)
	mon.step(context.Background())
	assert.True(t, mon.Snapshot().TelemetryStale)
	assert.InDelta(t, 1.0, value(t, met.stale), 0)
	assert.InDelta(t, 1.1, value(t, met.age), 1e-9)
	clk.advance(5 * time.Second) // no poll at all: a stuck loop still shows
	assert.InDelta(t, 6.1, value(t, met.age), 1e-9)
	clk.advance(-5 * time.Second)
	k, st, why := mon.Capacity("r0")
	assert.Equal(t, int64(50), k)
	assert.Equal(t, StateDegraded, st)
	assert.Equal(t, "stale GPU telemetry (last good 1.1s ago)", why)

	src.mu.Lock()
	src.fail = false
	src.mu.Unlock()
	clk.advance(100 * time.Millisecond)
	mon.step(context.Background())
	assert.InDelta(t, 0.0, value(t, met.stale), 0)
	k, st, _ = mon.Capacity("r0")
	assert.Equal(t, int64(100), k)
	assert.Equal(t, StateHealthy, st)
}

func TestMonitorOperatorDrain(t *testing.T) {
	t.Parallel()
	r := newRig(t, Config{RecoverSamples: 1})
	require.NoError(t, r.mon.Drain("r0", "maintenance"))
	r.want(t, "r0", 0, StateDraining, "drained at once")
	r.tick(time.Second)
	r.want(t, "r0", 0, StateDraining, "stays drained")
	require.NoError(t, r.mon.Drain("r0", ""))
	r.tick(100 * time.Millisecond)
	r.want(t, "r0", 10_000, StateHealthy, "undrained")
	require.ErrorIs(t, r.mon.Drain("nope", "x"), ErrUnknownReplica)
}

func TestMonitorSizing(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name     string
		cfg      Config
		replica  Replica
		obs      ReplicaMetrics
		drain    bool
		want     int64
		wantBase int64
	}{
		{name: "KV blocks × block size", replica: Replica{Name: "r"},
			obs: ReplicaMetrics{OK: true, NumGPUBlocks: 2048, BlockSize: 16, KVUsage: 0.95}, want: 32768, wantBase: 32768},
		{name: "KV capacity halved → half", replica: Replica{Name: "r"},
			obs: ReplicaMetrics{OK: true, NumGPUBlocks: 1024, BlockSize: 16, KVUsage: 0.95}, want: 16384, wantBase: 16384},
		{name: "operator override wins", replica: Replica{Name: "r", CapacityTokens: 5000},
			obs: ReplicaMetrics{OK: true, NumGPUBlocks: 1024, BlockSize: 16, KVUsage: 0.95}, want: 5000, wantBase: 5000},
		{name: "target occupancy", cfg: Config{TargetOccupancy: 0.75}, replica: Replica{Name: "r"},
			obs: ReplicaMetrics{OK: true, NumGPUBlocks: 1000, BlockSize: 16, KVUsage: 0.95}, want: 12000, wantBase: 12000},
		{name: "no scrape, no override → 0", replica: Replica{Name: "r"}, want: 0, wantBase: 0},
		{name: "draining → 0", replica: Replica{Name: "r"}, drain: true,
			obs: ReplicaMetrics{OK: true, NumGPUBlocks: 2048, BlockSize: 16, KVUsage: 0.95}, want: 0, wantBase: 32768},
		{name: "one healthy scrape grows overcommit by one step", replica: Replica{Name: "r"},
			obs: ReplicaMetrics{OK: true, NumGPUBlocks: 1000, BlockSize: 10, KVUsage: 0.5}, want: 10500, wantBase: 10000},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := tt.cfg
			cfg.Replicas = []Replica{tt.replica}
			mon, err := NewMonitor(cfg, Deps{})
			require.NoError(t, err)
			if tt.obs.OK {
				require.NoError(t, mon.ObserveReplica("r", tt.obs))
			}
			if tt.drain {
				require.NoError(t, mon.Drain("r", "test"))
			}
			v, ok := mon.Snapshot().Replica("r")
			require.True(t, ok)
			assert.Equal(t, tt.want, v.CapacityTokens)
			assert.Equal(t, tt.wantBase, v.BaseTokens)
		})
	}
}

func TestMonitorOvercommitAIMD(t *testing.T) {
	t.Parallel()
	mon, err := NewMonitor(Config{MaxOvercommit: 2, OvercommitStep: 0.25, WaitingPersist: 2,
		Replicas: []Replica{{Name: "r", CapacityTokens: 1000}}}, Deps{})
	require.NoError(t, err)
	good := ReplicaMetrics{OK: true, KVUsage: 0.5}
	steps := []struct {
		name string
		obs  ReplicaMetrics
		want float64
	}{
		{"grow", good, 1.25},
		{"grow", good, 1.5},
		{"grow", good, 1.75},
		{"grow", good, 2},
		{"capped at max_overcommit", good, 2},
		{"kv above high water: hold", ReplicaMetrics{OK: true, KVUsage: 0.95}, 2},
		{"preemptions rise: halve", ReplicaMetrics{OK: true, KVUsage: 0.5, Preemptions: 3}, 1},
		{"flat preemptions: grow", ReplicaMetrics{OK: true, KVUsage: 0.5, Preemptions: 3}, 1.25},
		{"grow", ReplicaMetrics{OK: true, KVUsage: 0.5, Preemptions: 3}, 1.5},
		{"waiting once: hold", ReplicaMetrics{OK: true, KVUsage: 0.5, Preemptions: 3, Waiting: 4}, 1.5},
		{"waiting persists: halve", ReplicaMetrics{OK: true, KVUsage: 0.5, Preemptions: 3, Waiting: 2}, 1},
		{"failed scrape: hold", ReplicaMetrics{OK: false}, 1},
		{"counter reset (restart): grow", ReplicaMetrics{OK: true, KVUsage: 0.5}, 1.25},
	}
	for i, s := range steps {
		require.NoError(t, mon.ObserveReplica("r", s.obs))
		v, _ := mon.Snapshot().Replica("r")
		assert.InDelta(t, s.want, v.Overcommit, 1e-12, "step %d %s", i, s.name)
		assert.Equal(t, int64(1000*s.want), v.CapacityTokens, "step %d %s", i, s.name)
	}
}

func TestMonitorHoldUsesFleetMaxTimesMargin(t *testing.T) {
	t.Parallel()
	mon, err := NewMonitor(Config{Replicas: []Replica{
		{Name: "a", GPUMsPerInputToken: 0.1, GPUMsPerOutputToken: 1},
		{Name: "b", GPUMsPerInputToken: 0.2, GPUMsPerOutputToken: 0.5},
	}}, Deps{})
	require.NoError(t, err)
	// max a = 0.2, max b = 1; (0.2·1000 + 1·100) × 1.2 = 360.
	assert.Equal(t, int64(360), mon.Hold(1000, 100))
	assert.InDelta(t, 150.0, mon.Estimator("a").Estimate(500, 100), 1e-9)
	assert.Nil(t, mon.Estimator("zz"))
	assert.Nil(t, mon.Clock("zz"))
}

func TestMonitorUnknownReplica(t *testing.T) {
	t.Parallel()
	mon, err := NewMonitor(Config{Replicas: []Replica{{Name: "r"}}}, Deps{})
	require.NoError(t, err)
	require.ErrorIs(t, mon.ObserveReplica("x", ReplicaMetrics{OK: true}), ErrUnknownReplica)
	k, st, why := mon.Capacity("x")
	assert.Equal(t, int64(0), k)
	assert.Equal(t, StateDown, st)
	assert.Equal(t, "unknown replica", why)
}

func TestMonitorRejectsBadConfig(t *testing.T) {
	t.Parallel()
	_, err := NewMonitor(Config{DegradedFactor: 2}, Deps{})
	require.EqualError(t, err, "gpu.degraded_factor must be in (0, 1]")
}

func TestMonitorVLLMModeMetersSimCounters(t *testing.T) {
	t.Parallel()
	clk := &manualClock{t: t0}
	reg := prometheus.NewRegistry()
	met, err := NewMetrics(reg)
	require.NoError(t, err)
	attr, err := NewAttributionMetrics(reg)
	require.NoError(t, err)
	mon, err := NewMonitor(Config{Telemetry: ModeVLLM, Replicas: []Replica{{Name: "r0", GPUCount: 2}}},
		Deps{Source: NewVLLM(clk.now), Now: clk.now, Metrics: met, Attribution: attr})
	require.NoError(t, err)
	obs := func(busy, joules float64) ReplicaMetrics {
		return ReplicaMetrics{OK: true, NumGPUBlocks: 100, BlockSize: 16, HasSimGPUUtilization: true, SimGPUUtilization: 0.6,
			HasSimGPUBusy: true, SimGPUBusySeconds: busy, HasSimGPUEnergy: true, SimGPUEnergyJoules: joules, At: clk.now()}
	}
	require.NoError(t, mon.ObserveReplica("r0", obs(10, 5000))) // the baseline
	mon.step(context.Background())
	s := mon.Snapshot()
	require.Len(t, s.GPUs, 2)
	assert.Equal(t, "vllm:r0/0", s.GPUs[0].UUID)
	assert.InDelta(t, 0.6, s.GPUs[1].Utilization, 0)
	v, _ := s.Replica("r0")
	assert.InDelta(t, 0.6, v.Utilization, 0)
	assert.InDelta(t, 0.6, value(t, met.gpuUtil.WithLabelValues("vllm:r0/1")), 0)

	c := mon.Clock("r0")
	tk := c.Start(clk.now(), "acme")
	clk.advance(time.Second)
	mon.step(context.Background()) // counters, not polls, close this replica's intervals
	require.NoError(t, mon.ObserveReplica("r0", obs(10.6, 5400)))
	assert.Equal(t, Use{GPUNs: 1_200_000_000, EnergyUJ: 400_000_000}, c.End(clk.now(), tk), "0.6 s busy × 2 GPUs; 400 J")
	mon.step(context.Background())
	assert.InDelta(t, 1.2, value(t, met.busy.WithLabelValues("r0")), 1e-9)
	assert.InDelta(t, 400, value(t, met.energy.WithLabelValues("r0")), 1e-9)
	assert.InDelta(t, 1200, value(t, attr.gpuMs.WithLabelValues("acme")), 1e-9)
	assert.InDelta(t, 400, value(t, attr.joules.WithLabelValues("acme")), 1e-9)
	// A restart (counters back to 0) starts a new baseline: nothing negative.
	require.NoError(t, mon.ObserveReplica("r0", obs(0.1, 10)))
	mon.step(context.Background())
	assert.InDelta(t, 1.2, value(t, met.busy.WithLabelValues("r0")), 1e-9)
}

func TestMonitorWithoutSimRatioCountsBusyWhileRunning(t *testing.T) {
	t.Parallel()
	clk := &manualClock{t: t0}
	mon, err := NewMonitor(Config{Telemetry: ModeOff, Replicas: []Replica{{Name: "r0"}}},
		Deps{Now: clk.now})
	require.NoError(t, err)
	require.NoError(t, mon.ObserveReplica("r0", ReplicaMetrics{OK: true, Running: 3}))
	mon.step(context.Background())
	c := mon.Clock("r0")
	clk.advance(time.Second) // idle: nothing local runs, so nothing is busy
	tk := c.Start(clk.now(), "acme")
	clk.advance(250 * time.Millisecond)
	mon.step(context.Background())
	clk.advance(250 * time.Millisecond)
	assert.Equal(t, Use{GPUNs: 500_000_000}, c.End(clk.now(), tk))
	assert.Equal(t, ClockTotals{BusyGPUNs: 500_000_000}, c.Totals())
}

// TestMonitorNVMLAttributesBusyHalfByRunningTime (go-nvml's DGX H100
// mock): in an interval where the GPU's utilisation samples show it idle
// half the time, two tenants get exactly the busy half, split by their
// running time (1/n per instant), and the energy counter's delta the same
// way.
func TestMonitorNVMLAttributesBusyHalfByRunningTime(t *testing.T) {
	t.Parallel()
	node := newFakeNode(t)
	clk := &manualClock{t: t0}
	src, err := NewNVML(node.srv, NVMLOptions{Now: clk.now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	reg := prometheus.NewRegistry()
	met, err := NewMetrics(reg)
	require.NoError(t, err)
	attr, err := NewAttributionMetrics(reg)
	require.NoError(t, err)
	mon, err := NewMonitor(Config{Replicas: []Replica{{Name: "r0", GPUs: []string{node.uuid(2)}, CapacityTokens: 1000}}},
		Deps{Source: src, Now: clk.now, Metrics: met, Attribution: attr})
	require.NoError(t, err)
	ms := func(d int) time.Time { return t0.Add(time.Duration(d) * time.Millisecond) }
	node.sample(2, ms(0), 0)
	node.set(2, func(g *fakeGPU) { g.energyMJ = 1_000_000 })
	clk.advance(100 * time.Millisecond)
	mon.step(context.Background()) // reads the samples' baseline
	clk.advance(100 * time.Millisecond)
	mon.step(context.Background()) // the counters' baseline, at 200 ms

	c := mon.Clock("r0")
	a := c.Start(ms(200), "acme")
	b := c.Start(ms(250), "beta")
	assert.Equal(t, Use{GPUNs: 25e6}, c.End(ms(300), b), "settled before any interval with work: busy while it ran")
	// 200–300 ms: a kernel ran 200–250 (one 100 % sample), none 250–300.
	node.sample(2, ms(200), 0) // 0–200 ms idle, read with the next poll
	node.sample(2, ms(250), 100)
	node.sample(2, ms(300), 0)
	node.set(2, func(g *fakeGPU) { g.energyMJ += 30_000 })
	clk.advance(100 * time.Millisecond)
	mon.step(context.Background())
	// acme: 50 ms alone + 50 ms shared = 75 ms of share; beta 25 ms.
	assert.InDelta(t, 37.5, value(t, attr.gpuMs.WithLabelValues("acme")), 1e-9)
	assert.InDelta(t, 12.5, value(t, attr.gpuMs.WithLabelValues("beta")), 1e-9)
	assert.InDelta(t, 22.5, value(t, attr.joules.WithLabelValues("acme")), 1e-9)
	assert.InDelta(t, 7.5, value(t, attr.joules.WithLabelValues("beta")), 1e-9)
	assert.InDelta(t, 0.05, value(t, met.busy.WithLabelValues("r0")), 1e-12, "exactly the busy half")
	assert.InDelta(t, 0.0, value(t, met.unattributed.WithLabelValues("r0")), 0)
	assert.InDelta(t, 30.0, value(t, met.energy.WithLabelValues("r0")), 1e-12)
	// acme settles at the last interval's rate: 0.5 busy, 300 W.
	clk.advance(100 * time.Millisecond)
	assert.Equal(t, Use{GPUNs: 37.5e6 + 50e6, EnergyUJ: 22.5e6 + 30e6}, c.End(clk.now(), a))
	s := mon.Snapshot()
	assert.Equal(t, int64(50e6), s.GPUs[2].BusyNs)
	assert.Equal(t, int64(1_030_000), s.GPUs[2].EnergyMJ)
}

// TestNVMLMetersFallBackToUtilizationAndPower: without utilisation samples
// or an energy counter, busy time integrates utilisation and energy power
// over the poll intervals.
func TestNVMLMetersFallBackToUtilizationAndPower(t *testing.T) {
	t.Parallel()
	node := newFakeNode(t)
	node.set(0, func(g *fakeGPU) { g.noSamples, g.noEnergy, g.util, g.powerMW = true, true, 40, 250_000 })
	clk := &manualClock{t: t0}
	src, err := NewNVML(node.srv, NVMLOptions{Now: clk.now})
	require.NoError(t, err)
	t.Cleanup(func() { _ = src.Close() })
	clk.advance(500 * time.Millisecond)
	s, err := src.Poll(context.Background())
	require.NoError(t, err)
	assert.Equal(t, int64(200e6), s.GPUs[0].BusyNs, "40 % of 500 ms")
	assert.Equal(t, int64(125_000), s.GPUs[0].EnergyMJ, "250 W × 0.5 s")
	assert.Equal(t, int64(0), s.GPUs[1].BusyNs, "samples supported, none yet")
}

func TestMonitorRunPollsEveryIntervalUntilCancelled(t *testing.T) {
	t.Parallel()
	synctestRun(t, func(t *testing.T) {
		src := &countingSource{}
		mon, err := NewMonitor(Config{PollInterval: 100 * time.Millisecond}, Deps{Source: src})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- mon.Run(ctx) }()
		time.Sleep(1050 * time.Millisecond) // fake time inside the bubble
		cancel()
		require.NoError(t, <-done)
		assert.Equal(t, 11, src.n(), "one at start + one per 100 ms")
	})
}

type countingSource struct {
	mu    sync.Mutex
	polls int
}

func (c *countingSource) Poll(context.Context) (Sample, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.polls++
	return Sample{Source: "off", At: time.Now()}, nil
}

func (c *countingSource) n() int {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.polls
}

func TestVLLMSourceOrdersByReplicaAndKeepsLastOnFailure(t *testing.T) {
	t.Parallel()
	v := NewVLLM(func() time.Time { return t0 })
	v.ObserveReplica("b", 1, ReplicaMetrics{OK: true, HasSimGPUUtilization: true, SimGPUUtilization: 0.25})
	v.ObserveReplica("a", 2, ReplicaMetrics{OK: true, Running: 2})
	v.ObserveReplica("b", 1, ReplicaMetrics{OK: false})
	s, err := v.Poll(context.Background())
	require.NoError(t, err)
	require.Len(t, s.GPUs, 3)
	assert.Equal(t, []string{"vllm:a/0", "vllm:a/1", "vllm:b/0"}, []string{s.GPUs[0].UUID, s.GPUs[1].UUID, s.GPUs[2].UUID})
	assert.InDelta(t, -1.0, s.GPUs[0].Utilization, 0, "no sim ratio: unknown")
	assert.InDelta(t, 0.25, s.GPUs[2].Utilization, 0, "failed scrape keeps the last value")
	assert.Equal(t, "vllm", s.Source)
	assert.Equal(t, t0, s.At)
}

func TestAttributionMetrics(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	a, err := NewAttributionMetrics(reg)
	require.NoError(t, err)
	a.add("acme", Use{GPUNs: 1_250_000, EnergyUJ: 2_500_000})
	a.add("acme", Use{GPUNs: 2_000_000})
	a.add("beta", Use{GPUNs: -1, EnergyUJ: -1})
	a.Overrun("acme", 3)
	a.Overrun("acme", 0)
	assert.InDelta(t, 3.25, value(t, a.gpuMs.WithLabelValues("acme")), 1e-12)
	assert.InDelta(t, 2.5, value(t, a.joules.WithLabelValues("acme")), 1e-12)
	assert.InDelta(t, 3.0, value(t, a.overrun.WithLabelValues("acme")), 0)
	assert.InDelta(t, 0.0, value(t, a.gpuMs.WithLabelValues("beta")), 0)
	_, err = NewAttributionMetrics(reg)
	require.Error(t, err, "registering twice is refused")
	var nilA *AttributionMetrics
	nilA.Overrun("x", 1) // a nil *AttributionMetrics records nothing
}

func TestMonitorHalvedKVGivesHalfCapacityAndDrainGivesZero(t *testing.T) {
	t.Parallel()
	mon, err := NewMonitor(Config{MaxOvercommit: 1, Replicas: []Replica{{Name: "r"}}}, Deps{})
	require.NoError(t, err)
	require.NoError(t, mon.ObserveReplica("r", ReplicaMetrics{OK: true, NumGPUBlocks: 4096, BlockSize: 16}))
	k1, _, _ := mon.Capacity("r")
	require.NoError(t, mon.ObserveReplica("r", ReplicaMetrics{OK: true, NumGPUBlocks: 2048, BlockSize: 16}))
	k2, _, _ := mon.Capacity("r")
	assert.Equal(t, int64(65536), k1)
	assert.Equal(t, k1/2, k2, "half the KV, half the capacity")
	require.NoError(t, mon.Drain("r", "test"))
	k3, st, why := mon.Capacity("r")
	assert.Equal(t, int64(0), k3)
	assert.Equal(t, StateDraining, st)
	assert.Equal(t, "operator drain: test", why)
}
