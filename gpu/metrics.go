package gpu

import (
	"errors"
	"sync"
	"sync/atomic"

	"github.com/prometheus/client_golang/prometheus"
)

// Metrics are the series the [Monitor] maintains. Build with [NewMetrics];
// a nil *Metrics records nothing.
type Metrics struct {
	gpuUtil       *prometheus.GaugeVec
	gpuMem        *prometheus.GaugeVec
	gpuTemp       *prometheus.GaugeVec
	gpuPower      *prometheus.GaugeVec
	gpuXID        *prometheus.CounterVec
	stale         prometheus.GaugeFunc
	age           prometheus.GaugeFunc
	repStale      *prometheus.GaugeVec
	repState      *prometheus.GaugeVec
	capacity      *prometheus.GaugeVec
	overcommit    *prometheus.GaugeVec
	busy          *prometheus.CounterVec
	unattributed  *prometheus.CounterVec
	energy        *prometheus.CounterVec
	unattributedJ *prometheus.CounterVec

	// telemetry reports (age seconds, stale) at scrape time, so that a
	// stalled poll loop still shows as a growing age. Set by NewMonitor.
	telemetry atomic.Pointer[func() (float64, bool)]
}

func (m *Metrics) telemetryNow() (float64, bool) {
	if f := m.telemetry.Load(); f != nil {
		return (*f)()
	}
	return 0, false
}

// NewMetrics registers the GPU series on reg:
//
//	sluice_gpu_utilization_ratio{gpu}              busy fraction 0–1 (gpu = UUID)
//	sluice_gpu_memory_used_bytes{gpu}
//	sluice_gpu_temperature_celsius{gpu}
//	sluice_gpu_power_watts{gpu}
//	sluice_gpu_xid_errors_total{gpu,xid}
//	sluice_gpu_telemetry_stale                     1 while the last good GPU sample is older than stale_after
//	sluice_gpu_telemetry_age_seconds               age of the last good GPU sample (computed when scraped,
//	                                               so it grows even if the poll loop itself is stuck)
//	sluice_replica_telemetry_stale{replica}        1 while the replica's last good scrape is older than stale_after
//	sluice_replica_health_state{replica}           0 healthy, 1 degraded, 2 draining, 3 down
//	sluice_replica_capacity_tokens{replica}        K_r (0 when draining or down)
//	sluice_replica_overcommit_ratio{replica}       AIMD factor in [1, max_overcommit]
//	sluice_replica_gpu_busy_seconds_total{replica} metered busy GPU-seconds (closed sample intervals)
//	sluice_replica_gpu_unattributed_seconds_total{replica} the part no local request got
//	sluice_replica_gpu_energy_joules_total{replica} metered GPU energy (closed sample intervals)
//	sluice_replica_gpu_unattributed_joules_total{replica} the part no local request got
func NewMetrics(reg prometheus.Registerer) (*Metrics, error) {
	gv := func(name, help string, labels ...string) *prometheus.GaugeVec {
		return prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: name, Help: help}, labels)
	}
	cv := func(name, help string, labels ...string) *prometheus.CounterVec {
		return prometheus.NewCounterVec(prometheus.CounterOpts{Name: name, Help: help}, labels)
	}
	m := &Metrics{
		gpuUtil:       gv("sluice_gpu_utilization_ratio", "GPU busy fraction (0-1) from the telemetry source.", "gpu"),
		gpuMem:        gv("sluice_gpu_memory_used_bytes", "GPU memory in use.", "gpu"),
		gpuTemp:       gv("sluice_gpu_temperature_celsius", "GPU core temperature.", "gpu"),
		gpuPower:      gv("sluice_gpu_power_watts", "GPU board power draw.", "gpu"),
		gpuXID:        cv("sluice_gpu_xid_errors_total", "Critical XID events seen per GPU and code.", "gpu", "xid"),
		repStale:      gv("sluice_replica_telemetry_stale", "1 while the replica's last good scrape is older than gpu.stale_after.", "replica"),
		repState:      gv("sluice_replica_health_state", "Replica health: 0 healthy, 1 degraded, 2 draining, 3 down.", "replica"),
		capacity:      gv("sluice_replica_capacity_tokens", "Replica token capacity K_r used by the dispatch gate.", "replica"),
		overcommit:    gv("sluice_replica_overcommit_ratio", "AIMD overcommit factor of the replica's capacity.", "replica"),
		busy:          cv("sluice_replica_gpu_busy_seconds_total", "Metered busy GPU time of the replica, in GPU-seconds.", "replica"),
		unattributed:  cv("sluice_replica_gpu_unattributed_seconds_total", "Busy GPU time attributed to no local request (idle intervals, other instances).", "replica"),
		energy:        cv("sluice_replica_gpu_energy_joules_total", "Metered GPU energy of the replica.", "replica"),
		unattributedJ: cv("sluice_replica_gpu_unattributed_joules_total", "GPU energy attributed to no local request (intervals without work, other instances).", "replica"),
	}
	m.stale = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_gpu_telemetry_stale",
		Help: "1 while the last good GPU telemetry sample is older than gpu.stale_after."},
		func() float64 { _, st := m.telemetryNow(); return b2f(st) })
	m.age = prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sluice_gpu_telemetry_age_seconds",
		Help: "Age of the last good GPU telemetry sample, computed at scrape time."},
		func() float64 { a, _ := m.telemetryNow(); return a })
	if reg == nil {
		return m, nil
	}
	var errs []error
	for _, c := range []prometheus.Collector{m.gpuUtil, m.gpuMem, m.gpuTemp, m.gpuPower, m.gpuXID, m.stale, m.age,
		m.repStale, m.repState, m.capacity, m.overcommit, m.busy, m.unattributed, m.energy, m.unattributedJ} {
		errs = append(errs, reg.Register(c))
	}
	if err := errors.Join(errs...); err != nil {
		return nil, err
	}
	return m, nil
}

// AttributionMetrics are the per-tenant GPU series: GPU time and energy,
// fed by the replicas' [Clock]s as each sample interval closes, and the
// overrun beyond holds, fed by the scheduler at settlement. Safe for
// concurrent use.
type AttributionMetrics struct {
	gpuMs   *prometheus.CounterVec
	joules  *prometheus.CounterVec
	overrun *prometheus.CounterVec
	// gpuMsOf and joulesOf cache the tenants' children of gpuMs and joules:
	// add runs at every interval close (every request's end without a busy
	// signal), and a label lookup hashes and checks the tenant each time.
	gpuMsOf, joulesOf sync.Map // tenant → prometheus.Counter
}

// child returns vec's child for tenant, cached in m.
func child(m *sync.Map, vec *prometheus.CounterVec, tenant string) prometheus.Counter {
	if c, ok := m.Load(tenant); ok {
		return c.(prometheus.Counter)
	}
	c, _ := m.LoadOrStore(tenant, vec.WithLabelValues(tenant))
	return c.(prometheus.Counter)
}

// NewAttributionMetrics registers sluice_tenant_gpu_ms_total{tenant},
// sluice_tenant_gpu_joules_total{tenant} and
// sluice_gpu_ms_overrun_total{tenant} on reg.
func NewAttributionMetrics(reg prometheus.Registerer) (*AttributionMetrics, error) {
	a := &AttributionMetrics{
		gpuMs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_tenant_gpu_ms_total",
			Help: "Busy GPU-milliseconds attributed to the tenant's requests, per closed sample interval."}, []string{"tenant"}),
		joules: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_tenant_gpu_joules_total",
			Help: "GPU energy attributed to the tenant's requests, per closed sample interval."}, []string{"tenant"}),
		overrun: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_gpu_ms_overrun_total",
			Help: "GPU-milliseconds settled beyond the request's hold."}, []string{"tenant"}),
	}
	if reg != nil {
		if err := errors.Join(reg.Register(a.gpuMs), reg.Register(a.joules), reg.Register(a.overrun)); err != nil {
			return nil, err
		}
	}
	return a, nil
}

// add records one interval's attribution to tenant (exported unrounded).
func (a *AttributionMetrics) add(tenant string, u Use) {
	if u.GPUNs > 0 {
		child(&a.gpuMsOf, a.gpuMs, tenant).Add(float64(u.GPUNs) / 1e6)
	}
	if u.EnergyUJ > 0 {
		child(&a.joulesOf, a.joules, tenant).Add(float64(u.EnergyUJ) / 1e6)
	}
}

// Overrun records a settled request's GPU-ms beyond its hold.
func (a *AttributionMetrics) Overrun(tenant string, overrunMs int64) {
	if a == nil || overrunMs <= 0 {
		return
	}
	a.overrun.WithLabelValues(tenant).Add(float64(overrunMs))
}
