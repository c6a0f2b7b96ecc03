package lifecycle

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// The scheduler's side of vLLM transparency: counting before a
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
func (e *Engine) countAndPlan(ctx context.Context, t *policy.Tenant, pol *policy.Snapshot, req *vllm.Request) (_ *vllm.Request, _ vllm.Plan, counted bool, _ error) {
	// Only the generation endpoints have a /tokenize rendering to ask for.
	tried := isOther(req.Endpoint)
	if (pol.Cfg.Upstream.TokenCount == "tokenize" || req.NeedsExactCount()) && !req.InputExact && !tried {
		req, tried = e.tokenize(ctx, req), true
	}
	if req.NeedsExactCount() && !req.Tokenized {
		return req, vllm.Plan{}, tried, apierr.Invalidf("chat_template", "a chat_template in the body is counted only by the replica's /tokenize, which could not count it; send the request without chat_template")
	}
	plan, err := e.planFor(t, req)
	if (err != nil || plan.BoundCut || plan.BoundOver) && !req.InputExact && !tried {
		tried = true
		if exact := e.tokenize(ctx, req); exact.InputExact {
			req = exact
			plan, err = e.planFor(t, req)
		}
	}
	return req, plan, tried || req.InputExact, err
}

// planFor plans the cap and checks the tenant's input limit, in vLLM's
// order: a request the model cannot take is its 400 before a tenant limit
// (Request.Plan).
func (e *Engine) planFor(t *policy.Tenant, req *vllm.Request) (vllm.Plan, error) {
	plan, err := req.Plan(vllm.Limits{MaxModelLen: int(e.reps.MaxModelLen(req.Model)), TenantMaxOutput: int(t.Cfg.MaxOutputTokens)})
	if err != nil {
		return plan, err
	}
	if in := int64(req.TotalInputTokens()); in > t.Cfg.MaxInputTokens {
		return plan, fmt.Errorf("input of %d tokens exceeds the tenant's max_input_tokens %d: %w", in, t.Cfg.MaxInputTokens, apierr.ErrContextLength)
	}
	return plan, nil
}

// recount replaces the call's bytes bound with the replica's exact count
// (once per call), re-planning the cap on it. It reports whether the holds
// are to be sized and reserved again; an error is the exact count's verdict
// on the request (a 400 comes before any budget).
func (e *Engine) recount(c *call) (bool, error) {
	c.counted = true
	if isOther(c.req.Endpoint) {
		return false, nil
	}
	exact := e.tokenize(c.ctx, c.req)
	if !exact.InputExact {
		return false, nil // the documented fallback: the bound decides
	}
	plan, err := e.planFor(c.t, exact)
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
// (vllm.Stream.SettleFor): per prompt, with an abort allowance of one
// stream interval per unfinished choice.
func (e *Engine) settleUsage(c *call) vllm.Usage {
	return c.stream.SettleFor(vllm.Shape{N: c.req.N, Inputs: c.req.InputTokens, Allowance: allowanceFor(c), Cap: c.plan.Cap})
}

// allowanceFor is the abort allowance per unfinished choice: what vLLM may
// have generated past the last usage chunk Sluice read. That is one stream
// interval, the effective one of the request: the largest of the replicas'
// --stream-interval (upstream.stream_interval) and the request's own
// stream_interval, which raises the server's, never lowers it
// (vllm/entrypoints/openai/completion/protocol.py), so a client cannot
// shrink its charge by asking for a large interval.
//
// # Why one interval
//
// vLLM's output processor (vllm/v1/engine/output_processor.py,
// RequestState.make_request_output) hands a choice's output on as soon as
// stream_interval tokens have accumulated since the last output it handed
// on, so at most interval − 1 generated tokens wait unsent; the engine step
// in flight when the abort reaches the engine core adds one token, and
// outputs of an aborted request are dropped after that (abort_requests).
// The chunks vLLM wrote before the connection closed are read before
// settling (Stream.takeArrived). At interval 1 the charge is therefore the
// last cumulative count plus one per unfinished choice: at most one token
// above what ran. What it can miss is an undercharge, never an overcharge:
// outputs vLLM's API server had merged but not yet written when it saw the
// disconnect (RequestOutputCollector, under load), and several tokens of
// one speculative-decoding step. A step between two usage chunks larger
// than the interval is that merging, not a larger interval, so it does not
// raise the allowance.
//
// A tool parser can hold chunks back for a whole call
// (chat_completion/serving.py skips chunks whose parsed delta is empty),
// so with tools the allowance is the cap: the reservation, never more.
func allowanceFor(c *call) int {
	a := max(1, c.pol.Cfg.Upstream.StreamInterval, c.upInterval)
	if c.req.Stream {
		a = max(a, c.req.StreamInterval)
	}
	if c.req.HasTools() {
		a = max(a, c.plan.Cap)
	}
	return a
}

// upstreamInterval is the stream_interval a non-streamed call is sent
// upstream with as a stream (upstream.non_streamed_interval), 0 to send it
// non-streamed: so when the setting is 0, when its cap is no larger than
// the interval (its hold is then within one interval per choice of what
// can run), and when a stream cannot rebuild vLLM's body faithfully
// (vllm.Request.Reassemblable).
func upstreamInterval(c *call) int {
	if c.req.Stream || isOther(c.ep) {
		return 0
	}
	k := config.DefaultNonStreamedInterval
	if p := c.pol.Cfg.Upstream.NonStreamedInterval; p != nil {
		k = *p
	}
	if k <= 0 || c.plan.Cap <= k || !c.req.Reassemblable() {
		return 0
	}
	return k
}

// sentUsage is the charge of a call sent upstream whose response never
// opened. A stream gets its headers before prefill, so nothing but prefill
// can have run; a non-streamed request answers only when it is done, so
// vLLM may have generated up to its cap and reports nothing: it is charged
// its hold. That includes a non-200 answer to a non-streamed request that
// vLLM may give after generating (upstreamRan).
func sentUsage(c *call) vllm.Usage {
	u := vllm.Usage{PromptTokens: c.plan.InputTokens}
	if !c.req.Stream && c.upInterval == 0 {
		u.CompletionTokens = c.plan.Cap * c.plan.Choices
	}
	return u
}

// upstreamRan reports whether a non-200 answer may come after vLLM ran the
// request. A stream's errors after generation come inside it (its usage so
// far is then the evidence); a non-streamed request is answered once
// generation ended, and a choice that ended with finish_reason "error" is
// answered 500 (vllm/entrypoints/openai/chat_completion/serving.py and
// completion/serving.py, GenerationError). A 4xx is a refusal before any
// generation, a 503 vLLM's admission control refusing to queue it.
//
// The other endpoints are charged only from an answer that opened: their
// non-200 answers count as refusals.
func upstreamRan(c *call, ue *vllm.UpstreamError) bool {
	return !isOther(c.ep) && !c.req.Stream && c.upInterval == 0 && ue.Status >= 500 && ue.Status != 503
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

// peeked holds a stream's first event, which execute reads before it
// counts the stream as opened (Engine.first).
type peeked struct {
	ev  vllm.Event
	err error
	ok  bool
}

// first reads a stream's first event before the call counts as started.
// vLLM sends the 200 headers before the request enters its engine (the
// handler returns a StreamingResponse whose generator has not run yet,
// vllm/entrypoints/openai/api_server.py) and the first event only with the
// first output (the chat role chunk goes out on the generator's first
// iteration, vllm/entrypoints/openai/chat_completion/serving.py), so until
// it arrives the request may be waiting in the replica's queue, where it
// can be taken back (takeback.go): takeBack, when not nil, cancels ctx,
// this attempt's context, for that.
//
// An evidence stream's refusal (upstreamInterval) is turned back into the
// answer vLLM gives a non-streamed request: its engine refuses a streamed
// request it cannot queue (503, a full waiting queue:
// vllm/v1/engine/admission_control.py) with an error event after the 200
// headers, where it answers a non-streamed request with a 503 response,
// which another replica may take: such a first event is returned as that
// non-streamed 503 (the stream closed), so that execute retries as it
// would have. Anything else is kept for the reader (call.next).
func (e *Engine) first(ctx context.Context, c *call, st *vllm.Stream, takeBack context.CancelCauseFunc) error {
	if takeBack != nil {
		e.mu.Lock()
		e.unstarted[c] = takeBack
		e.mu.Unlock()
	}
	ev, err := st.Next()
	if takeBack != nil {
		e.mu.Lock()
		delete(e.unstarted, c)
		e.mu.Unlock()
		// Taken back while registered (TakeBackWaiting cancels under
		// e.mu), whatever the read returned: the abort is on its way.
		if errors.Is(context.Cause(ctx), errTakenBack) {
			_ = st.Close()
			return errTakenBack
		}
	}
	if c.upInterval > 0 && err == nil && ev.Err != nil && ev.Err.Status == 503 {
		ue := *ev.Err
		ue.InStream = false
		_ = st.Close()
		return &ue
	}
	c.peeked = peeked{ev: ev, err: err, ok: true}
	return nil
}

// next is the stream's next event, the peeked one first. The peeked
// event's bytes are the stream's until its next read, which comes after.
func (c *call) next() (vllm.Event, error) {
	if c.peeked.ok {
		p := c.peeked
		c.peeked = peeked{}
		return p.ev, p.err
	}
	return c.stream.Next()
}
