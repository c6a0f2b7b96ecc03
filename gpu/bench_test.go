package gpu

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// BenchmarkClockAttribution is the GPU-ms attribution cost per request:
// Start at dispatch + End at completion on one replica's clock.
func BenchmarkClockAttribution(b *testing.B) {
	c := NewClock(8, c0)
	c.SetUtilization(c0, 0.7)
	bg := c.Start(c0) // one long request keeps n > 0
	now := c0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		t := c.Start(now)
		now = now.Add(time.Microsecond)
		_ = c.End(now, t)
	}
	_ = c.End(now, bg)
}

// BenchmarkClockAttributionParallel: many goroutines dispatching and
// completing on one replica's clock (the mutex's worst case).
func BenchmarkClockAttributionParallel(b *testing.B) {
	c := NewClock(8, time.Now())
	c.SetUtilization(time.Now(), 0.7)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t := c.Start(time.Now())
			_ = c.End(time.Now(), t)
		}
	})
}

// BenchmarkMonitorCapacity is the dispatch gate's lock-free read.
func BenchmarkMonitorCapacity(b *testing.B) {
	reps := make([]Replica, 16)
	for i := range reps {
		reps[i] = Replica{Name: "r" + strconv.Itoa(i), CapacityTokens: 100_000}
	}
	m, err := NewMonitor(Config{Replicas: reps}, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if k, _, _ := m.Capacity("r7"); k != 100_000 {
				b.Errorf("capacity %d", k)
			}
		}
	})
}

// BenchmarkMonitorHold is the admission-time GPU-ms hold over 16 replicas.
func BenchmarkMonitorHold(b *testing.B) {
	reps := make([]Replica, 16)
	for i := range reps {
		reps[i] = Replica{Name: "r" + strconv.Itoa(i)}
	}
	m, err := NewMonitor(Config{Replicas: reps}, Deps{})
	if err != nil {
		b.Fatal(err)
	}
	b.ReportAllocs()
	for b.Loop() {
		_ = m.Hold(1000, 256)
	}
}

// BenchmarkEstimatorObserve is one RLS update at settlement.
func BenchmarkEstimatorObserve(b *testing.B) {
	e := NewEstimator(0.05, 0.5, 0.99)
	i := int64(0)
	b.ReportAllocs()
	for b.Loop() {
		i++
		e.Observe(100+i%4000, 10+i%1000, 0.02*float64(100+i%4000)+1.3*float64(10+i%1000))
	}
}

// BenchmarkMonitorStepVLLM is one evaluation of 8 replicas with 1 GPU each
// under the vLLM-derived source: the Monitor's own per-poll cost.
func BenchmarkMonitorStepVLLM(b *testing.B) {
	reps := make([]Replica, 8)
	for i := range reps {
		reps[i] = Replica{Name: "r" + strconv.Itoa(i)}
	}
	src := NewVLLM(nil)
	m, err := NewMonitor(Config{Telemetry: ModeVLLM, Replicas: reps}, Deps{Source: src})
	if err != nil {
		b.Fatal(err)
	}
	for _, r := range reps {
		if err := m.ObserveReplica(r.Name, ReplicaMetrics{OK: true, NumGPUBlocks: 1000, BlockSize: 16, KVUsage: 0.95,
			HasSimGPUUtilization: true, SimGPUUtilization: 0.5}); err != nil {
			b.Fatal(err)
		}
	}
	ctx := context.Background()
	b.ReportAllocs()
	for b.Loop() {
		m.step(ctx)
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N)/8, "ns/GPU-poll")
}
