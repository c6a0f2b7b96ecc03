package vllm

import (
	"context"
	"io"
	"net/http"
	"net/http/httptest"
	"sync"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func v(x float64) Value { return Value{V: x, OK: true} }

func TestParseMetrics(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		file  string
		model string
		want  Metrics
	}{
		{
			name:  "vllm v1 exposition filtered by model",
			file:  "metrics_vllm.txt",
			model: "m",
			want: Metrics{
				Running: v(3), Waiting: v(1), KVUsage: v(0.25),
				PreemptionsTotal: v(7), PromptTokensTotal: v(1000), GenerationTokensTotal: v(2500),
				SuccessTotal: v(16), AbortsTotal: v(2),
				KVCapacityTokens: v(2048 * 16), NumGPUBlocks: v(2048), BlockSize: v(16),
				GPUUtilization: v(0.5), GPUBusySecondsTotal: v(12.5), GPUEnergyJoulesTotal: v(9100.25), SimAbortedTotal: v(2),
				E2ESecondsTotal: v(31.5), E2ECount: v(14),
			},
		},
		{
			name:  "no model filter sums every model",
			file:  "metrics_vllm.txt",
			model: "",
			want: Metrics{
				Running: v(102), Waiting: v(1), KVUsage: v(0.25),
				PreemptionsTotal: v(7), PromptTokensTotal: v(1000), GenerationTokensTotal: v(2500),
				SuccessTotal: v(16), AbortsTotal: v(2),
				KVCapacityTokens: v(2048 * 16), NumGPUBlocks: v(2048), BlockSize: v(16),
				GPUUtilization: v(0.5), GPUBusySecondsTotal: v(12.5), GPUEnergyJoulesTotal: v(9100.25), SimAbortedTotal: v(2),
				E2ESecondsTotal: v(931.5), E2ECount: v(24),
			},
		},
		{
			name:  "compat variants: engines summed, DP cache total not summed again, old kv name, finish_reason, garbage skipped, missing unknown",
			file:  "metrics_compat.txt",
			model: "m",
			want: Metrics{
				Running: v(7), Waiting: v(0), KVUsage: v(0.625),
				SuccessTotal: v(11), AbortsTotal: v(3),
				// Two engine labels each carry the DP total of 100 blocks.
				KVCapacityTokens: v(1600), NumGPUBlocks: v(100), BlockSize: v(16),
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			got := ParseMetrics(readTestdata(t, tt.file), tt.model)
			assert.Equal(t, tt.want, got)
		})
	}
}

func TestParseMetricsAbortsKnownZero(t *testing.T) {
	t.Parallel()
	m := ParseMetrics([]byte(`vllm:request_success_total{finished_reason="stop"} 4`+"\n"), "")
	assert.Equal(t, v(0), m.AbortsTotal, "reasons reported, none abort: known zero")
	m = ParseMetrics([]byte("vllm:num_requests_running 1\n"), "")
	assert.Equal(t, Value{}, m.AbortsTotal, "no success counter: unknown")
}

func TestCounterDropped(t *testing.T) {
	t.Parallel()
	a := Metrics{GenerationTokensTotal: v(10), PreemptionsTotal: v(1)}
	b := Metrics{GenerationTokensTotal: v(11)}
	assert.False(t, b.CounterDropped(&a))
	c := Metrics{GenerationTokensTotal: v(3), PreemptionsTotal: v(1)}
	assert.True(t, c.CounterDropped(&a))
}

// fakeReplica serves canned /metrics and /health; fields may be changed
// between polls.
type fakeReplica struct {
	mu      sync.Mutex
	metrics string
	health  int
}

func (f *fakeReplica) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	f.mu.Lock()
	defer f.mu.Unlock()
	switch r.URL.Path {
	case "/metrics":
		_, _ = io.WriteString(w, f.metrics)
	case "/health":
		w.WriteHeader(f.health)
	default:
		w.WriteHeader(http.StatusNotFound)
	}
}

func (f *fakeReplica) set(metrics string, health int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.metrics, f.health = metrics, health
}

// startFake serves a fakeReplica answering metrics with /health 200.
func startFake(t *testing.T, metrics string) (*fakeReplica, *httptest.Server) {
	f := &fakeReplica{}
	f.set(metrics, 200)
	srv := httptest.NewServer(f)
	t.Cleanup(srv.Close)
	return f, srv
}

func TestPoller(t *testing.T) {
	t.Parallel()
	f, srv := startFake(t, "vllm:num_requests_running{model_name=\"m\",engine=\"0\"} 2\nvllm:generation_tokens_total{model_name=\"m\"} 100\n")
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)
	reg := prometheus.NewRegistry()
	p, err := NewPoller(PollerConfig{
		Replicas: []Target{{Name: "r0", URL: srv.URL, Model: "m"}, {Name: "dead", URL: "http://127.0.0.1:1"}},
		Now:      func() time.Time { return now },
	}, NewClient(Config{DialTimeout: time.Second}), reg)
	require.NoError(t, err)

	r0, ok := p.Get("r0")
	require.True(t, ok)
	assert.False(t, r0.Up, "not up before the first poll")

	p.PollOnce(t.Context())
	r0, _ = p.Get("r0")
	assert.True(t, r0.Up)
	assert.True(t, r0.Healthy)
	assert.Equal(t, v(2), r0.Metrics.Running)
	assert.Equal(t, Value{}, r0.Metrics.Waiting, "missing metric is unknown")
	assert.Equal(t, now, r0.ScrapedAt)
	dead, _ := p.Get("dead")
	assert.False(t, dead.Up)
	assert.Equal(t, 1, dead.Failures)
	assert.NotEmpty(t, dead.LastError)
	assert.False(t, dead.TimedOut, "a refused connection is not a timeout")

	// Health fails: still up until three polls in a row fail.
	f.set("vllm:generation_tokens_total{model_name=\"m\"} 150\n", 503)
	for i := 1; i <= 3; i++ {
		now = now.Add(time.Second)
		p.PollOnce(t.Context())
		r0, _ = p.Get("r0")
		assert.Equal(t, i, r0.Failures)
		assert.Equal(t, i < 3, r0.Up, "poll %d", i)
		assert.False(t, r0.Healthy)
		assert.False(t, r0.TimedOut, "an error status is not a timeout")
		assert.Equal(t, now, r0.ScrapedAt, "metrics still scraped")
	}
	assert.InDelta(t, 0, gathered(t, reg, "sluice_vllm_replica_up", "r0", ""), 0)
	assert.InDelta(t, 3, gathered(t, reg, "sluice_vllm_poll_errors_total", "r0", "health"), 0)

	// Recovery and a restart (counter drop).
	f.set("vllm:generation_tokens_total{model_name=\"m\"} 5\n", 200)
	p.PollOnce(t.Context())
	r0, _ = p.Get("r0")
	assert.True(t, r0.Up)
	assert.Equal(t, 0, r0.Failures)
	assert.True(t, r0.Restarted)
	assert.Equal(t, 1, r0.Restarts)
	p.PollOnce(t.Context())
	r0, _ = p.Get("r0")
	assert.False(t, r0.Restarted)
	assert.Equal(t, 1, r0.Restarts)

	snap := p.Snapshot()
	require.Len(t, snap, 2)
	assert.Equal(t, "r0", snap[0].Name)
	assert.Equal(t, "dead", snap[1].Name)
}

// TestPollerScrapeHook: the hook runs as /metrics is asked for; what it
// returns gets the parsed metrics when they answer, and nothing when the
// scrape fails.
func TestPollerScrapeHook(t *testing.T) {
	t.Parallel()
	_, srv := startFake(t, "vllm:num_requests_running{model_name=\"m\"} 3\nvllm:num_requests_waiting{model_name=\"m\"} 1\n")
	var asked []string
	got := map[string][]Metrics{}
	p, err := NewPoller(PollerConfig{
		Replicas:    []Target{{Name: "r0", URL: srv.URL}, {Name: "dead", URL: "http://127.0.0.1:1"}},
		Concurrency: 1, // the hook's calls are then in order
		Scrape: func(name string) func(*Metrics) {
			asked = append(asked, name)
			return func(m *Metrics) { got[name] = append(got[name], *m) }
		},
	}, NewClient(Config{DialTimeout: time.Second}), nil)
	require.NoError(t, err)
	p.PollOnce(t.Context())
	assert.ElementsMatch(t, []string{"r0", "dead"}, asked)
	require.Len(t, got["r0"], 1)
	assert.Equal(t, v(3), got["r0"][0].Running)
	assert.Equal(t, v(1), got["r0"][0].Waiting)
	assert.Empty(t, got["dead"], "a failed scrape answers nothing")

	// Each round is signalled; rounds nobody took yet leave one signal.
	select {
	case <-p.Polled():
	default:
		t.Fatal("a round of polls was not signalled")
	}
	p.PollOnce(t.Context())
	p.PollOnce(t.Context())
	<-p.Polled()
	select {
	case <-p.Polled():
		t.Fatal("two rounds not taken left two signals")
	default:
	}
}

// TestPollerTimedOut: a replica that answers nothing within the poll's
// timeout fails the poll with TimedOut set (slow, not known dead).
func TestPollerTimedOut(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	defer srv.Close()
	defer close(release)
	p, err := NewPoller(PollerConfig{Replicas: []Target{{Name: "r0", URL: srv.URL}}, Timeout: 20 * time.Millisecond}, nil, nil)
	require.NoError(t, err)
	p.PollOnce(t.Context())
	r0, _ := p.Get("r0")
	assert.Equal(t, 1, r0.Failures)
	assert.False(t, r0.Healthy)
	assert.True(t, r0.TimedOut, r0.LastError)
}

func TestPollerRunStopsOnCancel(t *testing.T) {
	t.Parallel()
	_, srv := startFake(t, "")
	p, err := NewPoller(PollerConfig{Replicas: []Target{{Name: "r0", URL: srv.URL}}, Interval: time.Hour}, nil, nil)
	require.NoError(t, err)
	ctx, cancel := contextWithCancel(t)
	done := make(chan error, 1)
	go func() { done <- p.Run(ctx) }()
	cancel()
	require.NoError(t, <-done)
}

func TestPollerConfigValidate(t *testing.T) {
	t.Parallel()
	err := PollerConfig{Replicas: []Target{{Name: "a", URL: "x"}, {Name: "a", URL: "http://h"}, {}}, Interval: -1}.Validate()
	require.Error(t, err)
	for _, want := range []string{
		"upstream.replicas[0].url must start with http:// or https://",
		`upstream.replicas[1].name "a" is duplicated`,
		"upstream.replicas[2].name is required",
		"upstream.scrape_interval must be >= 0",
	} {
		assert.Contains(t, err.Error(), want)
	}
}

func contextWithCancel(t *testing.T) (context.Context, context.CancelFunc) {
	return context.WithCancel(t.Context())
}

// gathered reads one series from reg by replica (and kind) label.
func gathered(t *testing.T, reg *prometheus.Registry, name, replica, kind string) float64 {
	t.Helper()
	mfs, err := reg.Gather()
	require.NoError(t, err)
	for _, mf := range mfs {
		if mf.GetName() != name {
			continue
		}
		for _, m := range mf.GetMetric() {
			var rep, k string
			for _, l := range m.GetLabel() {
				switch l.GetName() {
				case "replica":
					rep = l.GetValue()
				case "kind":
					k = l.GetValue()
				}
			}
			if rep == replica && k == kind {
				if g := m.GetGauge(); g != nil {
					return g.GetValue()
				}
				return m.GetCounter().GetValue()
			}
		}
	}
	t.Fatalf("series %s{replica=%q,kind=%q} not found", name, replica, kind)
	return 0
}

func TestReplicaFresh(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 1, 1, 0, 0, 10, 0, time.UTC)
	tests := []struct {
		name string
		r    Replica
		want bool
	}{
		{"fresh", Replica{Up: true, ScrapedAt: now.Add(-2 * time.Second)}, true},
		{"stale", Replica{Up: true, ScrapedAt: now.Add(-4 * time.Second)}, false},
		{"down", Replica{Up: false, ScrapedAt: now}, false},
		{"never scraped", Replica{Up: true}, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tt.want, tt.r.Fresh(now, 3*time.Second))
		})
	}
}
