package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/vllm"
)

// The endpoints other than chat and completions run the same lifecycle
// (Start, Finish) on the same fakes: these pin what they are charged, how
// their answers are delivered and what their tool calls count.

// otherServer is a test server on up whose dispatch loop runs.
func otherServer(t *testing.T, tenantExtra string, up Upstream) (*Engine, *lifecycletest.Ledger) {
	t.Helper()
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, lifecycletest.Config(t, "", tenantExtra), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.dispatchLoop(ctx)
	return s, led
}

// A whole answer of each family is the client's as vLLM sent it, and the
// call settles once from the answer's usage: input only where nothing is
// generated, the request alone where no model runs.
func TestOtherEndpointsSettleFromTheirAnswer(t *testing.T) {
	for _, tc := range []struct {
		ep       vllm.Endpoint
		body     string
		in, out  int64
		contains string
	}{
		{vllm.EndpointEmbeddings, `{"model":"m","input":"hello there"}`, 5, 0, `"embedding":[0.5]`},
		{vllm.EndpointResponses, `{"model":"m","input":"hi","max_output_tokens":16}`, 5, 3, `"output_text"`},
		{vllm.EndpointMessages, `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`, 5, 3, `"type":"message"`},
		{vllm.EndpointTokenize, `{"model":"m","prompt":"hi"}`, 0, 0, `"count":5`},
	} {
		t.Run(tc.ep.Path(), func(t *testing.T) {
			up := &lifecycletest.Upstream{Out: 3}
			s, led := otherServer(t, "    budgets: [{dimension: tokens, limit: 100000, window: 1h}, {dimension: requests, limit: 100, window: 1h}]\n", up)
			body, err := serve(context.Background(), s, admission{ep: tc.ep, body: []byte(tc.body)})
			require.NoError(t, err)
			assert.Contains(t, string(body), tc.contains)
			assert.Equal(t, int64(1), up.Runs.Load())
			assert.Equal(t, 1, led.N("settle"))
			u := tenantUsage(t, s, led.Memory)
			assert.Equal(t, ledger.Amounts{}, u.Reserved, "nothing left held")
			assert.Equal(t, tc.in+tc.out, lifecycletest.Committed(u, ledger.Tokens, time.Hour), "tokens charged")
			assert.Equal(t, int64(1), lifecycletest.Committed(u, ledger.Requests, time.Hour))
		})
	}
}

// notSentOnce refuses the first Post before sending it (a connection
// refused), then answers as lifecycletest.Upstream.
type notSentOnce struct {
	lifecycletest.Upstream
	mu    sync.Mutex
	tried []string
}

func (u *notSentOnce) Post(ctx context.Context, url, path string, body []byte, id string) (*http.Response, error) {
	u.mu.Lock()
	u.tried = append(u.tried, url)
	first := len(u.tried) == 1
	u.mu.Unlock()
	if first {
		return nil, vllm.ErrNotSent
	}
	return u.Upstream.Post(ctx, url, path, body, id)
}

// The other endpoints are sent by execute's one loop: a replica that
// refused before anything was sent is retried on another of the pool.
func TestOtherEndpointRetriedOnAnotherReplica(t *testing.T) {
	up := &notSentOnce{Upstream: lifecycletest.Upstream{Out: 1}}
	cfg := lifecycletest.Config(t, "", "")
	cfg.Upstream.Replicas = append(cfg.Upstream.Replicas, cfg.Upstream.Replicas[0])
	cfg.Upstream.Replicas[1].Name, cfg.Upstream.Replicas[1].URL = "r1", "http://r1.invalid"
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, cfg, led, up)
	s.reps.Capacity = lifecycletest.FixedCapacity(map[string]int64{"r0": 1 << 20, "r1": 1 << 20})
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.dispatchLoop(ctx)
	body, err := serve(ctx, s, admission{ep: vllm.EndpointEmbeddings, body: []byte(`{"model":"m","input":"hi"}`)})
	require.NoError(t, err)
	assert.Contains(t, string(body), `"embedding"`)
	up.mu.Lock()
	defer up.mu.Unlock()
	require.Len(t, up.tried, 2)
	assert.NotEqual(t, up.tried[0], up.tried[1], "the retry went to the other replica")
	assert.Equal(t, 1, led.N("settle"))
}

// A streamed /v1/responses or /v1/messages answer is delivered by Finish
// like chat's: every event passes, the call settles once from the final
// usage, and each tool call counts once in the workflow
// (response.output_item.done and response.completed repeat the items).
func TestOtherStreamsDeliveredByFinish(t *testing.T) {
	for _, tc := range []struct {
		ep   vllm.Endpoint
		body string
		last string
	}{
		{vllm.EndpointResponses, `{"model":"m","input":"hi","max_output_tokens":16,"stream":true}`, "event: response.completed\n"},
		{vllm.EndpointMessages, `{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`, "event: message_stop\n"},
	} {
		t.Run(tc.ep.Path(), func(t *testing.T) {
			s, led, tk := streamedCallOn(t, &lifecycletest.Upstream{Out: 4, Tools: 2}, tc.ep, []byte(tc.body))
			c := tk.c
			wf := &workflow{created: s.now()}
			c.wf = wf
			var buf bytes.Buffer
			out := &writerSink{w: &buf}
			assert.Equal(t, outcomeOK, tk.Finish(out))
			assert.Zero(t, out.other)
			assert.Contains(t, buf.String(), tc.last)
			assert.Equal(t, strings.Count(lifecycletest.OtherStream(tc.ep.Path(), 4, 2), "event: "), strings.Count(buf.String(), "event: "), "every event passed")
			assert.Equal(t, phaseSettled, c.phase)
			assert.Equal(t, 1, led.N("settle"))
			assert.True(t, c.usage.Final)
			assert.Equal(t, 4, c.usage.CompletionTokens)
			wf.mu.Lock()
			defer wf.mu.Unlock()
			assert.Equal(t, int64(2), wf.toolCalls)
		})
	}
}

// A streamed /v1/responses answer never written (the client left before
// the headers went out: Finish with no sink) is settled once as a client
// disconnect, its upstream answer closed.
func TestResponsesStreamNeverWrittenSettlesAsDisconnect(t *testing.T) {
	gate := make(chan struct{})
	defer close(gate)
	_, led, tk := streamedCallOn(t, &lifecycletest.Upstream{Out: 3, Gate: gate}, vllm.EndpointResponses,
		[]byte(`{"model":"m","input":"hi","max_output_tokens":16,"stream":true}`))
	assert.Equal(t, outcomeCancelled, tk.Finish(nil))
	c := tk.c
	assert.Equal(t, 1, led.N("settle"))
	assert.Equal(t, phaseSettled, c.phase)
	require.ErrorIs(t, context.Cause(c.ctx), apierr.ErrClientGone)
	assert.Equal(t, "client_disconnect", c.abortCause)
}

// failAfter writes to the client until its budget of writes is spent,
// then fails as a closed connection.
type failAfter struct {
	bytes.Buffer
	left int
}

func (w *failAfter) Write(p []byte) (int, error) {
	if w.left == 0 {
		return 0, errors.New("broken pipe")
	}
	w.left--
	return w.Buffer.Write(p)
}

// A client that leaves mid-stream ends a /v1/messages call as chat's: a
// client disconnect, the upstream answer cancelled, settled once from the
// deltas seen.
func TestMessagesStreamClientLeaves(t *testing.T) {
	gate := make(chan struct{})
	close(gate)
	_, led, tk := streamedCallOn(t, &lifecycletest.Upstream{Out: 6, Gate: gate}, vllm.EndpointMessages,
		[]byte(`{"model":"m","max_tokens":16,"stream":true,"messages":[{"role":"user","content":"hi"}]}`))
	out := &writerSink{w: &failAfter{left: 4}} // message_start, the block's start, two deltas
	assert.Equal(t, outcomeCancelled, tk.Finish(out))
	require.Error(t, out.err)
	c := tk.c
	assert.Equal(t, phaseSettled, c.phase)
	assert.Equal(t, 1, led.N("settle"))
	assert.Equal(t, "client_disconnect", c.abortCause)
	assert.False(t, c.usage.Final)
	assert.GreaterOrEqual(t, c.usage.CompletionTokens, 2, "at least the deltas the client saw")
}

// max_tool_calls holds on /v1/responses as on chat: a whole answer's
// function_call items count, and the envelope refuses the call after the
// limit.
func TestResponsesToolCallsEnforceMaxToolCalls(t *testing.T) {
	for _, ep := range []vllm.Endpoint{vllm.EndpointResponses, vllm.EndpointMessages} {
		t.Run(ep.Path(), func(t *testing.T) {
			up := &lifecycletest.Upstream{Out: 2, Tools: 2}
			s, _ := otherServer(t, "    workflow_defaults: {max_tool_calls: 3}\n", up)
			body := `{"model":"m","input":"hi","max_output_tokens":16}`
			if ep == vllm.EndpointMessages {
				body = `{"model":"m","max_tokens":16,"messages":[{"role":"user","content":"hi"}]}`
			}
			a := admission{ep: ep, body: []byte(body), workflow: "agent-1"}
			for range 2 { // 2 then 4 tool calls: past the limit of 3
				_, err := serve(context.Background(), s, a)
				require.NoError(t, err)
			}
			_, err := serve(context.Background(), s, a)
			require.ErrorIs(t, err, ErrWorkflow)
			assert.Contains(t, err.Error(), "tool_calls exhausted: 4 of 3 used")
			assert.Equal(t, int64(2), up.Runs.Load(), "the refused call never went upstream")
		})
	}
}

// An illegal lifecycle move is refused, counted and reported: a second
// Finish of one ticket.
func TestFinishTwiceIsIllegal(t *testing.T) {
	s, led := otherServer(t, "", &lifecycletest.Upstream{Out: 1})
	var illegal []error
	s.onIllegal = func(err error) { illegal = append(illegal, err) }
	pol := s.pol.Load()
	tk, err := s.begin(context.Background(), pol.Tenants["acme"], pol, admission{ep: vllm.EndpointEmbeddings, body: []byte(`{"model":"m","input":"hi"}`), reqID: "r"})
	require.NoError(t, err)
	var out recordingSink
	assert.Equal(t, outcomeOK, tk.Finish(&out))
	tk.Finish(&out)
	require.Len(t, illegal, 1)
	assert.ErrorIs(t, illegal[0], errFinishedTwice)
	assert.Equal(t, 1, led.N("settle"))
}
