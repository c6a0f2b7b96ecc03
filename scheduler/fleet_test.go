package scheduler

import (
	"math"
	"testing"
	"testing/synctest"
	"time"

	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/vllm"
)

// TestDeferredWaitingKeepsOvercommit: requests vLLM reports waiting
// "deferred" (a LoRA slot, a KV transfer) are no sign of a full replica:
// they do not cut the overcommit, while the same number waiting for
// capacity halves it.
func TestDeferredWaitingKeepsOvercommit(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
	src := &snapSource{}
	at := time.Unix(1_800_000_000, 0)
	poll := func(capacity, deferred float64) float64 {
		at = at.Add(time.Second)
		ok := func(x float64) vllm.Value { return vllm.Value{V: x, OK: true} }
		src.snap = &vllm.Replica{Name: "r0", Up: true, Healthy: true, CheckedAt: at, ScrapedAt: at,
			Metrics: vllm.Metrics{Running: ok(4), Waiting: ok(capacity + deferred), WaitingCapacity: ok(capacity), WaitingDeferred: ok(deferred)}}
		s.Observe(t.Context(), src, nil)
		v, _ := s.gpu.Snapshot().Replica("r0")
		return v.Overcommit
	}
	var oc float64
	for range 10 {
		oc = poll(0, 0)
	}
	require.Greater(t, oc, 1.2, "overcommit grew while nothing waited")
	for range 5 {
		assert.GreaterOrEqual(t, poll(0, 5), oc, "deferred waiting does not mean full")
	}
	before := poll(0, 0)
	poll(5, 0)
	assert.Less(t, poll(5, 0), before, "waiting for capacity cuts it")
}

// TestBatchSizedReplica: a scrape without vllm:cache_config_info sizes the
// replica on max_num_seqs × its context length (the sequence limit binds
// first), marks it "batch", and its KV usage, a fraction of nothing known,
// adds no load. With KV metrics it is "kv".
func TestBatchSizedReplica(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
	mon, err := gpu.NewMonitor(gpu.Config{Telemetry: gpu.ModeOff, Replicas: []gpu.Replica{{Name: "r0"}}}, gpu.Deps{})
	require.NoError(t, err)
	s.gpu = mon
	s.reps.Capacity = s.capacityOf
	r := s.reps.List()[0]
	r.MaxSeqs = 4
	r.MaxModelLen.Store(1000)
	src := &snapSource{}
	at := time.Unix(1_800_000_000, 0)
	ok := func(x float64) vllm.Value { return vllm.Value{V: x, OK: true} }
	observe := func(m vllm.Metrics) gpu.ReplicaView {
		at = at.Add(time.Second)
		src.snap = &vllm.Replica{Name: "r0", Up: true, Healthy: true, CheckedAt: at, ScrapedAt: at, Metrics: m}
		s.Observe(t.Context(), src, nil)
		v, _ := s.gpu.Snapshot().Replica("r0")
		return v
	}
	k, _, _ := s.capacityOf("r0")
	require.Zero(t, k, "unknown before a scrape")

	v := observe(vllm.Metrics{Running: ok(0), Waiting: ok(0), KVUsage: ok(0.5)})
	assert.Equal(t, gpu.SizingBatch, v.Sizing)
	assert.Equal(t, int64(float64(4*1000)*s.gpu.Config().TargetOccupancy), v.BaseTokens)
	k, load, _, _ := s.reps.RoomOf(r)
	assert.Positive(t, k)
	assert.Zero(t, load, "KV usage of a batch-sized replica is no load")
	assert.True(t, s.reps.Up(r))

	v = observe(vllm.Metrics{Running: ok(0), Waiting: ok(0), KVUsage: ok(0.5), NumGPUBlocks: ok(100), BlockSize: ok(16), KVCapacityTokens: ok(1600)})
	assert.Equal(t, gpu.SizingKV, v.Sizing)
	assert.Equal(t, int64(float64(1600)*s.gpu.Config().TargetOccupancy), v.BaseTokens)
	_, load, _, _ = s.reps.RoomOf(r)
	assert.Equal(t, int64(0.5*float64(v.BaseTokens)), load)
}

// TestObserveLearnsServiceTime: each poll's vllm:e2e_request_latency_seconds
// reaches the replica's service time, which the gate reads before this
// instance has completed anything on the pool (gate.FleetLoad.Svc).
func TestObserveLearnsServiceTime(t *testing.T) {
	t.Parallel()
	s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
	r := s.reps.List()[0]
	src := &snapSource{}
	at := time.Unix(1_800_000_000, 0)
	ok := func(x float64) vllm.Value { return vllm.Value{V: x, OK: true} }
	poll := func(sum, count float64) {
		at = at.Add(time.Second)
		src.snap = &vllm.Replica{Name: "r0", Up: true, Healthy: true, CheckedAt: at, ScrapedAt: at,
			Metrics: vllm.Metrics{Running: ok(4), Waiting: ok(0), E2ESecondsTotal: ok(sum), E2ECount: ok(count)}}
		s.Observe(t.Context(), src, nil)
	}
	poll(100, 40)
	assert.InDelta(t, 2.5, r.ServiceTime(), 1e-9, "the replica's lifetime mean at the first scrape")
	poll(100, 40)
	poll(100, 40)
	assert.InDelta(t, 2.5, r.ServiceTime(), 1e-9, "nothing completed since")
	poll(130, 50)
	assert.InDelta(t, 2.5+(1-math.Pow(0.9, 10))*(3.0-2.5), r.ServiceTime(), 1e-9, "30 s over 10 since")
	var g dto.Metric
	require.NoError(t, s.m.ReplicaService.WithLabelValues("r0").Write(&g))
	assert.InDelta(t, r.ServiceTime(), g.GetGauge().GetValue(), 1e-9, "sluice_replica_service_seconds")
}

// TestObserveExportsTheReserve: sluice_replica_reserve_ratio shows what
// the gate of the replica's pool last kept free for light tenants beside a
// heavy one (gate.Gate.Reserved), read at each poll, and 0 once no heavy
// tenant has been assessed for a while.
func TestObserveExportsTheReserve(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestServer(t, lifecycletest.Config(t, "", ""), lifecycletest.NewLedger(t), &lifecycletest.Upstream{})
		src := &snapSource{}
		poll := func() float64 {
			at := time.Now()
			src.snap = &vllm.Replica{Name: "r0", Up: true, Healthy: true, CheckedAt: at, ScrapedAt: at,
				Metrics: vllm.Metrics{Running: vllm.Value{V: 32, OK: true}, Waiting: vllm.Value{OK: true}}}
			s.Observe(t.Context(), src, nil)
			var g dto.Metric
			require.NoError(t, s.m.ReplicaReserve.WithLabelValues("r0").Write(&g))
			return g.GetGauge().GetValue()
		}
		assert.Zero(t, poll(), "no heavy tenant")

		// A flood holding 28 of 32 sequences with 100 queued beside a light
		// tenant holding 4, sampled for 5 s: the flood keeps its peak and
		// two Poisson deviations free (TestAssessReservesTheLightPeakAndItsNoise).
		pools := s.Pools()
		loads := []gate.TenantLoad{{Name: "flood", Weight: 1, Held: 28, Queued: 100}, {Name: "light", Weight: 1, Held: 4}}
		f := gate.FleetLoad{Seqs: 32, SeqsCap: 32, TokensCap: 1 << 20}
		var light bool
		var reserve float64
		for range 50 {
			time.Sleep(100 * time.Millisecond)
			pools.Lock()
			light, reserve = pools.PoolLocked(s.reps.PoolKeyOf("m")).Gate.Assess(time.Now().UnixNano(), loads, 0, f, 0)
			pools.Unlock()
		}
		require.False(t, light)
		require.InDelta(t, 4.0/32, reserve, 1e-12)
		time.Sleep(time.Second)
		assert.InDelta(t, reserve, poll(), 1e-12)
		time.Sleep(10 * time.Second)
		assert.Zero(t, poll(), "no heavy tenant assessed since")
	})
}
