package lifecycle

import (
	"context"
	"errors"
	"time"

	"go.opentelemetry.io/otel/attribute"
	"go.opentelemetry.io/otel/codes"
	"go.opentelemetry.io/otel/propagation"
	"go.opentelemetry.io/otel/trace"

	"github.com/sluicehq/sluice/vllm"
)

// Tracing (docs/operations.md "Tracing"): one trace per admitted request, a request
// span with a child per stage (admission, queue wait, dispatch, upstream,
// settlement). The request path only records times it keeps anyway; the
// children are built once the call has ended (traceFinished, traceReleased,
// traceRefused), from those times, so a server without a tracer pays a nil
// check per step and the upstream client one context lookup. Only the
// request span is started live, at admission, because its context must
// exist before the upstream request carries it as traceparent.

// callTrace is a traced call's request span and the stage times that the
// call does not keep for itself. Nil when tracing is off.
type callTrace struct {
	span     trace.Span
	ctx      context.Context // the request span's context: the children's parent
	queuedAt time.Time       // reservation held, entering the queue
	handedAt time.Time       // the queue handed it a replica (zero: never)
	err      error           // why a call released without running failed, when release cannot tell
}

// traceErr notes err as the outcome of a call about to be released.
func (c *call) traceErr(err error) {
	if c.tr != nil {
		c.tr.err = err
	}
}

// Span names of a request's stages.
const (
	spanAdmit    = "sluice.admit"
	spanQueue    = "sluice.queue"
	spanDispatch = "sluice.dispatch"
	spanUpstream = "sluice.upstream"
	spanSettle   = "sluice.settle"
)

// traceContext reads a client's W3C trace context (traceparent and
// tracestate); an invalid one is ignored, as the W3C recommendation asks,
// and the request starts a trace of its own.
var traceContext propagation.TraceContext

// operationName is gen_ai.operation.name for an endpoint (OpenTelemetry
// GenAI semantic conventions); routes outside them use their own name.
func operationName(ep vllm.Endpoint) string {
	switch ep {
	case vllm.EndpointChat, vllm.EndpointResponses, vllm.EndpointMessages:
		return "chat"
	case vllm.EndpointCompletions:
		return "text_completion"
	case vllm.EndpointEmbeddings:
		return "embeddings"
	case vllm.EndpointScore:
		return "score"
	case vllm.EndpointRerank:
		return "rerank"
	case vllm.EndpointPooling:
		return "pooling"
	case vllm.EndpointClassify:
		return "classify"
	}
	return "other"
}

// startTrace starts c's request span at its arrival, as a child of the
// client's trace context when it sent one, and puts the span's
// traceparent in c.ctx for the upstream request.
func (e *Engine) startTrace(c *call, a admission) {
	parent := context.Background()
	if a.traceparent != "" {
		parent = traceContext.Extract(parent, propagation.MapCarrier{"traceparent": a.traceparent, "tracestate": a.tracestate})
	}
	op := operationName(c.ep)
	ctx, span := e.tracer.Start(parent, op+" "+c.req.Model, trace.WithTimestamp(c.arrival), trace.WithSpanKind(trace.SpanKindServer),
		trace.WithAttributes(
			attribute.String("gen_ai.operation.name", op),
			attribute.String("gen_ai.request.model", c.req.Model),
			attribute.String("sluice.tenant", c.t.Name),
			attribute.String("sluice.request_id", c.reqID),
			attribute.Bool("sluice.stream", c.req.Stream),
		))
	if c.req.MaxTokens > 0 {
		span.SetAttributes(attribute.Int("gen_ai.request.max_tokens", c.req.MaxTokens))
	}
	c.tr = &callTrace{span: span, ctx: ctx}
	carrier := propagation.MapCarrier{}
	traceContext.Inject(ctx, carrier)
	if tp := carrier["traceparent"]; tp != "" {
		c.ctx = vllm.WithTraceparent(c.ctx, tp)
	}
}

// traceRefused ends the trace of a call that ended at its reservation:
// refused, or an idempotent retry answered with the kept response.
func (e *Engine) traceRefused(c *call, err error) {
	end := e.now()
	e.child(c, spanAdmit, c.arrival, end)
	var replay *cachedResponse
	if errors.As(err, &replay) {
		c.tr.span.SetAttributes(attribute.Bool("sluice.replayed", true))
		err = nil // the edge answers 200 with the kept body
	}
	e.endTrace(c, err, end, false)
}

// traceReleased ends the trace of a call released without running; from
// is when its release began.
func (e *Engine) traceReleased(c *call, from time.Time) {
	e.stages(c, from)
	end := e.now()
	e.child(c, spanSettle, from, end)
	err := c.tr.err
	if cause := context.Cause(c.ctx); cause != nil {
		err = cause
	} else if err == nil && c.exitReason != 0 {
		err = c.queueExit(from)
	}
	c.tr.span.SetAttributes(attribute.Bool("sluice.released", true))
	e.endTrace(c, err, end, false)
}

// traceFinished ends the trace of a dispatched call; from is when its
// settlement began (the upstream's end).
func (e *Engine) traceFinished(c *call, err error, from time.Time) {
	e.stages(c, from)
	if !c.dispatchAt.IsZero() && c.sent {
		_, up := e.tracer.Start(c.tr.ctx, spanUpstream, trace.WithTimestamp(c.dispatchAt), trace.WithSpanKind(trace.SpanKindClient),
			trace.WithAttributes(attribute.String("sluice.replica", c.rep.Name)))
		if !c.firstByte.IsZero() {
			up.AddEvent("first_byte", trace.WithTimestamp(c.firstByte))
		}
		if c.abortCause != "" {
			up.SetAttributes(attribute.String("sluice.abort_cause", c.abortCause))
		}
		up.End(trace.WithTimestamp(from))
	}
	end := e.now()
	e.child(c, spanSettle, from, end)
	sp := c.tr.span
	sp.SetAttributes(attribute.String("sluice.replica", c.rep.Name))
	if c.usage.Known {
		sp.SetAttributes(
			attribute.Int("gen_ai.usage.input_tokens", c.usage.PromptTokens),
			attribute.Int("gen_ai.usage.output_tokens", c.usage.CompletionTokens),
			attribute.Bool("sluice.usage_final", c.usage.Final))
	}
	if c.abortCause != "" {
		sp.SetAttributes(attribute.String("sluice.abort_cause", c.abortCause))
	}
	// A streamed answer's 200 went out with its first event; what ends
	// the stream later is in the span's status, not a second status code.
	e.endTrace(c, err, end, c.req.Stream && c.stream != nil)
}

// stages adds the admission, queue and dispatch children; end closes the
// last stage the call reached.
func (e *Engine) stages(c *call, end time.Time) {
	tr := c.tr
	if tr.queuedAt.IsZero() {
		e.child(c, spanAdmit, c.arrival, end)
		return
	}
	e.child(c, spanAdmit, c.arrival, tr.queuedAt)
	if tr.handedAt.IsZero() {
		e.child(c, spanQueue, tr.queuedAt, end)
		return
	}
	e.child(c, spanQueue, tr.queuedAt, tr.handedAt)
	dispatched := c.dispatchAt
	if dispatched.IsZero() || dispatched.Before(tr.handedAt) {
		dispatched = end
	}
	e.child(c, spanDispatch, tr.handedAt, dispatched)
}

// child records one finished stage of c.
func (e *Engine) child(c *call, name string, start, end time.Time) {
	_, sp := e.tracer.Start(c.tr.ctx, name, trace.WithTimestamp(start))
	sp.End(trace.WithTimestamp(end))
}

// endTrace sets the request span's outcome and ends it at end. Only the
// error's code goes in the span, never its message, which may quote the
// request.
func (e *Engine) endTrace(c *call, err error, end time.Time, sentOK bool) {
	sp := c.tr.span
	o, ae := outcomeFor(err)
	status := 200
	if ae != nil && !sentOK {
		status = ae.Status
	}
	sp.SetAttributes(attribute.String("sluice.outcome", o.String()), attribute.Int("http.response.status_code", status))
	if ae != nil {
		sp.SetAttributes(attribute.String("error.type", ae.Code))
		sp.SetStatus(codes.Error, ae.Code)
	}
	sp.End(trace.WithTimestamp(end))
}
