package gpu

import (
	"context"
	"fmt"
	"strings"
	"time"
)

// Source produces GPU telemetry samples. Implementations: [NVML], [VLLM]
// and [Off]. Poll is called by one owner (the [Monitor]'s Run loop, or the
// `sluice gpus` command); implementations need not be safe for concurrent
// Poll calls unless they say so.
type Source interface {
	Poll(ctx context.Context) (Sample, error)
}

// Sample is one poll of every GPU a source sees.
type Sample struct {
	// Source names the implementation: "nvml", "vllm" or "off".
	Source string
	// At is when the sample was taken.
	At time.Time
	// GPUs holds one entry per device, in index order for NVML.
	GPUs []GPUStat
}

// Clock-event (throttle) reason bits, as in NVML's nvmlClocksEventReason*.
const (
	ReasonGPUIdle        uint64 = 0x1
	ReasonAppClocks      uint64 = 0x2
	ReasonSWPowerCap     uint64 = 0x4
	ReasonHWSlowdown     uint64 = 0x8
	ReasonSyncBoost      uint64 = 0x10
	ReasonSWThermal      uint64 = 0x20
	ReasonHWThermal      uint64 = 0x40
	ReasonHWPowerBrake   uint64 = 0x80
	ReasonDisplayClocks  uint64 = 0x100
	ReasonBoardLimit     uint64 = 0x200
	ReasonReliability    uint64 = 0x400
	degradingReasonsMask        = ReasonHWSlowdown | ReasonSWThermal | ReasonHWThermal | ReasonHWPowerBrake
)

var reasonNames = []struct {
	bit  uint64
	name string
}{
	{ReasonSWPowerCap, "sw_power_cap"},
	{ReasonHWSlowdown, "hw_slowdown"},
	{ReasonSWThermal, "sw_thermal"},
	{ReasonHWThermal, "hw_thermal"},
	{ReasonHWPowerBrake, "hw_power_brake"},
	{ReasonSyncBoost, "sync_boost"},
	{ReasonBoardLimit, "board_limit"},
	{ReasonReliability, "reliability"},
	{ReasonAppClocks, "app_clocks"},
	{ReasonDisplayClocks, "display_clocks"},
	{ReasonGPUIdle, "idle"},
}

// ReasonNames lists the names of the set clock-event bits, most serious
// first; unknown bits are ignored.
func ReasonNames(mask uint64) []string {
	var out []string
	for _, r := range reasonNames {
		if mask&r.bit != 0 {
			out = append(out, r.name)
		}
	}
	return out
}

// GPUStat is one GPU's telemetry. Fields a device does not support hold the
// documented "unknown" value.
type GPUStat struct {
	// Index is the NVML index; -1 for vLLM-derived entries.
	Index int `json:"index"`
	// UUID is the NVML UUID, or "vllm:<replica>/<i>" for vLLM-derived entries.
	UUID string `json:"uuid"`
	// Name is the product name ("NVIDIA H100 80GB HBM3").
	Name string `json:"name"`
	// Replica is set by sources that know the owner (vLLM-derived entries).
	Replica string `json:"replica,omitempty"`
	// MemoryTotalBytes and MemoryUsedBytes: 0 when unknown.
	MemoryTotalBytes uint64 `json:"memory_total_bytes"`
	MemoryUsedBytes  uint64 `json:"memory_used_bytes"`
	// Utilization is the busy fraction (0–1); -1 when unknown.
	Utilization float64 `json:"utilization"`
	// TemperatureC is the core temperature in °C; -1 when unknown.
	TemperatureC int `json:"temperature_c"`
	// PowerMilliwatts is the board power draw; -1 when unknown.
	PowerMilliwatts int64 `json:"power_mw"`
	// BusyNs is the GPU's busy time since the source opened, in ns: from
	// NVML's utilisation samples (each sample's busy share × its period),
	// else utilisation × poll interval; -1 when unknown.
	BusyNs int64 `json:"busy_ns"`
	// EnergyMJ is NVML's total-energy counter (millijoules since the driver
	// loaded), else ∫ power dt since the source opened; -1 when unknown.
	EnergyMJ int64 `json:"energy_mj"`
	// ClockEventReasons is the NVML clock-event (throttle) bit mask.
	ClockEventReasons uint64 `json:"clock_event_reasons"`
	// ECCSupported reports whether the ECC counters below are meaningful.
	ECCSupported bool `json:"ecc_supported"`
	// ECCCorrected and ECCUncorrected are volatile (since boot) totals.
	ECCCorrected   uint64 `json:"ecc_corrected"`
	ECCUncorrected uint64 `json:"ecc_uncorrected"`
	// RemapPending: a row remap (or page retirement) awaits a GPU reset.
	RemapPending bool `json:"remap_pending"`
	// RemapFailed: row remapping has failed; the GPU needs service.
	RemapFailed bool `json:"remap_failed"`
	// XIDs are the critical XID events seen since the previous poll.
	XIDs []uint64 `json:"xids,omitempty"`
	// Lost is set when NVML reports the GPU lost or unreachable.
	Lost bool `json:"lost,omitempty"`
}

// AssessGPU classifies one GPU from its current sample and, where known, the
// previous one (nil for a first sample; counter rises need both). It returns
// the condition the GPU alone would put its replica in and a reason ("" when
// healthy). It does not latch: [Monitor] keeps fatal conditions for
// [Config.FatalHold].
func (c *Config) AssessGPU(cur GPUStat, prev *GPUStat) (State, string) {
	switch {
	case cur.Lost:
		return StateDraining, fmt.Sprintf("GPU %s lost", cur.UUID)
	case cur.RemapFailed:
		return StateDraining, fmt.Sprintf("GPU %s row remapping failed", cur.UUID)
	case cur.RemapPending:
		return StateDraining, fmt.Sprintf("GPU %s row remap pending a reset", cur.UUID)
	}
	for _, x := range cur.XIDs {
		if c.fatalXID(x) {
			return StateDraining, fmt.Sprintf("GPU %s XID %d", cur.UUID, x)
		}
	}
	if prev != nil && cur.ECCSupported && prev.ECCSupported && cur.ECCUncorrected > prev.ECCUncorrected {
		return StateDraining, fmt.Sprintf("GPU %s uncorrected ECC errors %d→%d", cur.UUID, prev.ECCUncorrected, cur.ECCUncorrected)
	}
	if r := cur.ClockEventReasons & degradingReasonsMask; r != 0 {
		return StateDegraded, fmt.Sprintf("GPU %s throttled (%s)", cur.UUID, strings.Join(ReasonNames(r), ","))
	}
	if prev != nil && cur.ECCSupported && prev.ECCSupported && cur.ECCCorrected > prev.ECCCorrected {
		return StateDegraded, fmt.Sprintf("GPU %s corrected ECC errors rising %d→%d", cur.UUID, prev.ECCCorrected, cur.ECCCorrected)
	}
	if cur.MemoryTotalBytes > 0 && c.MemoryPressureRatio < 1 &&
		float64(cur.MemoryUsedBytes) > c.MemoryPressureRatio*float64(cur.MemoryTotalBytes) {
		return StateDegraded, fmt.Sprintf("GPU %s memory %d of %d MiB used (shared with another process?)",
			cur.UUID, cur.MemoryUsedBytes>>20, cur.MemoryTotalBytes>>20)
	}
	return StateHealthy, ""
}

// Off is the source for `gpu.telemetry: off`: it never sees a GPU.
// Safe for concurrent use.
type Off struct{ now func() time.Time }

// NewOff returns an [Off] source; a nil now uses time.Now.
func NewOff(now func() time.Time) *Off {
	if now == nil {
		now = time.Now
	}
	return &Off{now: now}
}

// Poll returns an empty sample.
func (o *Off) Poll(context.Context) (Sample, error) {
	return Sample{Source: string(ModeOff), At: o.now()}, nil
}
