package apierr

import "github.com/sluicehq/sluice/internal/plainjson"

// The pinned error shape's bytes (ARCHITECTURE.md §3.3): the JSON body of a
// refusal, OpenAI's or, on the Messages API, Anthropic's (anthropic.go),
// and the SSE error event of a failure after a stream's headers.

// Body is the refusal's JSON body: vLLM's own when it passed through
// (Raw), else the pinned shape, Anthropic's when anthropic is set.
func (ae *Error) Body(anthropic bool) []byte {
	if ae.Raw != nil {
		return ae.Raw
	}
	if anthropic {
		return anthropicErrorBody(ae)
	}
	b, _ := plainjson.Marshal(errorBody(ae))
	return b
}

// sseError renders a mid-stream refusal as vLLM does: an error event, then
// [DONE].
func sseError(ae *Error) []byte {
	b, _ := plainjson.Marshal(errorBody(ae))
	return append(append(append([]byte("data: "), b...), "\n\n"...), "data: [DONE]\n\n"...)
}

// StreamEvent renders a failure after a stream's headers in the
// endpoint's shape: Anthropic's error event on its routes, vLLM's
// (sseError) elsewhere.
func StreamEvent(anthropic bool, cause error) []byte {
	ae := For(MidStream(cause))
	if anthropic {
		return anthropicSSEError(ae)
	}
	return sseError(ae)
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

func errorBody(ae *Error) errorJSON {
	var b errorJSON
	b.Error.Message, b.Error.Type, b.Error.Code, b.Error.Details = ae.Message, ae.Type, ae.Code, ae.Details
	if ae.Param != "" {
		p := ae.Param
		b.Error.Param = &p
	}
	return b
}
