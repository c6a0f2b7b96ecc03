package vllm

// Anthropic's Messages API as vLLM serves it (vllm/entrypoints/anthropic/
// protocol.py, serving.py): the request is converted to a chat completion
// (system text first, then the messages; images become image_url parts,
// tool_use blocks tool calls, tool_result blocks tool messages), so it is
// bounded by the same bytes rule as chat.

// parseMessages bounds a /v1/messages or /v1/messages/count_tokens body:
// model and messages are required, and max_tokens (≥ 1) on /v1/messages,
// as vLLM's pydantic models require them.
func (r *Request) parseMessages(present func(string) (span, bool), need func(string) (span, error), opts CountOptions) error {
	body := r.body
	if _, err := need("model"); err != nil {
		return err
	}
	if r.Model == "" {
		return invalid("model", "must be a non-empty string")
	}
	msgs, err := need("messages")
	if err != nil {
		return err
	}
	if body[msgs.start] != '[' {
		return invalid("messages", "must be an array")
	}
	b := boundOf(body, msgs)
	if b.media > 0 {
		r.HasMedia, r.MediaParts = true, b.media
	}
	n := b.tokens(opts.MediaTokensPerPart) + opts.TemplateTokensPerRequest + max(1, b.items)*opts.TemplateTokensPerMessage
	if sys, ok := present("system"); ok {
		sb := boundOf(body, sys)
		n += sb.tokens(opts.MediaTokensPerPart) + opts.TemplateTokensPerMessage
	}
	for _, name := range []string{"tools", "chat_template_kwargs", "tool_choice", "output_config"} {
		if v, ok := present(name); ok {
			n += indentedLen(body[v.start:v.end])
		}
	}
	r.InputTokens = []int{n}
	if r.Endpoint == EndpointCountTokens {
		r.InputExact = true // counted by the replica, charged as a request
		r.InputTokens = []int{0}
		return nil
	}
	st, _ := present("stream")
	if r.Stream, err = optBool(body, st, "stream", false); err != nil {
		return err
	}
	mt, err := need("max_tokens")
	if err != nil {
		return err
	}
	v, _, err := optInt(body, mt, "max_tokens")
	if err != nil {
		return err
	}
	if v < 1 {
		return invalid("max_tokens", "must be at least 1")
	}
	r.MaxTokens = v
	return nil
}
