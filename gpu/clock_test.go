package gpu

import (
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"pgregory.net/rapid"
)

var c0 = time.Date(2026, 11, 29, 12, 0, 0, 0, time.UTC)

func at(d time.Duration) time.Time { return c0.Add(d) }

// tally collects a clock's per-tenant sink.
type tally map[string]Use

func (tl tally) sink(tenant string, u Use) { tl[tenant] = tl[tenant].plus(u) }

func newTallied(g int) (*Clock, tally) {
	c, tl := NewClock(g, c0), tally{}
	c.sink = tl.sink
	return c, tl
}

// TestClockSplitsIntervalByRunningShare: an interval's metered busy time
// and energy go to the requests that ran in it, 1/n per instant; a request
// that ends mid-interval settles at the previous interval's rate and the
// meter gets its exact share when the interval closes.
func TestClockSplitsIntervalByRunningShare(t *testing.T) {
	t.Parallel()
	c, tl := newTallied(1)
	c.Close(at(0), Use{}) // sampled mode, baseline at 0
	a := c.Start(at(0), "acme")
	b := c.Start(at(500*time.Millisecond), "beta")
	// 0–1 s: the GPU was busy half the time and used 300 J. acme ran alone
	// for 0.5 s and shared 0.5 s: 0.75 of the interval; beta 0.25.
	c.Close(at(time.Second), Use{GPUNs: 5e8, EnergyUJ: 300e6})
	assert.Equal(t, tally{"acme": {3.75e8, 225e6}, "beta": {1.25e8, 75e6}}, tl)
	// acme ends at 1.5 s: its 0.25 s share since the close, at the last
	// interval's rate (0.5 busy), estimates 1.25e8 more GPU-ns and 75 J.
	assert.Equal(t, Use{GPUNs: 5e8, EnergyUJ: 300e6}, c.End(at(1500*time.Millisecond), a))
	// 1–2 s was fully busy (1e9 GPU-ns, 600 J): acme's share 0.25, beta's 0.75.
	c.Close(at(2*time.Second), Use{GPUNs: 1e9, EnergyUJ: 600e6})
	assert.Equal(t, tally{"acme": {6.25e8, 375e6}, "beta": {8.75e8, 525e6}}, tl)
	// beta: exact through 2 s, then 0.5 s alone at the intervals' weighted
	// rate: (0.8·0.5e9 + 1e9) / (0.8 + 1) s = 0.778 GPU-ns/ns, and
	// (0.8·300 + 600) J / 1.8 s = 466.7 W.
	assert.Equal(t, Use{GPUNs: 8.75e8 + 388_888_889, EnergyUJ: 525e6 + 233_333_333}, c.End(at(2500*time.Millisecond), b))
	assert.Equal(t, ClockTotals{BusyGPUNs: 1.5e9, EnergyUJ: 900e6}, c.Totals(), "nothing unattributed")
}

// TestClockIdleIsNeverCharged: an interval without work is unattributed,
// and a partly idle interval charges only the busy time the meter saw.
func TestClockIdleIsNeverCharged(t *testing.T) {
	t.Parallel()
	c, tl := newTallied(2)
	c.Close(at(0), Use{})
	c.Close(at(time.Second), Use{GPUNs: 3e8, EnergyUJ: 70e6}) // another process, or idle power
	a := c.Start(at(time.Second), "acme")
	assert.Equal(t, Use{GPUNs: 1e9}, c.End(at(1500*time.Millisecond), a), "before any interval with work: busy on both GPUs")
	c.Close(at(2*time.Second), Use{GPUNs: 4e8, EnergyUJ: 100e6})
	assert.Equal(t, tally{"acme": {4e8, 100e6}}, tl)
	assert.Equal(t, ClockTotals{BusyGPUNs: 7e8, UnattributedGPUNs: 3e8, EnergyUJ: 170e6, UnattributedEnergyUJ: 70e6}, c.Totals())
}

// TestClockClosesAtPastSampleTimes: a sample read before the scheduler
// heard of it closes the interval at its own time, so requests that ended
// or started after it are split exactly; a sample not after the last one
// is carried into the next interval.
func TestClockClosesAtPastSampleTimes(t *testing.T) {
	t.Parallel()
	c, tl := newTallied(1)
	c.Close(at(0), Use{})
	a := c.Start(at(0), "acme")
	c.End(at(time.Second), a)
	b := c.Start(at(1200*time.Millisecond), "beta")
	// At 2 s the scrape read at 1.1 s arrives: acme only.
	c.Close(at(1100*time.Millisecond), Use{GPUNs: 9e8})
	assert.Equal(t, tally{"acme": {GPUNs: 9e8}}, tl)
	c.Close(at(1100*time.Millisecond), Use{GPUNs: 1e6}) // a duplicate time: carried
	c.End(at(2*time.Second), b)
	c.Close(at(2*time.Second), Use{GPUNs: 8e8})
	assert.Equal(t, tally{"acme": {GPUNs: 9e8}, "beta": {GPUNs: 8.01e8}}, tl)
	assert.Equal(t, ClockTotals{BusyGPUNs: 1.701e9}, c.Totals())
}

// TestClockExactModeIsProcessorSharing: without a busy signal the replica
// is busy on every GPU while a request runs, and End is exact at once.
func TestClockExactModeIsProcessorSharing(t *testing.T) {
	t.Parallel()
	c, tl := newTallied(2)
	a := c.Start(at(0), "acme")
	b := c.Start(at(time.Second), "beta")
	assert.Equal(t, Use{GPUNs: 3e9}, c.End(at(2*time.Second), a), "alone 1 s × 2 GPUs + shared 1 s")
	assert.Equal(t, Use{GPUNs: 5e9}, c.End(at(4*time.Second), b), "shared 1 s + alone 2 s × 2 GPUs")
	c.CloseExact(at(5 * time.Second))
	assert.Equal(t, tally{"acme": {GPUNs: 3e9}, "beta": {GPUNs: 5e9}}, tl)
	assert.Equal(t, ClockTotals{BusyGPUNs: 8e9}, c.Totals(), "idle 4–5 s is not busy")
	assert.Equal(t, Use{}, c.End(at(6*time.Second), Ticket{}), "a zero ticket")
	assert.Equal(t, Use{GPUNs: 5e9}, c.End(at(6*time.Second), b), "a second End repeats the first")
}

func TestClockSharedReplicaFloorsAtVLLMRunning(t *testing.T) {
	t.Parallel()
	c, _ := newTallied(1)
	c.SetExternalRunning(c0, 2) // another instance runs one more request
	a := c.Start(c0, "acme")
	assert.Equal(t, Use{GPUNs: 5e8}, c.End(at(time.Second), a), "half the GPU second")
	c.SetExternalRunning(at(time.Second), -3) // nonsense is floored at 0
	a = c.Start(at(time.Second), "acme")
	assert.Equal(t, Use{GPUNs: 1e9}, c.End(at(2*time.Second), a))
	assert.Equal(t, ClockTotals{BusyGPUNs: 2e9, UnattributedGPUNs: 5e8}, c.Totals(), "the other instance's half")
}

func TestClockIgnoresBackwardsTime(t *testing.T) {
	t.Parallel()
	c, _ := newTallied(1)
	a := c.Start(at(time.Second), "acme")
	assert.Equal(t, Use{}, c.End(at(500*time.Millisecond), a))
}

// TestClockConservationProperty: on random traces of dispatches,
// completions, samples (some at past times, some duplicates) and time
// steps, Σ per-tenant attribution + unattributed = Σ metered amounts
// exactly; an interval without work is wholly unattributed and one with
// work loses at most rounding (1 unit per request and amount).
func TestClockConservationProperty(t *testing.T) {
	t.Parallel()
	rapid.Check(t, func(rt *rapid.T) {
		c, tl := newTallied(rapid.IntRange(1, 8).Draw(rt, "g"))
		c.Close(c0, Use{})
		now, closed := c0, c0
		var running []Ticket
		var metered Use
		var workNs time.Duration // running time since the last close
		live := 0                // requests that ran in the open interval
		steps := rapid.IntRange(1, 300).Draw(rt, "steps")
		for range steps {
			switch rapid.IntRange(0, 3).Draw(rt, "op") {
			case 0:
				running = append(running, c.Start(now, rapid.SampledFrom([]string{"a", "b", "c"}).Draw(rt, "tenant")))
				live++
			case 1:
				if len(running) > 0 {
					i := rapid.IntRange(0, len(running)-1).Draw(rt, "i")
					if u := c.End(now, running[i]); u.GPUNs < 0 || u.EnergyUJ < 0 {
						rt.Fatalf("negative settle figure %+v", u)
					}
					running = append(running[:i], running[i+1:]...)
				}
			case 2:
				q := Use{GPUNs: rapid.Int64Range(0, 4e9).Draw(rt, "busy"), EnergyUJ: rapid.Int64Range(0, 3e9).Draw(rt, "uj")}
				before := c.Totals()
				c.Close(now, q)
				after := c.Totals()
				metered = metered.plus(q)
				if now.After(closed) {
					un := after.UnattributedGPUNs - before.UnattributedGPUNs
					switch {
					case workNs == 0 && un != after.BusyGPUNs-before.BusyGPUNs:
						rt.Fatalf("an interval without work attributed %d of %d", after.BusyGPUNs-before.BusyGPUNs-un, after.BusyGPUNs-before.BusyGPUNs)
					case workNs >= time.Millisecond && un > int64(live):
						rt.Fatalf("an interval with work left %d GPU-ns unattributed (%d requests)", un, live)
					}
					closed, workNs, live = now, 0, len(running)
				}
			case 3:
				dt := time.Duration(rapid.Int64Range(0, int64(2*time.Second)).Draw(rt, "dt"))
				if len(running) > 0 {
					workNs += dt
				}
				now = now.Add(dt)
			}
		}
		for _, tk := range running {
			c.End(now, tk)
		}
		now = now.Add(time.Second)
		c.Close(now, Use{})
		var given Use
		for _, u := range tl {
			given = given.plus(u)
		}
		tot := c.Totals()
		if given.GPUNs+tot.UnattributedGPUNs != metered.GPUNs || tot.BusyGPUNs != metered.GPUNs {
			rt.Fatalf("GPU-ns: attributed %d + unattributed %d, busy %d, metered %d", given.GPUNs, tot.UnattributedGPUNs, tot.BusyGPUNs, metered.GPUNs)
		}
		if given.EnergyUJ+tot.UnattributedEnergyUJ != metered.EnergyUJ || tot.EnergyUJ != metered.EnergyUJ {
			rt.Fatalf("µJ: attributed %d + unattributed %d, metered %d", given.EnergyUJ, tot.UnattributedEnergyUJ, metered.EnergyUJ)
		}
		if len(c.runs) != 0 || len(c.log) > 2 {
			rt.Fatalf("after the last close %d runs and %d checkpoints remain", len(c.runs), len(c.log))
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

func TestConfigValidateNamesFields(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want []string
	}{
		{"defaults are valid", Config{}, nil},
		{"bad mode", Config{Telemetry: "dcgm"}, []string{`gpu.telemetry must be auto, nvml, vllm or off, got "dcgm"`}},
		{"several", Config{DegradedFactor: 1.5, GPUMsMargin: 0.5}, []string{
			"gpu.degraded_factor must be in (0, 1]", "gpu.gpu_ms_margin must be ≥ 1"}},
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
