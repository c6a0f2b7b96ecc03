package scheduler

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/vllm"
)

// The scheduler's side of vLLM transparency (issue 19): counting before a
// refusal or a cut, settling what vLLM reported, and telling a request vLLM
// refused apart from one it ran.

// countAndPlan bounds the request's input and plans its output cap. The
// bytes bound may size a hold, but it is never the reason a request is
// refused or its cap cut (docs/VLLM.md Part 2): when it would be, or when
// the request may not fit the model's context at all (vLLM's 400, which
// comes before any tenant limit or budget), the replica's /tokenize counts
// exactly first, and only a failed count leaves the bound's answer (the
// documented fallback). counted reports that /tokenize was asked (or has
// nothing to render), so a later budget denial need not ask again.
func (s *Server) countAndPlan(ctx context.Context, t *tenant, pol *policy, req *vllm.Request) (_ *vllm.Request, _ vllm.Plan, counted bool, _ error) {
	// Only the generation endpoints have a /tokenize rendering to ask for.
	tried := isOther(req.Endpoint)
	if pol.cfg.Upstream.TokenCount == "tokenize" && !req.InputExact && !tried {
		req, tried = s.tokenize(ctx, req), true
	}
	plan, err := s.planFor(t, req)
	if (err != nil || plan.BoundCut || plan.BoundOver) && !req.InputExact && !tried {
		tried = true
		if exact := s.tokenize(ctx, req); exact.InputExact {
			req = exact
			plan, err = s.planFor(t, req)
		}
	}
	return req, plan, tried || req.InputExact, err
}

// planFor plans the cap and checks the tenant's input limit, in vLLM's
// order: a request the model cannot take is its 400 before a tenant limit
// (Request.Plan).
func (s *Server) planFor(t *tenant, req *vllm.Request) (vllm.Plan, error) {
	plan, err := req.Plan(vllm.Limits{MaxModelLen: int(s.reps.maxModelLen(req.Model)), TenantMaxOutput: int(t.cfg.MaxOutputTokens)})
	if err != nil {
		return plan, err
	}
	if in := int64(req.TotalInputTokens()); in > t.cfg.MaxInputTokens {
		return plan, fmt.Errorf("input of %d tokens exceeds the tenant's max_input_tokens %d: %w", in, t.cfg.MaxInputTokens, ErrContextLength)
	}
	return plan, nil
}

// recount replaces the call's bytes bound with the replica's exact count
// (once per call), re-planning the cap on it. It reports whether the holds
// are to be sized and reserved again; an error is the exact count's verdict
// on the request (a 400 comes before any budget).
func (s *Server) recount(c *call) (bool, error) {
	c.counted = true
	if isOther(c.req.Endpoint) {
		return false, nil
	}
	exact := s.tokenize(c.ctx, c.req)
	if !exact.InputExact {
		return false, nil // the documented fallback: the bound decides
	}
	plan, err := s.planFor(c.t, exact)
	if err != nil {
		return false, err
	}
	c.req, c.plan = exact, plan
	return true, nil
}

// exactMayFit reports whether an exact input count could turn a token
// budget's denial into a grant: the budget has room for at least one input
// token plus the least output the call could go with (its cap, or for a cap
// Sluice may lower, the floor). An exhausted budget is refused without
// asking a replica to count, so a flood of refused requests costs the
// replicas nothing.
func exactMayFit(c *call, d *ledger.DeniedError, floor int64) bool {
	free := d.Limit - d.Committed - d.Reserved
	out := int64(c.plan.Cap)
	if c.req.MaxTokens == 0 || d.Scope == ledger.KindWorkflow {
		out = min(out, max(1, floor, c.minTokens()))
	}
	return free > out*int64(max(1, c.plan.Choices))
}

// settleUsage is what a dispatched call whose stream opened is charged
// (vllm.Stream.SettleFor): per prompt, with an abort allowance of at least
// one stream interval per unfinished choice.
func (s *Server) settleUsage(c *call) vllm.Usage {
	return c.stream.SettleFor(vllm.Shape{N: c.req.N, Inputs: c.req.InputTokens, Allowance: allowanceFor(c), Cap: c.plan.Cap})
}

// allowanceFor is the abort allowance per unfinished choice: the tokens
// vLLM may generate between two usage chunks. That is its effective stream
// interval, the larger of the server's --stream-interval and the request's
// stream_interval (vllm/entrypoints/openai/completion/protocol.py), so a
// client cannot shrink its charge by asking for a large interval; the
// stream raises it further to the largest step it saw. A tool parser can
// hold chunks back for a whole call (chat_completion/serving.py skips
// chunks whose parsed delta is empty), so with tools the allowance is the
// cap: the reservation, never more.
func allowanceFor(c *call) int {
	a := max(abortAllowance, c.req.StreamInterval)
	if c.req.HasTools() {
		a = max(a, c.plan.Cap)
	}
	return a
}

// sentUsage is the charge of a call sent upstream whose response never
// opened. A streamed request gets its headers before prefill, so nothing
// but prefill can have run; a non-streamed one answers only when it is
// done, so vLLM may have generated up to its cap and reports nothing: it is
// charged its hold.
func sentUsage(c *call) vllm.Usage {
	u := vllm.Usage{PromptTokens: c.plan.InputTokens}
	if !c.req.Stream {
		u.CompletionTokens = c.plan.Cap * c.plan.Choices
	}
	return u
}

// ran reports whether vLLM may have run the call: it was sent, and the
// engine did not refuse it with an error event before any output (vLLM's
// errors after a stream's headers, docs/VLLM.md §1.5).
func (c *call) ran() bool {
	return c.sent && (c.stream == nil || c.stream.Refused() == nil)
}

// minTokens is the client's min_tokens: a cap Sluice lowers must not go
// below it (vLLM would refuse naming a max_tokens the client never sent).
func (c *call) minTokens() int64 {
	if c.req == nil {
		return 0
	}
	return int64(c.req.MinTokens)
}
