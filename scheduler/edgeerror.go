package scheduler

import (
	"context"
	"errors"
	"strconv"

	"github.com/sluicehq/sluice/scheduler/audit"
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

// outcome answers a call that ended in err.
func (e *Edge) outcome(rc *fasthttp.RequestCtx, c *call, err error) {
	if errors.Is(err, ErrClientGone) || errors.Is(context.Cause(c.ctx), ErrClientGone) {
		e.s.m.count(c.t.name, outcomeCancelled, nil)
		rc.SetConnectionClose()
		return
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
	e.reject(rc, c.t.name, err)
}

// reject writes err in the pinned error shape, audits and counts it.
func (e *Edge) reject(rc *fasthttp.RequestCtx, tenant string, err error) {
	ae := e.writeError(rc, tenant, err)
	if ae.Status != 499 && ae.Raw == nil {
		e.s.record(audit.Record{Kind: audit.KindDeny, Tenant: tenant, RequestID: string(rc.Response.Header.Peek("X-Request-Id")),
			Code: ae.Code, Reason: ae.Message})
	}
	label := tenant
	if label == "" {
		label = "_unauthenticated"
	}
	o, _ := outcomeFor(err)
	if ae.Raw != nil {
		// vLLM's refusal passed through: not Sluice's rejection.
		o = outcomeUpstreamError
	}
	e.s.m.count(label, o, ae)
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
