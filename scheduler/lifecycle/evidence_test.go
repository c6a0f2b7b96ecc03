package lifecycle

import (
	"context"
	"io"
	"net"
	"os"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/vllm"
)

// bodyUpstream records the bodies sent upstream and answers like
// lifecycletest.Upstream.
type bodyUpstream struct {
	lifecycletest.Upstream
	mu     sync.Mutex
	bodies []string
}

func (u *bodyUpstream) Stream(ctx context.Context, url, path string, body []byte, id string) (*vllm.Stream, error) {
	u.mu.Lock()
	u.bodies = append(u.bodies, string(body))
	u.mu.Unlock()
	return u.Upstream.Stream(ctx, url, path, body, id)
}

func (u *bodyUpstream) last() string {
	u.mu.Lock()
	defer u.mu.Unlock()
	return u.bodies[len(u.bodies)-1]
}

// A non-streamed request goes upstream as a stream of
// upstream.non_streamed_interval tokens per chunk when its cap is larger
// and a stream carries its members faithfully; otherwise as it came.
func TestNonStreamedSentAsStreamForEvidence(t *testing.T) {
	up := &bodyUpstream{Upstream: lifecycletest.Upstream{Out: 3}}
	s := newTestEngine(t, lifecycletest.Config(t, "", "    max_output_tokens: 1024\n"), lifecycletest.NewLedger(t), up)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.dispatchLoop(ctx)
	for _, tc := range []struct {
		body     string
		interval int
	}{
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":500}`, 64},
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":64}`, 0},
		{`{"model":"m","messages":[{"role":"user","content":"hi"}]}`, 64}, // the tenant's cap, 1024
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":500,"tools":[{"type":"function","function":{"name":"f"}}]}`, 0},
		{`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":500,"stream":true}`, 0},
	} {
		c, _, err := s.start(context.Background(), s.pol.Load().Tenants["acme"], s.pol.Load(),
			admission{ep: vllm.EndpointChat, body: []byte(tc.body), reqID: "r"})
		require.NoError(t, err, tc.body)
		if c.req.Stream {
			s.finish(c, nil)
		}
		c.end()
		assert.Equal(t, tc.interval, c.upInterval, tc.body)
		assert.Equal(t, tc.interval > 0, strings.Contains(up.last(), `"stream_interval":64`), up.last())
		assert.Equal(t, tc.interval > 0 || c.req.Stream, strings.Contains(up.last(), `"continuous_usage_stats":true`), up.last())
	}
}

// vLLM answers a non-streamed request only once generation ended, and a
// choice that ended in error is a 500 then: the request may have generated
// up to its cap and reported nothing, so it is charged its hold, never 0.
// A 4xx is a refusal before any generation: nothing is charged.
func TestNonStreamedNon200AfterGenerationChargedHold(t *testing.T) {
	for _, tc := range []struct {
		status  int
		in, out int
	}{
		{500, -1, 8},
		{400, 0, 0},
	} {
		up := &lifecycletest.Upstream{Fail: &vllm.UpstreamError{Replica: "r0", Status: tc.status, Body: []byte(`{"error":{"message":"x","type":"x","code":500}}`)}}
		led := lifecycletest.NewLedger(t)
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		pol := s.pol.Load()
		c, _, err := s.start(context.Background(), pol.Tenants["acme"], pol,
			admission{ep: vllm.EndpointChat, body: lifecycletest.ChatBody(""), reqID: "r"})
		require.Error(t, err)
		require.NotNil(t, c)
		t.Logf("status %d: %v", tc.status, err)
		c.end()
		assert.Equal(t, 0, c.upInterval, "a cap of 8 is within one interval: non-streamed upstream")
		in := tc.in
		if in < 0 {
			in = c.plan.InputTokens
		}
		assert.Equal(t, in, c.usage.PromptTokens, "status %d", tc.status)
		assert.Equal(t, tc.out, c.usage.CompletionTokens, "status %d: the cap × choices", tc.status)
		assert.Equal(t, 1, led.N("settle")+led.N("release"), "status %d", tc.status)
		assert.Equal(t, phaseSettled, c.phase)
	}
}

// ctxPipeUpstream streams what the test writes to its pipe; cancelling the
// request closes it, as closing a replica connection does.
type ctxPipeUpstream struct {
	lifecycletest.Upstream
	pr *io.PipeReader
}

func (u *ctxPipeUpstream) Stream(ctx context.Context, _, _ string, _ []byte, _ string) (*vllm.Stream, error) {
	context.AfterFunc(ctx, func() { _ = u.pr.CloseWithError(context.Cause(ctx)) })
	return vllm.NewStream(u.pr, "r0", 0), nil
}

// A streaming client that stops reading: the write that cannot complete
// within server.stream_write_timeout ends the call as client_stalled, its
// upstream aborted, charged what ran (the usage read plus one interval),
// its slot freed, the deadline the connection's (net.Pipe: a write blocks
// until the reader reads).
func TestStalledStreamReaderEndsAtWriteDeadline(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	pr, pw := io.Pipe()
	s := newTestEngine(t, lifecycletest.Config(t, "server: {stream_write_timeout: 50ms}\n", ""), led, &ctxPipeUpstream{pr: pr})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.dispatchLoop(ctx)
	pol := s.pol.Load()
	events := strings.SplitAfter(lifecycletest.SSECompletion(8), "\n\n")
	// Start returns with the stream's first event read (Engine.first).
	go func() { _, _ = io.WriteString(pw, events[0]) }()
	tk, err := s.begin(context.Background(), pol.Tenants["acme"], pol,
		admission{ep: vllm.EndpointChat, body: lifecycletest.ChatBody(`,"stream":true`), reqID: "r"})
	require.NoError(t, err)
	c := tk.c
	client, server := net.Pipe()
	t.Cleanup(func() { _ = client.Close(); _ = server.Close() })
	out := &writerSink{w: server, conn: server}
	done := make(chan error, 1)
	go func() { tk.Finish(out); done <- out.err }()

	got := make([]byte, 4096)
	n, err := client.Read(got) // the client reads the first event
	require.NoError(t, err)
	assert.Contains(t, string(got[:n]), `"content":"x"`)
	// Then it stops reading: the next event's write blocks until the
	// deadline.
	_, err = io.WriteString(pw, events[1])
	require.NoError(t, err)
	require.ErrorIs(t, <-done, os.ErrDeadlineExceeded)
	require.ErrorIs(t, context.Cause(c.ctx), apierr.ErrClientStalled)
	require.ErrorIs(t, context.Cause(c.ctx), apierr.ErrClientGone)
	assert.Equal(t, "client_stalled", c.abortCause)
	assert.Equal(t, phaseSettled, c.phase)
	assert.Equal(t, 1, led.N("settle"))
	assert.Equal(t, 5, c.usage.PromptTokens)
	assert.Equal(t, 2+1, c.usage.CompletionTokens, "two tokens ran and were read, plus one interval")
	assert.Zero(t, c.t.RT.Inflight.Load(), "its slot is free")
	assert.Zero(t, c.t.RT.InflightTokens.Load(), "its replica room is free")
}

// fullQueueUpstream answers streams on r0 with vLLM's in-stream refusal of
// a full waiting queue, and like lifecycletest.Upstream elsewhere.
type fullQueueUpstream struct {
	lifecycletest.Upstream
	mu    sync.Mutex
	tried []string
}

func (u *fullQueueUpstream) Stream(ctx context.Context, url, path string, body []byte, id string) (*vllm.Stream, error) {
	u.mu.Lock()
	u.tried = append(u.tried, url)
	u.mu.Unlock()
	if strings.Contains(url, "r0") {
		sse := "data: {\"error\":{\"message\":\"The waiting queue is full.\",\"type\":\"ServiceUnavailableError\",\"param\":null,\"code\":503}}\n\ndata: [DONE]\n\n"
		return vllm.NewStream(io.NopCloser(strings.NewReader(sse)), url, 0), nil
	}
	return u.Upstream.Stream(ctx, url, path, body, id)
}

// An evidence stream refused by a full queue (an error event where a
// non-streamed request gets a 503 response) goes to another replica, as
// the non-streamed request would have: nothing ran on the first.
func TestEvidenceStreamQueueFullRetriesElsewhere(t *testing.T) {
	y := "upstream:\n  routing: least_load\n  replicas:\n    - {name: r0, url: \"http://r0.invalid\"}\n    - {name: r1, url: \"http://r1.invalid\"}\ngpu: {telemetry: off}\n" +
		"tenants:\n  - name: acme\n    api_keys: [\"" + config.HashKey("sk-acme") + "\"]\n"
	cfg, err := config.Parse([]byte(y))
	require.NoError(t, err)
	up := &fullQueueUpstream{Upstream: lifecycletest.Upstream{Out: 3}}
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, cfg, led, up)
	s.reps.Capacity = lifecycletest.FixedCapacity(map[string]int64{"r0": 1 << 20, "r1": 1 << 20})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.dispatchLoop(ctx)
	pol := s.pol.Load()
	for range 4 { // whichever replica the route picks first
		c, body, err := s.start(context.Background(), pol.Tenants["acme"], pol,
			admission{ep: vllm.EndpointChat, body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":500}`), reqID: "r"})
		require.NoError(t, err)
		c.end()
		assert.Contains(t, string(body), `"content":"xxx"`)
		assert.Equal(t, "r1", c.rep.Name)
		assert.Equal(t, 3, c.usage.CompletionTokens)
		assert.True(t, c.usage.Final)
	}
	up.mu.Lock()
	defer up.mu.Unlock()
	assert.Contains(t, up.tried, "http://r0.invalid", "r0 was tried: %v", up.tried)
}

// sseUpstream answers every stream with its fixed SSE body.
type sseUpstream struct {
	lifecycletest.Upstream
	sse string
}

func (u *sseUpstream) Stream(_ context.Context, url, _ string, _ []byte, _ string) (*vllm.Stream, error) {
	return vllm.NewStream(io.NopCloser(strings.NewReader(u.sse)), url, 0), nil
}

// A 500 inside an evidence stream after output (vLLM's finish_reason
// "error"): the client gets vLLM's status as for a non-streamed request,
// and the charge is the usage so far plus one interval, not 0 nor the hold.
func TestEvidenceStreamErrorAfterOutputChargedUsage(t *testing.T) {
	chunks := strings.SplitAfter(lifecycletest.SSECompletion(3), "\n\n")[:3] // three content chunks
	sse := strings.Join(chunks, "") + "data: {\"error\":{\"message\":\"Internal server error\",\"type\":\"InternalServerError\",\"param\":null,\"code\":500}}\n\ndata: [DONE]\n\n"
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, &sseUpstream{sse: sse})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.dispatchLoop(ctx)
	pol := s.pol.Load()
	c, _, err := s.start(context.Background(), pol.Tenants["acme"], pol,
		admission{ep: vllm.EndpointChat, body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":500}`), reqID: "r"})
	require.Error(t, err)
	c.end()
	var ue *vllm.UpstreamError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, 500, ue.Status)
	assert.False(t, ue.InStream, "answered as vLLM answers a non-streamed request")
	assert.Equal(t, 64, c.upInterval)
	assert.Equal(t, 5, c.usage.PromptTokens)
	assert.Equal(t, 3+64, c.usage.CompletionTokens, "the usage so far plus one interval")
	assert.Equal(t, 1, led.N("settle"))
}
