package lifecycle

import (
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
)

// Expected use (docs/SCHEDULING.md §7). A call's ledger hold is its worst
// case, input + cap × choices, where cap is the remaining context when
// neither the client, the tenant nor a budget set one, or with
// server.hold_prediction a prediction that grows as it runs (predict.go).
// Replica room and the fair-share cost are sized on what it is expected
// to use: the same prediction, or without it expected_output_tokens. vLLM's
// scheduler admits a request by the KV it holds now, not by its cap
// (vllm/v1/core/sched/scheduler.py allocates blocks as tokens are
// computed), so sizing room on caps would leave replicas idle that vLLM
// would fill, and an uncapped chat would count as a whole context.

// expectedOutput is the output a call is expected to generate over all its
// choices: per choice min(cap, the prediction or server.expected_output_tokens), raised to
// the client's min_tokens, and the whole cap with ignore_eos (it runs to
// the cap).
func (e *Engine) expectedOutput(c *call) int64 {
	per := int64(c.plan.Cap)
	if c.req == nil || !c.req.IgnoreEOS {
		floor := c.pol.Cfg.Server.ExpectedOutputTokens
		if c.pol.Cfg.Server.HoldPrediction.On() && c.req != nil && c.ep.HasOutput() {
			// The same prediction the hold is sized on (predict.go).
			floor = e.predictedOutput(c)
		}
		if c.req != nil {
			floor = max(floor, int64(c.req.MinTokens))
		}
		per = min(per, floor)
	}
	// per ≤ cap: the product is within the hold's, checked by sizeHolds.
	return per * int64(c.plan.Choices)
}

// sizeExpected sets the call's replica room (size) and fair-share cost
// from its input and expected output.
func (e *Engine) sizeExpected(c *call, in int64) error {
	out := e.expectedOutput(c)
	c.size = in + out
	cost := c.pol.Cfg.Server.Cost
	if cost.Unit == "gpu_ms" {
		c.cost = max(1, e.reps.GPUHold(e.gpu, c.req.Model, in, out))
		return nil
	}
	wi, ok1 := mulAmount(cost.WIn, in)
	wo, ok2 := mulAmount(cost.WOut, out)
	if !ok1 || !ok2 || wi > ledger.MaxAmount-wo {
		return apierr.Invalidf("max_tokens", "the request's fair-share cost is out of range; lower max_tokens")
	}
	c.cost = wi + wo
	return nil
}

// atCap reports a call whose output cap is the most its tenant may ask
// for, for the abuse detector's max_cap_burst: the tenant's
// max_output_tokens, or without one a cap the client sent that fills the
// model's remaining context. A request without a cap of its own is not at
// it: vLLM's default is no sign of abuse.
func (e *Engine) atCap(c *call) bool {
	if m := c.t.Cfg.MaxOutputTokens; m > 0 {
		return int64(c.plan.Cap) >= m
	}
	if c.req == nil || c.req.MaxTokens == 0 {
		return false
	}
	mml := e.reps.MaxModelLen(c.req.Model)
	maxIn := 0
	for _, n := range c.req.InputTokens {
		maxIn = max(maxIn, n)
	}
	return mml > 0 && int64(c.req.MaxTokens+maxIn) >= mml
}
