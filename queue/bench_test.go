package queue

import (
	"context"
	"fmt"
	"math/rand/v2"
	"runtime"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type benchPayload struct{ _ int } // not zero-size: each payload has its own address

func benchQueue(tb testing.TB, tenantsN, perTenant int) (*Queue[*benchPayload], []string, []int64) {
	tb.Helper()
	cfg := Config{MaxWait: 24 * time.Hour, Tenants: make([]TenantConfig, tenantsN)}
	names := make([]string, tenantsN)
	for i := range tenantsN {
		names[i] = fmt.Sprintf("tenant-%06d", i)
		cfg.Tenants[i] = TenantConfig{Name: names[i], Weight: float64(1 + i%4)}
	}
	q, err := New[*benchPayload](cfg, Deps[*benchPayload]{})
	require.NoError(tb, err)
	r := rand.New(rand.NewPCG(1, 1))
	costs := make([]int64, 4096)
	for i := range costs {
		costs[i] = 10 + r.Int64N(4000)
	}
	p := &benchPayload{}
	for i := range perTenant * tenantsN {
		_, err := q.Enqueue(Request[*benchPayload]{Tenant: names[i%tenantsN], Cost: costs[i%len(costs)], BodyBytes: 512, Payload: p})
		require.NoError(tb, err)
	}
	return q, names, costs
}

func dispatchAll(Item[*benchPayload]) Verdict { return Dispatch }

// BenchmarkPick measures one steady-state decision: Next (pick band, tenant
// and head; charge) + Release + Enqueue of a replacement for the same
// tenant, with every tenant backlogged. 0 allocs/op is the goal.
func BenchmarkPick(b *testing.B) {
	for _, n := range []int{10, 1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			q, _, costs := benchQueue(b, n, 2)
			p := &benchPayload{}
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				it, ok := q.Next(dispatchAll)
				if !ok {
					b.Fatal("nothing to dispatch")
				}
				q.Release(it.Handle)
				i++
				if _, err := q.Enqueue(Request[*benchPayload]{Tenant: it.Tenant, Cost: costs[i&4095], BodyBytes: 512, Payload: p}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

// BenchmarkPickLatency samples the latency of every Next call (the tenant
// selection decision) and reports its p50, p99 and p99.9 in ns.
func BenchmarkPickLatency(b *testing.B) {
	for _, n := range []int{10, 1_000, 10_000, 100_000} {
		b.Run(fmt.Sprintf("tenants=%d", n), func(b *testing.B) {
			q, _, costs := benchQueue(b, n, 2)
			p := &benchPayload{}
			samples := make([]int64, 0, 1<<20)
			i := 0
			b.ReportAllocs()
			for b.Loop() {
				t0 := time.Now()
				it, ok := q.Next(dispatchAll)
				d := time.Since(t0)
				if !ok {
					b.Fatal("nothing to dispatch")
				}
				if len(samples) < cap(samples) {
					samples = append(samples, int64(d))
				}
				q.Release(it.Handle)
				i++
				if _, err := q.Enqueue(Request[*benchPayload]{Tenant: it.Tenant, Cost: costs[i&4095], BodyBytes: 512, Payload: p}); err != nil {
					b.Fatal(err)
				}
			}
			slices.Sort(samples)
			pct := func(f float64) float64 { return float64(samples[int(f*float64(len(samples)-1))]) }
			b.ReportMetric(pct(0.50), "p50-ns")
			b.ReportMetric(pct(0.99), "p99-ns")
			b.ReportMetric(pct(0.999), "p99.9-ns")
		})
	}
}

// BenchmarkEnqueueCancel measures an arrival refused nothing and cancelled
// at once (client gone) with 10,000 tenants backlogged.
func BenchmarkEnqueueCancel(b *testing.B) {
	q, names, _ := benchQueue(b, 10_000, 2)
	p := &benchPayload{}
	i := 0
	b.ReportAllocs()
	for b.Loop() {
		i++
		it, err := q.Enqueue(Request[*benchPayload]{Tenant: names[i%len(names)], Cost: 100, BodyBytes: 512, Payload: p})
		if err != nil {
			b.Fatal(err)
		}
		q.Cancel(it.Handle)
	}
}

// BenchmarkParallelEnqueueDispatch has every goroutine enqueue and dispatch
// through the one mutex, as admission handlers and the dispatch loop do.
func BenchmarkParallelEnqueueDispatch(b *testing.B) {
	q, names, _ := benchQueue(b, 1_000, 2)
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		p := &benchPayload{}
		i := 0
		for pb.Next() {
			i++
			if _, err := q.Enqueue(Request[*benchPayload]{Tenant: names[i%len(names)], Cost: 100, BodyBytes: 512, Payload: p}); err != nil {
				b.Error(err)
				return
			}
			if it, ok := q.Next(dispatchAll); ok {
				q.Release(it.Handle)
			}
		}
	})
}

// BenchmarkFullReject measures the refusal path (429 queue_full).
func BenchmarkFullReject(b *testing.B) {
	q, err := New[*benchPayload](Config{Tenants: []TenantConfig{{Name: "a", MaxDepth: 1}}}, Deps[*benchPayload]{})
	require.NoError(b, err)
	_, err = q.Enqueue(Request[*benchPayload]{Tenant: "a"})
	require.NoError(b, err)
	b.ReportAllocs()
	for b.Loop() {
		if _, err := q.Enqueue(Request[*benchPayload]{Tenant: "a"}); err == nil {
			b.Fatal("not refused")
		}
	}
}

// heapPerEntry returns the heap bytes per queued entry (bodies excluded,
// one shared payload pointer) for entries spread over tenantsN tenants.
func heapPerEntry(tb testing.TB, tenantsN, entries int) float64 {
	tb.Helper()
	q, names, _ := benchQueue(tb, tenantsN, 0)
	p := &benchPayload{}
	var before, after runtime.MemStats
	runtime.GC()
	runtime.ReadMemStats(&before)
	for i := range entries {
		if _, err := q.Enqueue(Request[*benchPayload]{Tenant: names[i%tenantsN], Cost: 100, BodyBytes: 512, Payload: p}); err != nil {
			tb.Fatal(err)
		}
	}
	runtime.GC()
	runtime.ReadMemStats(&after)
	runtime.KeepAlive(q)
	return float64(after.HeapAlloc-before.HeapAlloc) / float64(entries)
}

// BenchmarkMemoryPerEntry reports heap bytes per queued entry.
func BenchmarkMemoryPerEntry(b *testing.B) {
	for b.Loop() {
		b.ReportMetric(heapPerEntry(b, 1_000, 100_000), "B/entry")
	}
}

// TestMemoryPerEntry: a queued entry costs at most 1 KiB besides its body.
func TestMemoryPerEntry(t *testing.T) {
	if testing.Short() {
		t.Skip("allocates ~30 MB")
	}
	got := heapPerEntry(t, 1_000, 100_000)
	t.Logf("%.0f B per queued entry", got)
	assert.LessOrEqual(t, got, 1024.0)
}

// TestSteadyStateAllocsZero: enqueue + dispatch + release allocate nothing
// once the pools are warm.
func TestSteadyStateAllocsZero(t *testing.T) {
	q, _, costs := benchQueue(t, 1_000, 2)
	p := &benchPayload{}
	i := 0
	step := func() {
		it, ok := q.Next(dispatchAll)
		if !ok {
			t.Fatal("nothing to dispatch")
		}
		q.Release(it.Handle)
		i++
		if _, err := q.Enqueue(Request[*benchPayload]{Tenant: it.Tenant, Cost: costs[i&4095], BodyBytes: 512, Payload: p}); err != nil {
			t.Fatal(err)
		}
	}
	for range 10_000 {
		step()
	}
	assert.Zero(t, testing.AllocsPerRun(10_000, step))
}

// BenchmarkExpiryLateness measures, on the real clock with Run's runtime
// timer, how late expired entries are reported: each iteration queues
// `entries` entries with deadlines spread over 200 ms and waits until all
// have expired, with the timer alone and with a 1 ms ExpirySpin. It reports the p50, p99, p99.9 and maximum of (report time
// − deadline) over all iterations.
func BenchmarkExpiryLateness(b *testing.B) {
	for _, bc := range []struct {
		n    int
		spin time.Duration
	}{{10_000, 0}, {10_000, time.Millisecond}, {100_000, 0}, {100_000, time.Millisecond}} {
		n := bc.n
		b.Run(fmt.Sprintf("entries=%d/spin=%v", n, bc.spin), func(b *testing.B) {
			cfg := Config{MaxWait: time.Hour, ExpirySpin: bc.spin}
			for i := range 100 {
				cfg.Tenants = append(cfg.Tenants, TenantConfig{Name: fmt.Sprintf("t%d", i)})
			}
			var all []int64
			r := rand.New(rand.NewPCG(4, 4))
			for b.Loop() {
				lat := make([]int64, 0, n)
				done := make(chan struct{})
				q, err := New[int](cfg, Deps[int]{OnExpire: func(it Item[int]) {
					lat = append(lat, int64(time.Since(it.Deadline)))
					if len(lat) == n {
						close(done)
					}
				}})
				require.NoError(b, err)
				// Deadlines start after the enqueues are surely done.
				start := time.Now().Add(50*time.Millisecond + time.Duration(n)*3*time.Microsecond)
				for i := range n {
					d := start.Add(time.Duration(r.Int64N(int64(200 * time.Millisecond))))
					if _, err := q.Enqueue(Request[int]{Tenant: cfg.Tenants[i%100].Name, Deadline: d, Payload: i}); err != nil {
						b.Fatal(err)
					}
				}
				ctx, cancel := context.WithCancel(b.Context())
				var wg sync.WaitGroup
				wg.Go(func() { _ = q.Run(ctx) })
				<-done
				cancel()
				wg.Wait()
				all = append(all, lat...)
			}
			slices.Sort(all)
			pct := func(f float64) float64 { return float64(all[int(f*float64(len(all)-1))]) / 1e3 }
			b.ReportMetric(pct(0.5), "p50-µs")
			b.ReportMetric(pct(0.99), "p99-µs")
			b.ReportMetric(pct(0.999), "p99.9-µs")
			b.ReportMetric(float64(all[len(all)-1])/1e3, "max-µs")
		})
	}
}

// BenchmarkClockNow is the baseline cost of one time.Now on this machine:
// Next reads the clock once, and PickLatency's sampling adds about one more.
func BenchmarkClockNow(b *testing.B) {
	var t time.Time
	for b.Loop() {
		t = time.Now()
	}
	_ = t
}

// BenchmarkPickStandingQueue: one decision (Next + Release + Enqueue) on a
// tenant with 256 queued entries whose head waited past LIFOAfter: strict
// FIFO against adaptive LIFO, which scans the flow heap's last level for
// the newest entry (shedding off, so the 256 stay queued).
func BenchmarkPickStandingQueue(b *testing.B) {
	for _, mode := range []struct {
		name string
		lifo time.Duration
	}{{"fifo", -1}, {"lifo", time.Second}} {
		b.Run(mode.name, func(b *testing.B) {
			clk := &benchClock{now: time.Unix(1e9, 0)}
			q, err := New[*benchPayload](Config{MaxWait: 24 * time.Hour, LIFOAfter: mode.lifo, ShedAfter: -1, Tenants: []TenantConfig{{Name: "a"}}},
				Deps[*benchPayload]{Clock: clk})
			require.NoError(b, err)
			p := &benchPayload{}
			for range 256 {
				_, err := q.Enqueue(Request[*benchPayload]{Tenant: "a", Cost: 100, Payload: p})
				require.NoError(b, err)
			}
			clk.now = clk.now.Add(time.Minute)
			b.ReportAllocs()
			for b.Loop() {
				it, ok := q.Next(dispatchAll)
				if !ok {
					b.Fatal("nothing to dispatch")
				}
				q.Release(it.Handle)
				if _, err := q.Enqueue(Request[*benchPayload]{Tenant: "a", Cost: 100, Payload: p}); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}

type benchClock struct{ now time.Time }

func (c *benchClock) Now() time.Time { return c.now }
