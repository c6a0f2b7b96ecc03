package node

import (
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// slowSim decodes slowly enough to act mid-generation.
func slowSim() sim.Config {
	c := sim.DefaultConfig()
	c.DecodeStep = 15 * time.Millisecond
	c.OutputLenMax = 1000
	return c
}

const budgets = "    budgets:\n      - {dimension: tokens, limit: 100000000, window: 1h}\n      - {dimension: output_tokens, limit: 100000000, window: 1h}\n      - {dimension: input_tokens, limit: 100000000, window: 1h}\n"

const longStream = `{"model":"sim-model","prompt":"tell me a very long story please","max_tokens":400,"ignore_eos":true,"stream":true}`

func TestStreamedMatchesDirect(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	body := `{"model":"sim-model","messages":[{"role":"user","content":"stream me"}],"max_tokens":10,"stream":true,"stream_options":{"include_usage":true}}`
	via := n.post(t, "/v1/chat/completions", keyAcme, body, "X-Request-Id", "stream-same")
	viaBody := readAll(t, via)
	require.Equal(t, 200, via.StatusCode, string(viaBody))
	assert.Equal(t, "text/event-stream", via.Header.Get("Content-Type"))

	req, _ := http.NewRequest("POST", rep.url+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("X-Request-Id", "stream-same")
	direct, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	directBody := readAll(t, direct)

	// Chunking depends on timing (tokens produced while a chunk is being
	// written are packed into the next one, as in vLLM), so compare what
	// the stream says: text, finish reason, usage, ids and the end marker.
	assert.Equal(t, summarize(t, sseEvents(directBody)), summarize(t, sseEvents(viaBody)))
}

type streamSummary struct {
	ID, Model, Text, Finish string
	Usage                   string
	Done                    bool
}

func summarize(t *testing.T, events []string) streamSummary {
	t.Helper()
	var s streamSummary
	for _, e := range events {
		if e == "[DONE]" {
			s.Done = true
			continue
		}
		var c struct {
			ID      string `json:"id"`
			Model   string `json:"model"`
			Choices []struct {
				Delta struct {
					Content string `json:"content"`
				} `json:"delta"`
				Finish *string `json:"finish_reason"`
			} `json:"choices"`
			Usage json.RawMessage `json:"usage"`
		}
		require.NoError(t, json.Unmarshal([]byte(e), &c), e)
		s.ID, s.Model = c.ID, c.Model
		for _, ch := range c.Choices {
			s.Text += ch.Delta.Content
			if ch.Finish != nil {
				s.Finish = *ch.Finish
			}
		}
		if len(c.Usage) > 0 && string(c.Usage) != "null" {
			s.Usage = string(c.Usage)
		}
	}
	return s
}

// readChunks reads k SSE data events from a streaming response.
func readChunks(t *testing.T, r io.Reader, k int) {
	t.Helper()
	buf := make([]byte, 0, 4096)
	tmp := make([]byte, 1024)
	for strings.Count(string(buf), "data: ") < k {
		m, err := r.Read(tmp)
		require.NoError(t, err)
		buf = append(buf, tmp[:m]...)
	}
}

func TestClientDisconnectMidStreamAbortsUpstream(t *testing.T) {
	rep := startSim(t, slowSim())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, budgets, ""))

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", n.api+"/v1/completions", strings.NewReader(longStream))
	req.Header.Set("Authorization", "Bearer "+keyAcme)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	require.Equal(t, 200, resp.StatusCode)
	readChunks(t, resp.Body, 5)
	cancel() // the client hangs up mid-decode
	resp.Body.Close()

	eventually(t, "simulator abort", func() bool { return rep.Stats().Aborted == 1 })
	eventually(t, "simulator idle", func() bool { return rep.Stats().Running == 0 })
	eventually(t, "abort metric", func() bool {
		return n.metric(t, "sluice_upstream_aborts_total", map[string]string{"cause": "client_disconnect"}) == 1
	})
	eventually(t, "holds released", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0 &&
			n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "output_tokens"}) > 0
	})
	gen := float64(rep.Stats().GenerationTokens)
	out := n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "output_tokens"})
	// Charged: the tokens the client saw streamed plus the documented
	// allowance of one token per choice; never less than what was
	// generated up to the last chunk read, never far above what ran.
	assert.LessOrEqual(t, out, gen+1, "charged %v output tokens, simulator generated %v", out, gen)
	assert.GreaterOrEqual(t, out, float64(5-1), "charged %v", out)
	in := n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "input_tokens"})
	assert.InDelta(t, float64(rep.Stats().PromptTokens), in, 1e-9)
	assert.InDelta(t, 1.0, n.metric(t, "sluice_requests_total", map[string]string{"tenant": "acme", "outcome": "cancelled"}), 1e-9)
}

func TestClientDisconnectNonStreamedAbortsUpstream(t *testing.T) {
	rep := startSim(t, slowSim())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, budgets, ""))

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", n.api+"/v1/completions",
		strings.NewReader(strings.Replace(longStream, `"stream":true`, `"stream":false`, 1)))
	req.Header.Set("Authorization", "Bearer "+keyAcme)
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	eventually(t, "generation started", func() bool { return rep.Stats().GenerationTokens >= 3 })
	cancel()
	require.Error(t, <-errc)
	eventually(t, "simulator abort", func() bool { return rep.Stats().Aborted == 1 && rep.Stats().Running == 0 })
	eventually(t, "abort metric and release", func() bool {
		return n.metric(t, "sluice_upstream_aborts_total", map[string]string{"cause": "client_disconnect"}) == 1 &&
			n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0
	})
}

func TestClientDisconnectWhileQueuedNeverReachesReplica(t *testing.T) {
	rep := startSim(t, slowSim())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    concurrency: 1\n"+budgets, ""))

	// The first request holds acme's only slot.
	first := n.post(t, "/v1/completions", keyAcme, longStream)
	require.Equal(t, 200, first.StatusCode)
	defer first.Body.Close()
	readChunks(t, first.Body, 1)

	ctx, cancel := context.WithCancel(context.Background())
	req, _ := http.NewRequestWithContext(ctx, "POST", n.api+"/v1/completions", strings.NewReader(longStream))
	req.Header.Set("Authorization", "Bearer "+keyAcme)
	errc := make(chan error, 1)
	go func() {
		resp, err := http.DefaultClient.Do(req)
		if err == nil {
			resp.Body.Close()
		}
		errc <- err
	}()
	eventually(t, "second request queued", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "requests"}) == 2
	})
	cancel()
	require.Error(t, <-errc)
	eventually(t, "queued hold released", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "requests"}) == 1
	})
	assert.Equal(t, int64(1), rep.Stats().Received, "the cancelled request must never reach the replica")
	assert.InDelta(t, 1.0, n.metric(t, "sluice_requests_total", map[string]string{"tenant": "acme", "outcome": "cancelled"}), 1e-9)
}

func TestQueueDeadlineExpires504(t *testing.T) {
	rep := startSim(t, slowSim())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    concurrency: 1\n", ""))
	first := n.post(t, "/v1/completions", keyAcme, longStream)
	require.Equal(t, 200, first.StatusCode)
	defer first.Body.Close()
	readChunks(t, first.Body, 1)

	resp := n.post(t, "/v1/completions", keyAcme, longStream, "X-Request-Timeout", "0.2")
	body := readAll(t, resp)
	assert.Equal(t, 504, resp.StatusCode)
	code, _ := errorCode(t, body)
	assert.Equal(t, "deadline_exceeded", code)
	assert.Equal(t, int64(1), rep.Stats().Received, "an expired request must never reach the replica")
	assert.InDelta(t, 0.0, n.metric(t, "sluice_expired_dispatch_total", nil), 1e-9)
}

func TestBudgetExceeded429(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    budgets: [{dimension: requests, limit: 2, window: 1h}]\n", ""))
	for i := range 2 {
		resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody)
		body := readAll(t, resp)
		require.Equal(t, 200, resp.StatusCode, "request %d: %s", i, body)
		assert.Equal(t, "2", resp.Header.Get("x-ratelimit-limit-requests"))
		assert.Equal(t, fmt.Sprint(1-i), resp.Header.Get("x-ratelimit-remaining-requests"))
	}
	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	body := readAll(t, resp)
	require.Equal(t, 429, resp.StatusCode, string(body))
	code, det := errorCode(t, body)
	assert.Equal(t, "tenant_budget_exceeded", code)
	assert.Equal(t, "tenant", det["scope"])
	assert.Equal(t, "requests", det["dimension"])
	assert.Equal(t, "1h", det["window"])
	assert.EqualValues(t, 2, det["limit"])
	assert.EqualValues(t, 2, det["committed"])
	assert.EqualValues(t, 1, det["requested"])
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	assert.NotEmpty(t, resp.Header.Get("retry-after-ms"))
	assert.Equal(t, "false", resp.Header.Get("x-should-retry"))
	assert.Equal(t, int64(2), rep.Stats().Received)
	// beta is unaffected.
	ok := n.post(t, "/v1/chat/completions", keyBeta, chatBody)
	readAll(t, ok)
	assert.Equal(t, 200, ok.StatusCode)
}

func TestErrorCodes(t *testing.T) {
	rep := startSim(t, slowSim())
	top := "server: {max_body_bytes: 2048, drain_timeout: 5s, max_depth: 1}\n"
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    concurrency: 1\n    max_input_tokens: 100\n", top))
	tests := []struct {
		name   string
		path   string
		key    string
		body   string
		hdr    []string
		status int
		code   string
	}{
		{"no key", "/v1/chat/completions", "", chatBody, nil, 401, "invalid_api_key"},
		{"bad json", "/v1/chat/completions", keyAcme, `{"model":`, nil, 400, "invalid_request"},
		{"wrong type", "/v1/chat/completions", keyAcme, `{"model":"sim-model","messages":"hi"}`, nil, 400, "invalid_request"},
		{"unknown model", "/v1/chat/completions", keyAcme, `{"model":"gpt-9","messages":[{"role":"user","content":"hi"}]}`, nil, 404, "model_not_found"},
		{"bad timeout header", "/v1/chat/completions", keyAcme, chatBody, []string{"X-Request-Timeout", "soon"}, 400, "invalid_request"},
		{"input over tenant max", "/v1/completions", keyAcme, `{"model":"sim-model","prompt":[` + strings.Repeat("1,", 200) + `1],"max_tokens":1}`, nil, 400, "context_length_exceeded"},
		{"body too large", "/v1/chat/completions", keyAcme, `{"model":"sim-model","messages":[{"role":"user","content":"` + strings.Repeat("x", 4096) + `"}]}`, nil, 413, "request_too_large"},
		{"unknown route", "/v1/audio/transcriptions", keyAcme, `{}`, nil, 404, "not_found"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			resp := n.post(t, tc.path, tc.key, tc.body, tc.hdr...)
			body := readAll(t, resp)
			assert.Equal(t, tc.status, resp.StatusCode, string(body))
			code, _ := errorCode(t, body)
			assert.Equal(t, tc.code, code)
			assert.NotEmpty(t, resp.Header.Get("X-Request-Id"))
		})
	}
	assert.Equal(t, int64(0), rep.Stats().Received, "no refused request reaches the replica")

	// queue_full: one running (concurrency 1), one queued (max_depth 1),
	// the third is refused at once with Retry-After.
	first := n.post(t, "/v1/completions", keyAcme, longStream)
	require.Equal(t, 200, first.StatusCode)
	defer first.Body.Close()
	readChunks(t, first.Body, 1)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		n.call(t, "/v1/completions", keyAcme, longStream, "X-Request-Timeout", "3")
	}()
	eventually(t, "one queued", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "requests"}) == 2
	})
	resp := n.post(t, "/v1/completions", keyAcme, longStream)
	body := readAll(t, resp)
	assert.Equal(t, 429, resp.StatusCode, string(body))
	code, _ := errorCode(t, body)
	assert.Equal(t, "queue_full", code)
	assert.NotEmpty(t, resp.Header.Get("Retry-After"))
	wg.Wait()
}
