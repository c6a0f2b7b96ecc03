// Package lifecycletest holds the fakes the call lifecycle's tests and the
// composition root's share: a ledger whose calls a test may intercept one
// operation at a time, a vLLM that answers from canned streams and counts
// executions, and small configs. Only tests import it.
package lifecycletest

import (
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/vllm"
	"github.com/stretchr/testify/require"
)

// Ledger is a real ledger.Memory whose calls a test may intercept one
// operation at a time: a hook that answers ok replaces the Memory's answer.
// Set hooks under Set.
type Ledger struct {
	*ledger.Memory
	mu         sync.Mutex
	OnReserve  func(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error, bool)
	OnExtend   func(ctx context.Context, ref ledger.Ref) (time.Time, error, bool)
	OnRelease  func(ctx context.Context, ref ledger.Ref) (error, bool)
	OnSettle   func(ctx context.Context, ref ledger.Ref) (ledger.Settlement, error, bool)
	OnDispatch func(ctx context.Context, ref ledger.Ref) (error, bool)
	calls      map[string]int
	settled    map[ledger.RequestID]Settled
}

// Settled is what a Settle was asked to charge.
type Settled struct {
	Actual ledger.Amounts
	Source ledger.Source
}

// SettledOf is the last Settle asked for id's record; false when none was.
func (f *Ledger) SettledOf(id ledger.RequestID) (Settled, bool) {
	f.mu.Lock()
	defer f.mu.Unlock()
	s, ok := f.settled[id]
	return s, ok
}

// NewLedger is a Ledger on a fresh Memory with a 60 s lease bound.
func NewLedger(t testing.TB) *Ledger {
	t.Helper()
	m, err := ledger.NewMemory(ledger.MemoryConfig{LeaseTTL: 60 * time.Second})
	require.NoError(t, err)
	return LedgerOn(m)
}

// LedgerOn is a Ledger on m (a journal-backed Memory a test reopens).
func LedgerOn(m *ledger.Memory) *Ledger {
	return &Ledger{Memory: m, calls: map[string]int{}, settled: map[ledger.RequestID]Settled{}}
}

func (f *Ledger) count(op string) {
	f.mu.Lock()
	f.calls[op]++
	f.mu.Unlock()
}

// N is how many times op ("reserve", "dispatch", "extend", "release",
// "settle", "charge") was called.
func (f *Ledger) N(op string) int {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.calls[op]
}

// Set runs fn under the fake's lock (hooks are read under it too).
func (f *Ledger) Set(fn func()) {
	f.mu.Lock()
	defer f.mu.Unlock()
	fn()
}

func (f *Ledger) Reserve(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error) {
	f.count("reserve")
	f.mu.Lock()
	h := f.OnReserve
	f.mu.Unlock()
	if h != nil {
		if g, err, ok := h(ctx, req); ok {
			return g, err
		}
	}
	return f.Memory.Reserve(ctx, req)
}

func (f *Ledger) MarkDispatched(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error {
	f.count("dispatch")
	f.mu.Lock()
	h := f.OnDispatch
	f.mu.Unlock()
	if h != nil {
		if err, ok := h(ctx, ref); ok {
			return err
		}
	}
	return f.Memory.MarkDispatched(ctx, ref, owner)
}

func (f *Ledger) Extend(ctx context.Context, ref ledger.Ref, owner ledger.Owner, ttl time.Duration) (time.Time, error) {
	f.count("extend")
	f.mu.Lock()
	h := f.OnExtend
	f.mu.Unlock()
	if h != nil {
		if exp, err, ok := h(ctx, ref); ok {
			return exp, err
		}
	}
	return f.Memory.Extend(ctx, ref, owner, ttl)
}

func (f *Ledger) Release(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error {
	f.count("release")
	f.mu.Lock()
	h := f.OnRelease
	f.mu.Unlock()
	if h != nil {
		if err, ok := h(ctx, ref); ok {
			return err
		}
	}
	return f.Memory.Release(ctx, ref, owner)
}

func (f *Ledger) Settle(ctx context.Context, ref ledger.Ref, actual ledger.Amounts, src ledger.Source) (ledger.Settlement, error) {
	f.count("settle")
	f.mu.Lock()
	f.settled[ref.ID] = Settled{Actual: actual, Source: src}
	h := f.OnSettle
	f.mu.Unlock()
	if h != nil {
		if st, err, ok := h(ctx, ref); ok {
			return st, err
		}
	}
	return f.Memory.Settle(ctx, ref, actual, src)
}

func (f *Ledger) Charge(ctx context.Context, req ledger.ChargeRequest) (ledger.Settlement, error) {
	f.count("charge")
	return f.Memory.Charge(ctx, req)
}

// Upstream answers every Stream with a completed vLLM stream of out
// tokens, or, when gate is set, a stream that sends its role chunk (the
// request started) and blocks until gate closes or the call's context
// ends; with Queued too, it sends nothing before the gate (the request
// waits in the replica's queue).
type Upstream struct {
	Runs   atomic.Int64 // Stream calls that reached the "replica"
	Out    int
	Gate   chan struct{}
	Queued bool
	Fail   error // returned by Stream and Post when set
	Tools  int   // tool calls in every answer of the other endpoints (Post)
	// Aborted counts gated streams whose context ended before the gate.
	Aborted atomic.Int64
}

// RoleChunk is vLLM's first chat chunk (it goes out with the first
// output), with the continuous usage Sluice asks for.
const RoleChunk = "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"role\":\"assistant\",\"content\":\"\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":0,\"total_tokens\":5}}\n\n"

func (u *Upstream) Stream(ctx context.Context, _, _ string, _ []byte, _ string) (*vllm.Stream, error) {
	if u.Fail != nil {
		return nil, u.Fail
	}
	u.Runs.Add(1)
	body := SSECompletion(u.Out)
	if u.Gate == nil {
		return vllm.NewStream(io.NopCloser(strings.NewReader(body)), "r0", 0), nil
	}
	pr, pw := io.Pipe()
	go func() {
		if !u.Queued {
			_, _ = io.WriteString(pw, RoleChunk)
		}
		select {
		case <-u.Gate:
			_, _ = io.WriteString(pw, body)
			_ = pw.Close()
		case <-ctx.Done():
			u.Aborted.Add(1)
			_ = pw.CloseWithError(context.Cause(ctx))
		}
	}()
	return vllm.NewStream(pr, "r0", 0), nil
}

func (u *Upstream) Tokenize(context.Context, string, string, *vllm.Request) ([]int, int, error) {
	return nil, 0, fmt.Errorf("no tokenizer")
}

func (u *Upstream) CountText(context.Context, string, string, string) (int, error) {
	return 0, fmt.Errorf("no tokenizer")
}

// Post answers the endpoints other than chat and completions as vLLM
// does: a whole JSON answer with its usage (OtherAnswer), or for a
// streamed /v1/responses or /v1/messages their SSE events (OtherStream),
// each with out output tokens and tools tool calls; gate and fail as for
// Stream.
func (u *Upstream) Post(ctx context.Context, _, path string, body []byte, _ string) (*http.Response, error) {
	if u.Fail != nil {
		return nil, u.Fail
	}
	u.Runs.Add(1)
	ans := OtherAnswer(path, u.Out, u.Tools)
	if bytes.Contains(body, []byte(`"stream":true`)) {
		ans = OtherStream(path, u.Out, u.Tools)
	}
	var r io.ReadCloser = io.NopCloser(strings.NewReader(ans))
	if u.Gate != nil {
		pr, pw := io.Pipe()
		go func() {
			select {
			case <-u.Gate:
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

func (u *Upstream) ReadBody(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	return io.ReadAll(resp.Body)
}

// OtherAnswer is vLLM's whole answer on path: 5 prompt tokens, out output
// tokens where the endpoint generates, tools tool calls.
func OtherAnswer(path string, out, tools int) string {
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

// OtherStream is vLLM's streamed /v1/responses (response.completed with
// its usage last: vllm/entrypoints/openai/responses/serving.py) or
// Anthropic /v1/messages answer (usage in message_delta:
// vllm/entrypoints/anthropic/serving.py) of out tokens and tools calls.
func OtherStream(path string, out, tools int) string {
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

// SSECompletion is vLLM's stream of a chat completion of out tokens with
// continuous usage, then the final usage chunk and [DONE].
func SSECompletion(out int) string {
	var b strings.Builder
	for i := 1; i <= out; i++ {
		fmt.Fprintf(&b, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{\"content\":\"x\"},\"finish_reason\":null}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", i, 5+i)
	}
	fmt.Fprintf(&b, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[{\"index\":0,\"delta\":{},\"finish_reason\":\"stop\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", out, 5+out)
	fmt.Fprintf(&b, "data: {\"id\":\"c\",\"object\":\"chat.completion.chunk\",\"created\":1,\"model\":\"m\",\"choices\":[],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d,\"total_tokens\":%d}}\n\n", out, 5+out)
	b.WriteString("data: [DONE]\n\n")
	return b.String()
}

// Config is a one-replica config; tenantExtra is appended to tenant
// acme (4-space indented YAML lines), top to the top level.
func Config(t testing.TB, top, tenantExtra string) *config.File {
	t.Helper()
	y := "upstream:\n  replicas:\n    - {name: r0, url: \"http://r0.invalid\"}\ngpu: {telemetry: off}\n" + top +
		fmt.Sprintf("tenants:\n  - name: acme\n    api_keys: [%q]\n%s", config.HashKey("sk-acme"), tenantExtra)
	cfg, err := config.Parse([]byte(y))
	require.NoError(t, err, y)
	return cfg
}

// ChatBody is a small chat request.
func ChatBody(extra string) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":8` + extra + `}`)
}

// FixedCapacity sizes every replica the same.
// FixedCapacity sizes each named replica at a fixed token capacity, healthy;
// any other is down.
func FixedCapacity(k map[string]int64) fleet.CapacityFunc {
	return func(name string) (int64, int64, gpu.State) {
		if v, ok := k[name]; ok {
			return v, v, gpu.StateHealthy
		}
		return 0, 0, gpu.StateDown
	}
}

// PendingLogConfig is a config whose admin state file, and so whose
// pending-writes log (returned), live in a fresh directory, with hourly
// token and request budgets for acme.
func PendingLogConfig(t *testing.T) (*config.File, string) {
	dir := t.TempDir()
	cfg := Config(t, fmt.Sprintf("admin: {state_file: %q}\n", dir+"/admin.json"),
		"    budgets:\n      - {dimension: tokens, limit: 1000000, window: 1h}\n      - {dimension: requests, limit: 1000, window: 1h}\n")
	return cfg, dir + "/admin.json.pending.jsonl"
}

// Lines counts a file's lines (the pending-writes log's entries).
func Lines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return bytes.Count(b, []byte("\n"))
}

// Usage reads the scope k of tenant k from m.
func Usage(t testing.TB, m *ledger.Memory, k ledger.ScopeKey) ledger.Usage {
	t.Helper()
	u, err := m.Snapshot(context.Background(), k, k)
	require.NoError(t, err)
	return u
}

// Committed is the committed amount of u's limit of dimension d and window
// w; -1 when there is none.
func Committed(u ledger.Usage, d ledger.Dim, w time.Duration) int64 {
	for _, l := range u.Limits {
		if l.Limit.Dim == d && l.Limit.Window == w {
			return l.Committed
		}
	}
	return -1
}
