package vllm_test

import (
	"context"
	"errors"
	"io"
	"net/http/httptest"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm"
	"github.com/sluicehq/sluice/vllm/sim"
)

// The client against the simulator (VLLM.md Part 3): the same checks run
// against a pinned vLLM where a GPU is available.

func startSim(t *testing.T, mod func(*sim.Config)) (*sim.Replica, string) {
	t.Helper()
	cfg := sim.DefaultConfig()
	cfg.Model = "m"
	if mod != nil {
		mod(&cfg)
	}
	r, err := sim.New(cfg)
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Run(ctx) }()
	srv := httptest.NewServer(r.Handler())
	t.Cleanup(func() {
		cancel()
		srv.Close()
		<-done
	})
	return r, srv.URL
}

func TestSimChatRoundTrip(t *testing.T) {
	t.Parallel()
	_, url := startSim(t, nil)
	c := vllm.NewClient(vllm.Config{})
	body := `{"model":"m","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell me about the sea and the sky"}],"n":2,"max_tokens":20}`
	req, err := vllm.Parse(vllm.EndpointChat, []byte(body), vllm.CountOptions{})
	require.NoError(t, err)

	counts, maxLen, err := c.Tokenize(t.Context(), url, "m", req)
	require.NoError(t, err)
	require.Len(t, counts, 1)
	assert.Equal(t, 4096, maxLen)
	assert.GreaterOrEqual(t, req.InputTokens[0], counts[0], "bytes mode must bound the exact count")
	exact, err := req.WithExactInput(counts)
	require.NoError(t, err)
	plan, err := exact.Plan(vllm.Limits{MaxModelLen: maxLen, TenantMaxOutput: 10})
	require.NoError(t, err)
	assert.Equal(t, vllm.Plan{Cap: 10, Choices: 2, InputTokens: counts[0], OutputTokens: 20}, plan)

	s, err := c.Stream(t.Context(), url, "/v1/chat/completions", exact.Rewrite(nil, plan.Cap), "conf-1")
	require.NoError(t, err)
	defer s.Close()
	a := vllm.NewAssembler(vllm.EndpointChat)
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		require.NoError(t, a.Add(ev))
	}
	u := s.Usage()
	require.True(t, u.Final, "a non-streamed response is one whole event with its usage")
	assert.Equal(t, counts[0], u.PromptTokens, "/tokenize count equals usage.prompt_tokens")
	assert.LessOrEqual(t, u.CompletionTokens, plan.OutputTokens, "vLLM enforces the rewritten cap")
	out, err := a.Body()
	require.NoError(t, err)
	assert.Contains(t, string(out), `"object":"chat.completion"`)
}

func TestSimCumulativeUsageMatchesFinal(t *testing.T) {
	t.Parallel()
	_, url := startSim(t, func(c *sim.Config) { c.StreamInterval = 3 })
	c := vllm.NewClient(vllm.Config{})
	req, err := vllm.Parse(vllm.EndpointCompletions, []byte(`{"model":"m","prompt":["one two three","four"],"n":2,"max_tokens":30,"stream":true}`), vllm.CountOptions{})
	require.NoError(t, err)
	s, err := c.Stream(t.Context(), url, "/v1/completions", req.Rewrite(nil, 30), "")
	require.NoError(t, err)
	defer s.Close()
	var beforeFinal vllm.Usage
	for {
		ev, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		if !ev.Final {
			beforeFinal = s.Usage()
		}
	}
	final := s.Usage()
	require.True(t, final.Final)
	assert.Equal(t, 4, beforeFinal.Choices)
	assert.Equal(t, final.CompletionTokens, beforeFinal.CompletionTokens,
		"Σ per-choice last cumulative completion_tokens equals the final usage")
}

func TestSimCancelAbortsAndPollerSeesIt(t *testing.T) {
	t.Parallel()
	rep, url := startSim(t, func(c *sim.Config) { c.OutputLenMax = 100000 })
	c := vllm.NewClient(vllm.Config{})
	req, err := vllm.Parse(vllm.EndpointChat, []byte(`{"model":"m","messages":[{"role":"user","content":"go on"}],"ignore_eos":true,"max_tokens":3000,"stream":true}`), vllm.CountOptions{})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	s, err := c.Stream(ctx, url, "/v1/chat/completions", req.Rewrite(nil, 3000), "")
	require.NoError(t, err)
	for range 3 {
		_, err := s.Next()
		require.NoError(t, err)
	}
	cancel()
	// Events already buffered may still come; then the cancel shows.
	for err == nil {
		_, err = s.Next()
	}
	require.ErrorIs(t, err, context.Canceled)
	settled := s.Settle(1, 1, 3000, req.TotalInputTokens())
	assert.False(t, settled.Final)
	assert.Positive(t, settled.CompletionTokens)
	require.NoError(t, s.Close())

	require.Eventually(t, func() bool { return rep.Stats().Aborted == 1 }, 10*time.Second, 5*time.Millisecond,
		"the simulator must see the abort")
	p, err := vllm.NewPoller(vllm.PollerConfig{Replicas: []vllm.Target{{Name: "r0", URL: url, Model: "m"}}}, c, nil)
	require.NoError(t, err)
	p.PollOnce(t.Context())
	r0, ok := p.Get("r0")
	require.True(t, ok)
	assert.True(t, r0.Up)
	assert.Equal(t, vllm.Value{V: 1, OK: true}, r0.Metrics.SimAbortedTotal)
	assert.Equal(t, vllm.Value{V: 65536, OK: true}, r0.Metrics.KVCapacityTokens)
	assert.True(t, r0.Metrics.Running.OK)
	assert.True(t, r0.Metrics.GPUBusySecondsTotal.OK)
}

func TestSimErrors(t *testing.T) {
	t.Parallel()
	_, url := startSim(t, nil)
	c := vllm.NewClient(vllm.Config{})
	_, err := c.Stream(t.Context(), url, "/v1/chat/completions", []byte(`{"model":"nope","messages":[{"role":"user","content":"x"}],"stream":true}`), "")
	var ue *vllm.UpstreamError
	require.ErrorAs(t, err, &ue)
	assert.Equal(t, 404, ue.Status)
	assert.Equal(t, "NotFoundError", ue.Type)

	_, err = c.Stream(t.Context(), url, "/v1/completions", []byte(`{"model":"m","prompt":"x","max_tokens":5000,"stream":true}`), "")
	require.ErrorAs(t, err, &ue)
	assert.True(t, ue.ContextLength(), "got %+v", ue)

	ms, err := c.Models(t.Context(), url)
	require.NoError(t, err)
	assert.Equal(t, []vllm.Model{{ID: "m", MaxModelLen: 4096}}, ms)
}
