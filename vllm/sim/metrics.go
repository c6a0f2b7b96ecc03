package sim

import (
	"strconv"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Finish reasons, as vLLM's request_success_total labels them.
const (
	reasonStop   = "stop"
	reasonLength = "length"
	reasonAbort  = "abort"
	reasonError  = "error"
)

// vLLM's histogram buckets (vllm/v1/metrics/loggers.py).
var (
	ttftBuckets = []float64{0.001, 0.005, 0.01, 0.02, 0.04, 0.06, 0.08, 0.1, 0.25, 0.5,
		0.75, 1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0, 160.0, 640.0, 2560.0}
	itlBuckets = []float64{0.01, 0.025, 0.05, 0.075, 0.1, 0.15, 0.2, 0.3, 0.4, 0.5, 0.75,
		1.0, 2.5, 5.0, 7.5, 10.0, 20.0, 40.0, 80.0}
	e2eBuckets = []float64{0.3, 0.5, 0.8, 1.0, 1.5, 2.0, 2.5, 5.0, 10.0, 15.0, 20.0, 30.0,
		40.0, 50.0, 60.0, 120.0, 240.0, 480.0, 960.0, 1920.0, 7680.0}
)

// utilWindow is the window of sim_gpu_utilization_ratio.
const utilWindow = 10 * time.Second

// metrics holds one replica's Prometheus metrics, registered on its own
// registry.
type metrics struct {
	running, waiting, kvUsage prometheus.Gauge
	// waitingCapacity and waitingDeferred are
	// vllm:num_requests_waiting_by_reason{reason="capacity"|"deferred"}.
	waitingCapacity, waitingDeferred prometheus.Gauge
	// loraInfo is vllm:lora_requests_info (nil without LoRA adapters).
	loraInfo                  *prometheus.GaugeVec
	promptTokens, genTokens   prometheus.Counter
	preemptions               prometheus.Counter
	prefixQueries, prefixHits prometheus.Counter
	successVec                *prometheus.CounterVec
	successByReason           map[string]prometheus.Counter
	ttft, itl, e2e            prometheus.Observer
	aborted                   prometheus.Counter
	util                      *utilTracker
	power                     *powerModel
}

func newMetrics(cfg *Config, reg prometheus.Registerer, busyNanos func() int64) (*metrics, error) {
	labels := prometheus.Labels{"model_name": cfg.Model, "engine": "0"}
	reasonLabel := "finished_reason"
	kvName := "vllm:kv_cache_usage_perc"
	itlName, itlHelp := "vllm:inter_token_latency_seconds", "Histogram of inter-token latency in seconds."
	if cfg.MetricsCompat {
		labels = prometheus.Labels{"model_name": cfg.Model}
		reasonLabel = "finish_reason"
		kvName = "vllm:gpu_cache_usage_perc"
		itlName, itlHelp = "vllm:time_per_output_token_seconds", "Histogram of time per output token in seconds."
	}
	gauge := func(name, help string) prometheus.Gauge {
		return prometheus.NewGauge(prometheus.GaugeOpts{Name: name, Help: help, ConstLabels: labels})
	}
	counter := func(name, help string) prometheus.Counter {
		return prometheus.NewCounter(prometheus.CounterOpts{Name: name, Help: help, ConstLabels: labels})
	}
	hist := func(name, help string, b []float64) prometheus.Histogram {
		return prometheus.NewHistogram(prometheus.HistogramOpts{Name: name, Help: help, ConstLabels: labels, Buckets: b})
	}
	m := &metrics{
		running:       gauge("vllm:num_requests_running", "Number of requests in model execution batches."),
		waiting:       gauge("vllm:num_requests_waiting", "Number of requests waiting to be processed."),
		kvUsage:       gauge(kvName, "KV-cache usage. 1 means 100 percent usage."),
		promptTokens:  counter("vllm:prompt_tokens_total", "Number of prefill tokens processed."),
		genTokens:     counter("vllm:generation_tokens_total", "Number of generation tokens processed."),
		preemptions:   counter("vllm:num_preemptions_total", "Cumulative number of preemption from the engine."),
		prefixQueries: counter("vllm:prefix_cache_queries_total", "Prefix cache queries, in terms of number of queried tokens."),
		prefixHits:    counter("vllm:prefix_cache_hits_total", "Prefix cache hits, in terms of number of cached tokens."),
		successVec: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "vllm:request_success_total", Help: "Count of successfully processed requests.", ConstLabels: labels,
		}, []string{reasonLabel}),
		aborted: counter("sim_aborted_requests_total", "Requests the simulator aborted after their client went away."),
		util:    &utilTracker{clk: cfg.Clock, start: cfg.Clock.Now()},
	}
	ttft := hist("vllm:time_to_first_token_seconds", "Histogram of time to first token in seconds.", ttftBuckets)
	itl := hist(itlName, itlHelp, itlBuckets)
	e2e := hist("vllm:e2e_request_latency_seconds", "Histogram of e2e request latency in seconds.", e2eBuckets)
	m.ttft, m.itl, m.e2e = ttft, itl, e2e
	m.successByReason = map[string]prometheus.Counter{}
	for _, r := range []string{reasonStop, reasonLength, reasonAbort, reasonError} {
		m.successByReason[r] = m.successVec.WithLabelValues(r)
	}
	info := prometheus.NewGauge(prometheus.GaugeOpts{
		Name: "vllm:cache_config_info", Help: "Information of the LLMEngine CacheConfig.",
		ConstLabels: mergeLabels(labels, prometheus.Labels{
			"block_size":     strconv.Itoa(cfg.BlockSize),
			"num_gpu_blocks": strconv.Itoa(cfg.KVTokens / cfg.BlockSize),
		}),
	})
	info.Set(1)
	util := prometheus.NewGaugeFunc(prometheus.GaugeOpts{
		Name: "sim_gpu_utilization_ratio", Help: "Fraction of the last 10s the simulated GPU was busy.", ConstLabels: labels,
	}, m.util.ratio)
	busy := prometheus.NewCounterFunc(prometheus.CounterOpts{
		Name: "sim_gpu_busy_seconds_total", Help: "Simulated GPU time with a non-empty batch (sum of step durations).", ConstLabels: labels,
	}, func() float64 { return time.Duration(busyNanos()).Seconds() })
	m.power = &powerModel{clk: cfg.Clock, start: m.util.start, busy: busyNanos, util: m.util.ratio}
	// vllm:num_requests_waiting_by_reason splits waiting into "capacity"
	// and "deferred" (LoRA budget, KV transfer, blocked), summing to
	// vllm:num_requests_waiting (vllm/v1/metrics/loggers.py,
	// WAITING_REASON_CAPACITY / _DEFERRED); older releases lack it.
	byReason := prometheus.NewGaugeVec(prometheus.GaugeOpts{
		Name: "vllm:num_requests_waiting_by_reason", Help: "Number of waiting requests by reason.", ConstLabels: labels,
	}, []string{"reason"})
	m.waitingCapacity, m.waitingDeferred = byReason.WithLabelValues("capacity"), byReason.WithLabelValues("deferred")
	cs := []prometheus.Collector{
		m.running, m.waiting, m.promptTokens, m.genTokens, m.preemptions,
		m.prefixQueries, m.prefixHits, m.successVec, ttft, itl, e2e, m.aborted, busy, util,
	}
	if !cfg.MetricsCompat {
		cs = append(cs, byReason)
	}
	if !cfg.NoKVMetrics {
		cs = append(cs, m.kvUsage, info)
	}
	if len(cfg.LoRAModules) > 0 {
		// vllm:lora_requests_info has no model_name or engine label; each
		// scheduler update sets the series of the current adapter lists to
		// the time, and old lists' series stay with older times
		// (loggers.py: gauge_lora_info ... set_to_current_time()).
		m.loraInfo = prometheus.NewGaugeVec(prometheus.GaugeOpts{
			Name: "vllm:lora_requests_info", Help: "Running stats on lora requests.",
		}, []string{"max_lora", "waiting_lora_adapters", "running_lora_adapters"})
		cs = append(cs, m.loraInfo)
	}
	for _, c := range append(cs, m.power.collectors(labels)...) {
		if err := reg.Register(c); err != nil {
			return nil, err
		}
	}
	return m, nil
}

func mergeLabels(a, b prometheus.Labels) prometheus.Labels {
	out := prometheus.Labels{}
	for k, v := range a {
		out[k] = v
	}
	for k, v := range b {
		out[k] = v
	}
	return out
}

func (m *metrics) success(reason string) { m.successByReason[reason].Inc() }

// utilTracker keeps busy time per second of (simulated) time for the
// utilization gauge. Safe for concurrent use.
type utilTracker struct {
	clk   Clock
	start time.Time

	mu      sync.Mutex // guards buckets
	buckets [utilBuckets]utilBucket
}

const utilBuckets = 16

type utilBucket struct {
	sec  int64 // unix second this bucket holds
	busy time.Duration
}

// add records dur of busy time for a step that ended at end.
func (u *utilTracker) add(end time.Time, dur time.Duration) {
	sec := end.Unix()
	u.mu.Lock()
	b := &u.buckets[uint64(sec)%utilBuckets]
	if b.sec != sec {
		b.sec, b.busy = sec, 0
	}
	b.busy += dur
	u.mu.Unlock()
}

// ratio is the busy fraction over the last utilWindow (or since start).
func (u *utilTracker) ratio() float64 {
	now := u.clk.Now()
	window := min(utilWindow, now.Sub(u.start))
	if window <= 0 {
		return 0
	}
	from := now.Add(-window).Unix()
	var busy time.Duration
	u.mu.Lock()
	for _, b := range u.buckets {
		if b.sec >= from && b.sec <= now.Unix() {
			busy += b.busy
		}
	}
	u.mu.Unlock()
	return min(1, busy.Seconds()/window.Seconds())
}
