package lifecycle

import (
	"errors"
	"strconv"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/vllm"
)

// Growth as a call generates (docs/LEDGER.md §12). A call whose hold is a
// prediction (predict.go) watches the cumulative output its stream
// reports (vLLM's continuous usage, every stream interval): once the output
// seen comes within one step of the hold, the hold grows by a step through
// the ledger's Grow, atomically against every scope of the request, up to
// the worst case (cap × choices). When a budget cannot cover the step
// (a *DeniedError), or the ledger cannot answer (fail closed), the
// generation is stopped at the budget: the upstream request is aborted,
// the client gets what was generated with finish_reason "length" and is
// told why (X-Sluice-Stopped on a non-streamed answer; a last chunk with
// a "sluice" member on a stream), and the call is charged what ran.
//
// The bound. Holds never pass a budget (c + r ≤ max: every grow is
// admitted like a Reserve), and a call asks for its next step while a
// whole step of its hold is still unused. A stopped call is charged what
// ran: the output seen, plus what vLLM generated before the abort reached
// it (one stream interval per unfinished choice, allowanceFor), and the
// chunks that arrived meanwhile. That is within a step of its hold as long
// as the abort lands within a step's worth of decoding; a replica that
// decodes faster than Sluice aborts (a stalled front end, a simulator at
// 50 µs a token) could run further, so the charge of a stopped call is
// bounded at its hold plus one step (boundStopped): a budget is passed by
// at most one step per request running when it ran out, whatever the
// timing, and what ran past that is logged, not charged.

// errBudgetEnded is the cause a call's context is cancelled with when
// Sluice stops its generation at a budget.
var errBudgetEnded = errors.New("generation stopped at a budget")

// growth is a predicted hold's state.
type growth struct {
	worst int64 // the output the hold may grow to: cap × choices
	step  int64 // server.hold_prediction.step_tokens
	// stop is why the generation was stopped; nil while it runs.
	stop *growStop
	// grown counts the steps taken.
	grown int
	// refused is why the last step was refused: the generation then runs
	// on to the hold it has, and stops there.
	refused *growStop
	// The stream's id, created and model, for the chunk that ends it.
	id      string
	created int64
	model   string
	meta    bool
}

// growStop says why a generation was stopped.
type growStop struct {
	reason string // "budget" or "ledger_unavailable"
	denied *ledger.DeniedError
}

// growHold grows a predicted hold when the output seen comes within one
// step of it; it reports true when the generation must stop (the call's
// context is then cancelled with errBudgetEnded, which aborts upstream).
// ev is the event just read.
func (e *Engine) growHold(c *call, ev *vllm.Event) bool {
	g := c.growth
	if g == nil || g.stop != nil || c.stream == nil || ev.Done {
		return false
	}
	if !g.meta && !ev.Done && ev.Err == nil && !ev.Whole && len(ev.Data) > 0 {
		g.id, g.created, g.model, g.meta = vllm.ChunkMeta(ev.Data)
	}
	u := c.stream.Usage()
	if u.Final {
		return false
	}
	seen, held := int64(u.CompletionTokens), c.held[ledger.OutputTokens]
	if g.refused != nil {
		// What is held is the client's to use: stop only at the hold, not
		// when a step is refused (a small budget left would otherwise end
		// a generation a step before its hold).
		if seen < held {
			return false
		}
		return e.stopGrowth(c, g.refused)
	}
	if held-seen >= g.step || held >= g.worst {
		return false
	}
	to := min(g.worst, max(held, seen)+g.step)
	next, err := e.holdFor(c, c.held[ledger.InputTokens], to)
	if err == nil {
		gr := e.led.(grower) // watchable checked it
		op := c.ledgerOp()
		err = gr.Grow(op, c.ref, e.owner, c.held, next)
		op.cancel()
		e.noteLedger("grow", err)
	}
	if err == nil {
		c.held = next
		g.grown++
		return false
	}
	why := &growStop{reason: "budget", denied: deniedOf(err)}
	if why.denied == nil {
		why.reason = "ledger_unavailable"
		if !ledger.IsStoreError(err) {
			e.log.Error("ledger grow refused; the generation stops at its hold", "request_id", c.reqID, "err", err)
			why.reason = "ledger_error"
		}
	}
	if seen < held {
		g.refused = why
		return false
	}
	return e.stopGrowth(c, why)
}

// stopGrowth ends a generation at its hold: upstream is aborted and the
// client is told why.
func (e *Engine) stopGrowth(c *call, why *growStop) bool {
	c.growth.stop = why
	c.abortCause = "budget"
	c.cancel(errBudgetEnded)
	return true
}

// header is the X-Sluice-Stopped value: the reason, then the scope,
// dimension and window of the budget that ended it.
func (st *growStop) header() []byte {
	b := []byte(st.reason)
	if d := st.denied; d != nil {
		b = append(b, "; scope="...)
		b = append(b, d.Scope.String()...)
		b = append(b, "; dimension="...)
		b = append(b, d.Dim.String()...)
		if d.Window > 0 {
			b = append(b, "; window="...)
			b = append(b, ledger.FormatWindow(d.Window)...)
		}
	}
	return b
}

// json is the stream's "sluice" member: {"stopped":reason,"scope":…,
// "dimension":…,"window":…}.
func (st *growStop) json() []byte {
	b := append([]byte(`{"stopped":`), strconv.Quote(st.reason)...)
	if d := st.denied; d != nil {
		b = append(b, `,"scope":`...)
		b = strconv.AppendQuote(b, d.Scope.String())
		b = append(b, `,"dimension":`...)
		b = strconv.AppendQuote(b, d.Dim.String())
		if d.Window > 0 {
			b = append(b, `,"window":`...)
			b = strconv.AppendQuote(b, ledger.FormatWindow(d.Window))
		}
	}
	return append(b, '}')
}

// appendStopped appends the chunk that ends a stopped stream (every
// unfinished choice with finish_reason "length" and the "sluice" member)
// and [DONE].
func appendStopped(b []byte, c *call) []byte {
	g := c.growth
	return vllm.AppendLimitChunk(b, c.ep, g.id, g.created, g.model, c.stream.Unfinished(c.plan.Choices), g.stop.json())
}

// stoppedBody is the non-streamed answer of a stopped generation: what
// arrived, every unfinished choice ending with "length".
func stoppedBody(c *call, asm *vllm.Assembler) ([]byte, error) {
	if asm == nil {
		asm = vllm.NewAssembler(c.ep)
	}
	asm.EndAtLimit(c.plan.Choices)
	return asm.Body()
}

// boundStopped bounds the charge of a call stopped at a budget at its hold
// plus one step of output (the stated overshoot); the output past it, if
// any ran, is logged and not charged.
func (e *Engine) boundStopped(c *call, a ledger.Amounts) ledger.Amounts {
	g := c.growth
	if g == nil || g.stop == nil {
		return a
	}
	most := c.held[ledger.OutputTokens] + g.step
	out := a[ledger.OutputTokens]
	if out <= most {
		return a
	}
	e.log.Warn("generation stopped at a budget ran past its hold plus one step; the excess is not charged",
		"request_id", c.reqID, "tenant", c.t.Name, "ran", out, "charged", most)
	in := a[ledger.InputTokens]
	a[ledger.OutputTokens] = most
	a[ledger.Tokens] = in + most
	a[ledger.USDMicros] = c.pol.PriceCached(c.req.Model, in, int64(c.usage.CachedTokens), most)
	return a
}
