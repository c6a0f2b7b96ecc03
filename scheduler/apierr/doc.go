// Package apierr is what a client is told when Sluice refuses or fails its
// request: the pipeline's sentinel errors, the one map from an error to its
// HTTP status, error code, retry headers and details (For), and the bytes
// of the pinned error shape (ARCHITECTURE.md §3.3): OpenAI's body,
// Anthropic's on the Messages API, and the SSE error event of a failure
// after a stream's headers.
//
// The pipeline's errors that carry their own numbers (a budget's, a queue
// rule's, a workflow's) implement Refuser and build their refusal
// themselves; everything else is mapped here, in one order. It imports only
// the leaves whose errors it maps and never a call, the server or HTTP.
package apierr
