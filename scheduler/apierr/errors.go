package apierr

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// Sentinel errors of the admission pipeline. For maps them (and the errors
// of queue, ledger and vllm) to HTTP responses.
var (
	ErrUnauthorized  = policy.ErrUnauthorized
	ErrTooLarge      = errors.New("request body too large")
	ErrBadRequest    = errors.New("invalid request")
	ErrUnknownModel  = errors.New("unknown model")
	ErrContextLength = errors.New("context length exceeded")
	ErrNoReplica     = errors.New("no healthy replica")
	ErrDraining      = errors.New("server is draining")
	ErrClientGone    = errors.New("client disconnected")
	// ErrClientStalled is a streaming client that stopped reading: a write
	// to it blocked for server.stream_write_timeout. It is a client
	// disconnect (errors.Is ErrClientGone) with its own abort cause.
	ErrClientStalled  = fmt.Errorf("%w: stopped reading (server.stream_write_timeout)", ErrClientGone)
	ErrDeadline       = errors.New("deadline exceeded")
	ErrNotFound       = errors.New("not found")
	ErrInProgress     = errors.New("a request with this Idempotency-Key is in flight or unresolved")
	ErrAlreadyDone    = errors.New("a request with this Idempotency-Key already completed")
	ErrUpstreamFailed = errors.New("upstream replica failed")
	ErrClamped        = errors.New("tenant is clamped")
)

// badRequestError wraps ErrBadRequest with a message and the offending param.
type badRequestError struct {
	msg   string
	param string
}

func (e *badRequestError) Error() string        { return e.msg }
func (e *badRequestError) Is(target error) bool { return target == ErrBadRequest }

// Invalidf is a 400 invalid_request naming param (the body field or header
// at fault; "" for none) with a formatted message.
func Invalidf(param, format string, a ...any) error {
	return &badRequestError{msg: fmt.Sprintf(format, a...), param: param}
}

// Refuser is an error that knows its own refusal: the pipeline's errors
// that carry details (a budget's numbers, a queue rule, a workflow limit)
// build it themselves.
type Refuser interface {
	error
	APIError() *Error
}

// Error is one refusal in the pinned error shape (ARCHITECTURE.md §3.3):
// what the client edge writes (Status, the Retry-After, retry-after-ms and
// x-should-retry headers of RetryAfter and NoRetry, and Body) and what the
// outcome counters record.
type Error struct {
	Status  int
	Code    string
	Type    string
	Message string
	Param   string
	Details map[string]any
	// RetryAfter sets Retry-After and retry-after-ms when > 0.
	RetryAfter time.Duration
	// NoRetry sets x-should-retry: false (a closed budget window).
	NoRetry bool
	// Raw, when set, is sent as the body verbatim (upstream 400/404
	// pass-through).
	Raw []byte
}

// For is the one place that maps an outcome to an HTTP status and error
// code (HOUSE-STYLE §4).
func For(err error) *Error {
	var (
		denied *ledger.DeniedError
		full   *queue.FullError
		br     *badRequestError
		ue     *vllm.UpstreamError
		ir     *vllm.InvalidRequestError
		se     *midStream
		ref    Refuser
	)
	switch {
	case errors.As(err, &se):
		return streamStatus(se)
	case errors.Is(err, ErrDraining):
		return &Error{Status: 503, Code: "draining", Type: "service_unavailable", Message: "the server is shutting down", RetryAfter: time.Second}
	case errors.As(err, &ref):
		return ref.APIError()
	case errors.Is(err, ErrUnauthorized):
		return &Error{Status: 401, Code: "invalid_api_key", Type: "authentication_error", Message: "missing or unknown API key"}
	case errors.Is(err, ErrTooLarge):
		return &Error{Status: 413, Code: "request_too_large", Type: "invalid_request_error", Message: err.Error()}
	case errors.As(err, &br):
		return &Error{Status: 400, Code: "invalid_request", Type: "invalid_request_error", Message: br.msg, Param: br.param}
	case errors.As(err, &ir):
		return &Error{Status: 400, Code: "invalid_request", Type: "invalid_request_error", Message: ir.Error(), Param: ir.Param}
	case errors.Is(err, ErrUnknownModel):
		return &Error{Status: 404, Code: "model_not_found", Type: "invalid_request_error", Message: err.Error()}
	case errors.Is(err, ErrContextLength), errors.Is(err, vllm.ErrContextLength):
		return &Error{Status: 400, Code: "context_length_exceeded", Type: "invalid_request_error", Message: err.Error(), Param: "messages"}
	case errors.As(err, &full):
		return &Error{Status: 429, Code: "queue_full", Type: "rate_limit_error", Message: err.Error(),
			RetryAfter: full.RetryAfter, Details: map[string]any{"bound": full.Bound.String()}}
	case errors.As(err, &denied):
		return Denied(denied)
	case errors.Is(err, ledger.ErrLeaseLost):
		// Before dispatch (the fence fired while queued) nothing ran.
		return &Error{Status: 503, Code: "ledger_unavailable", Type: "service_unavailable", Message: "the budget ledger could not keep the request's reservation alive; nothing was sent upstream", RetryAfter: time.Second}
	case ledger.IsStoreError(err):
		// Before the deadline case: a store timeout is an unknown ledger
		// outcome, not the client's deadline.
		return &Error{Status: 503, Code: "ledger_unavailable", Type: "service_unavailable", Message: "the budget ledger cannot decide; nothing was sent upstream", RetryAfter: time.Second}
	case errors.Is(err, queue.ErrExpired), errors.Is(err, ErrDeadline):
		return &Error{Status: 504, Code: "deadline_exceeded", Type: "timeout_error", Message: "the request's deadline passed before it could be served"}
	case errors.Is(err, ErrInProgress), errors.Is(err, ErrAlreadyDone):
		return &Error{Status: 409, Code: "idempotency_conflict", Type: "invalid_request_error", Message: err.Error(), NoRetry: true}
	case errors.Is(err, ledger.ErrCorrupt), errors.Is(err, ledger.ErrPolicy), errors.Is(err, ledger.ErrInvalid),
		errors.Is(err, ledger.ErrConflict), errors.Is(err, ledger.ErrAlreadyFinal):
		return &Error{Status: 500, Code: "ledger_error", Type: "server_error", Message: "the budget ledger refused the request; operators have been alerted"}
	case errors.Is(err, ErrClamped):
		return &Error{Status: 403, Code: "tenant_clamped", Type: "permission_error", Message: err.Error(), NoRetry: true}
	case errors.Is(err, vllm.ErrNoCap):
		// No cap from the client or the tenant, and no replica has told
		// the model's context length yet: nothing can size the hold.
		return &Error{Status: 503, Code: "no_healthy_replica", Type: "service_unavailable",
			Message: "the model's context length is not known yet (no replica has reported max_model_len): send max_tokens, or retry", RetryAfter: time.Second}
	case errors.Is(err, ErrNoReplica):
		return &Error{Status: 503, Code: "no_healthy_replica", Type: "service_unavailable", Message: "no replica can take work", RetryAfter: time.Second}
	case errors.Is(err, ErrNotFound):
		return &Error{Status: 404, Code: "not_found", Type: "invalid_request_error", Message: err.Error()}
	case errors.As(err, &ue) && (ue.Status == 400 || ue.Status == 404) && !ue.InStream:
		code := "invalid_request"
		if ue.ContextLength() {
			code = "context_length_exceeded"
		}
		// vLLM's own refusal passes through unchanged when it has a body.
		return &Error{Status: ue.Status, Code: code, Type: "invalid_request_error", Message: "the replica refused the request", Param: ue.Param, Raw: ue.Body}
	case errors.Is(err, ErrClientGone):
		return &Error{Status: 499, Code: "client_cancelled", Type: "client_error", Message: "client disconnected"}
	}
	return &Error{Status: 502, Code: "upstream_error", Type: "server_error", Message: "the replica failed to complete the request"}
}

// midStream is a failure after the 200 headers went out: the client gets
// it as an SSE error event, so it is never a refusal (4xx) even when its
// cause would be one.
type midStream struct{ cause error }

func (e *midStream) Error() string { return "mid-stream: " + e.cause.Error() }
func (e *midStream) Unwrap() error { return e.cause }

// MidStream is cause as a failure after a stream's 200 headers.
func MidStream(cause error) error { return &midStream{cause: cause} }

// IsMidStream reports whether err failed after a stream's headers.
func IsMidStream(err error) bool {
	var se *midStream
	return errors.As(err, &se)
}

func streamStatus(se *midStream) *Error {
	if errors.Is(se.cause, ErrDeadline) || errors.Is(se.cause, queue.ErrExpired) {
		return &Error{Status: 504, Code: "deadline_exceeded", Type: "timeout_error", Message: "the request's deadline passed while it was being served"}
	}
	if errors.Is(se.cause, ErrDraining) {
		return &Error{Status: 503, Code: "draining", Type: "service_unavailable", Message: "the server is shutting down", RetryAfter: time.Second}
	}
	if errors.Is(se.cause, ErrClientGone) {
		return &Error{Status: 499, Code: "client_cancelled", Type: "client_error", Message: "client disconnected"}
	}
	return &Error{Status: 502, Code: "upstream_error", Type: "server_error", Message: "the replica failed to complete the request"}
}

// Denied is a budget's refusal: 429 with the scope, dimension, window and
// the numbers that refused it.
func Denied(d *ledger.DeniedError) *Error {
	code := "tenant_budget_exceeded"
	scope := d.Scope.String()
	if d.Scope == ledger.KindWorkflow {
		code = "workflow_budget_exceeded"
	}
	det := map[string]any{
		"scope":     scope,
		"dimension": d.Dim.String(),
		"window":    ledger.FormatWindow(d.Window),
		"limit":     d.Limit,
		"committed": d.Committed,
		"reserved":  d.Reserved,
		"requested": d.Requested,
	}
	if !d.ResetsAt.IsZero() {
		det["resets_at"] = d.ResetsAt.UTC().Format(time.RFC3339)
	}
	return &Error{
		Status: 429, Code: code, Type: "rate_limit_error",
		Message:    fmt.Sprintf("%s budget exceeded: %s per %s", scope, d.Dim, ledger.FormatWindow(d.Window)),
		Details:    det,
		RetryAfter: max(d.RetryAfter, time.Second),
		NoRetry:    true,
	}
}
