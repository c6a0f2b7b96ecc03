package multiturn

import (
	"context"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/node"
	"github.com/sluicehq/sluice/vllm/sim"
)

// benchSim is a replica whose prefill cost dominates TTFT as on a GPU
// (20k prompt tokens/s, 10 ms decode steps).
func benchSim() sim.Config {
	c := sim.DefaultConfig()
	c.PrefillTPS = 20000
	c.DecodeStep = 10 * time.Millisecond
	c.OutputLenMax = 32
	return c
}

type fleet struct {
	reps []*sim.Replica
	urls []string
}

func startFleet(tb testing.TB, n int) *fleet {
	tb.Helper()
	f := &fleet{}
	for i := range n {
		c := benchSim()
		c.ReplicaIndex = i
		r, err := sim.New(c)
		if err != nil {
			tb.Fatal(err)
		}
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		if err != nil {
			tb.Fatal(err)
		}
		ctx, cancel := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- r.Serve(ctx, ln) }()
		tb.Cleanup(func() { cancel(); <-done })
		f.reps = append(f.reps, r)
		f.urls = append(f.urls, "http://"+ln.Addr().String())
	}
	return f
}

// report is what a routing mode achieved on the fleet.
func (f *fleet) report(b *testing.B, res Result) {
	var q, h, most, sum int64
	for _, r := range f.reps {
		s := r.Stats()
		q += s.PrefixQueryTokens
		h += s.PrefixHitTokens
		most = max(most, s.Received)
		sum += s.Received
	}
	hit := float64(h) / float64(max(q, 1))
	over := float64(most) / (float64(sum) / float64(len(f.reps)))
	b.ReportMetric(hit*100, "hit%")
	b.ReportMetric(float64(res.P50().Microseconds())/1000, "p50_ttft_ms")
	b.ReportMetric(float64(res.P90().Microseconds())/1000, "p90_ttft_ms")
	b.ReportMetric(over, "max/mean_load")
	b.ReportMetric(float64(res.Errors), "errors")
	b.Logf("requests %d errors %d hit %.1f%% p50 %v p90 %v max/mean %.2f wall %v", res.Requests, res.Errors, hit*100, res.P50(), res.P90(), over, res.Wall)
}

const benchKey = "sk-multiturn-bench"

func startSluice(tb testing.TB, urls []string, routing string) string {
	tb.Helper()
	var b strings.Builder
	fmt.Fprintf(&b, "upstream:\n  scrape_interval: 50ms\n  routing: %s\n  replicas:\n", routing)
	for i, u := range urls {
		fmt.Fprintf(&b, "    - {name: r%d, url: %q}\n", i, u)
	}
	b.WriteString("gpu: {telemetry: off}\nserver: {drain_timeout: 5s, max_wait: 120s}\n")
	fmt.Fprintf(&b, "tenants:\n  - {name: bench, concurrency: 256, max_input_tokens: 100000, queue: {max_wait: 120s}, api_keys: [%q]}\n", config.HashKey(benchKey))
	cfg, err := config.Parse([]byte(b.String()))
	if err != nil {
		tb.Fatal(err)
	}
	apiLn, _ := net.Listen("tcp", "127.0.0.1:0")
	adminLn, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() {
		done <- node.Run(ctx, cfg, node.Options{APIListener: apiLn, AdminListener: adminLn, AdminToken: "x", Registry: prometheus.NewRegistry()})
	}()
	tb.Cleanup(func() { cancel(); <-done })
	api := "http://" + apiLn.Addr().String()
	deadline := time.Now().Add(10 * time.Second)
	for {
		req, _ := http.NewRequest(http.MethodGet, api+"/v1/models", nil)
		req.Header.Set("Authorization", "Bearer "+benchKey)
		if resp, err := http.DefaultClient.Do(req); err == nil {
			ok := resp.StatusCode == 200
			resp.Body.Close()
			if r2, err := http.Get(api + "/readyz"); err == nil {
				ready := r2.StatusCode == 200
				r2.Body.Close()
				if ok && ready {
					time.Sleep(200 * time.Millisecond) // one more scrape: every replica sized and its models read
					return api
				}
			}
		}
		if time.Now().After(deadline) {
			tb.Fatal("sluice not ready")
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// startHAProxy runs haproxy in front of urls with balance algo.
func startHAProxy(tb testing.TB, urls []string, algo string) string {
	tb.Helper()
	bin, err := exec.LookPath("haproxy")
	if err != nil {
		tb.Skip("haproxy not installed")
	}
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	addr := ln.Addr().String()
	ln.Close()
	var b strings.Builder
	fmt.Fprintf(&b, "global\n  maxconn 4096\ndefaults\n  mode http\n  timeout connect 5s\n  timeout client 300s\n  timeout server 300s\n  option http-no-delay\n")
	fmt.Fprintf(&b, "frontend fe\n  bind %s\n  default_backend be\nbackend be\n  balance %s\n", addr, algo)
	for i, u := range urls {
		fmt.Fprintf(&b, "  server s%d %s\n", i, strings.TrimPrefix(u, "http://"))
	}
	path := filepath.Join(tb.TempDir(), "haproxy.cfg")
	if err := os.WriteFile(path, []byte(b.String()), 0o600); err != nil {
		tb.Fatal(err)
	}
	cmd := exec.Command(bin, "-f", path, "-db")
	if err := cmd.Start(); err != nil {
		tb.Fatal(err)
	}
	tb.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	deadline := time.Now().Add(5 * time.Second)
	for {
		if c, err := net.Dial("tcp", addr); err == nil {
			c.Close()
			return "http://" + addr
		}
		if time.Now().After(deadline) {
			tb.Fatal("haproxy not listening")
		}
		time.Sleep(10 * time.Millisecond)
	}
}

// BenchmarkMultiTurnRouting runs the multi-turn preset on 4 replicas per
// routing mode, each with cold caches, and reports the fleet's prefix-cache
// hit rate, client-side p50/p90 TTFT and the busiest replica's requests
// over the mean. Run with -benchtime=1x (one workload per mode):
//
//	go test -run '^$' -bench MultiTurnRouting -benchtime=1x ./bench/multiturn/
func BenchmarkMultiTurnRouting(b *testing.B) {
	const replicas = 4
	modes := []struct {
		name  string
		setup func(b *testing.B, f *fleet) Config
	}{
		{"direct-roundrobin", func(_ *testing.B, f *fleet) Config {
			var n atomic.Int64
			return Config{Route: func(string, []byte) string { return f.urls[int(n.Add(1))%len(f.urls)] }}
		}},
		{"haproxy-roundrobin", func(b *testing.B, f *fleet) Config {
			return Config{BaseURL: startHAProxy(b, f.urls, "roundrobin")}
		}},
		{"haproxy-leastconn", func(b *testing.B, f *fleet) Config {
			return Config{BaseURL: startHAProxy(b, f.urls, "leastconn")}
		}},
		{"sluice-leastload", func(b *testing.B, f *fleet) Config {
			return Config{BaseURL: startSluice(b, f.urls, "least_load"), APIKey: benchKey}
		}},
		{"sluice-affinity", func(b *testing.B, f *fleet) Config {
			return Config{BaseURL: startSluice(b, f.urls, "affinity"), APIKey: benchKey}
		}},
		{"oracle", func(_ *testing.B, f *fleet) Config {
			// The replica whose cache holds the longest prefix now; ties
			// (a new conversation) go round robin.
			var n atomic.Int64
			return Config{Route: func(path string, body []byte) string {
				best, bestHit := int(n.Add(1))%len(f.reps), 0
				for i, r := range f.reps {
					if h := r.PrefixHit(path, body); h > bestHit {
						best, bestHit = i, h
					}
				}
				return f.urls[best]
			}}
		}},
	}
	for _, m := range modes {
		b.Run(m.name, func(b *testing.B) {
			for range b.N {
				b.StopTimer()
				f := startFleet(b, replicas)
				cfg := m.setup(b, f)
				b.StartTimer()
				ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
				res, err := Run(ctx, cfg)
				cancel()
				if err != nil {
					b.Fatal(err)
				}
				b.StopTimer()
				f.report(b, res)
			}
		})
	}
}
