// Package gpu turns GPU telemetry and vLLM replica scrapes into what the
// scheduler's dispatch gate and GPU-ms accounting need (SCHEDULING §7–§9):
// per-replica health, capacity in tokens, GPU time and energy attributed to
// requests, and a GPU-ms estimator. It decides nothing about dispatch and
// imports no other Sluice package: the scheduler feeds it plain
// [ReplicaMetrics].
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
// choice. Utilisation, memory used, temperature, power, clock-event
// reasons and the busy and energy meters (utilisation samples, the
// total-energy counter) are read every poll (default 100 ms); name, memory total, ECC
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
//	  (not counting ReplicaMetrics.Excused ones)
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
// # GPU-milliseconds and energy
//
// Each replica has a [Clock] that splits metered amounts, busy GPU time and
// GPU energy, per sample interval over the requests that ran in it, in
// proportion to their share of the interval: 1/m per instant, m = the
// replica's running requests (max(local, vLLM's num_requests_running)
// with [Deps.SharedReplicas], the other instances' part unattributed). So
//
//	Σ tenants + unattributed = Σ metered            (to the ns and µJ)
//
// at any load; an interval in which no request ran is unattributed whole,
// so idle is never charged. The meter, per replica:
//
//   - NVML, for a replica with GPUs: busy time from each GPU's utilisation
//     samples (nvmlDeviceGetSamples: value% × the sample's period), else
//     utilisation × poll interval; energy from nvmlDeviceGetTotalEnergyConsumption,
//     else power × poll interval. One interval per poll, ending at the
//     sample's time.
//   - The simulator under `gpu.telemetry: vllm`: sim_gpu_busy_seconds_total
//     × g and sim_gpu_energy_joules_total, one interval per scrape, ending
//     when the scrape was sent: its counters were read a little later, but
//     a request dispatched in between has rarely finished a step, so its
//     busy time lands in its own interval.
//   - Neither (off, real vLLM without NVML): wall-clock, busy on all g GPUs
//     while a request runs, no energy; intervals close at every poll and
//     at every request's end, so settlement is exact.
//
// A sampled replica whose counters stop for 10 × StaleAfter falls back to
// wall-clock (logged) until they return, and re-baselines.
//
// Interval ends may lie in the past (a scrape answered late): every Start,
// End and change of m writes a checkpoint of the share clock, so a
// request's share of an interval is exact however late its sample comes.
//
// # Settlement and its error bound
//
// A request that ends mid-interval must settle before the interval's
// sample arrives. It settles (the ledger's gpu_ms and gpu_joules, the
// estimator, fair-share reconciliation) with what closed intervals gave it
// plus its share s of the open interval at the recent rate r̂ (the last
// intervals' Σ amount / Σ share, weighted 0.8 per interval back). When the
// interval closes, the meter (sluice_tenant_gpu_ms_total,
// sluice_tenant_gpu_joules_total) gets its exact part r·s; the ledger keeps
// the estimate. Per request the settled figure errs by s·|r̂ − r|, with s
// at most one interval (plus a late scrape's lag) of its running time and
// r ≤ g GPU-s/s for busy time: at most g × 100 ms of GPU time per request
// with NVML's default poll, g × the scrape interval under vllm telemetry;
// zero in wall-clock mode. Across requests the errors have zero mean at a
// steady rate: in the open-loop test (50 ms scrapes, requests of 10–40
// GPU-ms, wholly inside one or two intervals) Σ settled was within 2 % of
// the meter, and the meter within 0.1 ms of the simulator's busy time.
//
// Holds come from [Monitor.Hold] (fleet-max [Estimator] coefficients ×
// margin) and, for energy, [Monitor.HoldEnergy]: the GPU-ms hold × the
// fleet's largest attributed energy per attributed busy GPU time
// ([DefaultWattsPerGPU] before a GPU-second of data). GPU time beyond the
// hold is reported (sluice_gpu_ms_overrun_total), never aborted.
//
// # Concurrency
//
// [Monitor.Run] is the only poller. ObserveReplica, Drain and the
// read methods may be called from any goroutine. Clock and Estimator are
// internally synchronised.
package gpu
