package scheduler

import (
	"context"
	"errors"
	"strconv"

	"github.com/sluicehq/sluice/vllm"
	"github.com/valyala/fasthttp"
)

// How the edge answers a call that did not succeed: the pinned error shape
// (Anthropic's on its routes), the audit record and the outcome counters.

// sseError renders a mid-stream refusal as vLLM does: an error event, then
// [DONE].
func sseError(ae *apiError) []byte {
	b, _ := marshal(errorBody(ae))
	return append(append(append([]byte("data: "), b...), "\n\n"...), "data: [DONE]\n\n"...)
}

// streamErrorEvent renders a mid-stream failure in the endpoint's shape:
// Anthropic's error event on its routes, vLLM's (sseError) elsewhere.
func streamErrorEvent(c *call, cause error) []byte {
	ae := statusFor(&streamError{cause: cause})
	if c.ep.Anthropic() {
		return anthropicSSEError(ae)
	}
	return sseError(ae)
}

// refuse answers a call that ended in err before its answer (the sink's
// refuse, edge.go); nil when the client left.
func (e *Edge) refuse(rc *fasthttp.RequestCtx, c *call, err error) *apiError {
	if errors.Is(err, ErrClientGone) || errors.Is(context.Cause(c.ctx), ErrClientGone) {
		rc.SetConnectionClose()
		return nil
	}
	if c.rep != nil && c.sent {
		e.successHeaders(rc, c) // Server-Timing and budget headers still apply
	}
	var ue *vllm.UpstreamError
	if errors.As(err, &ue) && ue.Status == 404 && !ue.InStream && c.rep != nil {
		// vLLM no longer serves the model (an adapter unloaded): read its
		// models again.
		c.rep.modelsAt.Store(0)
	}
	return e.writeError(rc, c.t.name, err)
}

// reject writes err in the pinned error shape, audits and counts it.
func (e *Edge) reject(rc *fasthttp.RequestCtx, tenant string, err error) {
	ae := e.writeError(rc, tenant, err)
	e.s.countRefusal(tenant, string(rc.Response.Header.Peek("X-Request-Id")), err, ae)
}

type errorJSON struct {
	Error struct {
		Message string         `json:"message"`
		Type    string         `json:"type"`
		Code    string         `json:"code"`
		Param   *string        `json:"param"`
		Details map[string]any `json:"details,omitempty"`
	} `json:"error"`
}

func errorBody(ae *apiError) errorJSON {
	var b errorJSON
	b.Error.Message, b.Error.Type, b.Error.Code, b.Error.Details = ae.Message, ae.Type, ae.Code, ae.Details
	if ae.Param != "" {
		p := ae.Param
		b.Error.Param = &p
	}
	return b
}

// writeError writes the response for err and returns its classification.
func (e *Edge) writeError(rc *fasthttp.RequestCtx, tenant string, err error) *apiError {
	ae := statusFor(err)
	if ae.Status >= 500 && ae.Status != 503 && ae.Status != 504 {
		e.s.log.Warn("request failed", "tenant", tenant, "status", ae.Status, "code", ae.Code, "err", err)
	}
	rc.SetStatusCode(ae.Status)
	if ae.Raw != nil {
		rc.SetContentType("application/json")
		rc.SetBody(ae.Raw)
		return ae
	}
	if ae.RetryAfter > 0 {
		rc.Response.Header.Set("Retry-After", retryAfterSeconds(ae.RetryAfter))
		rc.Response.Header.Set("retry-after-ms", strconv.FormatInt(max(1, ae.RetryAfter.Milliseconds()), 10))
	}
	if ae.NoRetry {
		rc.Response.Header.Set("x-should-retry", "false")
	}
	rc.SetContentType("application/json")
	if anthropicPath(rc.Path()) {
		rc.SetBody(anthropicErrorBody(ae))
		return ae
	}
	b, _ := marshal(errorBody(ae))
	rc.SetBody(b)
	return ae
}
