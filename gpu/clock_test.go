package gpu

import (
	"math"
	"math/big"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

var c0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return c0.Add(d) }

func TestClockProcessorSharing(t *testing.T) {
	t.Parallel()
	// g = 2, u = 0.5: the replica does 1 GPU-second per second.
	c := NewClock(2, c0)
	c.SetUtilization(c0, 0.5)
	a := c.Start(at(0))
	b := c.Start(at(time.Second))
	assert.Equal(t, int64(1_500_000_000), c.End(at(2*time.Second), a), "alone 1 s + shared 1 s")
	assert.Equal(t, int64(500_000_000), c.Elapsed(at(2*time.Second), b))
	assert.Equal(t, int64(2_500_000_000), c.End(at(4*time.Second), b), "shared 1 s + alone 2 s")
	c.SetUtilization(at(5*time.Second), 1) // idle but busy: unattributed from 4 s... u was 0.5 over 4–5 s
	got := c.Totals(at(6 * time.Second))
	assert.Equal(t, ClockTotals{BusyGPUNs: 4e9 + 1e9 + 2e9, UnattributedGPUNs: 1e9 + 2e9}, got)
	assert.Equal(t, int64(3), GPUMs(3_499_999))
	assert.Equal(t, int64(4), GPUMs(3_500_000))
	assert.Equal(t, int64(0), GPUMs(499_999))
	assert.Equal(t, int64(0), GPUMs(-5))
}

func TestClockUnknownUtilizationIsBusyWhileRunning(t *testing.T) {
	t.Parallel()
	c := NewClock(4, c0)
	c.SetUtilization(c0, -1)
	a := c.Start(at(time.Second))
	assert.Equal(t, int64(8e9), c.End(at(3*time.Second), a), "4 GPUs × 2 s")
	assert.Equal(t, ClockTotals{BusyGPUNs: 8e9}, c.Totals(at(10*time.Second)))
	c.SetUtilization(at(10*time.Second), math.NaN())
	c.SetUtilization(at(10*time.Second), 7) // clamped to 1
	a = c.Start(at(10 * time.Second))
	assert.Equal(t, int64(4e9), c.End(at(11*time.Second), a))
}

func TestClockSharedReplicaFloorsAtVLLMRunning(t *testing.T) {
	t.Parallel()
	c := NewClock(1, c0)
	c.SetUtilization(c0, 1)
	c.SetExternalRunning(c0, 2) // another instance runs one more request
	a := c.Start(c0)
	assert.Equal(t, int64(5e8), c.End(at(time.Second), a), "half the GPU second")
	c.SetExternalRunning(at(time.Second), -3) // nonsense is floored at 0
	a = c.Start(at(time.Second))
	assert.Equal(t, int64(1e9), c.End(at(2*time.Second), a))
}

func TestClockIgnoresBackwardsTime(t *testing.T) {
	t.Parallel()
	c := NewClock(1, c0)
	c.SetUtilization(c0, 1)
	a := c.Start(at(time.Second))
	assert.Equal(t, int64(0), c.End(at(500*time.Millisecond), a))
	assert.Equal(t, int64(0), c.End(at(time.Second), Ticket{}), "End without Start does not go negative")
}

// TestClockConservationProperty: on random traces of dispatches,
// completions, utilisation changes and time steps, Σ per-request GPU-ns
// equals ∫u·g dt over the time with running requests, exactly up to the
// carried residue (< n GPU-ns), and unattributed time is the rest.
func TestClockConservationProperty(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		g := rapid.IntRange(1, 8).Draw(rt, "g")
		c := NewClock(g, c0)
		now := c0
		var running []Ticket
		var attributed int64
		uPPM := int64(0)
		auto := false
		refAtt, refAll := new(big.Int), new(big.Int) // in ppm·GPU-ns
		maxN := 0
		steps := rapid.IntRange(1, 400).Draw(rt, "steps")
		for range steps {
			switch rapid.IntRange(0, 3).Draw(rt, "op") {
			case 0:
				running = append(running, c.Start(now))
				maxN = max(maxN, len(running))
			case 1:
				if len(running) > 0 {
					i := rapid.IntRange(0, len(running)-1).Draw(rt, "i")
					attributed += c.End(now, running[i])
					running = append(running[:i], running[i+1:]...)
				}
			case 2:
				if rapid.IntRange(0, 9).Draw(rt, "unknown") == 0 {
					c.SetUtilization(now, -1)
					auto = true
				} else {
					u := rapid.Float64Range(0, 1).Draw(rt, "u")
					c.SetUtilization(now, u)
					uPPM, auto = int64(math.Round(u*1e6)), false
				}
			case 3:
				dt := time.Duration(rapid.Int64Range(0, int64(3*time.Second)).Draw(rt, "dt"))
				u := uPPM
				if auto {
					u = 0
					if len(running) > 0 {
						u = 1e6
					}
				}
				num := new(big.Int).Mul(big.NewInt(u*int64(g)), big.NewInt(int64(dt)))
				refAll.Add(refAll, num)
				if len(running) > 0 {
					refAtt.Add(refAtt, num)
				}
				now = now.Add(dt)
			}
		}
		for _, tk := range running {
			attributed += c.End(now, tk)
		}
		want := new(big.Int).Quo(refAtt, big.NewInt(1e6)).Int64()
		tot := c.Totals(now)
		if attributed > want || attributed < want-int64(maxN)-1 {
			rt.Fatalf("Σ attributed %d GPU-ns, ∫u·g dt while running %d (max n %d)", attributed, want, maxN)
		}
		wantAll := new(big.Int).Quo(refAll, big.NewInt(1e6)).Int64()
		if tot.BusyGPUNs != wantAll {
			rt.Fatalf("busy %d, want %d", tot.BusyGPUNs, wantAll)
		}
		wantUnatt := new(big.Int).Quo(new(big.Int).Sub(refAll, refAtt), big.NewInt(1e6)).Int64()
		if d := tot.UnattributedGPUNs - wantUnatt; d < -1 || d > 1 {
			rt.Fatalf("unattributed %d, want %d", tot.UnattributedGPUNs, wantUnatt)
		}
		// The bar: within 1 % of busy GPU time (it is exact here).
		if want > 1e6 && math.Abs(float64(attributed-want)) > 0.01*float64(want) {
			rt.Fatalf("conservation off by more than 1%%: %d vs %d", attributed, want)
		}
	})
}

func TestEstimatorLearnsCoefficients(t *testing.T) {
	t.Parallel()
	e := NewEstimator(0.05, 0.5, 0.99)
	a, b := e.Coefficients()
	assert.InDelta(t, 0.05, a, 1e-12)
	assert.InDelta(t, 0.5, b, 1e-12)
	// True cost: 0.02 GPU-ms per input token, 1.3 per output token.
	for i := range 300 {
		in, out := int64(100+(i*7919)%4000), int64(10+(i*104729)%1000)
		e.Observe(in, out, 0.02*float64(in)+1.3*float64(out))
	}
	// The seed's weight decays as λ^n, leaving a bias under 1 % (seed a was 150 % off).
	a, b = e.Coefficients()
	assert.InEpsilon(t, 0.02, a, 1e-2)
	assert.InEpsilon(t, 1.3, b, 1e-3)
	assert.InDelta(t, 0.02*2000+1.3*100, e.Estimate(2000, 100), 0.5)

	// Forgetting tracks a change (e.g. a slower model swapped in).
	for i := range 500 {
		in, out := int64(100+(i*7919)%4000), int64(10+(i*104729)%1000)
		e.Observe(in, out, 0.04*float64(in)+2*float64(out))
	}
	a, b = e.Coefficients()
	assert.InEpsilon(t, 0.04, a, 1e-2)
	assert.InEpsilon(t, 2.0, b, 5e-3)
}

func TestEstimatorClampsAndIgnoresJunk(t *testing.T) {
	t.Parallel()
	e := NewEstimator(-1, 0.5, 1)
	a, _ := e.Coefficients()
	assert.InDelta(t, 0.0, a, 0, "negative seed clamped")
	for i := range 200 {
		in, out := int64(1000+i), int64(10+i%50)
		// Input tokens "cost" negative time: a must stay ≥ 0.
		e.Observe(in, out, math.Max(0, 2*float64(out)-0.01*float64(in)))
		a, b := e.Coefficients()
		require.GreaterOrEqual(t, a, 0.0)
		require.GreaterOrEqual(t, b, 0.0)
	}
	before := *e.coef.Load()
	e.Observe(0, 0, 5)
	e.Observe(10, 10, math.NaN())
	e.Observe(10, 10, math.Inf(1))
	e.Observe(-1, 10, 5)
	e.Observe(10, 10, -1)
	assert.Equal(t, before, *e.coef.Load())
}

func TestOverrunOf(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name        string
		factor      float64
		hold, used  int64
		wantOverrun int64
		wantAbort   bool
	}{
		{"under hold", 0, 100, 80, 0, false},
		{"over hold, abort off", 0, 100, 500, 400, false},
		{"over hold, below factor", 2, 100, 200, 100, false},
		{"past factor", 2, 100, 201, 101, true},
		{"no hold never aborts", 2, 0, 50, 50, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			cfg := Config{GPUMsAbortFactor: tt.factor}
			o, ab := cfg.OverrunOf(tt.hold, tt.used)
			assert.Equal(t, tt.wantOverrun, o)
			assert.Equal(t, tt.wantAbort, ab)
		})
	}
}

func TestConfigValidateNamesFields(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"defaults are valid", Config{}, nil},
		{"bad mode", Config{Telemetry: "dcgm"}, []string{`gpu.telemetry must be auto, nvml, vllm or off, got "dcgm"`}},
		{"several", Config{DegradedFactor: 1.5, GPUMsMargin: 0.5, GPUMsAbortFactor: 0.5}, []string{
			"gpu.degraded_factor must be in (0, 1]", "gpu.gpu_ms_margin must be ≥ 1", "gpu.gpu_ms_abort_factor must be 0 (off) or ≥ 1"}},
		{"replicas", Config{Replicas: []Replica{
			{Name: "a", GPUs: []string{"GPU-1", ""}}, {Name: "a", GPUs: []string{"GPU-1"}}, {CapacityTokens: -1}}}, []string{
			`gpu.replicas[0].gpus[1] is empty`,
			`gpu.replicas[1].name "a" is a duplicate`,
			`gpu.replicas[1].gpus[0] "GPU-1" is already used by replica "a"`,
			`gpu.replicas[2].name is required`,
			`gpu.replicas[2] (): gpu_count, capacity_tokens and gpu_ms coefficients must be ≥ 0`}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			err := tt.cfg.WithDefaults().Validate()
			if tt.want == nil {
				require.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tt.want {
				assert.Contains(t, err.Error(), w)
			}
		})
	}
}

func TestReplicaGPUCount(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 1, Replica{}.gpuCount())
	assert.Equal(t, 2, Replica{GPUs: []string{"0", "1"}}.gpuCount())
	assert.Equal(t, 4, Replica{GPUs: []string{"0"}, GPUCount: 4}.gpuCount())
}
