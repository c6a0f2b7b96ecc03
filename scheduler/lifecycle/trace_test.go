package lifecycle

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.opentelemetry.io/otel/attribute"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"go.opentelemetry.io/otel/sdk/trace/tracetest"
)

// tracedServer is newTestEngine with a tracer whose spans rec records as
// they end.
func tracedServer(t *testing.T, tenantExtra string, up Upstream) (*Engine, *tracetest.SpanRecorder) {
	rec := tracetest.NewSpanRecorder()
	tp := sdktrace.NewTracerProvider(sdktrace.WithSpanProcessor(rec))
	s := newTestEngine(t, lifecycletest.Config(t, "", tenantExtra), lifecycletest.NewLedger(t), up)
	s.tracer = tp.Tracer("test")
	return s, rec
}

// requestTrace is one request's spans: the request span and its children
// by name, each checked to be the request span's child.
func requestTrace(t *testing.T, spans []sdktrace.ReadOnlySpan, reqID string) (sdktrace.ReadOnlySpan, map[string]sdktrace.ReadOnlySpan) {
	t.Helper()
	var root sdktrace.ReadOnlySpan
	for _, sp := range spans {
		for _, kv := range sp.Attributes() {
			if kv.Key == "sluice.request_id" && kv.Value.AsString() == reqID {
				root = sp
			}
		}
	}
	require.NotNil(t, root, reqID)
	kids := map[string]sdktrace.ReadOnlySpan{}
	for _, sp := range spans {
		if sp.Parent().SpanID() == root.SpanContext().SpanID() {
			kids[sp.Name()] = sp
		}
	}
	return root, kids
}

func attrOf(sp sdktrace.ReadOnlySpan, k attribute.Key) attribute.Value {
	for _, kv := range sp.Attributes() {
		if kv.Key == k {
			return kv.Value
		}
	}
	return attribute.Value{}
}

func dur(sp sdktrace.ReadOnlySpan) time.Duration { return sp.EndTime().Sub(sp.StartTime()) }

// In fake time, the stages' spans have the durations the calls spent in
// them: a request that runs 10 s upstream has a 10 s upstream span; one
// queued behind it that expires at its 3 s max_wait has a 3 s queue span,
// no dispatch or upstream, and the request span says why it ended (504
// deadline_exceeded).
func TestTraceStagesInFakeTime(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		gate := make(chan struct{})
		up := &lifecycletest.Upstream{Out: 2, Gate: gate}
		s, rec := tracedServer(t, "    concurrency: 1\n    queue: {max_wait: 3s}\n", up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		go func() { _ = s.q.Run(ctx) }()
		first := make(chan error, 1)
		go func() {
			_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), reqID: "first"})
			first <- err
		}()
		synctest.Wait()
		time.AfterFunc(10*time.Second, func() { close(gate) })
		_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), reqID: "second"})
		require.Error(t, err)
		require.NoError(t, <-first)

		spans := rec.Ended()
		root, kids := requestTrace(t, spans, "first")
		require.Len(t, kids, 5)
		assert.Equal(t, 10*time.Second, dur(kids[spanUpstream]), "upstream: the 10 s the replica took")
		assert.Equal(t, 10*time.Second, dur(root))
		assert.Equal(t, "ok", attrOf(root, "sluice.outcome").AsString())
		assert.Equal(t, int64(8), attrOf(root, "gen_ai.request.max_tokens").AsInt64())
		assert.Equal(t, int64(2), attrOf(root, "gen_ai.usage.output_tokens").AsInt64())
		assert.Equal(t, "r0", attrOf(root, "sluice.replica").AsString())

		root, kids = requestTrace(t, spans, "second")
		require.Len(t, kids, 3, "admitted, queued, released: %v", kids)
		assert.Equal(t, 3*time.Second, dur(kids[spanQueue]), "queued to its max_wait")
		assert.Contains(t, kids, spanSettle)
		assert.Equal(t, 3*time.Second, dur(root))
		assert.Equal(t, "expired", attrOf(root, "sluice.outcome").AsString())
		assert.Equal(t, int64(504), attrOf(root, "http.response.status_code").AsInt64())
		assert.Equal(t, "deadline_exceeded", attrOf(root, "error.type").AsString())
		assert.True(t, attrOf(root, "sluice.released").AsBool())
	})
}

// A request its budget refuses is traced too: the request span and its
// admission, with the refusal's status and code.
func TestTraceRefusedAtReservation(t *testing.T) {
	t.Parallel()
	s, rec := tracedServer(t, "    budgets: [{dimension: requests, limit: 1, window: 1h}]\n", &lifecycletest.Upstream{Out: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	go func() { _ = s.q.Run(ctx) }()
	_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), reqID: "ok"})
	require.NoError(t, err)
	_, err = serve(ctx, s, admission{body: lifecycletest.ChatBody(""), reqID: "refused"})
	require.Error(t, err)
	root, kids := requestTrace(t, rec.Ended(), "refused")
	assert.Len(t, kids, 1)
	assert.Contains(t, kids, spanAdmit)
	assert.Equal(t, int64(429), attrOf(root, "http.response.status_code").AsInt64())
	assert.Equal(t, "tenant_budget_exceeded", attrOf(root, "error.type").AsString())
	assert.Equal(t, "rejected", attrOf(root, "sluice.outcome").AsString())
}

// An idempotent retry of a completed request is answered 200 with the
// kept response: its trace says so, not a failure.
func TestTraceReplayedRetry(t *testing.T) {
	t.Parallel()
	s, rec := tracedServer(t, "", &lifecycletest.Upstream{Out: 2})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	go func() { _ = s.q.Run(ctx) }()
	_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k", reqID: "first"})
	require.NoError(t, err)
	_, err = serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k", reqID: "retry"})
	var replay *cachedResponse
	require.ErrorAs(t, err, &replay)
	root, _ := requestTrace(t, rec.Ended(), "retry")
	assert.True(t, attrOf(root, "sluice.replayed").AsBool())
	assert.Equal(t, "ok", attrOf(root, "sluice.outcome").AsString())
	assert.Equal(t, int64(200), attrOf(root, "http.response.status_code").AsInt64())
}
