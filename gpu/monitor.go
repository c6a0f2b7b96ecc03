package gpu

import (
	"context"
	"fmt"
	"log/slog"
	"math"
	"strconv"
	"sync"
	"sync/atomic"
	"time"
)

// ReplicaMetrics is what the scheduler learned from one scrape of a
// replica's /metrics and /health (SCHEDULING §7), summed over vLLM's
// `engine` label. It is a plain struct so that gpu need not import vllm.
type ReplicaMetrics struct {
	// OK is false when the scrape or the /health check failed; the other
	// fields are then ignored.
	OK bool
	// Reason says why it failed (logged; must not contain secrets).
	Reason string
	// Excused marks a failure that is no evidence against the replica (a
	// timeout while it kept completing requests): it does not count towards
	// DownAfter.
	Excused bool
	// NumGPUBlocks and BlockSize come from vllm:cache_config_info.
	NumGPUBlocks, BlockSize int64
	// BatchTokens stands in for the KV capacity of a replica whose metrics
	// lack vllm:cache_config_info (older vLLM releases, vLLM-compatible
	// engines): the scheduler sizes it on its batch (max_num_seqs) and
	// passes a token bound that batch always reaches first. Used only while
	// no KV capacity is known and no override is configured.
	BatchTokens int64
	// KVUsage is vllm:kv_cache_usage_perc (0–1).
	KVUsage float64
	// Waiting is the requests waiting for room: of
	// vllm:num_requests_waiting, those the replica does not report as
	// "deferred" (vllm:num_requests_waiting_by_reason); a request held back
	// for a LoRA slot or a KV transfer is no sign of a full replica, so it
	// does not cut the overcommit. Running is vllm:num_requests_running.
	Waiting, Running int64
	// Preemptions is the vllm:num_preemptions_total counter.
	Preemptions float64
	// SimGPUUtilization is sim_gpu_utilization_ratio (simulator only),
	// valid when HasSimGPUUtilization.
	SimGPUUtilization    float64
	HasSimGPUUtilization bool
	// SimGPUBusySeconds is the sim_gpu_busy_seconds_total counter and
	// SimGPUEnergyJoules sim_gpu_energy_joules_total (simulator only),
	// valid when their Has flag is set. With them the replica's GPU time
	// and energy are metered from counters (gpu/doc.go).
	SimGPUBusySeconds, SimGPUEnergyJoules float64
	HasSimGPUBusy, HasSimGPUEnergy        bool
	// At is when the counters were read (the scrape's time). Optional;
	// zero means when ObserveReplica is called.
	At time.Time
	// Restarted: the replica's counters went back since the previous
	// scrape (it restarted); the counters start a new baseline.
	Restarted bool
}

// utilization is the vLLM-derived busy fraction: the simulator's ratio
// when present, else -1 (unknown: the clock counts busy while running).
func (m ReplicaMetrics) utilization() float64 {
	if m.HasSimGPUUtilization {
		return min(max(m.SimGPUUtilization, 0), 1)
	}
	return -1
}

// Deps are the [Monitor]'s collaborators.
type Deps struct {
	// Source supplies GPU samples. Optional; nil means [Off].
	Source Source
	// Logger receives health transitions and telemetry notices. Optional;
	// nil discards.
	Logger *slog.Logger
	// Now is the clock. Optional; nil means time.Now.
	Now func() time.Time
	// Metrics records the GPU and replica series. Optional.
	Metrics *Metrics
	// SharedReplicas: other Sluice instances dispatch to the same replicas,
	// so the GPU-ms clock divides by max(local running, vLLM's running)
	// (SCHEDULING §9). Optional; default false (local count only).
	SharedReplicas bool
	// Attribution receives every interval's per-tenant GPU time and
	// energy. Optional.
	Attribution *AttributionMetrics
}

// ReplicaView is one replica's published state.
type ReplicaView struct {
	Name   string
	State  State
	Reason string
	// CapacityTokens is K_r = base × health factor × overcommit.
	CapacityTokens int64
	// BaseTokens is the override, else num_gpu_blocks × block_size, else
	// the batch bound (ReplicaMetrics.BatchTokens), times the target
	// occupancy; 0 before the first scrape without an override.
	BaseTokens int64
	// Sizing says where BaseTokens comes from: SizingConfig, SizingKV,
	// SizingBatch, or "" while unknown.
	Sizing       string
	HealthFactor float64
	Overcommit   float64
	// Utilization is the replica's current busy fraction (mean over its
	// GPUs, or the simulator's windowed ratio; -1 unknown), for display:
	// attribution uses the metered counters (gpu/doc.go).
	Utilization float64
	GPUCount    int
	ScrapeStale bool
	KVUsage     float64
	Waiting     int64
}

// Snapshot is an immutable view published after every evaluation. Never
// modify it.
type Snapshot struct {
	At             time.Time
	Source         string
	TelemetryStale bool
	GPUs           []GPUStat
	Replicas       []ReplicaView // in config order
	index          map[string]int
}

// Replica returns the named replica's view.
func (s *Snapshot) Replica(name string) (ReplicaView, bool) {
	i, ok := s.index[name]
	if !ok {
		return ReplicaView{}, false
	}
	return s.Replicas[i], true
}

// replica is the Monitor's per-replica state.
type replica struct {
	cfg   Replica    // immutable
	g     int        // immutable GPU count
	clock *Clock     // immutable pointer; internally synchronised
	est   *Estimator // immutable pointer; internally synchronised

	// Guarded by Monitor.mu.
	haveObs     bool
	obs         ReplicaMetrics
	obsAt       time.Time
	kvTokens    int64
	batchTokens int64
	fails       int
	failReason  string
	prevPreempt float64
	havePreempt bool
	waitStreak  int
	oc          float64
	drain       string // operator drain reason; "" when not drained
	fatalUntil  time.Time
	fatalReason string
	gpuCond     State
	gpuReason   string
	state       State
	reason      string
	worse       int
	better      int
	util        float64
	exported    ClockTotals // totals already added to the metrics
	// Metering: sampled is set once a counter baseline exists (NVML or
	// the simulator's counters); closedAt is the last sampled close.
	sampled  bool
	closedAt time.Time
	ctrBusy  float64 // simulator counters at the last scrape
	ctrJ     float64
	ctrJOK   bool
}

// Monitor turns GPU telemetry and replica scrapes into per-replica health,
// capacity and GPU-ms clocks (SCHEDULING §7–§9). Run owns the polling; the
// scheduler calls [Monitor.ObserveReplica] after each scrape and reads
// [Monitor.Capacity] or [Monitor.Snapshot] lock-free on the dispatch path.
// All methods are safe for concurrent use.
type Monitor struct {
	cfg    Config
	src    Source
	obsSrc replicaObserver // src's optional extra, or nil
	log    *slog.Logger
	now    func() time.Time
	met    *Metrics
	attr   *AttributionMetrics
	shared bool
	// set is the replicas; replaced whole under mu (membership.go).
	set atomic.Pointer[repSet]

	snap       atomic.Pointer[Snapshot]
	lastGoodNs atomic.Int64 // lastGoodAt as Unix ns, for the metrics' lock-free read

	watts atomic.Uint64 // float64 bits: fleet's largest W per busy GPU, for energy holds

	mu         sync.Mutex // guards the fields below and replica's guarded fields
	last       Sample
	prevByUUID map[string]GPUStat
	lastGoodAt time.Time
	pollFailed bool
	pollErr    error // the last poll's error; nil after a good poll
	stale      bool
}

// NewMonitor validates cfg (after defaults) and builds a Monitor with one
// [Clock] and one [Estimator] per configured replica.
func NewMonitor(cfg Config, deps Deps) (*Monitor, error) {
	cfg = cfg.WithDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if deps.Now == nil {
		deps.Now = time.Now
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	if deps.Source == nil {
		deps.Source = NewOff(deps.Now)
	}
	now := deps.Now()
	m := &Monitor{
		cfg: cfg, src: deps.Source, log: deps.Logger, now: deps.Now, met: deps.Metrics,
		shared:     deps.SharedReplicas,
		lastGoodAt: now, prevByUUID: map[string]GPUStat{},
	}
	m.obsSrc, _ = deps.Source.(replicaObserver)
	m.lastGoodNs.Store(now.UnixNano())
	m.watts.Store(math.Float64bits(DefaultWattsPerGPU))
	if m.met != nil {
		f := func() (float64, bool) {
			age := m.now().Sub(time.Unix(0, m.lastGoodNs.Load()))
			return age.Seconds(), age > m.cfg.StaleAfter
		}
		m.met.telemetry.Store(&f)
	}
	m.attr = deps.Attribution
	set := &repSet{byName: make(map[string]*replica, len(cfg.Replicas))}
	for _, rc := range cfg.Replicas {
		r := m.newReplica(rc, now)
		set.reps = append(set.reps, r)
		set.byName[rc.Name] = r
	}
	m.set.Store(set)
	m.mu.Lock()
	m.publishLocked(now)
	m.mu.Unlock()
	return m, nil
}

// Config returns the defaulted configuration in use.
func (m *Monitor) Config() Config { return m.cfg }

// Run polls the source every [Config.PollInterval] until ctx is cancelled,
// then returns nil. Call it once, from the owning errgroup. It does not
// close the source.
func (m *Monitor) Run(ctx context.Context) error {
	t := time.NewTicker(m.cfg.PollInterval)
	defer t.Stop()
	m.step(ctx)
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
			m.step(ctx)
		}
	}
}

// step polls once and re-evaluates every replica.
func (m *Monitor) step(ctx context.Context) {
	s, err := m.src.Poll(ctx)
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	fresh := err == nil
	if fresh {
		if m.pollFailed {
			m.log.Info("gpu telemetry poll recovered", "source", s.Source)
		}
		m.pollFailed, m.pollErr = false, nil
		m.prevByUUID = make(map[string]GPUStat, len(m.last.GPUs))
		for _, g := range m.last.GPUs {
			m.prevByUUID[g.UUID] = g
		}
		m.last, m.lastGoodAt = s, now
		m.lastGoodNs.Store(now.UnixNano())
	} else if ctx.Err() == nil {
		m.pollErr = err
		if !m.pollFailed {
			m.pollFailed = true
			m.log.Warn("gpu telemetry poll failed", "err", err)
		}
	}
	stale := now.Sub(m.lastGoodAt) > m.cfg.StaleAfter
	if stale != m.stale {
		m.stale = stale
		if stale {
			m.log.Warn("gpu telemetry stale", "age", now.Sub(m.lastGoodAt).String())
		} else {
			m.log.Info("gpu telemetry fresh again")
		}
	}
	for _, r := range m.set.Load().reps {
		m.evaluateLocked(r, now, fresh)
		m.meterLocked(r, now, fresh)
	}
	m.updateWattsLocked()
	if m.met != nil {
		if fresh {
			for _, g := range s.GPUs {
				if g.Utilization >= 0 {
					m.met.gpuUtil.WithLabelValues(g.UUID).Set(g.Utilization)
				}
				if g.MemoryTotalBytes > 0 {
					m.met.gpuMem.WithLabelValues(g.UUID).Set(float64(g.MemoryUsedBytes))
				}
				if g.TemperatureC >= 0 {
					m.met.gpuTemp.WithLabelValues(g.UUID).Set(float64(g.TemperatureC))
				}
				if g.PowerMilliwatts >= 0 {
					m.met.gpuPower.WithLabelValues(g.UUID).Set(float64(g.PowerMilliwatts) / 1000)
				}
				for _, x := range g.XIDs {
					m.met.gpuXID.WithLabelValues(g.UUID, strconv.FormatUint(x, 10)).Inc()
				}
			}
		}
		for _, r := range m.set.Load().reps {
			t, e := r.clock.Totals(), r.exported
			name := r.cfg.Name
			m.met.busy.WithLabelValues(name).Add(float64(t.BusyGPUNs-e.BusyGPUNs) / 1e9)
			m.met.unattributed.WithLabelValues(name).Add(float64(t.UnattributedGPUNs-e.UnattributedGPUNs) / 1e9)
			m.met.energy.WithLabelValues(name).Add(float64(t.EnergyUJ-e.EnergyUJ) / 1e6)
			m.met.unattributedJ.WithLabelValues(name).Add(float64(t.UnattributedEnergyUJ-e.UnattributedEnergyUJ) / 1e6)
			r.exported = t
		}
	}
	m.publishLocked(now)
}

func b2f(b bool) float64 {
	if b {
		return 1
	}
	return 0
}

// gpusOfLocked returns the replica's GPU entries in the last sample, and the
// configured GPUs that are missing from it. NVML samples match by UUID or
// index; other sources by their Replica field. Caller holds mu.
func (m *Monitor) gpusOfLocked(r *replica) (stats []GPUStat, missing []string) {
	if m.last.Source != string(ModeNVML) {
		for _, g := range m.last.GPUs {
			if g.Replica == r.cfg.Name {
				stats = append(stats, g)
			}
		}
		return stats, nil
	}
	for _, id := range r.cfg.GPUs {
		found := false
		for _, g := range m.last.GPUs {
			if g.UUID == id || (g.Index >= 0 && strconv.Itoa(g.Index) == id) {
				stats = append(stats, g)
				found = true
				break
			}
		}
		if !found {
			missing = append(missing, id)
		}
	}
	return stats, missing
}

// evaluateLocked updates r's utilisation, GPU condition and health state.
// Caller holds mu.
func (m *Monitor) evaluateLocked(r *replica, now time.Time, fresh bool) {
	stats, missing := m.gpusOfLocked(r)

	// Utilisation drives the GPU clock.
	u, sum, known := -1.0, 0.0, 0
	if !m.stale {
		for _, g := range stats {
			if g.Utilization >= 0 {
				sum += g.Utilization
				known++
			}
		}
	}
	switch {
	case known > 0:
		u = sum / float64(known)
	case r.haveObs:
		u = r.obs.utilization()
	}
	r.util = u

	// GPU condition, re-assessed only on a fresh sample; fatal ones latch.
	if fresh {
		r.gpuCond, r.gpuReason = StateHealthy, ""
		for _, id := range missing {
			r.fatalUntil, r.fatalReason = now.Add(m.cfg.FatalHold), fmt.Sprintf("GPU %s missing from telemetry", id)
		}
		for _, g := range stats {
			var prev *GPUStat
			if p, ok := m.prevByUUID[g.UUID]; ok {
				prev = &p
			}
			st, why := m.cfg.AssessGPU(g, prev)
			switch {
			case st >= StateDraining:
				r.fatalUntil, r.fatalReason = now.Add(m.cfg.FatalHold), why
			case st > r.gpuCond:
				r.gpuCond, r.gpuReason = st, why
			}
		}
	}

	cond, reason := StateHealthy, ""
	worse := func(s State, why string) {
		if s > cond {
			cond, reason = s, why
		}
	}
	if r.drain != "" {
		worse(StateDraining, "operator drain: "+r.drain)
	}
	if r.fails >= m.cfg.DownAfter {
		worse(StateDown, fmt.Sprintf("%d failed scrapes in a row: %s", r.fails, r.failReason))
	}
	if now.Before(r.fatalUntil) {
		worse(StateDraining, r.fatalReason)
	}
	worse(r.gpuCond, r.gpuReason)
	if r.haveObs && now.Sub(r.obsAt) > m.cfg.StaleAfter {
		worse(StateDegraded, fmt.Sprintf("stale scrape (last good %s ago)", now.Sub(r.obsAt).Round(time.Millisecond)))
	}
	if m.stale && len(r.cfg.GPUs) > 0 && m.last.Source == string(ModeNVML) {
		worse(StateDegraded, fmt.Sprintf("stale GPU telemetry (last good %s ago)", now.Sub(m.lastGoodAt).Round(time.Millisecond)))
	}

	switch {
	case cond > r.state:
		r.better = 0
		r.worse++
		if cond.immediate() || r.worse >= m.cfg.EnterSamples {
			m.transitionLocked(r, cond, reason)
		}
	case cond < r.state:
		r.worse = 0
		r.better++
		if r.better >= m.cfg.RecoverSamples {
			m.transitionLocked(r, cond, reason)
		}
	default:
		r.worse, r.better = 0, 0
		if cond != StateHealthy {
			r.reason = reason
		}
	}
}

// transitionLocked moves r to state to and logs why. Caller holds mu.
func (m *Monitor) transitionLocked(r *replica, to State, reason string) {
	from, was := r.state, r.reason
	r.state, r.reason, r.worse, r.better = to, reason, 0, 0
	if to > from {
		m.log.Warn("replica health worsened", "replica", r.cfg.Name, "from", from.String(), "to", to.String(), "reason", reason)
		return
	}
	m.log.Info("replica health recovered", "replica", r.cfg.Name, "from", from.String(), "to", to.String(), "was", was)
}

// ObserveReplica records one scrape (or a failed scrape or /health check)
// of the named replica. The scheduler calls it after every scrape; it
// updates the overcommit controller at once and health at the next poll.
func (m *Monitor) ObserveReplica(name string, obs ReplicaMetrics) error {
	r, ok := m.set.Load().byName[name]
	if !ok {
		return fmt.Errorf("observe %q: %w", name, ErrUnknownReplica)
	}
	if m.obsSrc != nil {
		m.obsSrc.ObserveReplica(name, r.g, obs)
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	if !obs.OK {
		if !obs.Excused {
			r.fails++
			r.failReason = obs.Reason
		}
		m.publishLocked(now)
		return nil
	}
	r.fails, r.failReason = 0, ""
	r.haveObs, r.obs, r.obsAt = true, obs, now
	if obs.NumGPUBlocks > 0 && obs.BlockSize > 0 {
		r.kvTokens = obs.NumGPUBlocks * obs.BlockSize
	}
	if obs.BatchTokens > 0 {
		r.batchTokens = obs.BatchTokens
	}
	// AIMD overcommit (SCHEDULING §7).
	rising := r.havePreempt && obs.Preemptions > r.prevPreempt
	r.prevPreempt, r.havePreempt = obs.Preemptions, true
	if obs.Waiting > 0 {
		r.waitStreak++
	} else {
		r.waitStreak = 0
	}
	switch {
	case rising || r.waitStreak >= m.cfg.WaitingPersist:
		r.oc = max(1, r.oc/2)
		r.waitStreak = 0
	case obs.KVUsage < m.cfg.KVHighWater && obs.Waiting == 0:
		r.oc = min(m.cfg.MaxOvercommit, r.oc+m.cfg.OvercommitStep)
	}
	if m.shared {
		r.clock.SetExternalRunning(now, obs.Running)
	}
	if obs.HasSimGPUBusy && !m.nvmlCoveredLocked(r) {
		m.meterCountersLocked(r, obs, now)
	}
	m.publishLocked(now)
	return nil
}

// Drain puts the named replica in draining at the next evaluation (and in
// the published snapshot at once) with an operator reason; "" undrains,
// after which it recovers through the usual hysteresis.
func (m *Monitor) Drain(name, reason string) error {
	r, ok := m.set.Load().byName[name]
	if !ok {
		return fmt.Errorf("drain %q: %w", name, ErrUnknownReplica)
	}
	now := m.now()
	m.mu.Lock()
	defer m.mu.Unlock()
	r.drain = reason
	if reason != "" && r.state < StateDraining {
		m.transitionLocked(r, StateDraining, "operator drain: "+reason)
	}
	m.publishLocked(now)
	return nil
}

// Where a replica's base capacity comes from (ReplicaView.Sizing).
const (
	SizingConfig = "config" // upstream.replicas[].capacity_tokens
	SizingKV     = "kv"     // vllm:cache_config_info
	SizingBatch  = "batch"  // max_num_seqs: the metrics lack KV capacity
)

// sizingLocked reports where r's base capacity comes from. Caller holds mu.
func sizingLocked(r *replica) string {
	switch {
	case r.cfg.CapacityTokens > 0:
		return SizingConfig
	case r.kvTokens > 0:
		return SizingKV
	case r.batchTokens > 0:
		return SizingBatch
	}
	return ""
}

// capacityLocked computes r's base and K_r. Caller holds mu.
func (m *Monitor) capacityLocked(r *replica) (base, k int64, factor float64) {
	base = r.cfg.CapacityTokens
	if base == 0 {
		base = r.kvTokens
	}
	if base == 0 {
		base = r.batchTokens
	}
	base = int64(math.Floor(float64(base) * m.cfg.TargetOccupancy))
	switch r.state {
	case StateHealthy:
		factor = 1
	case StateDegraded:
		factor = m.cfg.DegradedFactor
	default:
		factor = 0
	}
	return base, int64(math.Floor(float64(base) * factor * r.oc)), factor
}

// publishLocked builds and stores a new [Snapshot]. Caller holds mu.
func (m *Monitor) publishLocked(now time.Time) {
	s := &Snapshot{At: now, Source: m.last.Source, TelemetryStale: m.stale, GPUs: m.last.GPUs,
		Replicas: make([]ReplicaView, len(m.set.Load().reps)), index: make(map[string]int, len(m.set.Load().reps))}
	for i, r := range m.set.Load().reps {
		base, k, f := m.capacityLocked(r)
		scrapeStale := r.haveObs && now.Sub(r.obsAt) > m.cfg.StaleAfter
		s.Replicas[i] = ReplicaView{Name: r.cfg.Name, State: r.state, Reason: r.reason, CapacityTokens: k,
			BaseTokens: base, Sizing: sizingLocked(r), HealthFactor: f, Overcommit: r.oc, Utilization: r.util, GPUCount: r.g,
			ScrapeStale: scrapeStale, KVUsage: r.obs.KVUsage, Waiting: r.obs.Waiting}
		s.index[r.cfg.Name] = i
		if m.met != nil {
			m.met.capacity.WithLabelValues(r.cfg.Name).Set(float64(k))
			m.met.repState.WithLabelValues(r.cfg.Name).Set(float64(r.state))
			m.met.overcommit.WithLabelValues(r.cfg.Name).Set(r.oc)
			m.met.repStale.WithLabelValues(r.cfg.Name).Set(b2f(scrapeStale))
		}
	}
	m.snap.Store(s)
}

// Snapshot returns the latest published state (lock-free).
func (m *Monitor) Snapshot() *Snapshot { return m.snap.Load() }

// Capacity returns the named replica's K_r in tokens, its state and the
// reason for a non-healthy state (lock-free). An unknown replica reads
// (0, StateDown, "unknown replica").
func (m *Monitor) Capacity(name string) (tokens int64, state State, reason string) {
	v, ok := m.snap.Load().Replica(name)
	if !ok {
		return 0, StateDown, "unknown replica"
	}
	return v.CapacityTokens, v.State, v.Reason
}

// Clock returns the named replica's GPU clock, or nil if unknown.
func (m *Monitor) Clock(name string) *Clock {
	if r, ok := m.set.Load().byName[name]; ok {
		return r.clock
	}
	return nil
}

// Estimator returns the named replica's GPU-ms estimator, or nil if unknown.
func (m *Monitor) Estimator(name string) *Estimator {
	if r, ok := m.set.Load().byName[name]; ok {
		return r.est
	}
	return nil
}

// Hold returns the admission-time GPU-ms hold for a request: the fleet's
// largest a and b × [Config.GPUMsMargin], rounded up (SCHEDULING §8).
// Lock-free.
func (m *Monitor) Hold(input, output int64) int64 {
	var a, b float64
	for _, r := range m.set.Load().reps {
		ra, rb := r.est.Coefficients()
		a, b = max(a, ra), max(b, rb)
	}
	return int64(math.Ceil((a*float64(input) + b*float64(output)) * m.cfg.GPUMsMargin))
}
