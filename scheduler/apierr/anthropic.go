package apierr

import "github.com/sluicehq/sluice/internal/plainjson"

// Anthropic's Messages API (/v1/messages, /v1/messages/count_tokens) runs
// through the same lifecycle as every other endpoint; only
// its refusals differ: Anthropic's error shape, {"type":"error","error":
// {"type":…,"message":…}}, with the type the official SDKs expect for the
// status, so they raise their usual error classes. Sluice's code, param and
// details ride along in the error object, as in the OpenAI shape.

// anthropicType is Anthropic's error type for an HTTP status.
func anthropicType(status int) string {
	switch status {
	case 400, 405, 409, 422:
		return "invalid_request_error"
	case 401:
		return "authentication_error"
	case 403:
		return "permission_error"
	case 404:
		return "not_found_error"
	case 413:
		return "request_too_large"
	case 429:
		return "rate_limit_error"
	case 503, 529:
		return "overloaded_error"
	case 504:
		return "timeout_error"
	}
	return "api_error"
}

type anthropicErrorJSON struct {
	Type  string `json:"type"`
	Error struct {
		Type    string         `json:"type"`
		Message string         `json:"message"`
		Code    string         `json:"code,omitempty"`
		Param   string         `json:"param,omitempty"`
		Details map[string]any `json:"details,omitempty"`
	} `json:"error"`
}

func anthropicErrorBody(ae *Error) []byte {
	var e anthropicErrorJSON
	e.Type = "error"
	e.Error.Type, e.Error.Message = anthropicType(ae.Status), ae.Message
	e.Error.Code, e.Error.Param, e.Error.Details = ae.Code, ae.Param, ae.Details
	b, _ := plainjson.Marshal(e)
	return b
}

// anthropicSSEError is a mid-stream refusal as vLLM's Anthropic stream
// sends one: an error event, and no message_stop.
func anthropicSSEError(ae *Error) []byte {
	b := append([]byte("event: error\ndata: "), anthropicErrorBody(ae)...)
	return append(b, "\n\n"...)
}
