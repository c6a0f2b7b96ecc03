package gpu

import (
	"errors"
	"fmt"
	"slices"
	"time"
)

// Mode selects where GPU telemetry comes from (config `gpu.telemetry`).
type Mode string

// Telemetry modes.
const (
	// ModeAuto uses NVML when the driver library loads, else vLLM metrics.
	ModeAuto Mode = "auto"
	// ModeNVML requires NVML; [OpenSource] fails with [ErrUnavailable] without it.
	ModeNVML Mode = "nvml"
	// ModeVLLM derives utilisation from scraped replica metrics
	// (sim_gpu_utilization_ratio on the simulator, else busy while running).
	ModeVLLM Mode = "vllm"
	// ModeOff reads no GPU telemetry; utilisation counts as 1 while a replica
	// has running requests (the simulator's ratio if scraped), and health
	// comes from scrapes only.
	ModeOff Mode = "off"
)

// DefaultFatalXIDs are the XID codes that drain a replica unless
// [Config.FatalXIDs] says otherwise: 48 double-bit ECC, 62 internal
// micro-controller halt, 64 row-remapping failure, 74 NVLink error, 79 fallen
// off the bus, 92 high single-bit ECC rate, 94/95 contained/uncontained ECC,
// 119/120 GSP errors. Application XIDs (13, 31, 43, 45) are not on it.
var DefaultFatalXIDs = []uint64{48, 62, 64, 74, 79, 92, 94, 95, 119, 120}

// Replica maps one upstream replica to its GPUs and sizing overrides.
type Replica struct {
	// Name is the replica's name in upstream.replicas. Required, unique.
	Name string
	// GPUs lists the replica's GPUs by NVML UUID ("GPU-…") or index ("0").
	// Tensor-parallel replicas list several. Optional; empty means no NVML
	// data for this replica (utilisation then comes from vLLM metrics).
	GPUs []string
	// GPUCount is g in the GPU-ms clock when GPUs is empty. Optional;
	// default len(GPUs), else 1.
	GPUCount int
	// CapacityTokens overrides the KV-derived base capacity. Optional;
	// 0 means num_gpu_blocks × block_size from vllm:cache_config_info.
	CapacityTokens int64
	// GPUMsPerInputToken seeds this replica's estimator coefficient a.
	// Optional; 0 means [Config.GPUMsPerInputToken].
	GPUMsPerInputToken float64
	// GPUMsPerOutputToken seeds b. Optional; 0 means [Config.GPUMsPerOutputToken].
	GPUMsPerOutputToken float64
}

// gpuCount returns g for the replica.
func (r Replica) gpuCount() int {
	switch {
	case r.GPUCount > 0:
		return r.GPUCount
	case len(r.GPUs) > 0:
		return len(r.GPUs)
	}
	return 1
}

// Config configures GPU telemetry, health, sizing and GPU-ms attribution.
// Zero values take the defaults named on each field (see [Config.WithDefaults]),
// the only place they are defined: scheduler/config decodes the `gpu:`
// section and fills its defaults from here.
type Config struct {
	// Telemetry selects the source. Optional; default auto.
	Telemetry Mode
	// PollInterval is how often utilisation is sampled and health evaluated.
	// Optional; default 100ms.
	PollInterval time.Duration
	// InventoryEvery: the slow NVML fields (name, memory total, ECC counts,
	// row remapping) are read every InventoryEvery polls. Optional; default 10.
	InventoryEvery int
	// StaleAfter: a GPU sample or replica scrape older than this is stale and
	// degrades the replica. Optional; default 3s.
	StaleAfter time.Duration
	// EnterSamples is how many consecutive evaluations must see a degraded
	// condition before the state worsens. Draining and down conditions act
	// at once. Optional; default 3.
	EnterSamples int
	// RecoverSamples is how many consecutive evaluations must see a better
	// condition before the state improves. Optional; default 20 (2 s at 100ms).
	RecoverSamples int
	// DownAfter: this many failed scrapes or /health checks in a row mark
	// the replica down. Optional; default 3.
	DownAfter int
	// FatalXIDs drain the replica when seen on one of its GPUs. Optional;
	// default [DefaultFatalXIDs].
	FatalXIDs []uint64
	// FatalHold keeps a replica draining after a fatal XID or a new
	// uncorrected ECC error. Optional; default 10m.
	FatalHold time.Duration
	// MemoryPressureRatio: a GPU whose used/total memory exceeds this is
	// taken to be shared with another process and degrades its replica.
	// Optional; default 0.98; 1 disables.
	MemoryPressureRatio float64
	// DegradedFactor multiplies a degraded replica's capacity. Optional;
	// default 0.5; must be in (0, 1].
	DegradedFactor float64
	// TargetOccupancy multiplies the base capacity. Optional; default 1.
	TargetOccupancy float64
	// MaxOvercommit bounds the AIMD overcommit factor. Optional; default 2;
	// 1 disables overcommit.
	MaxOvercommit float64
	// OvercommitStep is the additive increase per healthy scrape. Optional;
	// default 0.05.
	OvercommitStep float64
	// KVHighWater: overcommit grows only while vllm:kv_cache_usage_perc is
	// below it. Optional; default 0.9.
	KVHighWater float64
	// WaitingPersist: overcommit halves after this many scrapes in a row with
	// vllm:num_requests_waiting > 0. Optional; default 2.
	WaitingPersist int
	// GPUMsPerInputToken seeds the estimator coefficient a (GPU-ms per input
	// token). Optional; default 0.05.
	GPUMsPerInputToken float64
	// GPUMsPerOutputToken seeds b (GPU-ms per output token). Optional;
	// default 10.
	GPUMsPerOutputToken float64
	// GPUMsMargin multiplies the fleet's largest coefficients for admission
	// holds. Optional; default 1.2; must be ≥ 1.
	GPUMsMargin float64
	// Forgetting is the estimator's RLS forgetting factor λ. Optional;
	// default 0.99; must be in (0, 1].
	Forgetting float64
	// Replicas maps replicas to GPUs. Every replica the scheduler observes
	// must be listed.
	Replicas []Replica
}

// WithDefaults returns c with every zero field set to its default.
func (c Config) WithDefaults() Config {
	def := func(p *float64, v float64) {
		if *p == 0 {
			*p = v
		}
	}
	defI := func(p *int, v int) {
		if *p == 0 {
			*p = v
		}
	}
	defD := func(p *time.Duration, v time.Duration) {
		if *p == 0 {
			*p = v
		}
	}
	if c.Telemetry == "" {
		c.Telemetry = ModeAuto
	}
	defD(&c.PollInterval, 100*time.Millisecond)
	defI(&c.InventoryEvery, 10)
	defD(&c.StaleAfter, 3*time.Second)
	defI(&c.EnterSamples, 3)
	defI(&c.RecoverSamples, 20)
	defI(&c.DownAfter, 3)
	if c.FatalXIDs == nil {
		c.FatalXIDs = slices.Clone(DefaultFatalXIDs)
	}
	defD(&c.FatalHold, 10*time.Minute)
	def(&c.MemoryPressureRatio, 0.98)
	def(&c.DegradedFactor, 0.5)
	def(&c.TargetOccupancy, 1)
	def(&c.MaxOvercommit, 2)
	def(&c.OvercommitStep, 0.05)
	def(&c.KVHighWater, 0.9)
	defI(&c.WaitingPersist, 2)
	def(&c.GPUMsPerInputToken, 0.05)
	def(&c.GPUMsPerOutputToken, 10)
	def(&c.GPUMsMargin, 1.2)
	def(&c.Forgetting, 0.99)
	c.Replicas = slices.Clone(c.Replicas)
	return c
}

// Validate checks a defaulted config and returns every problem, each naming
// its field path under `gpu.`.
func (c Config) Validate() error {
	var errs []error
	bad := func(format string, a ...any) { errs = append(errs, fmt.Errorf("gpu."+format, a...)) }
	switch c.Telemetry {
	case ModeAuto, ModeNVML, ModeVLLM, ModeOff:
	default:
		bad("telemetry must be auto, nvml, vllm or off, got %q", c.Telemetry)
	}
	if c.PollInterval <= 0 {
		bad("poll_interval must be > 0")
	}
	if c.InventoryEvery < 1 {
		bad("inventory_every must be ≥ 1")
	}
	if c.StaleAfter <= 0 {
		bad("stale_after must be > 0")
	}
	if c.EnterSamples < 1 || c.RecoverSamples < 1 || c.DownAfter < 1 || c.WaitingPersist < 1 {
		bad("enter_samples, recover_samples, down_after and waiting_persist must be ≥ 1")
	}
	if c.FatalHold <= 0 {
		bad("fatal_hold must be > 0")
	}
	if !(c.MemoryPressureRatio > 0 && c.MemoryPressureRatio <= 1) {
		bad("memory_pressure_ratio must be in (0, 1]")
	}
	if !(c.DegradedFactor > 0 && c.DegradedFactor <= 1) {
		bad("degraded_factor must be in (0, 1]")
	}
	if !(c.TargetOccupancy > 0 && c.TargetOccupancy <= 1) {
		bad("target_occupancy must be in (0, 1]")
	}
	if !(c.MaxOvercommit >= 1) {
		bad("max_overcommit must be ≥ 1")
	}
	if !(c.OvercommitStep > 0) {
		bad("overcommit_step must be > 0")
	}
	if !(c.KVHighWater > 0 && c.KVHighWater <= 1) {
		bad("kv_high_water must be in (0, 1]")
	}
	if c.GPUMsPerInputToken < 0 || c.GPUMsPerOutputToken < 0 {
		bad("gpu_ms_per_input_token and gpu_ms_per_output_token must be ≥ 0")
	}
	if !(c.GPUMsMargin >= 1) {
		bad("gpu_ms_margin must be ≥ 1")
	}
	if !(c.Forgetting > 0 && c.Forgetting <= 1) {
		bad("forgetting must be in (0, 1]")
	}
	seen := make(map[string]bool, len(c.Replicas))
	gpuOwner := make(map[string]string)
	for i, r := range c.Replicas {
		if r.Name == "" {
			bad("replicas[%d].name is required", i)
		} else if seen[r.Name] {
			bad("replicas[%d].name %q is a duplicate", i, r.Name)
		}
		seen[r.Name] = true
		if r.GPUCount < 0 || r.CapacityTokens < 0 || r.GPUMsPerInputToken < 0 || r.GPUMsPerOutputToken < 0 {
			bad("replicas[%d] (%s): gpu_count, capacity_tokens and gpu_ms coefficients must be ≥ 0", i, r.Name)
		}
		for j, g := range r.GPUs {
			if g == "" {
				bad("replicas[%d].gpus[%d] is empty", i, j)
				continue
			}
			if o, ok := gpuOwner[g]; ok {
				bad("replicas[%d].gpus[%d] %q is already used by replica %q", i, j, g, o)
			}
			gpuOwner[g] = r.Name
		}
	}
	return errors.Join(errs...)
}

// fatalXID reports whether x is on the configured fatal list.
func (c *Config) fatalXID(x uint64) bool { return slices.Contains(c.FatalXIDs, x) }
