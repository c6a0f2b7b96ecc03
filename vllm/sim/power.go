package sim

import (
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// The simulated board's power: P = powerIdleWatts + powerBusyWatts × u,
// u the busy fraction, so its energy counter is exactly
// powerIdleWatts × elapsed + powerBusyWatts × busy time. The figures are an
// H100 SXM's (about 70 W idle, 700 W at full load). NVML's counterpart is
// nvmlDeviceGetTotalEnergyConsumption (millijoules since the driver
// loaded); vLLM itself exports no power or energy metric, so these series
// are the simulator's own (sim_ prefix), like sim_gpu_busy_seconds_total.
const (
	powerIdleWatts = 70.0
	powerBusyWatts = 630.0
)

// powerModel derives power and energy from the engine's busy counter.
type powerModel struct {
	clk   Clock
	start time.Time
	busy  func() int64 // busy nanoseconds
	util  func() float64
}

// energyJoules is the energy used since the replica started.
func (p *powerModel) energyJoules() float64 {
	elapsed := p.clk.Now().Sub(p.start).Seconds()
	return powerIdleWatts*elapsed + powerBusyWatts*time.Duration(p.busy()).Seconds()
}

// watts is the power over the utilisation window.
func (p *powerModel) watts() float64 { return powerIdleWatts + powerBusyWatts*p.util() }

// collectors returns sim_gpu_energy_joules_total and sim_gpu_power_watts.
func (p *powerModel) collectors(labels prometheus.Labels) []prometheus.Collector {
	return []prometheus.Collector{
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sim_gpu_energy_joules_total",
			Help: "Simulated GPU energy since start: idle power x elapsed + busy power x busy time.", ConstLabels: labels}, p.energyJoules),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sim_gpu_power_watts",
			Help: "Simulated GPU board power over the utilisation window.", ConstLabels: labels}, p.watts),
	}
}

// EnergyJoules returns the replica's simulated GPU energy since it
// started, as sim_gpu_energy_joules_total (for tests).
func (r *Replica) EnergyJoules() float64 { return r.m.power.energyJoules() }
