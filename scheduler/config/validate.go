package config

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// validator collects problems; each names its field path.
type validator struct{ errs []error }

func (v *validator) add(format string, a ...any) { v.errs = append(v.errs, fmt.Errorf(format, a...)) }

func (v *validator) err() error { return errors.Join(v.errs...) }

func (v *validator) nonEmpty(path, s string) {
	if strings.TrimSpace(s) == "" {
		v.add("%s must not be empty", path)
	}
}

func (v *validator) oneOf(path, s string, allowed ...string) {
	if !slices.Contains(allowed, s) {
		v.add("%s must be one of %s (got %q)", path, strings.Join(allowed, ", "), s)
	}
}

func (v *validator) nonNeg(path string, n int64) {
	if n < 0 {
		v.add("%s must be >= 0", path)
	}
}

func (v *validator) positive(path string, n int64) {
	if n <= 0 {
		v.add("%s must be > 0", path)
	}
}

func (v *validator) nonNegF(path string, f float64) {
	if f < 0 || f != f {
		v.add("%s must be >= 0", path)
	}
}

func (v *validator) rangeF(path string, f, lo, hi float64) {
	if !(f >= lo && f <= hi) {
		v.add("%s must be in [%g, %g]", path, lo, hi)
	}
}

func (v *validator) positiveDur(path string, d time.Duration) {
	if d <= 0 {
		v.add("%s must be > 0", path)
	}
}

func (v *validator) url(path, s string) {
	u, err := url.Parse(s)
	if s == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.add("%s must be an http(s) URL (got %q)", path, s)
	}
}

// modelList checks a list of model names: non-empty, no duplicates.
func (v *validator) modelList(path string, ms []string) {
	seen := map[string]int{}
	for i, m := range ms {
		if m == "" {
			v.add("%s[%d] must not be empty", path, i)
			continue
		}
		if j, dup := seen[m]; dup {
			v.add("%s[%d] %q duplicates %s[%d]", path, i, m, path, j)
		}
		seen[m] = i
	}
}

// Validate checks a defaulted File and returns every problem, joined, each
// naming its field path.
func (f *File) Validate() error {
	var v validator
	v.nonEmpty("listen", f.Listen)
	v.nonEmpty("admin_listen", f.AdminListen)
	f.checkPaths(&v)
	v.oneOf("ledger.backend", f.Ledger.Backend, "memory", "redis")
	v.oneOf("ledger.fsync", f.Ledger.Fsync, "every_op", "group")
	v.positiveDur("ledger.fsync_interval", f.Ledger.FsyncInterval)
	v.positiveDur("ledger.lease_ttl", f.Ledger.LeaseTTL)
	if f.Ledger.LeaseTTL > 0 && f.Ledger.LeaseTTL < 3*time.Second {
		v.add("ledger.lease_ttl must be >= 3s (heartbeats run every lease_ttl/3, fencing needs 2s)")
	}
	// The ledgers bound leases at 2·lease_ttl and keep tombstones at least
	// twice that (a late Settle of an expired lease still finds its record).
	if r := f.Ledger.TombstoneRetention; r != 0 && r < 4*f.Ledger.LeaseTTL {
		v.add("ledger.tombstone_retention %s must be >= 4·ledger.lease_ttl (%s)", r, 4*f.Ledger.LeaseTTL)
	}
	if f.Ledger.Backend == "redis" {
		for i, a := range f.Ledger.Redis.Addrs {
			v.nonEmpty(fmt.Sprintf("ledger.redis.addrs[%d]", i), a)
		}
		v.positiveDur("ledger.redis.store_timeout", f.Ledger.Redis.StoreTimeout)
		if strings.ContainsAny(f.Ledger.Redis.KeyPrefix, "{}") {
			v.add("ledger.redis.key_prefix must not contain { or }")
		}
	}
	if len(f.Upstream.Replicas) == 0 && !f.Upstream.Discovery.Enabled() {
		v.add("upstream.replicas must list at least one replica (or upstream.discovery a source)")
	}
	names := map[string]int{}
	for i, r := range f.Upstream.Replicas {
		p := fmt.Sprintf("upstream.replicas[%d]", i)
		if j, dup := names[r.Name]; dup {
			v.add("%s.name %q duplicates upstream.replicas[%d]", p, r.Name, j)
		}
		names[r.Name] = i
		v.replica(p, r)
	}
	v.discovery(&f.Upstream.Discovery)
	v.oneOf("upstream.token_count", f.Upstream.TokenCount, "bytes", "tokenize")
	v.oneOf("upstream.routing", f.Upstream.Routing, "affinity", "least_load")
	v.positiveDur("upstream.scrape_interval", f.Upstream.ScrapeInterval)
	if f.Upstream.LearnScrapeInterval < 10*time.Millisecond {
		v.add("upstream.learn_scrape_interval must be at least 10ms (upstream.scrape_interval or more turns it off)")
	}
	if r := f.Upstream.LearnRamp; r != nil && (*r < 0 || *r > 16) {
		v.add("upstream.learn_ramp must be between 0 and 16 (0 turns the ramp off)")
	}
	if f.Upstream.DownAfter < 1 {
		v.add("upstream.down_after must be >= 1")
	}
	if f.Upstream.StreamInterval < 1 {
		v.add("upstream.stream_interval must be >= 1")
	}
	if n := f.Upstream.NonStreamedInterval; n != nil && (*n < 0 || *n > 1<<20) {
		v.add("upstream.non_streamed_interval must be between 0 and 1048576")
	}
	v.oneOf("gpu.telemetry", f.GPU.Telemetry, "auto", "nvml", "vllm", "off")
	v.positiveDur("gpu.interval", f.GPU.Interval)
	v.rangeF("gpu.degraded_factor", f.GPU.DegradedFactor, 0, 1)
	if f.GPU.MaxOvercommit < 1 {
		v.add("gpu.max_overcommit must be >= 1")
	}
	v.nonNegF("gpu.ms_per_input_token", f.GPU.MsPerInputToken)
	v.nonNegF("gpu.ms_per_output_token", f.GPU.MsPerOutputToken)
	if f.GPU.Margin < 1 {
		v.add("gpu.margin must be >= 1")
	}
	s := f.Server
	v.positive("server.max_body_bytes", s.MaxBodyBytes)
	v.positiveDur("server.max_wait", s.MaxWait)
	v.positive("server.max_depth", int64(s.MaxDepth))
	v.positive("server.max_bytes", s.MaxBytes)
	v.positiveDur("server.drain_timeout", s.DrainTimeout)
	v.rangeF("server.headroom", s.Headroom, 0, 0.9)
	v.positiveDur("server.reserve_hold", s.ReserveHold)
	v.positiveDur("server.standing_queue", s.StandingQueue)
	v.rangeF("server.reserve_margin", s.Margin(), 0, 8)
	v.rangeF("server.reserve_cap", s.Cap(), 0, 1)
	v.oneOf("server.cost.unit", s.Cost.Unit, "tokens", "gpu_ms")
	v.nonNeg("server.cost.w_in", s.Cost.WIn)
	v.positive("server.cost.w_out", s.Cost.WOut)
	v.nonNeg("server.template_allowance", s.TemplateAllowance)
	v.positive("server.min_output_tokens", s.MinOutputTokens)
	v.positive("server.expected_output_tokens", s.ExpectedOutputTokens)
	s.HoldPrediction.validate(&v, f.Upstream.StreamInterval, derefInt(f.Upstream.NonStreamedInterval))
	v.nonNeg("server.media_allowance", s.MediaAllowance)
	v.positiveDur("server.stream_write_timeout", s.StreamWriteTimeout)
	v.oneOf("server.fair_share", s.FairShare, "fleet", "local")
	models := map[string]int{}
	for i, p := range f.Prices {
		path := fmt.Sprintf("prices[%d]", i)
		v.nonEmpty(path+".model", p.Model)
		if j, dup := models[p.Model]; dup && p.Model != "" {
			v.add("%s.model %q duplicates prices[%d]", path, p.Model, j)
		}
		models[p.Model] = i
		v.nonNeg(path+".input_per_mtok", p.InputPerMTok)
		v.nonNeg(path+".output_per_mtok", p.OutputPerMTok)
		v.nonNeg(path+".cached_input_per_mtok", p.CachedInputPerMTok)
	}
	v.nonNeg("audit.max_bytes", f.Audit.MaxBytes)
	if f.Tracing.Endpoint != "" {
		v.url("tracing.endpoint", f.Tracing.Endpoint)
		if f.Tracing.SampleRatio <= 0 || f.Tracing.SampleRatio > 1 || f.Tracing.SampleRatio != f.Tracing.SampleRatio {
			v.add("tracing.sample_ratio must be in (0, 1] (got %g)", f.Tracing.SampleRatio)
		}
		v.nonEmpty("tracing.service_name", f.Tracing.ServiceName)
	}
	if f.Admin.KeysMaxStaleness < time.Second {
		v.add("admin.keys_max_staleness must be at least 1s (got %s)", f.Admin.KeysMaxStaleness)
	}
	if f.Admin.StatusToken != "" && !validKeyHash(f.Admin.StatusToken) {
		v.add("admin.status_token must be \"sha256:<64 hex digits>\" (run 'sluice key hash'); the raw token is never stored")
	}
	validateBudgets(&v, "global.budgets", f.Global.Budgets)
	if len(f.Tenants) == 0 {
		v.add("tenants must list at least one tenant")
	}
	tenantIdx := map[string]int{}
	keyIdx := map[string]string{}
	for i, t := range f.Tenants {
		p := fmt.Sprintf("tenants[%d]", i)
		v.oneOf(p+".cache_isolation", t.CacheIsolation, "", "salt")
		switch {
		case t.Name == "":
			v.add("%s.name must not be empty", p)
		case t.Name == "_global" || strings.ContainsAny(t.Name, " \t\n\"{}"):
			v.add("%s.name %q is reserved or has spaces, quotes or braces", p, t.Name)
		}
		if j, dup := tenantIdx[t.Name]; dup && t.Name != "" {
			v.add("%s.name %q duplicates tenants[%d]", p, t.Name, j)
		}
		tenantIdx[t.Name] = i
		if len(t.APIKeys) == 0 {
			v.add("%s.api_keys must list at least one key hash", p)
		}
		keyNames := map[string]string{}
		for j, k := range t.APIKeys {
			validateKey(&v, fmt.Sprintf("%s.api_keys[%d]", p, j), k, keyIdx, keyNames)
		}
		if t.Weight < 1 {
			v.add("%s.weight must be >= 1", p)
		}
		if t.Priority < 0 || t.Priority > 15 {
			v.add("%s.priority must be in 0..15", p)
		}
		if t.Concurrency < 0 {
			v.add("%s.concurrency must be >= 0 (0: no cap)", p)
		}
		v.nonNeg(p+".inflight_tokens", t.InflightTokens)
		v.positive(p+".max_input_tokens", t.MaxInputTokens)
		v.nonNeg(p+".max_output_tokens", t.MaxOutputTokens)
		v.positive(p+".queue.max_depth", int64(t.Queue.MaxDepth))
		v.positive(p+".queue.max_bytes", t.Queue.MaxBytes)
		v.positiveDur(p+".queue.max_wait", t.Queue.MaxWait)
		v.oneOf(p+".queue.order", t.Queue.Order, "fifo", "edf")
		for _, d := range []struct {
			key string
			d   time.Duration
		}{{"lifo_after", t.Queue.LIFOAfter}, {"shed_after", t.Queue.ShedAfter}} {
			switch {
			case d.d < 0 && d.key == "lifo_after":
				// Negative keeps arrival order.
			case d.d < 0:
				v.add("%s.queue.%s must be >= 0 (0: off)", p, d.key)
			case d.d > 0 && t.Queue.Order == "edf":
				v.add("%s.queue.%s applies to order fifo only (edf keeps deadline order)", p, d.key)
			}
		}
		validateBudgets(&v, p+".budgets", t.Budgets)
		w := t.Workflow
		wp := p + ".workflow_defaults"
		v.nonNeg(wp+".max_calls", w.MaxCalls)
		v.nonNeg(wp+".max_input_tokens", w.MaxInputTokens)
		v.nonNeg(wp+".max_output_tokens", w.MaxOutputTokens)
		if w.MaxDuration < 0 {
			v.add("%s.max_duration must be >= 0", wp)
		}
		v.nonNeg(wp+".max_usd_micros", w.MaxUSDMicros)
		v.nonNeg(wp+".max_retries", w.MaxRetries)
		v.nonNeg(wp+".max_tool_calls", w.MaxToolCalls)
		if t.Abuse.Enabled() {
			ab := t.Abuse
			ab.ApplyDefaults()
			if err := ab.Validate(p + ".abuse"); err != nil {
				v.errs = append(v.errs, err)
			}
		}
		v.nonNeg(p+".outage_allowance.requests", t.OutageAllowance.Requests)
		v.nonNeg(p+".outage_allowance.tokens", t.OutageAllowance.Tokens)
		v.modelList(p+".models", t.Models)
	}
	return v.err()
}

func validateBudgets(v *validator, path string, bs []Budget) {
	seen := map[string]int{}
	for j, b := range bs {
		p := fmt.Sprintf("%s[%d]", path, j)
		v.oneOf(p+".dimension", b.Dimension, Dimensions...)
		switch {
		case b.Limit < 0:
			v.add("%s.limit must be >= 0", p)
		case b.Limit > maxAmount:
			v.add("%s.limit must be <= 2^50", p)
		}
		switch {
		case b.Window < time.Second:
			v.add("%s.window must be >= 1s", p)
		case b.Window > 31*24*time.Hour:
			v.add("%s.window must be <= 744h (31 days)", p)
		case b.Window%time.Second != 0:
			v.add("%s.window must be whole seconds", p)
		}
		v.oneOf(p+".mode", b.Mode, "block", "warn")
		v.rangeF(p+".warn_ratio", b.WarnRatio, 0, 1)
		id := b.Dimension + "/" + b.Window.String()
		if k, dup := seen[id]; dup {
			v.add("%s duplicates %s[%d] (same dimension and window)", p, path, k)
		}
		seen[id] = j
	}
}
