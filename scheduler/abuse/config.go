package abuse

import (
	"errors"
	"fmt"
	"math"
	"strings"
	"time"
)

// Limits on the window shapes, so a tenant's state stays small (see
// [Detector]'s memory note).
const (
	// MaxWindow bounds Config.Window: the fine ring holds one bucket per
	// second of it.
	MaxWindow = 10 * time.Minute
	// MaxBaseline bounds Config.Baseline.
	MaxBaseline = 24 * time.Hour
	// MaxBaselineWindows bounds ceil(Baseline / Window): the coarse ring
	// holds that many buckets plus two.
	MaxBaselineWindows = 1440
)

// Config is one tenant's automatic abuse clamps, embedded as `abuse:` under
// a tenant (or as a server-wide default). The zero value, once defaulted,
// has no detector enabled and never clamps.
type Config struct {
	// Window is the detector window: every detector looks at the last
	// Window of traffic. Optional; default 30s; whole seconds, 1s..10m.
	Window time.Duration `yaml:"window"`
	// Baseline is how far back, before the detector window, the tenant's
	// own normal rate is measured. It is rounded up to whole windows.
	// Optional; default 10m; >= Window, <= 24h and <= 1440 windows.
	//
	// A tenant has no baseline until it has been observed for one full
	// Baseline (plus up to two windows of bucket alignment); until then,
	// and whenever the measured baseline is below MinRate, the rate
	// detectors compare against MinRate instead.
	Baseline time.Duration `yaml:"baseline"`
	// MinRate is the absolute floor under the baseline, per second. It is
	// the reference before a baseline exists, and it keeps a near-idle
	// tenant's tiny baseline from turning ordinary use into "20×".
	// Optional; zero fields mean no floor, and then a tenant without a
	// baseline (or with a zero baseline) is never rate-clamped.
	MinRate Rates `yaml:"min_rate"`
	// SpendRateFactor fires when the tenant's tokens/s or usd_micros/s over
	// the window exceeds this many times its reference (baseline, or
	// MinRate, whichever is larger). Optional; 0 disables; else > 1.
	SpendRateFactor float64 `yaml:"spend_rate_factor"`
	// GPUMsRateFactor is SpendRateFactor for GPU-ms/s. Optional; 0
	// disables; else > 1.
	GPUMsRateFactor float64 `yaml:"gpu_ms_rate_factor"`
	// MaxCapBurst fires on many admissions at the tenant's maximum output
	// cap within the window: its max_output_tokens, or without one a
	// client cap that fills the model's remaining context (a request
	// without a cap is never at it). Optional; Count 0 disables.
	MaxCapBurst MaxCapBurst `yaml:"max_cap_burst"`
	// DisconnectShare fires when a high share of the requests that
	// finished within the window were client disconnects. Optional; Share
	// 0 disables.
	DisconnectShare DisconnectShare `yaml:"disconnect_share"`
	// Denials fires at this many budget denials within the window.
	// Optional; 0 disables.
	Denials int64 `yaml:"denials"`
	// Clamp is what a firing detector applies. Required (at least one
	// restriction) when any detector is enabled.
	Clamp Clamp `yaml:"clamp"`
	// Cooldown is how long the detector stays silent after an operator
	// lifts a clamp ([Detector.Lifted]), so the lift is respected and the
	// baseline can learn the traffic the operator accepted. Optional;
	// default Baseline.
	Cooldown time.Duration `yaml:"cooldown"`
}

// Rates are per-second amounts.
type Rates struct {
	// TokensPerSecond is input+output tokens per second. Default 0.
	TokensPerSecond float64 `yaml:"tokens_per_second"`
	// USDMicrosPerSecond is spend in micro-USD per second. Default 0.
	USDMicrosPerSecond float64 `yaml:"usd_micros_per_second"`
	// GPUMsPerSecond is GPU milliseconds per second. Default 0.
	GPUMsPerSecond float64 `yaml:"gpu_ms_per_second"`
}

// MaxCapBurst is the max-output-cap burst detector.
type MaxCapBurst struct {
	// Count is the number of admissions at the cap within the window that
	// fires. 0 disables.
	Count int64 `yaml:"count"`
	// Share is the minimum share (0..1) of the window's admissions that
	// were at the cap, so a busy tenant that only sometimes asks for the
	// cap does not fire. Optional; default 0 (count alone decides).
	Share float64 `yaml:"share"`
}

// DisconnectShare is the client-disconnect detector.
type DisconnectShare struct {
	// Share (0..1] of finished requests that were client disconnects
	// within the window that fires. 0 disables.
	Share float64 `yaml:"share"`
	// MinCount is the minimum number of finished requests in the window
	// before the share is judged. Optional; default 20.
	MinCount int64 `yaml:"min_count"`
}

// Clamp is the restriction a firing detector asks for: the admin API's
// clamp. Zero limits leave that limit as configured.
type Clamp struct {
	// Concurrency caps the tenant's in-flight requests. 0: unchanged.
	Concurrency int `yaml:"concurrency"`
	// Weight lowers the tenant's fair-share weight. 0: unchanged.
	Weight int `yaml:"weight"`
	// MaxOutputTokens lowers the output cap. 0: unchanged.
	MaxOutputTokens int64 `yaml:"max_output_tokens"`
	// Models restricts the tenant to these models. Empty: unchanged.
	Models []string `yaml:"models"`
	// Duration is how long the clamp lasts. Optional; default 10m.
	Duration time.Duration `yaml:"duration"`
}

// Enabled reports whether any detector is on.
func (c *Config) Enabled() bool {
	return c.SpendRateFactor > 0 || c.GPUMsRateFactor > 0 || c.MaxCapBurst.Count > 0 ||
		c.DisconnectShare.Share > 0 || c.Denials > 0
}

// ApplyDefaults fills the optional fields left zero.
func (c *Config) ApplyDefaults() {
	if c.Window == 0 {
		c.Window = 30 * time.Second
	}
	if c.Baseline == 0 {
		c.Baseline = 10 * time.Minute
	}
	if c.Cooldown == 0 {
		c.Cooldown = c.Baseline
	}
	if c.Clamp.Duration == 0 {
		c.Clamp.Duration = 10 * time.Minute
	}
	if c.DisconnectShare.Share > 0 && c.DisconnectShare.MinCount == 0 {
		c.DisconnectShare.MinCount = 20
	}
}

// Validate checks a defaulted Config and returns every problem, joined,
// each naming its field path under path (e.g. "tenants[3].abuse").
func (c *Config) Validate(path string) error {
	var errs []error
	add := func(format string, a ...any) { errs = append(errs, fmt.Errorf(format, a...)) }
	switch {
	case c.Window < time.Second:
		add("%s.window must be >= 1s", path)
	case c.Window > MaxWindow:
		add("%s.window must be <= %s", path, MaxWindow)
	case c.Window%time.Second != 0:
		add("%s.window must be whole seconds", path)
	}
	switch {
	case c.Baseline < c.Window:
		add("%s.baseline must be >= window (%s)", path, c.Window)
	case c.Baseline > MaxBaseline:
		add("%s.baseline must be <= %s", path, MaxBaseline)
	case c.Window >= time.Second && baselineWindows(c.Baseline, c.Window) > MaxBaselineWindows:
		add("%s.baseline must be <= %d windows (got %d)", path, MaxBaselineWindows, baselineWindows(c.Baseline, c.Window))
	}
	rate := func(field string, r float64) {
		if r < 0 || math.IsNaN(r) || math.IsInf(r, 0) {
			add("%s.min_rate.%s must be a finite number >= 0", path, field)
		}
	}
	rate("tokens_per_second", c.MinRate.TokensPerSecond)
	rate("usd_micros_per_second", c.MinRate.USDMicrosPerSecond)
	rate("gpu_ms_per_second", c.MinRate.GPUMsPerSecond)
	factor := func(field string, f float64) {
		if f != 0 && !(f > 1 && !math.IsInf(f, 0)) {
			add("%s.%s must be 0 (off) or a finite number > 1", path, field)
		}
	}
	factor("spend_rate_factor", c.SpendRateFactor)
	factor("gpu_ms_rate_factor", c.GPUMsRateFactor)
	share := func(field string, s float64) {
		if !(s >= 0 && s <= 1) {
			add("%s.%s must be in 0..1", path, field)
		}
	}
	if c.MaxCapBurst.Count < 0 {
		add("%s.max_cap_burst.count must be >= 0", path)
	}
	share("max_cap_burst.share", c.MaxCapBurst.Share)
	if c.MaxCapBurst.Share > 0 && c.MaxCapBurst.Count == 0 {
		add("%s.max_cap_burst.count must be >= 1 when share is set", path)
	}
	share("disconnect_share.share", c.DisconnectShare.Share)
	if c.DisconnectShare.MinCount < 0 {
		add("%s.disconnect_share.min_count must be >= 0", path)
	}
	if c.Denials < 0 {
		add("%s.denials must be >= 0", path)
	}
	if c.Cooldown < 0 {
		add("%s.cooldown must be >= 0", path)
	}
	cl := c.Clamp
	if cl.Concurrency < 0 {
		add("%s.clamp.concurrency must be >= 0", path)
	}
	if cl.Weight < 0 {
		add("%s.clamp.weight must be >= 0", path)
	}
	if cl.MaxOutputTokens < 0 {
		add("%s.clamp.max_output_tokens must be >= 0", path)
	}
	for i, m := range cl.Models {
		if strings.TrimSpace(m) == "" {
			add("%s.clamp.models[%d] must not be empty", path, i)
		}
	}
	if cl.Duration <= 0 {
		add("%s.clamp.duration must be > 0", path)
	}
	if c.Enabled() && cl.Concurrency == 0 && cl.Weight == 0 && cl.MaxOutputTokens == 0 && len(cl.Models) == 0 {
		add("%s.clamp must restrict at least one of concurrency, weight, max_output_tokens, models when a detector is enabled", path)
	}
	return errors.Join(errs...)
}

// baselineWindows is ceil(baseline / window).
func baselineWindows(baseline, window time.Duration) int64 {
	return int64((baseline + window - 1) / window)
}
