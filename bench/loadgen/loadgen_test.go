package loadgen

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/bench/workload"
)

func oneTenant(name string, deadline time.Duration, reqs ...workload.Request) *workload.Schedule {
	for i := range reqs {
		reqs[i].N = i
		if reqs[i].InputLen == 0 {
			reqs[i].InputLen = 4
		}
		if reqs[i].OutputLen == 0 {
			reqs[i].OutputLen = 3
		}
	}
	return &workload.Schedule{Tenants: []workload.Plan{{Name: name, APIKey: "sk-" + name, Weight: 1, Deadline: deadline}}, Requests: reqs}
}

func sse(w http.ResponseWriter, events ...string) {
	w.Header().Set("Content-Type", "text/event-stream")
	w.WriteHeader(200)
	for _, e := range events {
		fmt.Fprintf(w, "data: %s\n\n", e)
		w.(http.Flusher).Flush()
	}
}

const (
	c1    = `{"choices":[{"index":0,"text":"a"}]}`
	cE    = `{"choices":[{"index":0,"text":""}]}`
	usage = `{"choices":[],"usage":{"prompt_tokens":4,"completion_tokens":3}}`
)

func errBody(w http.ResponseWriter, status int, code string) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	fmt.Fprintf(w, `{"error":{"message":"m","type":"t","code":%s,"param":null}}`, code)
}

// TestOutcomeClassification drives a stub server through every case of
// BENCH.md §5 and checks the outcome and reason recorded.
func TestOutcomeClassification(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		handler  http.HandlerFunc
		deadline time.Duration
		cancel   int
		cfg      func(*Config)
		want     Outcome
		reason   string
		unknown  bool
	}{
		{name: "success", handler: func(w http.ResponseWriter, _ *http.Request) { sse(w, c1, c1, c1, usage, "[DONE]") }, want: Success},
		{name: "success clean EOF after usage", handler: func(w http.ResponseWriter, _ *http.Request) { sse(w, c1, usage) }, want: Success},
		{name: "late", deadline: time.Millisecond, handler: func(w http.ResponseWriter, _ *http.Request) {
			time.Sleep(5 * time.Millisecond)
			sse(w, c1, usage, "[DONE]")
		}, want: Late},
		{name: "queue_full", handler: func(w http.ResponseWriter, _ *http.Request) { errBody(w, 429, `"queue_full"`) }, want: Rejected, reason: "queue_full"},
		{name: "tenant_budget_exceeded", handler: func(w http.ResponseWriter, _ *http.Request) { errBody(w, 429, `"tenant_budget_exceeded"`) }, want: Rejected, reason: "tenant_budget_exceeded"},
		{name: "ledger_unavailable", handler: func(w http.ResponseWriter, _ *http.Request) { errBody(w, 503, `"ledger_unavailable"`) }, want: Rejected, reason: "ledger_unavailable"},
		{name: "no_healthy_replica", handler: func(w http.ResponseWriter, _ *http.Request) { errBody(w, 503, `"no_healthy_replica"`) }, want: Rejected, reason: "no_healthy_replica"},
		{name: "http 429 no code", handler: func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(429) }, want: Rejected, reason: "http_429"},
		{name: "http 503 numeric code", handler: func(w http.ResponseWriter, _ *http.Request) { errBody(w, 503, `503`) }, want: Rejected, reason: "http_503"},
		{name: "deadline_exceeded", handler: func(w http.ResponseWriter, _ *http.Request) { errBody(w, 504, `"deadline_exceeded"`) }, want: Expired, reason: "deadline_exceeded"},
		{name: "queue_shed", handler: func(w http.ResponseWriter, _ *http.Request) { errBody(w, 503, `"queue_shed"`) }, want: Expired, reason: "queue_shed"},
		{name: "deadline mid-stream", handler: func(w http.ResponseWriter, _ *http.Request) { sse(w, c1, `{"error":{"code":"deadline_exceeded"}}`) }, want: Expired, reason: "deadline_exceeded"},
		{name: "http 504", handler: func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(504) }, want: Expired, reason: "http_504"},
		{name: "http 408", handler: func(w http.ResponseWriter, _ *http.Request) { w.WriteHeader(408) }, want: Expired, reason: "http_408"},
		{name: "vllm 400 numeric", handler: func(w http.ResponseWriter, _ *http.Request) { errBody(w, 400, `400`) }, want: Error, reason: "http_400"},
		{name: "known error code", handler: func(w http.ResponseWriter, _ *http.Request) { errBody(w, 400, `"context_length_exceeded"`) }, want: Error, reason: "context_length_exceeded"},
		{name: "unknown code", handler: func(w http.ResponseWriter, _ *http.Request) { errBody(w, 429, `"slow_down"`) }, want: Error, reason: "slow_down", unknown: true},
		{name: "upstream error mid-stream", handler: func(w http.ResponseWriter, _ *http.Request) { sse(w, c1, `{"error":{"code":"upstream_error"}}`) }, want: Error, reason: "upstream_error"},
		{name: "bad json", handler: func(w http.ResponseWriter, _ *http.Request) { sse(w, c1, `{nope`) }, want: Error, reason: ReasonBadJSON},
		{name: "stream cut", handler: func(w http.ResponseWriter, _ *http.Request) { sse(w, c1, c1) }, want: Error, reason: ReasonStreamCut},
		{name: "no choices", handler: func(w http.ResponseWriter, _ *http.Request) { sse(w, usage, "[DONE]") }, want: Error, reason: ReasonNoChoices},
		{name: "conn reset", handler: func(w http.ResponseWriter, _ *http.Request) {
			c, _, err := w.(http.Hijacker).Hijack()
			if err == nil {
				_ = c.(*net.TCPConn).SetLinger(0)
				_ = c.Close()
			}
		}, want: Error, reason: ReasonConnReset},
		{name: "request timeout", cfg: func(c *Config) { c.RequestTimeout = 20 * time.Millisecond }, handler: func(w http.ResponseWriter, r *http.Request) {
			sse(w, c1)
			<-r.Context().Done()
		}, want: ClientTimeout, reason: ReasonRequestTimeout},
		{name: "planned cancel", cancel: 2, handler: func(w http.ResponseWriter, r *http.Request) {
			sse(w, c1, c1)
			<-r.Context().Done()
		}, want: ClientTimeout, reason: ReasonPlannedCancel},
		{name: "cancelled at end", cfg: func(c *Config) { c.DrainTimeout = 20 * time.Millisecond }, handler: func(w http.ResponseWriter, r *http.Request) {
			sse(w, c1)
			<-r.Context().Done()
		}, want: CancelledAtEnd},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(tc.handler)
			defer srv.Close()
			cfg := Config{Targets: []string{srv.URL}, Model: "m", DrainTimeout: 5 * time.Second}
			if tc.cfg != nil {
				tc.cfg(&cfg)
			}
			res, err := Run(t.Context(), oneTenant("t", tc.deadline, workload.Request{CancelAfter: tc.cancel}), cfg)
			require.NoError(t, err)
			require.Len(t, res.Records, 1)
			rec := res.Records[0]
			assert.Equal(t, tc.want, rec.Outcome, "outcome (reason %q)", rec.Reason)
			assert.Equal(t, tc.reason, rec.Reason)
			assert.Equal(t, tc.unknown, rec.UnknownCode)
		})
	}
	t.Run("conn refused", func(t *testing.T) {
		t.Parallel()
		ln, err := net.Listen("tcp", "127.0.0.1:0")
		require.NoError(t, err)
		addr := ln.Addr().String()
		require.NoError(t, ln.Close())
		res, err := Run(t.Context(), oneTenant("t", 0, workload.Request{}), Config{Targets: []string{"http://" + addr}, Model: "m"})
		require.NoError(t, err)
		assert.Equal(t, Error, res.Records[0].Outcome)
		assert.Equal(t, ReasonConnRefused, res.Records[0].Reason)
	})
}

// TestWireContract checks headers and body bytes the server receives.
func TestWireContract(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var got []*http.Request
	var bodies []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		mu.Lock()
		got = append(got, r)
		bodies = append(bodies, string(b))
		mu.Unlock()
		w.Header().Set("Server-Timing", "queue;dur=12.250, upstream;dur=3.001")
		sse(w, c1, usage, "[DONE]")
	}))
	defer srv.Close()
	sc := oneTenant("chat-a", 2500*time.Millisecond, workload.Request{InputLen: 3, OutputLen: 7, PromptSeed: 9})
	sc.Tenants[0].Priority, sc.Tenants[0].HasPriority = 2, true
	res, err := Run(t.Context(), sc, Config{Targets: []string{srv.URL}, Model: "llama", IgnoreEOS: true, IDPrefix: "x-", Run: 2})
	require.NoError(t, err)
	require.Len(t, got, 1)
	h := got[0].Header
	assert.Equal(t, "/v1/completions", got[0].URL.Path)
	assert.Equal(t, "Bearer sk-chat-a", h.Get("Authorization"))
	assert.Equal(t, "x-chat-a-0-r2", h.Get("X-Request-Id"))
	assert.Equal(t, "2", h.Get("X-Priority"))
	ids := workload.PromptTokens(9, 0, 3)
	want := fmt.Sprintf(`{"model":"llama","prompt":[%d,%d,%d],"max_tokens":7,"stream":true,"stream_options":{"include_usage":true},"ignore_eos":true}`, ids[0], ids[1], ids[2])
	assert.Equal(t, want, bodies[0])
	rec := res.Records[0]
	dl := h.Get("X-Request-Timeout")
	assert.True(t, strings.HasPrefix(dl, "2.4") || dl == "2.5", "deadline minus send lag: %s", dl)
	assert.Equal(t, Success, rec.Outcome)
	assert.Equal(t, 4, rec.InTokens, "from usage")
	assert.Equal(t, 3, rec.OutTokens)
	assert.Equal(t, 12250*time.Microsecond, rec.ServerQueue, "Sluice's queue from Server-Timing")
	assert.Equal(t, 3001*time.Microsecond, rec.ServerUpstream)
	assert.True(t, rec.Sent <= rec.Headers && rec.Headers <= rec.First, "headers between send and first token: %v %v %v", rec.Sent, rec.Headers, rec.First)
}

func TestServerTiming(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		h           string
		queue, upst time.Duration
	}{
		{"queue;dur=0.500", 500 * time.Microsecond, -1},
		{"queue;dur=7.000, upstream;dur=41.250", 7 * time.Millisecond, 41250 * time.Microsecond},
		{"upstream;desc=\"x\";dur=2, queue;dur=1", time.Millisecond, 2 * time.Millisecond},
		{"", -1, -1},
		{"queue;dur=abc, upstream", -1, -1},
		{"queue;dur=-3", -1, -1},
	} {
		q, u := ServerTiming(tc.h)
		assert.Equal(t, tc.queue, q, tc.h)
		assert.Equal(t, tc.upst, u, tc.h)
	}
}

func TestFormatTimeout(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name     string
		deadline time.Duration
		lag      time.Duration
		want     string
	}{
		{"whole", 30 * time.Second, 0, "30"},
		{"decimal", 2500 * time.Millisecond, 0, "2.5"},
		{"lag", 30 * time.Second, 1500 * time.Millisecond, "28.5"},
		{"floor", time.Second, 5 * time.Second, "0.001"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, _ := FormatTimeout(tc.deadline, tc.lag)
			assert.Equal(t, tc.want, got)
		})
	}
}

// fakeSSE is a RoundTripper that streams events with fixed delays, so under
// synctest every time is exact.
type fakeSSE struct {
	ttft, itl time.Duration
	chunks    []string
	mu        sync.Mutex
	sends     []time.Duration
	t0        time.Time
}

func (f *fakeSSE) RoundTrip(r *http.Request) (*http.Response, error) {
	f.mu.Lock()
	f.sends = append(f.sends, time.Since(f.t0))
	f.mu.Unlock()
	pr, pw := io.Pipe()
	go func() {
		ctx := r.Context()
		wait := func(d time.Duration) bool {
			select {
			case <-time.After(d):
				return true
			case <-ctx.Done():
				return false
			}
		}
		for i, c := range f.chunks {
			d := f.itl
			if i == 0 {
				d = f.ttft
			}
			if !wait(d) {
				pw.CloseWithError(ctx.Err())
				return
			}
			if _, err := fmt.Fprintf(pw, "data: %s\n\n", c); err != nil {
				return
			}
		}
		_, _ = io.WriteString(pw, "data: "+usage+"\n\ndata: [DONE]\n\n")
		_ = pw.Close()
	}()
	return &http.Response{StatusCode: 200, Header: http.Header{"Content-Type": {"text/event-stream"}}, Body: pr, Request: r}, nil
}

// TestDispatcherTiming runs the dispatcher on fake time: sends happen at the
// intended times, TTFT/ITL/E2EL are exact, and max-concurrency waits are
// recorded as client queue time.
func TestDispatcherTiming(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := &fakeSSE{ttft: 50 * time.Millisecond, itl: 10 * time.Millisecond, chunks: []string{cE, c1, c1}, t0: time.Now()}
		sc := oneTenant("t", time.Second,
			workload.Request{At: 0}, workload.Request{At: 20 * time.Millisecond}, workload.Request{At: 100 * time.Millisecond})
		res, err := Run(t.Context(), sc, Config{Targets: []string{"http://fake"}, Model: "m", MaxConcurrency: 1,
			Client: &http.Client{Transport: f}})
		require.NoError(t, err)
		ms := time.Millisecond
		wantSent := []time.Duration{0, 70 * ms, 140 * ms} // second waits for the first (70 ms), third for the second
		for i, rec := range res.Records {
			assert.Equal(t, wantSent[i], rec.Sent, "sent %d", i)
			assert.Equal(t, 50*ms, rec.TTFT(), "ttft %d", i)
			assert.Equal(t, 70*ms, rec.E2EL(), "e2el %d", i)
			assert.Equal(t, []time.Duration{10 * ms, 10 * ms}, rec.ITL)
			assert.Equal(t, rec.First+10*ms, rec.FirstContent, "first non-empty text one chunk later")
			assert.True(t, rec.EarlyEmpty, "an empty chunk before the text")
			assert.Equal(t, Success, rec.Outcome)
		}
		assert.Equal(t, time.Duration(0), res.Records[0].ClientQueue)
		assert.Equal(t, 50*ms, res.Records[1].ClientQueue)
		assert.Equal(t, 40*ms, res.Records[2].ClientQueue)
	})
}

// TestDispatcherOpenLoop: without a concurrency cap a slow response never
// delays a later send.
func TestDispatcherOpenLoop(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := &fakeSSE{ttft: time.Second, itl: time.Second, chunks: []string{c1, c1}, t0: time.Now()}
		var reqs []workload.Request
		for i := range 20 {
			reqs = append(reqs, workload.Request{At: time.Duration(i) * 7 * time.Millisecond})
		}
		res, err := Run(context.Background(), oneTenant("t", 0, reqs...), Config{Targets: []string{"http://fake"}, Model: "m",
			Client: &http.Client{Transport: f}})
		require.NoError(t, err)
		for i, rec := range res.Records {
			assert.Equal(t, rec.Intended, rec.Sent, "request %d sent on time", i)
		}
	})
}

// TestProgressLine: the live line reports offered, sent, in flight, done
// and the interval's TTFT percentiles, on fake time.
func TestProgressLine(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		f := &fakeSSE{ttft: 50 * time.Millisecond, chunks: []string{c1}, t0: time.Now()}
		var reqs []workload.Request
		for i := range 5 {
			reqs = append(reqs, workload.Request{At: time.Duration(i) * 20 * time.Millisecond})
		}
		var buf strings.Builder
		_, err := Run(t.Context(), oneTenant("t", 0, reqs...), Config{Targets: []string{"http://fake"}, Model: "m",
			Client: &http.Client{Transport: f}, Progress: &buf, ProgressEvery: 40 * time.Millisecond})
		require.NoError(t, err)
		lines := strings.Split(strings.TrimSpace(buf.String()), "\n")
		require.Len(t, lines, 3, "ticks at 40, 80 and 120 ms; the run ends at 130 ms")
		assert.Contains(t, lines[2], "offered 5/5 sent 5 in flight 1 done 4 rejected 0 | TTFT p50 50 ms p99 50 ms")
	})
}

// TestConnectionsReused: a body closed right after [DONE] leaves the
// chunked terminator unread, and every request then opens a new
// connection; the client reads to the end, so connections are reused.
func TestConnectionsReused(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
		sse(w, c1, usage, "[DONE]")
		time.Sleep(10 * time.Millisecond) // the chunked terminator follows [DONE] later, as from vLLM
	}))
	defer srv.Close()
	var reqs []workload.Request
	for i := range 10 {
		reqs = append(reqs, workload.Request{At: time.Duration(i) * 2 * time.Millisecond})
	}
	res, err := Run(t.Context(), oneTenant("t", 0, reqs...), Config{Targets: []string{srv.URL}, Model: "m", MaxConcurrency: 1, Preconnect: 1})
	require.NoError(t, err)
	for _, r := range res.Records {
		require.Equal(t, Success, r.Outcome)
	}
	assert.Equal(t, int64(0), res.NewConns, "one pre-opened connection serves all ten sequential requests")
}

func TestBodyDataset(t *testing.T) {
	t.Parallel()
	sc := &workload.Schedule{Dataset: []workload.Entry{{Prompt: "say \"hi\"", OutputLen: 3}, {PromptIDs: []int{5, 6}, OutputLen: 2}}}
	for _, tc := range []struct {
		name    string
		backend string
		entry   int
		want    string
	}{
		{"text completions", "openai", 1, `{"model":"m","prompt":"say \"hi\"","max_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`},
		{"text chat", "openai-chat", 1, `{"model":"m","messages":[{"role":"user","content":"say \"hi\""}],"max_completion_tokens":3,"stream":true,"stream_options":{"include_usage":true}}`},
		{"ids completions", "openai", 2, `{"model":"m","prompt":[5,6],"max_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`},
		{"ids chat", "openai-chat", 2, `{"model":"m","messages":[{"role":"user","content":"5 6"}],"max_completion_tokens":2,"stream":true,"stream_options":{"include_usage":true}}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q := &workload.Request{Entry: tc.entry, OutputLen: sc.Dataset[tc.entry-1].OutputLen}
			assert.Equal(t, tc.want, string(Body(tc.backend, "m", sc, q, 9, false)))
		})
	}
}

// TestRoleChunkIsNotEarlyEmpty: vLLM's chat role chunk before the first
// text (vllm/entrypoints/openai/chat_completion/serving.py sends it with
// the first output) moves ttft before ttft_content but is not an empty
// chunk from a hop; a chunk with nothing in it is; a tool-call-only
// answer has no text at all and is not either.
func TestRoleChunkIsNotEarlyEmpty(t *testing.T) {
	t.Parallel()
	const (
		role  = `{"choices":[{"index":0,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]}`
		text  = `{"choices":[{"index":0,"delta":{"content":"a"},"finish_reason":null}]}`
		empty = `{"choices":[{"index":0,"delta":{"content":""},"finish_reason":null}]}`
		tool  = `{"choices":[{"index":0,"delta":{"tool_calls":[{"index":0,"function":{"arguments":"{"}}]},"finish_reason":null}]}`
		stop  = `{"choices":[{"index":0,"delta":{},"finish_reason":"tool_calls"}]}`
	)
	for _, tc := range []struct {
		name   string
		chunks []string
		early  bool
	}{
		{"role chunk", []string{role, text, text}, false},
		{"empty chunk", []string{role, empty, text}, true},
		{"tool calls only", []string{role, tool, stop}, false},
	} {
		synctest.Test(t, func(t *testing.T) {
			f := &fakeSSE{ttft: 50 * time.Millisecond, itl: 10 * time.Millisecond, chunks: tc.chunks, t0: time.Now()}
			res, err := Run(t.Context(), oneTenant("t", time.Second, workload.Request{At: 0}),
				Config{Targets: []string{"http://fake"}, Model: "m", Client: &http.Client{Transport: f}})
			require.NoError(t, err)
			rec := res.Records[0]
			assert.Equal(t, Success, rec.Outcome, tc.name)
			assert.Equal(t, tc.early, rec.EarlyEmpty, tc.name)
		})
	}
}
