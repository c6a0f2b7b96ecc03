// Package gpu turns GPU telemetry and vLLM replica scrapes into what the
// scheduler's dispatch gate and GPU-ms accounting need (SCHEDULING §7–§9):
// per-replica health, capacity in tokens, a virtual GPU clock and a GPU-ms
// estimator. It decides nothing about dispatch and imports no other Sluice
// package: the scheduler feeds it plain [ReplicaMetrics].
//
// # Telemetry
//
// A [Source] yields [Sample]s of per-GPU [GPUStat]s. [NVML] reads the node's
// GPUs through go-nvml, which dlopens libnvidia-ml at run time, so the binary
// runs on machines without a driver: [OpenNVML] then fails with
// [ErrUnavailable] (so does a build without cgo). [VLLM] derives one
// pseudo-GPU per replica GPU from scrapes (sim_gpu_utilization_ratio on the
// simulator, else "unknown": busy while requests run). [Off] sees nothing.
// [OpenSource] implements `gpu.telemetry: auto|nvml|vllm|off` and logs its
// choice. Utilisation, memory used, temperature, power and clock-event
// reasons are read every poll (default 100 ms); name, memory total, ECC
// counters and row-remap state every [Config.InventoryEvery] polls; XID
// events are drained from an NVML event set without blocking.
//
// # Replica ↔ GPU mapping
//
// [Replica.GPUs] lists a replica's GPUs by UUID or index (tensor parallel:
// several); its utilisation is their mean, g is their count. Replicas
// without GPUs, and every replica under the vLLM source, use scrape-derived
// utilisation.
//
// # Health
//
// Each poll [Monitor] computes every replica's instantaneous condition, the
// worst of:
//
//	operator drain                                 → draining
//	≥ DownAfter failed scrapes or /health in a row → down
//	fatal XID, new uncorrected ECC, row remap
//	  pending/failed, lost or missing GPU          → draining, latched for FatalHold
//	thermal/HW-slowdown/power-brake throttling,
//	  rising corrected ECC, GPU memory nearly full → degraded
//	scrape older than StaleAfter, or the replica's
//	  NVML telemetry older than StaleAfter         → degraded
//
// and moves the state with hysteresis: to a worse condition after
// EnterSamples consecutive polls (draining and down at once), to a better
// one after RecoverSamples consecutive polls. Transitions are logged with
// their reason. SW power capping alone is normal for a busy GPU and does not
// degrade. Memory "nearly full" is the NVML cross-check of KV sizing: vLLM
// preallocates its share, so more than MemoryPressureRatio used means
// another process is on the GPU.
//
// # Capacity
//
//	K_r = floor(base × TargetOccupancy × factor(state) × overcommit)
//
// base is [Replica.CapacityTokens] or num_gpu_blocks × block_size; factor is
// 1, DegradedFactor, or 0 for draining and down. Overcommit is AIMD in
// [1, MaxOvercommit]: +OvercommitStep per scrape with KV usage below
// KVHighWater and nothing waiting; halved when preemptions rise or waiting
// persists for WaitingPersist scrapes. The scheduler reads K_r lock-free via
// [Monitor.Capacity]; state is published as an immutable [Snapshot] in an
// atomic.Pointer after each poll and each scrape.
//
// # GPU-milliseconds
//
// Each replica has a [Clock]: V advances at u·g/n while n > 0, so a request's
// GPU time is V(end) − V(start) and Σ over requests = ∫u·g dt over busy time
// (exact up to a carried residue under n GPU-ns; busy time with n = 0 is
// reported as unattributed). u is held between polls. With
// [Deps.SharedReplicas], n is max(local, vLLM's num_requests_running).
// Holds come from [Monitor.Hold] (fleet-max [Estimator] coefficients ×
// margin); [Config.OverrunOf] splits actual use against the hold.
//
// # Concurrency
//
// [Monitor.Run] is the only poller. ObserveReplica, Drain and the
// read methods may be called from any goroutine. Clock and Estimator are
// internally synchronised.
package gpu
