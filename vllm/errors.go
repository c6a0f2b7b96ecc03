package vllm

import (
	"errors"
	"fmt"
	"strconv"
)

// ErrNotSent means no byte of the request reached the replica (the
// connection could not be established or was refused). The request may be
// retried on another replica. Errors after a request was sent never wrap it.
var ErrNotSent = errors.New("request not sent")

// ErrStreamCut means the upstream stream ended before "data: [DONE]"
// (connection dropped or reset). The edge answers 502.
var ErrStreamCut = errors.New("upstream stream cut before [DONE]")

// ErrEventTooLarge means one SSE event exceeded Config.MaxEventBytes.
var ErrEventTooLarge = errors.New("upstream SSE event too large")

// UpstreamError is a vLLM error: a non-200 response, or an SSE error event
// (`data: {"error": …}`) after the 200 headers (InStream). It is classified by
// Status, Type and Param, never by message.
type UpstreamError struct {
	// Replica is the replica's base URL.
	Replica string
	// Status is the HTTP status; for an SSE error event, the event's numeric
	// code (500 when it has none).
	Status int
	// Type, Param and Code are the error object's fields ("" when absent).
	Type, Param, Code string
	// Body is the error JSON as vLLM sent it (capped), for pass-through.
	Body []byte
	// InStream reports an SSE error event after the stream started.
	InStream bool
}

func (e *UpstreamError) Error() string {
	s := fmt.Sprintf("upstream %s: status %d", e.Replica, e.Status)
	if e.Type != "" {
		s += " type " + e.Type
	}
	if e.Param != "" {
		s += " param " + e.Param
	}
	if e.InStream {
		s += " (in stream)"
	}
	return s
}

// Retryable reports an error that another replica may not have: a 503 (admission
// control, dying engine) before the stream started.
func (e *UpstreamError) Retryable() bool { return !e.InStream && e.Status == 503 }

// ContextLength reports vLLM's prompt + max_tokens > max_model_len refusal
// (400 with param input_tokens, or input_text from the character pre-check).
func (e *UpstreamError) ContextLength() bool {
	return e.Status == 400 && (e.Param == "input_tokens" || e.Param == "input_text")
}

// parseErrorBody fills Type/Param/Code (and Status for in-stream events) from
// either vLLM error shape: nested {"error":{…}} or flat {"object":"error",…}.
// It reports whether b looked like an error object.
func parseErrorBody(b []byte, e *UpstreamError) bool {
	obj := -1
	isErr := false
	_ = eachMember(b, 0, func(m member) bool {
		switch {
		case m.keyIs(b, "error"):
			if b[m.valStart] == '{' {
				obj = m.valStart
				isErr = true
			}
		case m.keyIs(b, "object"):
			if string(b[m.valStart:m.valEnd]) == `"error"` {
				isErr = true
			}
		}
		return true
	})
	if !isErr {
		return false
	}
	if obj < 0 {
		obj = skipSpace(b, 0)
	}
	_ = eachMember(b, obj, func(m member) bool {
		v := b[m.valStart:m.valEnd]
		switch {
		case m.keyIs(b, "type"):
			e.Type = jsonText(v)
		case m.keyIs(b, "param"):
			e.Param = jsonText(v)
		case m.keyIs(b, "code"):
			e.Code = jsonText(v)
		}
		return true
	})
	return true
}

// jsonText renders a scalar JSON value as text: strings unquoted, null as "".
func jsonText(v []byte) string {
	if len(v) == 0 || string(v) == "null" {
		return ""
	}
	if v[0] == '"' {
		s, err := unquoteJSON(v)
		if err != nil {
			return ""
		}
		return s
	}
	if v[0] == '{' || v[0] == '[' {
		return ""
	}
	return string(v)
}

func codeStatus(code string, def int) int {
	if n, err := strconv.Atoi(code); err == nil && n >= 100 && n <= 599 {
		return n
	}
	return def
}
