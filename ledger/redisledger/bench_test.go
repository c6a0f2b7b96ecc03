package redisledger_test

import (
	"context"
	"flag"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/HdrHistogram/hdrhistogram-go"
	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// benchSetup starts a redis-server and a Ledger with production defaults
// (StoreTimeout 250ms, default pool) and returns request templates over 16
// tenants, each with a tenant and an api_key scope.
func benchSetup(b *testing.B) (*redisledger.Ledger, [][]ledger.Scope) {
	b.Helper()
	return benchSetupT(b, startRedis(b).Addr())
}

// benchMaxBatch runs the benchmarks with Config.MaxBatch (1: every
// operation its own script, as before batching), so one binary measures
// both sides: go test -bench . -args -maxbatch=1
var benchMaxBatch = flag.Int("maxbatch", 0, "redis ledger MaxBatch for the benchmarks (0: default)")

func benchSetupT(b testing.TB, addr string) (*redisledger.Ledger, [][]ledger.Scope) {
	return benchSetupAt(b, []string{addr})
}

// benchSetupAt is benchSetupT on the store at addrs (several: a Cluster).
func benchSetupAt(b testing.TB, addrs []string) (*redisledger.Ledger, [][]ledger.Scope) {
	l := newLedgerAt(b, addrs, func(c *redisledger.Config) {
		c.StoreTimeout = 250 * time.Millisecond
		c.MaxBatch = *benchMaxBatch
	})
	if err := l.LoadScripts(context.Background()); err != nil {
		b.Fatal(err)
	}
	scopes := make([][]ledger.Scope, 16)
	for i := range scopes {
		scopes[i] = []ledger.Scope{
			{Kind: ledger.KindTenant, Key: testKeyer.Key(ledger.KindTenant, "bench-"+string(rune('a'+i))), Limits: []ledger.Limit{
				{Dim: ledger.Tokens, Window: time.Hour, Max: ledger.MaxAmount},
				{Dim: ledger.Requests, Window: time.Minute, Max: ledger.MaxAmount},
				{Dim: ledger.Slots, Max: 1 << 20}}},
			{Kind: ledger.KindAPIKey, Key: testKeyer.Key(ledger.KindAPIKey, "bench-key-"+string(rune('a'+i))), Limits: []ledger.Limit{
				{Dim: ledger.Tokens, Window: 24 * time.Hour, Max: ledger.MaxAmount}}},
		}
	}
	return l, scopes
}

// pair runs one Reserve(Dispatch) + Settle and returns the Reserve latency.
func pair(ctx context.Context, l *redisledger.Ledger, sc []ledger.Scope, owner ledger.Owner) (time.Duration, error) {
	req := ledger.ReserveRequest{Ref: ledger.Ref{Tenant: sc[0].Key, ID: ledger.NewRequestID()}, Owner: owner,
		Scopes: sc, Held: held(512), Dispatch: true}
	start := time.Now()
	if _, err := l.Reserve(ctx, req); err != nil {
		return 0, err
	}
	lat := time.Since(start)
	_, err := l.Settle(ctx, req.Ref, held(300), ledger.SourceFinal)
	return lat, err
}

// BenchmarkReserveSettle64 measures closed-loop throughput of Reserve
// (Dispatch) + Settle pairs with 64 concurrent callers. Target: ≥ 20,000
// pairs/s on a 2-core machine (LEDGER.md §8).
func BenchmarkReserveSettle64(b *testing.B) {
	srv := startRedis(b)
	benchClosedLoop(b, []string{srv.Addr()}, false)
}

// BenchmarkReserveSettle64Cluster is BenchmarkReserveSettle64 on a
// three-node Cluster on this machine (every node shares its cores, so this
// measures what a Cluster costs per pair, not how it scales): srv-µs/pair is
// the sum of the nodes' CPU.
func BenchmarkReserveSettle64Cluster(b *testing.B) {
	benchClosedLoop(b, startCluster(b, 3).Addrs(), false)
}

// BenchmarkReserveSettle64GlobalCluster is the Cluster benchmark with a
// global scope on every request: its hold is on another node than most
// tenants, so every Reserve and Settle is two script calls.
func BenchmarkReserveSettle64GlobalCluster(b *testing.B) {
	benchClosedLoop(b, startCluster(b, 3).Addrs(), true)
}

// benchClosedLoop runs 64 callers' pairs against the store at addrs,
// with a global scope on every request if global.
func benchClosedLoop(b *testing.B, addrs []string, global bool) {
	l, scopes := benchSetupAt(b, addrs)
	if global {
		g := ledger.Scope{Kind: ledger.KindGlobal, Key: testKeyer.Key(ledger.KindGlobal, ""), Limits: []ledger.Limit{
			{Dim: ledger.Tokens, Window: time.Hour, Max: ledger.MaxAmount}}}
		for i := range scopes {
			scopes[i] = append(scopes[i], g)
		}
	}
	ctx := context.Background()
	var cpu0 time.Duration
	var calls0 int64
	for _, a := range addrs {
		cpu0 += serverCPU(b, a)
		calls0 += evalCalls(b, a)
	}
	owner := ledger.NewOwner()
	var next atomic.Int64
	var failed atomic.Int64
	b.ReportAllocs()
	b.SetParallelism(max(1, 64/runtimeProcs()))
	b.ResetTimer() // (starting a Cluster takes seconds)
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		sc := scopes[int(next.Add(1))%len(scopes)]
		for pb.Next() {
			if _, err := pair(ctx, l, sc, owner); err != nil {
				failed.Add(1)
			}
		}
	})
	el := time.Since(start)
	cpu, calls := -cpu0, -calls0
	for _, a := range addrs {
		cpu += serverCPU(b, a)
		calls += evalCalls(b, a)
	}
	b.ReportMetric(float64(failed.Load()), "failed")
	b.ReportMetric(float64(b.N-int(failed.Load()))/el.Seconds(), "pairs/s")
	b.ReportMetric(cpu.Seconds()*1e6/float64(b.N), "srv-µs/pair")
	b.ReportMetric(float64(calls)/float64(b.N), "calls/pair")
}

// evalCalls returns the server's EVALSHA, EVAL and FCALL calls so far (INFO
// commandstats): with batching a pair costs fewer than two.
func evalCalls(b testing.TB, addr string) int64 {
	b.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "commandstats").Result()
	if err != nil {
		b.Fatal(err)
	}
	var n int64
	for _, line := range strings.Split(info, "\n") {
		for _, cmd := range []string{"evalsha", "eval", "fcall"} {
			if rest, ok := strings.CutPrefix(strings.TrimSpace(line), "cmdstat_"+cmd+":calls="); ok {
				v, _, _ := strings.Cut(rest, ",")
				x, err := strconv.ParseInt(v, 10, 64)
				if err != nil {
					b.Fatal(err)
				}
				n += x
			}
		}
	}
	return n
}

// serverCPU returns redis-server's CPU time so far (used_cpu_user +
// used_cpu_sys of INFO cpu): server CPU per pair is far steadier than wall
// time on a shared machine.
func serverCPU(b testing.TB, addr string) time.Duration {
	b.Helper()
	c := redis.NewClient(&redis.Options{Addr: addr})
	defer c.Close()
	info, err := c.Info(context.Background(), "cpu").Result()
	if err != nil {
		b.Fatal(err)
	}
	var total float64
	for _, line := range strings.Split(info, "\n") {
		k, v, ok := strings.Cut(strings.TrimSpace(line), ":")
		if ok && (k == "used_cpu_user" || k == "used_cpu_sys") {
			f, err := strconv.ParseFloat(v, 64)
			if err != nil {
				b.Fatal(err)
			}
			total += f
		}
	}
	return time.Duration(total * float64(time.Second))
}

// BenchmarkReserveSettle64Global is BenchmarkReserveSettle64 with a global
// scope on every request: each Reserve and Settle is two scripts (global
// partition, then tenant partition), so expect about half the pairs/s.
func BenchmarkReserveSettle64Global(b *testing.B) {
	l, scopes := benchSetup(b)
	g := ledger.Scope{Kind: ledger.KindGlobal, Key: testKeyer.Key(ledger.KindGlobal, ""), Limits: []ledger.Limit{
		{Dim: ledger.Tokens, Window: time.Hour, Max: ledger.MaxAmount}}}
	for i := range scopes {
		scopes[i] = append(scopes[i], g)
	}
	ctx := context.Background()
	owner := ledger.NewOwner()
	var next, failed atomic.Int64
	var firstErr atomic.Pointer[error]
	b.ReportAllocs()
	b.SetParallelism(max(1, 64/runtimeProcs()))
	start := time.Now()
	b.RunParallel(func(pb *testing.PB) {
		sc := scopes[int(next.Add(1))%len(scopes)]
		for pb.Next() {
			if _, err := pair(ctx, l, sc, owner); err != nil {
				failed.Add(1)
				firstErr.CompareAndSwap(nil, &err)
			}
		}
	})
	el := time.Since(start)
	if p := firstErr.Load(); p != nil {
		b.Logf("first failure: %v", *p)
	}
	b.ReportMetric(float64(failed.Load()), "failed")
	b.ReportMetric(float64(b.N-int(failed.Load()))/el.Seconds(), "pairs/s")
}

// BenchmarkReserveOpenLoop drives Reserve + Settle pairs at a fixed rate
// (1,000, 2,500 and 5,000 pairs/s), open loop (each pair is scheduled at start + i/rate whether or not
// earlier ones finished, and latency counts from the scheduled time, so
// queueing is not hidden), and reports Reserve p50/p99. Target: p99 ≤ 2 ms.
func BenchmarkReserveOpenLoop(b *testing.B) {
	for _, rate := range []int{1000, 2500, 5000} {
		b.Run(fmt.Sprintf("rate=%d", rate), func(b *testing.B) { benchOpenLoop(b, rate) })
	}
}

func benchOpenLoop(b *testing.B, rate int) {
	l, scopes := benchSetup(b)
	ctx := context.Background()
	owner := ledger.NewOwner()
	hist := hdrhistogram.New(1, int64(10*time.Second/time.Microsecond), 3)
	var mu sync.Mutex // guards hist
	var failed atomic.Int64
	// Each request carries when it was due, or when the generator woke to
	// send it if later: Go's timers wake through epoll_wait in whole
	// milliseconds (runtime/netpoll_epoll.go rounds a shorter delay up to
	// 1 ms), and that slop of the generator is not the ledger's latency.
	// Time spent blocked handing it to a worker (all 256 busy) still counts.
	work := make(chan time.Time)
	var wg sync.WaitGroup
	for w := range 256 {
		wg.Add(1)
		go func() {
			defer wg.Done()
			sc := scopes[w%len(scopes)]
			for due := range work {
				req := ledger.ReserveRequest{Ref: ledger.Ref{Tenant: sc[0].Key, ID: ledger.NewRequestID()}, Owner: owner,
					Scopes: sc, Held: held(512), Dispatch: true}
				_, err := l.Reserve(ctx, req)
				lat := time.Since(due)
				if err == nil {
					_, err = l.Settle(ctx, req.Ref, held(300), ledger.SourceFinal)
				}
				if err != nil {
					failed.Add(1)
					continue
				}
				mu.Lock()
				_ = hist.RecordValue(lat.Microseconds())
				mu.Unlock()
			}
		}()
	}
	b.ReportAllocs()
	start := time.Now()
	var woke time.Time // when the generator last woke from its sleep
	i := 0
	for b.Loop() {
		due := start.Add(time.Duration(i) * time.Second / time.Duration(rate))
		if d := time.Until(due); d > 0 {
			time.Sleep(d) // the generator's fixed schedule
			woke = time.Now()
		}
		if woke.After(due) {
			due = woke
		}
		work <- due
		i++
	}
	close(work)
	wg.Wait()
	// Failures (StoreTimeout exceeded when the machine cannot keep up) are
	// reported, not fatal, so an overloaded run still records its figures.
	b.ReportMetric(float64(failed.Load()), "failed")
	b.ReportMetric(float64(hist.ValueAtQuantile(50)), "p50-µs")
	b.ReportMetric(float64(hist.ValueAtQuantile(99)), "p99-µs")
	b.ReportMetric(float64(hist.Max()), "max-µs")
}

func runtimeProcs() int { return runtime.GOMAXPROCS(0) }

// BenchmarkReclaimIdle measures Run's pass over 1,000 idle partitions (each
// with one settled request, as a fleet's tenants are between bursts): one
// op is one tick, and srv-µs/partition is redis-server's CPU per partition
// scanned. batch=1 scans each partition alone, as before the scans function
// (and as on a server without functions).
func BenchmarkReclaimIdle(b *testing.B) {
	for _, batch := range []int{1, 0} {
		name := "batch=default"
		if batch == 1 {
			name = "batch=1"
		}
		b.Run(name, func(b *testing.B) {
			srv := startRedis(b)
			l, _ := benchSetupT(b, srv.Addr())
			if batch > 0 {
				redisledger.SetScanBatch(l, batch)
			}
			ctx := context.Background()
			const parts = 1000
			idlePartitions(b, l, parts)
			cpu0 := serverCPU(b, srv.Addr())
			for b.Loop() {
				redisledger.ReclaimAll(ctx, l)
			}
			cpu := serverCPU(b, srv.Addr()) - cpu0
			b.ReportMetric(float64(cpu.Microseconds())/float64(b.N*parts), "srv-µs/partition")
		})
	}
}

// BenchmarkClusterReclaimIdle: one Run pass over 3,000 idle partitions of a
// three-node Cluster (1,000 a node, in batches per node); ms-per-pass is
// the pass's wall time, the figure the reclaim-pass histogram shows.
func BenchmarkClusterReclaimIdle(b *testing.B) {
	c := startCluster(b, 3)
	l := newLedgerAt(b, c.Addrs(), nil)
	ctx := context.Background()
	idlePartitions(b, l, 3000)
	start := time.Now()
	for b.Loop() {
		redisledger.ReclaimAll(ctx, l)
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/1000/float64(b.N), "ms/pass")
}

// idlePartitions registers n tenant partitions that are idle (one settled
// pair each, 64 at a time) and runs one Reclaim pass (the registry read,
// the library loaded).
func idlePartitions(b *testing.B, l *redisledger.Ledger, n int) {
	ctx := context.Background()
	owner := ledger.NewOwner()
	var wg sync.WaitGroup
	sem := make(chan struct{}, 64)
	for i := range n {
		wg.Go(func() {
			sem <- struct{}{}
			defer func() { <-sem }()
			sc := []ledger.Scope{{Kind: ledger.KindTenant, Key: testKeyer.Key(ledger.KindTenant, fmt.Sprintf("idle-%d", i)),
				Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: ledger.MaxAmount}}}}
			if _, err := pair(ctx, l, sc, owner); err != nil {
				b.Error(err)
			}
		})
	}
	wg.Wait()
	redisledger.ReclaimAll(ctx, l)
}
