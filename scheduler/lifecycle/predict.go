package lifecycle

import (
	"context"
	"slices"
	"sync"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/vllm"
)

// Predicted holds (docs/LEDGER.md §12, docs/SCHEDULING.md §7). A hold sized
// at the worst case (input + cap × choices, the cap being the rest of the
// context when nobody set one) locks a tenant out of a budget it never
// spends: forty concurrent chats without max_tokens each hold a whole
// context. With server.hold_prediction a call whose output Sluice can watch
// as it runs holds its input plus a prediction per choice instead: the
// hold_prediction.percentile of what the tenant's recent requests on the
// model produced, at least floor_tokens and the request's min_tokens, at
// most its cap. The reservation stays exact: the hold grows ahead of the
// output as it generates (grow.go) and settles at what ran.

// predictor keeps a tenant's recent outputs per choice, per model.
type predictor struct {
	mu sync.Mutex
	by map[string]*outputRing
}

// outputRing is the last len(v) outputs per choice, oldest overwritten.
type outputRing struct {
	v    []int64
	next int
	n    int
}

// observe records one request's output per choice.
func (p *predictor) observe(model string, perChoice int64, history int) {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.by == nil {
		p.by = map[string]*outputRing{}
	}
	r := p.by[model]
	if r == nil || len(r.v) != history {
		r = &outputRing{v: make([]int64, history)}
		p.by[model] = r
	}
	r.v[r.next] = perChoice
	r.next = (r.next + 1) % len(r.v)
	r.n = min(r.n+1, len(r.v))
}

// quantile returns the q-quantile (nearest rank) of the recorded outputs
// of model, false when none is recorded.
func (p *predictor) quantile(model string, q float64) (int64, bool) {
	p.mu.Lock()
	r := p.by[model]
	if r == nil || r.n == 0 {
		p.mu.Unlock()
		return 0, false
	}
	v := slices.Clone(r.v[:r.n])
	p.mu.Unlock()
	slices.Sort(v)
	k := int(q*float64(len(v))+0.999999) - 1
	return v[min(max(k, 0), len(v)-1)], true
}

// grower is the ledger's Grow (ledger.Ledger.Grow), which both backends
// have; a ledger without it keeps worst-case holds.
type grower interface {
	Grow(ctx context.Context, ref ledger.Ref, owner ledger.Owner, from, to ledger.Amounts) error
}

// watchable reports whether Sluice sees a call's output as it runs, so that
// its hold may be a prediction: chat and completions sent upstream as a
// stream (the client's, or an evidence stream for a non-streamed request,
// upstream.non_streamed_interval), with no tools (vLLM's tool parser may
// hold a whole call's chunks back, chat_completion/serving.py, so its
// output is not seen until it ends), on a ledger that can grow holds.
func (e *Engine) watchable(c *call) bool {
	if c.ep != vllm.EndpointChat && c.ep != vllm.EndpointCompletions {
		return false
	}
	if c.req == nil || c.req.HasTools() || c.outage {
		return false
	}
	if _, ok := e.led.(grower); !ok {
		return false
	}
	return c.req.Stream || upstreamInterval(c) > 0
}

// predictedOutput is the output per choice a call is predicted to produce:
// max(floor_tokens, the tenant's percentile on the model, min_tokens).
func (e *Engine) predictedOutput(c *call) int64 {
	hp := c.pol.Cfg.Server.HoldPrediction
	p := hp.FloorTokens
	if q, ok := localOf(c.t).pred.quantile(c.req.Model, hp.Percentile); ok {
		p = max(p, q)
	}
	return max(p, c.minTokens())
}

// holdOutput is the output a call's hold covers over all its choices:
// its cap, or the prediction when that is below the cap and the call is
// watchable. It sets c.growth for a predicted hold. The cap's product is
// checked by sizeHolds first.
func (e *Engine) holdOutput(c *call) int64 {
	worst := int64(c.plan.Cap) * int64(c.plan.Choices)
	c.growth = nil
	if !c.pol.Cfg.Server.HoldPrediction.On() || !e.watchable(c) {
		return worst
	}
	per := e.predictedOutput(c)
	if per >= int64(c.plan.Cap) {
		return worst
	}
	c.growth = &growth{worst: worst, step: c.pol.Cfg.Server.HoldPrediction.StepTokens}
	return per * int64(c.plan.Choices)
}

// observeOutput records what a call produced per choice, for the tenant's
// later predictions: a complete answer (final usage), or one Sluice ended
// at a budget (the least it wanted).
func (e *Engine) observeOutput(c *call, out int64, src ledger.Source) {
	if c.req == nil || !c.ep.HasOutput() || (src != ledger.SourceFinal && (c.growth == nil || c.growth.stop == nil)) {
		return
	}
	hp := c.pol.Cfg.Server.HoldPrediction
	if !hp.On() {
		return
	}
	localOf(c.t).pred.observe(c.req.Model, out/int64(max(1, c.plan.Choices)), hp.History)
}
