package node

import (
	"context"
	"encoding/json"
	"io"
	"net/http"
	"net/http/httptest"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/propagation"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/vllm/sim"
)

// keptSpans is an in-memory exporter whose spans outlive the provider's
// shutdown (tracetest's clears them), so the test reads them after the
// node stopped and flushed its batch.
type keptSpans struct{ *tracetest.InMemoryExporter }

func (keptSpans) Shutdown(context.Context) error { return nil }

// traceparentTap records the traceparent of each generation request a
// replica receives.
type traceparentTap struct {
	mu  sync.Mutex
	got []string
}

func (tp *traceparentTap) wrap(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method == http.MethodPost && strings.HasPrefix(r.URL.Path, "/v1/") {
			tp.mu.Lock()
			tp.got = append(tp.got, r.Header.Get("Traceparent"))
			tp.mu.Unlock()
		}
		next.ServeHTTP(w, r)
	})
}

func (tp *traceparentTap) all() []string {
	tp.mu.Lock()
	defer tp.mu.Unlock()
	return append([]string(nil), tp.got...)
}

func spanAttrs(s sdktrace.ReadOnlySpan) map[attribute.Key]attribute.Value {
	m := map[attribute.Key]attribute.Value{}
	for _, kv := range s.Attributes() {
		m[kv.Key] = kv.Value
	}
	return m
}

// remoteParent reads a traceparent header the way a replica would.
func remoteParent(t *testing.T, header string) trace.SpanContext {
	t.Helper()
	sc := trace.SpanContextFromContext(propagation.TraceContext{}.Extract(context.Background(), propagation.MapCarrier{"traceparent": header}))
	require.True(t, sc.IsValid(), "traceparent %q", header)
	return sc
}

// With tracing on, each request is one trace: a server span named after
// its GenAI operation and model, with one child per stage in order, the
// GenAI attributes and the tenant, and its context sent upstream as
// traceparent; a client's own traceparent becomes the request span's
// parent and its trace reaches the replica.
func TestTracingSpansAndTraceparent(t *testing.T) {
	t.Parallel()
	tap := &traceparentTap{}
	rep := startSimWrapped(t, sim.DefaultConfig(), tap.wrap)
	mem := tracetest.NewInMemoryExporter()
	n := startNodeOpts(t, nodeConfig(t, []*simReplica{rep}, "", ""), Options{TraceExporter: keptSpans{mem}})

	r := n.call(t, "/v1/chat/completions", keyAcme, `{"model":"sim-model","max_tokens":8,"messages":[{"role":"user","content":"secret prompt text"}]}`)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	var body struct {
		Usage struct {
			Prompt     int64 `json:"prompt_tokens"`
			Completion int64 `json:"completion_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(r.Body, &body))
	const clientTP = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	r2 := n.call(t, "/v1/chat/completions", keyBeta, `{"model":"sim-model","max_tokens":4,"stream":true,"messages":[{"role":"user","content":"hi"}]}`,
		"Traceparent", clientTP)
	require.Equal(t, 200, r2.StatusCode, string(r2.Body))
	require.NoError(t, n.stop()) // flushes the batched spans

	spans := mem.GetSpans().Snapshots()
	byTrace := map[trace.TraceID][]sdktrace.ReadOnlySpan{}
	for _, s := range spans {
		byTrace[s.SpanContext().TraceID()] = append(byTrace[s.SpanContext().TraceID()], s)
	}
	require.Len(t, byTrace, 2, "one trace per request")
	sent := tap.all()
	require.Len(t, sent, 2)

	checkTree := func(reqSpans []sdktrace.ReadOnlySpan) (root sdktrace.ReadOnlySpan) {
		t.Helper()
		children := map[string]sdktrace.ReadOnlySpan{}
		for _, s := range reqSpans {
			if s.SpanKind() == trace.SpanKindServer {
				root = s
			}
		}
		require.NotNil(t, root)
		assert.Equal(t, "chat sim-model", root.Name())
		for _, s := range reqSpans {
			if s.SpanContext().SpanID() == root.SpanContext().SpanID() {
				continue
			}
			assert.Equal(t, root.SpanContext().SpanID(), s.Parent().SpanID(), "%s is the request span's child", s.Name())
			children[s.Name()] = s
		}
		order := []string{"sluice.admit", "sluice.queue", "sluice.dispatch", "sluice.upstream", "sluice.settle"}
		require.Len(t, children, len(order), "children: %v", children)
		prevEnd := root.StartTime()
		for _, name := range order {
			c := children[name]
			require.NotNil(t, c, name)
			assert.False(t, c.StartTime().Before(prevEnd), "%s starts after the stage before it ends", name)
			assert.False(t, c.EndTime().Before(c.StartTime()), "%s ends after it starts", name)
			prevEnd = c.EndTime()
		}
		assert.Equal(t, root.StartTime(), children["sluice.admit"].StartTime(), "admission starts at arrival")
		assert.False(t, root.EndTime().Before(prevEnd), "the request span covers its stages")
		assert.Equal(t, trace.SpanKindClient, children["sluice.upstream"].SpanKind())
		return root
	}

	// The first request: a trace of its own, with its context upstream.
	first := remoteParent(t, sent[0])
	root := checkTree(byTrace[first.TraceID()])
	assert.False(t, root.Parent().IsValid(), "no client trace: a root span")
	assert.Equal(t, root.SpanContext().SpanID(), first.SpanID(), "the replica's parent is the request span")
	a := spanAttrs(root)
	assert.Equal(t, "chat", a["gen_ai.operation.name"].AsString())
	assert.Equal(t, "sim-model", a["gen_ai.request.model"].AsString())
	assert.Equal(t, int64(8), a["gen_ai.request.max_tokens"].AsInt64())
	assert.Equal(t, body.Usage.Prompt, a["gen_ai.usage.input_tokens"].AsInt64())
	assert.Equal(t, body.Usage.Completion, a["gen_ai.usage.output_tokens"].AsInt64())
	assert.Positive(t, body.Usage.Completion)
	assert.Equal(t, "acme", a["sluice.tenant"].AsString())
	assert.Equal(t, "r0", a["sluice.replica"].AsString())
	assert.Equal(t, "ok", a["sluice.outcome"].AsString())
	assert.Equal(t, int64(200), a["http.response.status_code"].AsInt64())
	for _, s := range byTrace[first.TraceID()] {
		for _, kv := range s.Attributes() {
			assert.NotContains(t, kv.Value.Emit(), "secret prompt", "%s %s", s.Name(), kv.Key)
			assert.NotContains(t, kv.Value.Emit(), keyAcme, "%s %s", s.Name(), kv.Key)
		}
	}

	// The second: the client's trace, continued to the replica.
	second := remoteParent(t, sent[1])
	assert.Equal(t, "4bf92f3577b34da6a3ce929d0e0e4736", second.TraceID().String(), "the client's trace reaches the replica")
	root2 := checkTree(byTrace[second.TraceID()])
	assert.Equal(t, "00f067aa0ba902b7", root2.Parent().SpanID().String(), "the client's span is the request span's parent")
	assert.True(t, root2.Parent().IsRemote())
	assert.Equal(t, root2.SpanContext().SpanID(), second.SpanID())
	assert.Equal(t, "beta", spanAttrs(root2)["sluice.tenant"].AsString())
	assert.True(t, spanAttrs(root2)["sluice.stream"].AsBool())
}

// With tracing.endpoint set, the spans reach the collector over OTLP/HTTP:
// a protobuf POST to the URL's /v1/traces, the last batch at shutdown.
func TestTracingExportsOTLPHTTP(t *testing.T) {
	t.Parallel()
	type export struct{ path, contentType string }
	got := make(chan export, 16)
	collector := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.Copy(io.Discard, r.Body)
		got <- export{r.URL.Path, r.Header.Get("Content-Type")}
	}))
	defer collector.Close()
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", "tracing: {endpoint: "+strconv.Quote(collector.URL)+"}\n"))
	r := n.call(t, "/v1/chat/completions", keyAcme, `{"model":"sim-model","max_tokens":4,"messages":[{"role":"user","content":"hi"}]}`)
	require.Equal(t, 200, r.StatusCode, string(r.Body))
	require.NoError(t, n.stop())
	select {
	case e := <-got:
		assert.Equal(t, export{"/v1/traces", "application/x-protobuf"}, e)
	default:
		t.Fatal("no spans reached the collector by the end of shutdown")
	}
}
