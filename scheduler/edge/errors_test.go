package edge

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
)

// A refusal's bytes: status, the retry headers and the pinned error shape,
// Anthropic's on the Messages API's paths, vLLM's own body passed through.
func TestWriteError(t *testing.T) {
	for _, tc := range []struct {
		name, path string
		ae         *apierr.Error
		status     int
		headers    map[string]string
		body       string
	}{
		{"openai shape with retry", "/v1/chat/completions", apierr.For(apierr.ErrDraining), 503,
			map[string]string{"Retry-After": "1", "retry-after-ms": "1000", "x-should-retry": "", "Content-Type": "application/json"},
			`{"error":{"message":"the server is shutting down","type":"service_unavailable","code":"draining","param":null}}`},
		{"param and no retry", "/v1/completions", &apierr.Error{Status: 409, Code: "idempotency_conflict", Type: "invalid_request_error", Message: "m", Param: "p", NoRetry: true}, 409,
			map[string]string{"Retry-After": "", "x-should-retry": "false"},
			`{"error":{"message":"m","type":"invalid_request_error","code":"idempotency_conflict","param":"p"}}`},
		{"anthropic shape", "/v1/messages", apierr.For(apierr.ErrDraining), 503,
			map[string]string{"Retry-After": "1"},
			`{"type":"error","error":{"type":"overloaded_error","message":"the server is shutting down","code":"draining"}}`},
		{"vLLM's body passed through", "/v1/chat/completions", &apierr.Error{Status: 400, Raw: []byte(`{"object":"error"}`)}, 400,
			map[string]string{"Content-Type": "application/json"}, `{"object":"error"}`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			var rc fasthttp.RequestCtx
			rc.Request.SetRequestURI(tc.path)
			writeError(&rc, tc.ae)
			assert.Equal(t, tc.status, rc.Response.StatusCode())
			for k, v := range tc.headers {
				assert.Equal(t, v, string(rc.Response.Header.Peek(k)), k)
			}
			assert.Equal(t, tc.body, string(rc.Response.Body()))
		})
	}
}

// A refused call's sink: a client that left gets its connection closed
// and nothing written; one that reached a replica gets its budget and
// timing headers with the refusal.
func TestWholeSinkRefuse(t *testing.T) {
	var rc fasthttp.RequestCtx
	(&wholeSink{rc: &rc}).Refuse(apierr.ErrClientGone, nil, lifecycle.Meta{})
	assert.True(t, rc.Response.ConnectionClose())
	assert.Empty(t, rc.Response.Body())

	var rc2 fasthttp.RequestCtx
	rc2.Request.SetRequestURI("/v1/chat/completions")
	(&wholeSink{rc: &rc2}).Refuse(nil, apierr.For(apierr.ErrNoReplica), lifecycle.Meta{Sent: true})
	assert.Equal(t, 503, rc2.Response.StatusCode())
	assert.Equal(t, "queue;dur=0.000", string(rc2.Response.Header.Peek("Server-Timing")))

	var rc3 fasthttp.RequestCtx
	(&wholeSink{rc: &rc3}).Refuse(nil, apierr.For(apierr.ErrNoReplica), lifecycle.Meta{})
	assert.Empty(t, rc3.Response.Header.Peek("Server-Timing"), "a call that never reached a replica has no timing")
}
