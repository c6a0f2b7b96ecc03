package gpu

import (
	"context"
	"fmt"
	"maps"
	"slices"
	"sync"
	"time"
)

// VLLM is the source for `gpu.telemetry: vllm` (and `auto` without NVML): it
// turns the replica metrics the scheduler scrapes into one pseudo-GPU entry
// per replica GPU, with utilisation from sim_gpu_utilization_ratio when the
// replica is the simulator, else unknown (-1: the GPU clock then counts the
// replica busy while requests run). It has no memory, thermal or error data. Safe for concurrent
// use: [Monitor.ObserveReplica] feeds it while Run polls it.
type VLLM struct {
	now func() time.Time

	mu   sync.Mutex         // guards reps
	reps map[string]vllmRep // replica name → latest observation
}

type vllmRep struct {
	gpus int
	util float64
}

// NewVLLM returns an empty [VLLM] source; a nil now uses time.Now.
func NewVLLM(now func() time.Time) *VLLM {
	if now == nil {
		now = time.Now
	}
	return &VLLM{now: now, reps: make(map[string]vllmRep)}
}

// ObserveReplica records a replica's latest scrape. Failed scrapes
// (m.OK false) keep the previous utilisation.
func (v *VLLM) ObserveReplica(name string, gpus int, m ReplicaMetrics) {
	if !m.OK {
		return
	}
	v.mu.Lock()
	v.reps[name] = vllmRep{gpus: max(gpus, 1), util: m.utilization()}
	v.mu.Unlock()
}

// Poll returns the pseudo-GPU entries, ordered by replica name.
func (v *VLLM) Poll(context.Context) (Sample, error) {
	s := Sample{Source: string(ModeVLLM), At: v.now()}
	v.mu.Lock()
	defer v.mu.Unlock()
	for _, name := range slices.Sorted(maps.Keys(v.reps)) {
		r := v.reps[name]
		for i := range r.gpus {
			s.GPUs = append(s.GPUs, GPUStat{
				Index: -1, UUID: fmt.Sprintf("vllm:%s/%d", name, i), Name: "vllm-derived",
				Replica: name, Utilization: r.util, TemperatureC: -1, PowerMilliwatts: -1, BusyNs: -1, EnergyMJ: -1,
			})
		}
	}
	return s, nil
}

// replicaObserver is the optional extra a [Source] implements to receive
// replica scrapes from [Monitor.ObserveReplica].
type replicaObserver interface {
	ObserveReplica(name string, gpus int, m ReplicaMetrics)
}
