package gpu

import (
	"context"
	"strconv"
	"testing"
	"time"
)

// BenchmarkClockAttribution is the attribution cost per request in exact
// mode (no busy signal): Start at dispatch + End at completion, which also
// closes the interval, on one replica's clock with one long request.
func BenchmarkClockAttribution(b *testing.B) {
	c := NewClock(8, c0)
	bg := c.Start(c0, "bg") // one long request keeps n > 0
	now := c0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		t := c.Start(now, "acme")
		now = now.Add(time.Microsecond)
		_ = c.End(now, t)
	}
	_ = c.End(now, bg)
}

// BenchmarkClockAttributionSampled: the same in sampled mode (NVML or
// simulator counters), with the interval closed every 100 requests, the
// close's cost shared out per request.
func BenchmarkClockAttributionSampled(b *testing.B) {
	c := NewClock(8, c0)
	c.sink = func(string, Use) {}
	c.Close(c0, Use{})
	bg := c.Start(c0, "bg")
	now := c0
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(time.Microsecond)
		t := c.Start(now, "acme")
		now = now.Add(time.Microsecond)
		_ = c.End(now, t)
		if i++; i%100 == 0 {
			c.Close(now, Use{GPUNs: 1600_000, EnergyUJ: 1_000_000})
		}
	}
	_ = c.End(now, bg)
}

// BenchmarkClockClose256: one interval close with 256 running requests
// of 8 tenants (a full vLLM batch), the per-poll cost on one replica.
func BenchmarkClockClose256(b *testing.B) {
	c := NewClock(8, c0)
	c.sink = func(string, Use) {}
	c.Close(c0, Use{})
	for i := range 256 {
		c.Start(c0, "t"+strconv.Itoa(i%8))
	}
	now := c0
	b.ReportAllocs()
	for b.Loop() {
		now = now.Add(100 * time.Millisecond)
		c.Close(now, Use{GPUNs: 8e8, EnergyUJ: 7e7})
	}
}

// BenchmarkClockAttributionParallel: many goroutines dispatching and
// completing on one replica's clock (the mutex's worst case).
func BenchmarkClockAttributionParallel(b *testing.B) {
	c := NewClock(8, time.Now())
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			t := c.Start(time.Now(), "acme")
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
