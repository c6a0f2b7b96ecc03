package abuse

import (
	"strconv"
	"sync/atomic"
	"testing"
	"time"
)

// benchConfig enables every detector at thresholds steady traffic never
// reaches, so each Observe evaluates them all and none fires.
func benchConfig() Config {
	return Config{
		SpendRateFactor: 10, GPUMsRateFactor: 10,
		MinRate:         Rates{TokensPerSecond: 1e12, USDMicrosPerSecond: 1e12, GPUMsPerSecond: 1e12},
		MaxCapBurst:     MaxCapBurst{Count: 1 << 40, Share: 0.5},
		DisconnectShare: DisconnectShare{Share: 0.9, MinCount: 1 << 40},
		Denials:         1 << 40,
		Clamp:           Clamp{Concurrency: 1},
	}
}

// BenchmarkObserve: one tenant, one goroutine, the clock moving 1ms per
// call (so rings advance a second every 1000 calls).
func BenchmarkObserve(b *testing.B) {
	now := t0
	d, err := New(benchConfig(), func() time.Time { return now })
	if err != nil {
		b.Fatal(err)
	}
	d.Observe("tenant", Event{Kind: Admitted}) // first sight allocates the rings
	ev := Event{Kind: Settled, Tokens: 300, USDMicros: 90, GPUMs: 2000}
	b.ReportAllocs()
	for b.Loop() {
		d.Observe("tenant", ev)
		now = now.Add(time.Millisecond)
	}
}

// BenchmarkObserveParallel: 64 tenants spread over GOMAXPROCS goroutines,
// the real clock.
func BenchmarkObserveParallel(b *testing.B) {
	d, err := New(benchConfig(), nil)
	if err != nil {
		b.Fatal(err)
	}
	names := make([]string, 64)
	for i := range names {
		names[i] = "tenant-" + strconv.Itoa(i)
		d.Observe(names[i], Event{Kind: Admitted})
	}
	var next atomic.Int64
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		i := int(next.Add(1))
		for pb.Next() {
			d.Observe(names[i%len(names)], Event{Kind: Settled, Tokens: 300, USDMicros: 90, GPUMs: 2000})
			i++
		}
	})
}
