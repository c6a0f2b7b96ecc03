package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/sluicehq/sluice/scheduler/node"
	"github.com/sluicehq/sluice/vllm/sim"
)

func gather(t *testing.T, reg *prometheus.Registry) metricsSnap {
	t.Helper()
	fams, err := reg.Gather()
	require.NoError(t, err)
	s := metricsSnap{}
	for _, f := range fams {
		s[f.GetName()] = f
	}
	return s
}

// TestTuneFromMetricsMath: two scrapes of the server's own series 10 s
// apart. solo grew by 100 ok and 5 expired (10.5 req/s offered); of its
// 100 TTFTs 80 are ≤ 1 s and 95 ≤ 2.5 s, so 80 + 15·(1/1.5) = 90 are
// within a 2 s SLO (9 req/s); the upstream latencies all fall in
// (25 ms, 50 ms], median 37.5 ms; so max_wait = 2 s − 37.5 ms truncated to
// 1.9 s and max_depth = ⌈9 × 1.9⌉ = 18. Counts before the window do not
// count, and a tenant without traffic in it gets no recommendation.
func TestTuneFromMetricsMath(t *testing.T) {
	t.Parallel()
	reg := prometheus.NewRegistry()
	m, err := lifecycle.NewMetrics(reg)
	require.NoError(t, err)
	m.Requests.WithLabelValues("solo", "ok").Add(1000) // before the window
	m.Requests.WithLabelValues("idle", "ok").Add(7)
	for range 50 {
		m.TTFT.WithLabelValues("solo").Observe(20)
		m.UpstreamLatency.WithLabelValues("r0").Observe(3)
	}
	first := gather(t, reg)
	m.Requests.WithLabelValues("solo", "ok").Add(100)
	m.Requests.WithLabelValues("solo", "expired").Add(5)
	for i := range 100 {
		switch {
		case i < 80:
			m.TTFT.WithLabelValues("solo").Observe(0.7)
		case i < 95:
			m.TTFT.WithLabelValues("solo").Observe(2)
		default:
			m.TTFT.WithLabelValues("solo").Observe(4)
		}
		m.UpstreamLatency.WithLabelValues(fmt.Sprintf("r%d", i%2)).Observe(0.04)
		m.QueueWait.WithLabelValues("solo").Observe(0.3)
	}
	last := gather(t, reg)
	r, notes, err := liveRun("http://x/metrics", first, last, 10*time.Second, map[string][2]float64{"solo": {12.5, 20}}, 2*time.Second)
	require.NoError(t, err)
	require.Len(t, r.tenants, 1, "idle had no traffic in the window")
	solo := r.tenants["solo"]
	assert.InDelta(t, 10.5, solo.offered, 1e-9)
	assert.InDelta(t, 9.0, solo.served, 1e-9)
	assert.InDelta(t, 37.5, r.ttftP50, 1e-9)
	assert.Equal(t, tuneTenant{served: solo.served, offered: solo.offered, concurrency: 12.5, maxConcurrent: 20}, solo)
	require.Len(t, notes, 1)
	assert.Equal(t, "tenant solo: 10.50 req/s offered, 10.00 ok, 9.00 within the SLO, 0.50 expired; queue wait p99 498ms; in flight mean 12.5, peak 20", notes[0])

	recs, _, err := tune([]tuneRun{r}, 2*time.Second, true)
	require.NoError(t, err)
	require.Len(t, recs, 1)
	assert.Equal(t, 1900*time.Millisecond, recs[0].maxWait)
	assert.Equal(t, 18, recs[0].maxDepth)
	assert.Equal(t, 20, recs[0].concurrency)

	_, _, err = liveRun("http://x/metrics", first, first, 10*time.Second, nil, 2*time.Second)
	assert.ErrorContains(t, err, "no requests in 10s")
}

// TestTuneFromLiveServer: `sluice tune --metrics` against a running node
// (embedded ledger, one simulated replica) under traffic recommends a
// queue for the tenant that sent it, and the tuned config passes `sluice
// config check`.
func TestTuneFromLiveServer(t *testing.T) {
	rep, err := sim.New(func() sim.Config {
		c := sim.DefaultConfig()
		c.OutputLenMax = 8
		return c
	}())
	require.NoError(t, err)
	simLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	simSrv := &http.Server{Handler: rep.Handler(), ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	wg.Add(2)
	go func() { defer wg.Done(); _ = rep.Run(ctx) }()
	go func() { defer wg.Done(); _ = simSrv.Serve(simLn) }()

	dir := t.TempDir()
	base := filepath.Join(dir, "sluice.yaml")
	yml := fmt.Sprintf("upstream:\n  scrape_interval: 50ms\n  replicas:\n    - {name: r0, url: \"http://%s\"}\n"+
		"gpu: {telemetry: off}\nserver: {drain_timeout: 1s}\ntenants:\n"+
		"  - {name: acme, api_keys: [%q]}\n  - {name: quiet, api_keys: [%q]}\n",
		simLn.Addr(), config.HashKey("sk-acme-test"), config.HashKey("sk-quiet-test"))
	require.NoError(t, os.WriteFile(base, []byte(yml), 0o600))
	cfg, err := config.Parse([]byte(yml))
	require.NoError(t, err)
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- node.Run(ctx, cfg, node.Options{APIListener: apiLn, AdminListener: adminLn, Registry: prometheus.NewRegistry(),
			Ready: func(string, string) { close(ready) }})
	}()
	stopLoad := make(chan struct{})
	var sent sync.WaitGroup
	t.Cleanup(func() {
		close(stopLoad)
		sent.Wait()
		cancel()
		assert.NoError(t, <-done)
		_ = simSrv.Close()
		wg.Wait()
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("node stopped: %v", err)
	}
	// Bounded wait for the first scrape to size the replica (another
	// process's state: polled, not slept on).
	require.Eventually(t, func() bool {
		snap, err := scrapeMetrics(context.Background(), "http://"+adminLn.Addr().String()+"/metrics")
		if err != nil || snap["sluice_replica_capacity_tokens"] == nil {
			return false
		}
		for _, m := range snap["sluice_replica_capacity_tokens"].GetMetric() {
			if m.GetGauge().GetValue() > 0 {
				return true
			}
		}
		return false
	}, 10*time.Second, 20*time.Millisecond)
	// Four clients in a closed loop until tune has read its window.
	body, _ := json.Marshal(map[string]any{"model": "sim-model", "max_tokens": 8,
		"messages": []map[string]string{{"role": "user", "content": "hello there"}}})
	oks := make(chan int, 4)
	for range 4 {
		sent.Add(1)
		go func() {
			defer sent.Done()
			n := 0
			defer func() { oks <- n }()
			for {
				select {
				case <-stopLoad:
					return
				default:
				}
				req, _ := http.NewRequest(http.MethodPost, "http://"+apiLn.Addr().String()+"/v1/chat/completions", bytes.NewReader(body))
				req.Header.Set("Authorization", "Bearer sk-acme-test")
				req.Header.Set("Content-Type", "application/json")
				resp, err := http.DefaultClient.Do(req)
				if err != nil {
					return
				}
				b, _ := io.ReadAll(resp.Body)
				resp.Body.Close()
				if resp.StatusCode == 200 {
					n++
				} else {
					t.Errorf("%d %s", resp.StatusCode, b)
					return
				}
			}
		}()
	}
	tuned := filepath.Join(dir, "tuned.yaml")
	code, out, errOut := runCLI(t, "", "tune", "--metrics", adminLn.Addr().String(), "--window", "1500ms", "--limit", "--config", base, "--out", tuned)
	require.Equal(t, 0, code, errOut)
	t.Log(out)
	assert.Contains(t, out, "  - name: acme\n    queue: {max_wait: ")
	assert.NotContains(t, out, "name: quiet", "no traffic, no recommendation")
	assert.Contains(t, out, "# tenant acme: ")
	assert.Contains(t, out, "# checked: "+base)

	code, out, errOut = runCLI(t, "", "config", "check", tuned)
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "ok (2 tenants")
	f, err := config.Load(tuned)
	require.NoError(t, err)
	acme := f.Tenants[0]
	assert.Positive(t, acme.Queue.MaxDepth)
	assert.Equal(t, 1900*time.Millisecond, acme.Queue.MaxWait, "2 s SLO less a few ms unqueued")
	assert.GreaterOrEqual(t, acme.Concurrency, 1)
	assert.LessOrEqual(t, acme.Concurrency, 4, "four closed-loop clients hold at most 4 in flight")
	orig, err := config.Load(base)
	require.NoError(t, err)
	assert.Equal(t, orig.Tenants[1].Queue, f.Tenants[1].Queue, "quiet is left alone")
	assert.NotEqual(t, orig.Tenants[0].Queue, acme.Queue)
}

func TestTuneMetricsBadInput(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{ReadHeaderTimeout: time.Second, Handler: http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		_, _ = w.Write([]byte("# some other exporter\nup 1\n"))
	})}
	go func() { _ = srv.Serve(ln) }()
	t.Cleanup(func() { _ = srv.Close() })
	for _, tt := range []struct {
		name   string
		args   []string
		code   int
		errHas string
	}{
		{"both", []string{"tune", "--metrics", "x:1", "r.json"}, 2, "not both"},
		{"bad window", []string{"tune", "--metrics", "x:1", "--window", "0s"}, 2, "--window must be > 0"},
		{"not sluice", []string{"tune", "--metrics", "http://" + ln.Addr().String() + "/metrics", "--window", "1ms"}, 1, "not a Sluice admin /metrics"},
	} {
		code, _, errOut := runCLI(t, "", tt.args...)
		assert.Equal(t, tt.code, code, tt.name)
		assert.Contains(t, errOut, tt.errHas, tt.name)
	}
	assert.Equal(t, "http://h:9/metrics", metricsURL("h:9"))
	assert.Equal(t, "https://h/metrics", metricsURL("https://h/"))
	assert.Equal(t, "http://h:9/metrics", metricsURL("http://h:9/metrics"))
	assert.True(t, strings.HasPrefix(metricsURL("h"), "http://"))
}
