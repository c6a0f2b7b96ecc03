package config

// HoldPrediction sizes a request's ledger hold on what its tenant's
// requests on its model produced recently, not on its worst case
// (docs/LEDGER.md §12, docs/SCHEDULING.md §7): input + min(cap,
// max(floor_tokens, the percentile of the last history outputs per
// choice, min_tokens)) per choice. As the request generates, Sluice grows
// the hold by step_tokens through the ledger ahead of its output; when a
// budget cannot cover the next step the generation is stopped at the
// budget (finish_reason "length", X-Sluice-Stopped / the stream's final
// chunk). Replica room and the fair-share cost are sized on the same
// prediction.
type HoldPrediction struct {
	// Enabled turns prediction on. Default true: worst-case holds lock
	// agents out of budgets they never spend (a chat without max_tokens
	// holds the rest of the context), and growth keeps the overshoot past
	// a budget within one step per running request.
	Enabled *bool `yaml:"enabled"`
	// Percentile of the recent outputs per choice the hold covers, in
	// (0, 1]. Default 0.95.
	Percentile float64 `yaml:"percentile"`
	// FloorTokens is the least output per choice a predicted hold covers
	// (also the prediction before any history). Default 256.
	FloorTokens int64 `yaml:"floor_tokens"`
	// StepTokens is how much output a hold grows by, once the output
	// seen comes within one step of it; it bounds the overshoot past a
	// budget per running request. Default 256; at least twice the
	// largest stream interval (upstream.stream_interval,
	// upstream.non_streamed_interval), so a usage report arrives before a
	// request passes its hold.
	StepTokens int64 `yaml:"step_tokens"`
	// History is how many recent outputs per tenant and model the
	// percentile reads. Default 64.
	History int `yaml:"history"`
}

// On reports whether prediction is enabled.
func (p HoldPrediction) On() bool { return p.Enabled == nil || *p.Enabled }

func (p *HoldPrediction) applyDefaults() {
	def(&p.Percentile, 0.95)
	def(&p.FloorTokens, 256)
	def(&p.StepTokens, 256)
	def(&p.History, 64)
}

func (p HoldPrediction) validate(v *validator, streamInterval, nonStreamed int) {
	if p.Percentile <= 0 || p.Percentile > 1 {
		v.add("server.hold_prediction.percentile must be in (0, 1], got %g", p.Percentile)
	}
	v.positive("server.hold_prediction.floor_tokens", p.FloorTokens)
	v.positive("server.hold_prediction.step_tokens", p.StepTokens)
	if p.History < 1 || p.History > 4096 {
		v.add("server.hold_prediction.history must be in 1..4096, got %d", p.History)
	}
	if iv := int64(max(streamInterval, nonStreamed)); p.On() && p.StepTokens < 2*iv {
		v.add("server.hold_prediction.step_tokens %d must be at least twice the largest stream interval (%d): a hold must not be passed between two usage reports", p.StepTokens, iv)
	}
}

func derefInt(p *int) int {
	if p == nil {
		return 0
	}
	return *p
}
