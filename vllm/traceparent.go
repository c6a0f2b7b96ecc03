package vllm

import "context"

type traceparentKey struct{}

// WithTraceparent returns ctx carrying a W3C traceparent value that
// [Client.Stream] and [Client.Post] send upstream as the traceparent header,
// so vLLM's own OpenTelemetry spans (--otlp-traces-endpoint) join the
// caller's trace (vLLM reads traceparent and tracestate: TRACE_HEADERS
// in vllm/tracing.py). A value travels in the context rather than as a
// parameter so that callers without tracing change nothing.
func WithTraceparent(ctx context.Context, traceparent string) context.Context {
	return context.WithValue(ctx, traceparentKey{}, traceparent)
}

// traceparentOf is the traceparent WithTraceparent put in ctx, or "" when
// none or not a valid header value.
func traceparentOf(ctx context.Context) string {
	tp, _ := ctx.Value(traceparentKey{}).(string)
	if !validHeaderValue(tp) {
		return ""
	}
	return tp
}
