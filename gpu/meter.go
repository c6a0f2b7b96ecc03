package gpu

import (
	"fmt"
	"math"
	"time"
)

// DefaultWattsPerGPU sizes energy holds until a replica has metered a GPU
// second of busy time with energy: an H100/H200 SXM board's 700 W limit.
const DefaultWattsPerGPU = 700.0

// meterStaleFactor × [Config.StaleAfter] without a new counter sample
// switches a metered replica to wall-clock attribution. Generous, because a
// loaded scrape loop lags without being broken, and the counters' next
// delta still covers the lag exactly; the bound only keeps a dead meter's
// open interval from growing without end.
const meterStaleFactor = 10

// nvmlCoveredLocked reports whether r is metered from NVML: the source is
// NVML and the replica names its GPUs. Caller holds mu.
func (m *Monitor) nvmlCoveredLocked(r *replica) bool {
	return m.last.Source == string(ModeNVML) && len(r.cfg.GPUs) > 0
}

// meterLocked closes r's GPU clock interval for this poll: at the NVML
// sample's time with the GPUs' counter deltas, or, for a replica without a
// counter (or whose counters stopped for meterStaleFactor × StaleAfter), at now with
// wall-clock attribution. Replicas metered from the simulator's counters
// are closed by ObserveReplica. Caller holds mu.
func (m *Monitor) meterLocked(r *replica, now time.Time, fresh bool) {
	if m.nvmlCoveredLocked(r) && fresh {
		at := m.last.At
		if at.IsZero() || at.After(now) {
			at = now
		}
		q, ok := m.gpuDeltaLocked(r)
		switch {
		case ok && r.sampled:
			r.clock.Close(at, q)
			r.closedAt = at
			return
		case ok:
			// First sample with counters: the baseline.
			r.clock.Baseline(at)
			r.sampled, r.closedAt = true, at
			return
		}
		r.sampled = false
	}
	if r.sampled && now.Sub(r.closedAt) <= meterStaleFactor*m.cfg.StaleAfter {
		return
	}
	if r.sampled {
		r.sampled = false
		m.log.Warn("gpu meter stale: attributing wall-clock time", "replica", r.cfg.Name,
			"last_sample_age", now.Sub(r.closedAt).Round(time.Millisecond).String())
	}
	r.clock.CloseExact(now)
}

// gpuDeltaLocked sums r's GPUs' busy time and energy since the previous
// NVML sample. ok is false when a GPU is missing or has no busy figure in
// either sample. A counter that went back (a GPU reset) adds nothing.
// Caller holds mu.
func (m *Monitor) gpuDeltaLocked(r *replica) (q Use, ok bool) {
	stats, missing := m.gpusOfLocked(r)
	if len(missing) > 0 || len(stats) == 0 {
		return Use{}, false
	}
	for _, g := range stats {
		p, seen := m.prevByUUID[g.UUID]
		if !seen || g.BusyNs < 0 || p.BusyNs < 0 {
			return Use{}, false
		}
		q.GPUNs += max(g.BusyNs-p.BusyNs, 0)
		if g.EnergyMJ >= 0 && p.EnergyMJ >= 0 && g.EnergyMJ >= p.EnergyMJ {
			q.EnergyUJ += (g.EnergyMJ - p.EnergyMJ) * 1000
		}
	}
	return q, true
}

// meterCountersLocked closes r's interval at the scrape's time with the
// simulator counters' deltas; the first scrape, and the first after a
// restart, only sets the baseline. Caller holds mu.
func (m *Monitor) meterCountersLocked(r *replica, obs ReplicaMetrics, now time.Time) {
	at := obs.At
	if at.IsZero() || at.After(now) {
		at = now
	}
	ns := func(s float64) int64 { return int64(math.Round(s * 1e9)) }
	uj := func(j float64) int64 { return int64(math.Round(j * 1e6)) }
	if !r.sampled || obs.Restarted || obs.SimGPUBusySeconds < r.ctrBusy {
		r.clock.Baseline(at)
	} else {
		// Deltas of the rounded totals, so that rounding never accumulates.
		q := Use{GPUNs: (ns(obs.SimGPUBusySeconds) - ns(r.ctrBusy)) * int64(r.g)}
		if obs.HasSimGPUEnergy && r.ctrJOK && obs.SimGPUEnergyJoules >= r.ctrJ {
			q.EnergyUJ = uj(obs.SimGPUEnergyJoules) - uj(r.ctrJ)
		}
		r.clock.Close(at, q)
	}
	r.sampled, r.closedAt = true, at
	r.ctrBusy, r.ctrJ, r.ctrJOK = obs.SimGPUBusySeconds, obs.SimGPUEnergyJoules, obs.HasSimGPUEnergy
}

// updateWattsLocked publishes the fleet's largest attributed energy per
// attributed busy GPU time (what a request settles per GPU-ms, idle power
// of the intervals it ran in included) for [Monitor.HoldEnergy]. Caller
// holds mu.
func (m *Monitor) updateWattsLocked() {
	w := 0.0
	for _, r := range m.set.Load().reps {
		t := r.clock.Totals()
		busy, uj := t.BusyGPUNs-t.UnattributedGPUNs, t.EnergyUJ-t.UnattributedEnergyUJ
		if busy >= 1e9 && uj > 0 {
			w = max(w, float64(uj)/float64(busy)*1000) // µJ/ns = kW
		}
	}
	if w == 0 {
		w = DefaultWattsPerGPU
	}
	m.watts.Store(math.Float64bits(w))
}

// HoldEnergy returns the admission-time energy hold in millijoules for a
// request held at gpuMs GPU-milliseconds: gpuMs × the fleet's largest
// metered watts per busy GPU ([DefaultWattsPerGPU] before any), rounded up.
// Lock-free.
func (m *Monitor) HoldEnergy(gpuMs int64) int64 {
	if gpuMs <= 0 {
		return 0
	}
	return int64(math.Ceil(float64(gpuMs) * math.Float64frombits(m.watts.Load())))
}

// Err reports a telemetry source whose polls have been failing for longer
// than [Config.StaleAfter] (nil otherwise), for the server's readiness.
// Each failure spell is also logged once when it starts and when it ends.
func (m *Monitor) Err() error {
	m.mu.Lock()
	defer m.mu.Unlock()
	age := m.now().Sub(m.lastGoodAt)
	if m.pollErr == nil || age <= m.cfg.StaleAfter {
		return nil
	}
	return fmt.Errorf("gpu telemetry failing for %s: %w", age.Round(time.Millisecond), m.pollErr)
}
