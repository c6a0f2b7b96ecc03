package edge

import (
	"math"
	"strconv"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/vllm"
)

// How the edge writes a refusal: the pinned error shape (Anthropic's on its
// routes) with its status and retry headers. The scheduler classifies
// (apierr.For, Reject, Finish's Sink.Refuse); the edge writes.

// reject has the scheduler classify, log, audit and count err, and writes
// its refusal. tenant is "" before authentication.
func (e *Edge) reject(rc *fasthttp.RequestCtx, tenant string, err error) {
	writeError(rc, e.s.Reject(tenant, string(rc.Response.Header.Peek("X-Request-Id")), err))
}

// writeError writes the response of the refusal ae.
func writeError(rc *fasthttp.RequestCtx, ae *apierr.Error) {
	rc.SetStatusCode(ae.Status)
	if ae.Raw != nil {
		// vLLM's own refusal, passed through unchanged.
		rc.SetContentType("application/json")
		rc.SetBody(ae.Raw)
		return
	}
	if ae.RetryAfter > 0 {
		rc.Response.Header.Set("Retry-After", retryAfterSeconds(ae.RetryAfter))
		rc.Response.Header.Set("retry-after-ms", strconv.FormatInt(max(1, ae.RetryAfter.Milliseconds()), 10))
	}
	if ae.NoRetry {
		rc.Response.Header.Set("x-should-retry", "false")
	}
	rc.SetContentType("application/json")
	rc.SetBody(ae.Body(anthropicPath(rc.Path())))
}

// anthropicPath reports a request path of the Messages API.
func anthropicPath(path []byte) bool {
	ep, ok := vllm.EndpointForPath(string(path))
	return ok && ep.Anthropic()
}

// retryAfterSeconds renders ceil(d) in whole seconds, at least 1.
func retryAfterSeconds(d time.Duration) string {
	return strconv.FormatInt(max(1, int64(math.Ceil(d.Seconds()))), 10)
}
