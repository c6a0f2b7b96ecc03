package sim

import (
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
)

// TestEnergyCounterIsIdlePlusBusyPower: sim_gpu_energy_joules_total is
// 70 W × the time since start + 630 W × busy time, and sim_gpu_power_watts
// is 70 W + 630 W × the utilisation window's busy fraction (fake time).
func TestEnergyCounterIsIdlePlusBusyPower(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		cfg := DefaultConfig()
		cfg.DecodeStep = 10 * time.Millisecond
		b := newBubble(t, cfg)
		start := time.Now()
		b.do(t.Context(), "/v1/completions", `{"model":"sim-model","prompt":"a","max_tokens":20,"ignore_eos":true}`, "e1")
		synctest.Wait()
		for b.r.Stats().Completed < 1 {
			time.Sleep(time.Millisecond)
			synctest.Wait()
		}
		time.Sleep(2 * time.Second) // idle: 70 W only
		busy := b.r.Stats().BusyTime
		elapsed := time.Since(start)
		want := 70*elapsed.Seconds() + 630*busy.Seconds()
		m := scrapeGatherer(t, b.r)
		assert.InDelta(t, want, m.value(t, "sim_gpu_energy_joules_total"), 1e-9)
		assert.InDelta(t, want, b.r.EnergyJoules(), 1e-9)
		assert.Greater(t, busy, 190*time.Millisecond, "20 steps of 10 ms ran")
		window := min(utilWindow, elapsed)
		assert.InDelta(t, 70+630*busy.Seconds()/window.Seconds(), m.value(t, "sim_gpu_power_watts"), 1e-6)
		b.stop()
	})
}
