package scheduler

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// Hand-written fakes for the scheduler's riskiest branches. fakeLedger is a
// real ledger.Memory whose calls a test may intercept one operation at a
// time; fakeUpstream serves canned vLLM streams and counts executions.

func init() { queueExpirySpin = 0 }

// fakeLedger delegates to a Memory unless a hook answers.
type fakeLedger struct {
	*ledger.Memory
	mu       sync.Mutex
	reserve  func(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error, bool)
	extend   func(ctx context.Context, ref ledger.Ref) (time.Time, error, bool)
	release  func(ctx context.Context, ref ledger.Ref) (error, bool)
	settle   func(ctx context.Context, ref ledger.Ref) (ledger.Settlement, error, bool)
	dispatch func(ctx context.Context, ref ledger.Ref) (error, bool)
	calls    map[string]int
}

func newFakeLedger(t testing.TB) *fakeLedger {
	t.Helper()
	m, err := ledger.NewMemory(ledger.MemoryConfig{LeaseTTL: 60 * time.Second})
	require.NoError(t, err)
	return &fakeLedger{Memory: m, calls: map[string]int{}}
}

func (f *fakeLedger) count(op string) {
	f.mu.Lock()
	f.calls[op]++
	f.mu.Unlock()
}

func (f *fakeLedger) n(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// set runs fn under the fake's lock (hooks are read under it too).
func (f *fakeLedger) set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

func (f *fakeLedger) Reserve(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error) {
	f.count("reserve")
	f.mu.Lock()
	h := f.reserve
	f.mu.Unlock()
	if h != nil {
		if g, err, ok := h(ctx, req); ok {
			return g, err
		}
	}
	return f.Memory.Reserve(ctx, req)
}

func (f *fakeLedger) MarkDispatched(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error {
	f.count("dispatch")
	f.mu.Lock()
	h := f.dispatch
	f.mu.Unlock()
	if h != nil {
		if err, ok := h(ctx, ref); ok {
			return err
		}
	}
	return f.Memory.MarkDispatched(ctx, ref, owner)
}

func (f *fakeLedger) Extend(ctx context.Context, ref ledger.Ref, owner ledger.Owner, ttl time.Duration) (time.Time, error) {
	f.count("extend")
	f.mu.Lock()
	h := f.extend
	f.mu.Unlock()
	if h != nil {
		if exp, err, ok := h(ctx, ref); ok {
			return exp, err
		}
	}
	return f.Memory.Extend(ctx, ref, owner, ttl)
}

func (f *fakeLedger) Release(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error {
	f.count("release")
	f.mu.Lock()
	h := f.release
	f.mu.Unlock()
	if h != nil {
		if err, ok := h(ctx, ref); ok {
			return err
		}
	}
	return f.Memory.Release(ctx, ref, owner)
}

func (f *fakeLedger) Settle(ctx context.Context, ref ledger.Ref, actual ledger.Amounts, src ledger.Source) (ledger.Settlement, error) {
	f.count("settle")
	f.mu.Lock()
	h := f.settle
	f.mu.Unlock()
	if h != nil {
		if st, err, ok := h(ctx, ref); ok {
			return st, err
		}
	}
	return f.Memory.Settle(ctx, ref, actual, src)
}

func (f *fakeLedger) Charge(ctx context.Context, req ledger.ChargeRequest) (ledger.Settlement, error) {
	f.count("charge")
	return f.Memory.Charge(ctx, req)
}

// fakeUpstream answers every Stream with a completed vLLM stream of out
// tokens, or, when gate is set, a stream that blocks until gate closes or
// the call's context ends.
type fakeUpstream struct {
	runs  atomic.Int64 // Stream calls that reached the "replica"
	out   int
	gate  chan struct{}
	fail  error // returned by Stream and Post when set
	tools int   // tool calls in every answer of the other endpoints (Post)
}

func (u *fakeUpstream) Stream(ctx context.Context, _, _ string, _ []byte, _ string) (*vllm.Stream, error) {
	if u.fail != nil {
		return nil, u.fail
	}
	u.runs.Add(1)
	body := sseCompletion(u.out)
	if u.gate == nil {
		return vllm.NewStream(io.NopCloser(strings.NewReader(body)), "r0", 0), nil
	}
	pr, pw := io.Pipe()
	go func() {
		select {
		case <-u.gate:
			_, _ = io.WriteString(pw, body)
			_ = pw.Close()
		case <-ctx.Done():
			_ = pw.CloseWithError(context.Cause(ctx))
		}
	}()
	return vllm.NewStream(pr, "r0", 0), nil
}

func (u *fakeUpstream) Tokenize(context.Context, string, string, *vllm.Request) ([]int, int, error) {
	return nil, 0, fmt.Errorf("no tokenizer")
}

func (u *fakeUpstream) CountText(context.Context, string, string, string) (int, error) {
	return 0, fmt.Errorf("no tokenizer")
}

// Post answers the endpoints other than chat and completions as vLLM
// does: a whole JSON answer with its usage (otherAnswer), or for a
// streamed /v1/responses or /v1/messages their SSE events (otherStream),
// each with out output tokens and tools tool calls; gate and fail as for
// Stream.
func (u *fakeUpstream) Post(ctx context.Context, _, path string, body []byte, _ string) (*http.Response, error) {
	if u.fail != nil {
		return nil, u.fail
	}
	u.runs.Add(1)
	ans := otherAnswer(path, u.out, u.tools)
	if bytes.Contains(body, []byte(`"stream":true`)) {
		ans = otherStream(path, u.out, u.tools)
	}
	var r io.ReadCloser = io.NopCloser(strings.NewReader(ans))
	if u.gate != nil {
		pr, pw := io.Pipe()
		go func() {
			select {
			case <-u.gate:
				_, _ = io.WriteString(pw, ans)
				_ = pw.Close()
			case <-ctx.Done():
				_ = pw.CloseWithError(context.Cause(ctx))
			}
		}()
		r = pr
	}
	return &http.Response{StatusCode: 200, Body: r}, nil
}

func (u *fakeUpstream) ReadBody(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// otherAnswer is vLLM's whole answer on path: 5 prompt tokens, out output
// tokens where the endpoint generates, tools tool calls.
func otherAnswer(path string, out, tools int) string {
	switch path {
	case "/v1/embeddings":
		return `{"object":"list","data":[{"object":"embedding","index":0,"embedding":[0.5]}],"model":"m","usage":{"prompt_tokens":5,"total_tokens":5,"completion_tokens":0}}`
	case "/v1/responses":
		items := []string{`{"type":"message","role":"assistant","content":[{"type":"output_text","text":"` + strings.Repeat("x", out) + `"}]}`}
		for i := range tools {
			items = append(items, fmt.Sprintf(`{"type":"function_call","call_id":"c%d","name":"f","arguments":"{}"}`, i))
		}
		return fmt.Sprintf(`{"id":"resp_1","object":"response","model":"m","status":"completed","output":[%s],"usage":{"input_tokens":5,"output_tokens":%d,"total_tokens":%d}}`,
			strings.Join(items, ","), out, 5+out)
	case "/v1/messages":
		blocks := []string{`{"type":"text","text":"` + strings.Repeat("x", out) + `"}`}
		for i := range tools {
			blocks = append(blocks, fmt.Sprintf(`{"type":"tool_use","id":"t%d","name":"f","input":{}}`, i))
		}
		return fmt.Sprintf(`{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[%s],"stop_reason":"end_turn","usage":{"input_tokens":5,"output_tokens":%d}}`,
			strings.Join(blocks, ","), out)
	default: // /tokenize and the other request-only endpoints
		return `{"count":5,"max_model_len":4096,"tokens":[1,2,3,4,5]}`
	}
}

// otherStream is vLLM's streamed /v1/responses (response.completed with
// its usage last: vllm/entrypoints/openai/responses/serving.py) or
// Anthropic /v1/messages answer (usage in message_delta:
// vllm/entrypoints/anthropic/serving.py) of out tokens and tools calls.
func otherStream(path string, out, tools int) string {
	var b strings.Builder
	ev := func(typ, data string) { fmt.Fprintf(&b, "event: %s\ndata: %s\n\n", typ, data) }
	if path == "/v1/messages" {
		ev("message_start", `{"type":"message_start","message":{"id":"msg_1","type":"message","role":"assistant","model":"m","content":[],"usage":{"input_tokens":5,"output_tokens":0}}}`)
		ev("content_block_start", `{"type":"content_block_start","index":0,"content_block":{"type":"text","text":""}}`)
		for range out {
			ev("content_block_delta", `{"type":"content_block_delta","index":0,"delta":{"type":"text_delta","text":"x"}}`)
		}
		ev("content_block_stop", `{"type":"content_block_stop","index":0}`)
		for i := range tools {
			ev("content_block_start", fmt.Sprintf(`{"type":"content_block_start","index":%d,"content_block":{"type":"tool_use","id":"t%d","name":"f","input":{}}}`, i+1, i))
			ev("content_block_stop", fmt.Sprintf(`{"type":"content_block_stop","index":%d}`, i+1))
		}
		ev("message_delta", fmt.Sprintf(`{"type":"message_delta","delta":{"stop_reason":"end_turn"},"usage":{"input_tokens":5,"output_tokens":%d}}`, out))
		ev("message_stop", `{"type":"message_stop"}`)
		return b.String()
	}
	ev("response.created", `{"type":"response.created","response":{"id":"resp_1","object":"response","status":"in_progress","output":[]}}`)
	for range out {
		ev("response.output_text.delta", `{"type":"response.output_text.delta","item_id":"m1","output_index":0,"content_index":0,"delta":"x"}`)
	}
	var items []string
	for i := range tools {
		item := fmt.Sprintf(`{"type":"function_call","call_id":"c%d","name":"f","arguments":"{}"}`, i)
		items = append(items, item)
		ev("response.output_item.added", fmt.Sprintf(`{"type":"response.output_item.added","output_index":%d,"item":%s}`, i+1, item))
		ev("response.output_item.done", fmt.Sprintf(`{"type":"response.output_item.done","output_index":%d,"item":%s}`, i+1, item))
	}
	ev("response.completed", fmt.Sprintf(`{"type":"response.completed","response":{"id":"resp_1","object":"response","status":"completed","output":[%s],"usage":{"input_tokens":5,"output_tokens":%d,"total_tokens":%d}}}`,
		strings.Join(items, ","), out, 5+out))
	return b.String()
}

// sseCompletion is vLLM's stream of a chat completion of out tokens with
// continuous usage, then the final usage chunk and [DONE].
func sseCompletion(out int) string {
	var b strings.Builder
	for i := 1; i <= out; i++ {
		fmt.Fprintf(&b, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", i, 5+i)
	}
	fmt.Fprintf(&b, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", out, 5+out)
	fmt.Fprintf(&b, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", out, 5+out)
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// testConfig is a one-replica config; tenantExtra is appended to tenant
// acme (4-space indented YAML lines), top to the top level.
func testConfig(t testing.TB, top, tenantExtra string) *config.File {
	t.Helper()
	y := "upstream:\n  replicas:\n    - {name: r0, url: \"http://r0.invalid\"}\ngpu: {telemetry: off}\n" + top +
		fmt.Sprintf("tenants:\n  - name: acme\n    api_keys: [%q]\n%s", config.HashKey("sk-acme"), tenantExtra)
	cfg, err := config.Parse([]byte(y))
	require.NoError(t, err, y)
	return cfg
}

// newTestServer builds a Server on the fakes with a fixed-size replica;
// opts set further Deps.
func newTestServer(t testing.TB, cfg *config.File, led Ledger, up Upstream, opts ...func(*Deps)) *Server {
	t.Helper()
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	mon, err := gpu.NewMonitor(gpu.Config{Telemetry: gpu.ModeOff, Replicas: []gpu.Replica{{Name: "r0", CapacityTokens: 1 << 20}}}, gpu.Deps{})
	require.NoError(t, err)
	deps := Deps{Ledger: led, Upstream: up, Keyer: keyer, GPU: mon}
	for _, o := range opts {
		o(&deps)
	}
	s, err := New(cfg, deps)
	require.NoError(t, err)
	s.reps.Capacity = fixedCapacity(map[string]int64{"r0": 1 << 20})
	for _, r := range s.reps.List() {
		r.MaxSeqs = 1 << 20
	}
	s.loopOnly = true // tests hold calls queued by not running the loop
	return s
}

// chatBody is a small chat request.
func chatBody(extra string) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8` + extra + `}`)
}

// serve runs one non-streamed request through the pipeline, as the edge
// does, and returns its outcome.
func serve(ctx context.Context, s *Server, a admission) ([]byte, error) {
	pol := s.pol.Load()
	t := pol.Tenants["acme"]
	if a.ep == 0 {
		a.ep = vllm.EndpointChat
	}
	if a.reqID == "" {
		a.reqID = "req"
	}
	c, body, err := s.start(ctx, t, pol, a)
	if c != nil {
		c.end()
	}
	return body, err
}

// start runs a call as the edge does: Start, then, unless the call
// streams, Finish into a recordingSink. It returns the call (nil: nothing
// was admitted), the answer's body and the error that ended it. A
// streaming call is returned with its answer open, for the test to finish
// and end (tests of the streamed delivery: stream_test.go).
func (s *Server) start(ctx context.Context, t *policy.Tenant, pol *policy.Snapshot, a admission) (*call, []byte, error) {
	tk, err := s.begin(ctx, t, pol, a)
	if tk == nil {
		return nil, nil, err
	}
	if tk.Streaming() {
		return tk.c, nil, nil
	}
	var out recordingSink
	tk.Finish(&out)
	return tk.c, out.body, out.err
}

// recordingSink keeps what Finish delivered: the body, or the error it
// answered, or the streamed bytes.
type recordingSink struct {
	body     []byte
	err      error
	refusals int
	streamed bytes.Buffer
}

func (r *recordingSink) Whole(_ Meta, body []byte) { r.body = body }

func (r *recordingSink) Refuse(err error, _ *apierr.Error, _ Meta) {
	r.err = err
	r.refusals++
}

func (r *recordingSink) Stream() (io.Writer, WriteDeadliner) { return &r.streamed, nil }

// tenantUsage reads acme's tenant scope from the Memory.
func tenantUsage(t testing.TB, s *Server, m *ledger.Memory) ledger.Usage {
	t.Helper()
	k := s.pol.Load().Tenants["acme"].ScopeKey
	u, err := m.Snapshot(context.Background(), k, k)
	require.NoError(t, err)
	return u
}

// committed is the committed amount of dim in acme's limit of that dim and
// window.
func committed(u ledger.Usage, d ledger.Dim, w time.Duration) int64 {
	for _, l := range u.Limits {
		if l.Limit.Dim == d && l.Limit.Window == w {
			return l.Committed
		}
	}
	return -1
}
