package vllm

import "fmt"

// Limits are the caps the scheduler applies on top of the client's.
type Limits struct {
	// MaxModelLen is the model's context length in tokens (from /v1/models
	// or /tokenize). 0 means unknown.
	MaxModelLen int
	// TenantMaxOutput is the tenant's per-request output cap. 0 means none.
	TenantMaxOutput int
	// BudgetMaxOutput is the largest per-choice output the budget allows.
	// 0 means no budget limit (refuse exhausted budgets before calling Plan).
	BudgetMaxOutput int
}

// Plan is the output side of admission for one request.
type Plan struct {
	// Cap is the per-choice output cap written upstream (max_tokens).
	Cap int
	// Choices is N × prompts: the number of sequences vLLM will run.
	Choices int
	// InputTokens is the total input over all prompts.
	InputTokens int
	// OutputTokens is the output reservation, Cap × Choices.
	OutputTokens int
	// BoundCut reports a cap lowered to the remaining context computed from
	// an upper-bound input count: count exactly before relying on it.
	BoundCut bool
	// BoundOver reports a client cap (or a prompt) that does not fit the
	// model's context by an upper-bound input count: an exact count decides
	// whether the request is vLLM's 400, before any limit or budget.
	BoundOver bool
	// Default reports that no cap is written upstream: a chat request
	// without a cap, counted exactly, whose limits all allow the whole
	// remaining context, gets vLLM's own default (the remaining context, or
	// the model's generation_config; get_max_tokens in
	// vllm/entrypoints/serve/utils/api_utils.py). Cap is then the most
	// vLLM can generate, max_model_len − prompt, which the hold covers.
	Default bool
	// room is max_model_len − prompt when Default: a Cap lowered below it
	// later (a budget) is written upstream again.
	room int
}

// UpstreamCap is the cap to write upstream ([Request.Rewrite]): Cap, or 0
// to keep the client's (absent) cap when Default and Cap was not lowered
// since.
func (p Plan) UpstreamCap() int {
	if p.Default && p.Cap >= p.room {
		return 0
	}
	return p.Cap
}

// Plan computes the approved output cap and reservation (VLLM.md Part 2):
// min(client value or vLLM's default, tenant cap, budget cap). vLLM's default
// is 16 for completions and the remaining context max_model_len − prompt for
// chat. With exact input counts, a client cap that cannot fit the context is
// ErrContextLength (vLLM's 400) whatever the tenant or budget caps would
// lower it to: vLLM validates the request it is sent before anything else
// (vllm/entrypoints/openai/engine/serving.py _validate_input), so an
// invalid request is refused as invalid before any limit is consulted. A
// cap Sluice injected is clamped to the remaining context instead. With
// upper-bound counts no request is refused here (BoundOver asks for an
// exact count): the chat default uses the bound (never below 1 token).
func (r *Request) Plan(l Limits) (Plan, error) {
	if !r.Endpoint.HasOutput() {
		return Plan{Choices: 1, InputTokens: r.TotalInputTokens()}, nil
	}
	maxIn := 0
	for _, n := range r.InputTokens {
		maxIn = max(maxIn, n)
	}
	p := Plan{Choices: r.N * r.Prompts(), InputTokens: r.TotalInputTokens()}
	// A chat prompt of exactly max_model_len without a cap is vLLM's to
	// refuse: it does so only when the engine adds it, after a stream's
	// headers (vllm/v1/engine/input_processor.py _validate_prompt_len).
	chatDefault := r.Endpoint == EndpointChat && r.MaxTokens == 0
	if r.InputExact && l.MaxModelLen > 0 && (maxIn > l.MaxModelLen || (maxIn == l.MaxModelLen && !chatDefault)) {
		return p, fmt.Errorf("prompt of %d tokens, model context %d: %w", maxIn, l.MaxModelLen, ErrContextLength)
	}
	if r.MaxTokens > 0 && l.MaxModelLen > 0 && r.MaxTokens > l.MaxModelLen-maxIn {
		if r.InputExact {
			return p, fmt.Errorf("prompt of %d tokens plus %d output tokens, model context %d: %w",
				maxIn, r.MaxTokens, l.MaxModelLen, ErrContextLength)
		}
		p.BoundOver = true
	}
	if !r.InputExact && l.MaxModelLen > 0 && maxIn >= l.MaxModelLen {
		p.BoundOver = true
	}
	remaining := 0 // 0: unknown
	if l.MaxModelLen > 0 {
		remaining = max(1, l.MaxModelLen-maxIn-r.TemplateMargin)
	}
	c := r.MaxTokens
	clientSet := c > 0
	fromBound := false // the remaining context decided c
	if !clientSet {
		switch r.Endpoint {
		case EndpointCompletions:
			c = 16
		default:
			c = remaining
			fromBound = remaining > 0
		}
	}
	for _, lim := range []int{l.TenantMaxOutput, l.BudgetMaxOutput} {
		if lim > 0 && (c == 0 || lim < c) {
			c = lim
			fromBound = false
		}
	}
	if c == 0 {
		return p, fmt.Errorf("plan: %w", ErrNoCap)
	}
	if remaining > 0 && c > remaining {
		if !clientSet || c != r.MaxTokens {
			c = remaining
			fromBound = true
		}
	}
	p.BoundCut = fromBound && !r.InputExact
	if !clientSet && r.Endpoint == EndpointChat && r.InputExact && l.MaxModelLen >= maxIn && l.MaxModelLen > 0 {
		room := max(1, l.MaxModelLen-maxIn)
		lim := 0
		for _, v := range []int{l.TenantMaxOutput, l.BudgetMaxOutput} {
			if v > 0 && (lim == 0 || v < lim) {
				lim = v
			}
		}
		if lim == 0 || lim >= room {
			c, p.Default, p.room = room, true, room
		}
	}
	if r.MinTokens > 0 && c < r.MinTokens && (!clientSet || c != r.MaxTokens) {
		// vLLM would refuse the lowered cap with a 400 naming a max_tokens
		// the client never sent; a client cap below its own min_tokens is
		// vLLM's 400 to give.
		p.Cap = c
		return p, &InvalidRequestError{Param: "min_tokens", Reason: fmt.Sprintf(
			"min_tokens %d exceeds the %d output tokens this request may use (tenant limit, budget or context)",
			r.MinTokens, c)}
	}
	p.Cap = c
	p.OutputTokens = c * p.Choices
	if r.ContextInput {
		// vLLM refuses a prompt plus cap beyond the context, so the stored
		// conversation and the body's input together hold at most the
		// context less the cap.
		if l.MaxModelLen <= 0 {
			return p, invalid("previous_response_id", "cannot be bounded yet: the model's context length is unknown; retry shortly")
		}
		p.InputTokens = max(p.InputTokens, l.MaxModelLen-c)
	}
	return p, nil
}
