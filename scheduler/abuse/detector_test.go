package abuse

import (
	"fmt"
	"math/rand/v2"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// t0 is a whole number of minutes since the epoch, so 30s windows align.
var t0 = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC)

// fakeClock is a manual clock, safe for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func newClock() *fakeClock { return &fakeClock{now: t0} }

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	defer c.mu.Unlock()
	c.now = c.now.Add(d)
}

func newDetector(t testing.TB, cfg Config, c *fakeClock) *Detector {
	t.Helper()
	d, err := New(cfg, c.Now)
	require.NoError(t, err)
	return d
}

var testClamp = Clamp{Concurrency: 1, MaxOutputTokens: 256, Duration: 10 * time.Minute}

// rateConfig has only the spend-rate detector: 10× baseline, no floor.
func rateConfig() Config {
	return Config{SpendRateFactor: 10, Clamp: testClamp}
}

// feed sends one Settled event of tokens per second for d (events at the
// current time, then each second), leaving the clock one second after the
// last event. It returns the decisions made.
func feed(d *Detector, c *fakeClock, tenant string, tokens int64, dur time.Duration) []Decision {
	var out []Decision
	for range int(dur / time.Second) {
		if dec, ok := d.Observe(tenant, Event{Kind: Settled, Tokens: tokens}); ok {
			out = append(out, dec)
		}
		c.Advance(time.Second)
	}
	return out
}

func TestSteadyTenantNeverClampedOverAnHour(t *testing.T) {
	t.Parallel()
	c := newClock()
	cfg := Config{
		SpendRateFactor: 4,
		GPUMsRateFactor: 4,
		// The floor is what a new tenant is judged by before it has a
		// baseline: here half its mean rate.
		MinRate:         Rates{TokensPerSecond: 500, USDMicrosPerSecond: 1000, GPUMsPerSecond: 2500},
		MaxCapBurst:     MaxCapBurst{Count: 40, Share: 0.5},
		DisconnectShare: DisconnectShare{Share: 0.3, MinCount: 20},
		Denials:         30,
		Clamp:           testClamp,
	}
	d := newDetector(t, cfg, c)
	rng := rand.New(rand.NewPCG(1, 2))
	var decisions []Decision
	obs := func(ev Event) {
		if dec, ok := d.Observe("steady", ev); ok {
			decisions = append(decisions, dec)
		}
	}
	// Ten requests a second on average, each 50..350 tokens, the rate
	// swinging ±50% over a slow cycle; a few at the cap, a few
	// disconnects, a few denials.
	for i := range 36000 {
		swing := 1 + 0.5*float64((i/600)%3-1)
		if rng.Float64() < swing*0.5 {
			obs(Event{Kind: Admitted, AtCap: rng.Float64() < 0.1})
			tok := 50 + rng.Int64N(300)
			ev := Event{Kind: Settled, Tokens: tok, USDMicros: 2 * tok, GPUMs: 5 * tok}
			if rng.Float64() < 0.05 {
				ev.Kind = Disconnected
			}
			obs(ev)
		}
		if rng.Float64() < 0.01 {
			obs(Event{Kind: Denied})
		}
		c.Advance(100 * time.Millisecond)
	}
	assert.Empty(t, decisions, "a steady tenant must never be clamped")
	_, known := d.tenants["steady"].baselineLocked()
	assert.True(t, known, "after an hour the tenant must have a baseline")
}

func TestJumpTo20xClampedWithinWindow(t *testing.T) {
	t.Parallel()
	c := newClock()
	d := newDetector(t, rateConfig(), c)
	require.Empty(t, feed(d, c, "a", 200, 15*time.Minute))
	jump := c.Now()
	got := feed(d, c, "a", 4000, time.Minute)
	require.Len(t, got, 1, "exactly one decision while the clamp is in force")
	dec := got[0]
	// The window holds 30 seconds: after n seconds at 4000/s it averages
	// (6000 + 3800n)/30, above 2000/s from n = 15, i.e. 14s after the jump.
	assert.Equal(t, 14*time.Second, dec.At.Sub(jump), "decision time after the jump")
	assert.LessOrEqual(t, dec.At.Sub(jump), 30*time.Second, "within the detector window")
	assert.Equal(t, Decision{
		Tenant:    "a",
		Detector:  DetectorSpendRate,
		Reason:    "tokens rate 10.5× baseline (2100/s vs 200/s over 30s)",
		Clamp:     testClamp,
		At:        jump.Add(14 * time.Second),
		ExpiresAt: jump.Add(14*time.Second + 10*time.Minute),
	}, dec)
}

func TestClampExpiresOnTime(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		afterJump  int64 // tokens/s after the decision
		wantRefire bool
	}{
		{name: "abuse continues: clamped again exactly at expiry", afterJump: 4000, wantRefire: true},
		{name: "back to normal: no new clamp", afterJump: 200, wantRefire: false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newClock()
			d := newDetector(t, rateConfig(), c)
			require.Empty(t, feed(d, c, "a", 200, 15*time.Minute))
			first := feed(d, c, "a", 4000, 15*time.Second)
			require.Len(t, first, 1)
			// Right up to expiry: silent whatever the traffic.
			quiet := feed(d, c, "a", tt.afterJump, first[0].ExpiresAt.Sub(c.Now()))
			assert.Empty(t, quiet, "no decision while the clamp is in force")
			assert.Equal(t, first[0].ExpiresAt, c.Now())
			after := feed(d, c, "a", tt.afterJump, 5*time.Minute)
			if !tt.wantRefire {
				assert.Empty(t, after)
				return
			}
			require.NotEmpty(t, after)
			assert.Equal(t, first[0].ExpiresAt, after[0].At, "re-armed exactly at expiry")
			assert.Equal(t, "tokens rate 20.0× baseline (4000/s vs 200/s over 30s)", after[0].Reason,
				"the baseline is the one frozen at the first decision, not the clamped traffic")
		})
	}
}

// TestDetectorsFireAtThreshold runs each detector alone on a fresh tenant
// (no baseline) within one window: at the threshold it fires on the last
// event with the exact reason; just below it does not.
func TestDetectorsFireAtThreshold(t *testing.T) {
	t.Parallel()
	n := func(k int, ev Event) []Event {
		out := make([]Event, k)
		for i := range out {
			out[i] = ev
		}
		return out
	}
	cat := func(a ...[]Event) []Event {
		var out []Event
		for _, x := range a {
			out = append(out, x...)
		}
		return out
	}
	adm, capd := Event{Kind: Admitted}, Event{Kind: Admitted, AtCap: true}
	set, disc, deny := Event{Kind: Settled}, Event{Kind: Disconnected}, Event{Kind: Denied}
	capCfg := Config{MaxCapBurst: MaxCapBurst{Count: 10, Share: 0.5}, Clamp: testClamp}
	discCfg := Config{DisconnectShare: DisconnectShare{Share: 0.5, MinCount: 20}, Clamp: testClamp}
	denyCfg := Config{Denials: 5, Clamp: testClamp}
	floorCfg := Config{
		SpendRateFactor: 10, GPUMsRateFactor: 10, Clamp: testClamp,
		MinRate: Rates{TokensPerSecond: 100, USDMicrosPerSecond: 1000, GPUMsPerSecond: 50},
	}
	tests := []struct {
		name         string
		cfg          Config
		events       []Event
		wantDetector string // "" = no decision
		wantReason   string
	}{
		{name: "cap burst at count and share", cfg: capCfg, events: cat(n(10, adm), n(10, capd)),
			wantDetector: DetectorMaxCapBurst,
			wantReason:   "10 of 20 admissions at the max output cap within 30s (threshold 10, min share 0.50)"},
		{name: "cap burst one below count", cfg: capCfg, events: n(9, capd)},
		{name: "cap burst below share", cfg: capCfg, events: cat(n(11, adm), n(10, capd))},
		{name: "disconnects at share", cfg: discCfg, events: cat(n(10, set), n(10, disc)),
			wantDetector: DetectorDisconnectShare,
			wantReason:   "client disconnects were 10 of 20 finished requests (50%) within 30s (threshold 50%, min 20)"},
		{name: "disconnects below share", cfg: discCfg, events: cat(n(11, set), n(9, disc))},
		{name: "disconnects below min count", cfg: discCfg, events: n(19, disc)},
		{name: "denials at threshold", cfg: denyCfg, events: n(5, deny),
			wantDetector: DetectorDenials, wantReason: "5 budget denials within 30s (threshold 5)"},
		{name: "denials below threshold", cfg: denyCfg, events: n(4, deny)},
		{name: "tokens above floor × factor", cfg: floorCfg, events: n(1, Event{Kind: Settled, Tokens: 30001}),
			wantDetector: DetectorSpendRate,
			wantReason:   "tokens rate 10.0× floor (1000/s vs min_rate 100/s over 30s; baseline below floor or not yet known)"},
		{name: "tokens at floor × factor", cfg: floorCfg, events: n(1, Event{Kind: Settled, Tokens: 30000})},
		{name: "usd above floor × factor", cfg: floorCfg, events: n(2, Event{Kind: Disconnected, USDMicros: 150001}),
			wantDetector: DetectorSpendRate,
			wantReason:   "usd_micros rate 10.0× floor (10000/s vs min_rate 1000/s over 30s; baseline below floor or not yet known)"},
		{name: "usd at floor × factor", cfg: floorCfg, events: n(1, Event{Kind: Settled, USDMicros: 300000})},
		{name: "gpu above floor × factor", cfg: floorCfg, events: n(1, Event{Kind: Settled, GPUMs: 16500}),
			wantDetector: DetectorGPUMsRate,
			wantReason:   "gpu_ms rate 11.0× floor (550/s vs min_rate 50/s over 30s; baseline below floor or not yet known)"},
		{name: "gpu at floor × factor", cfg: floorCfg, events: n(1, Event{Kind: Settled, GPUMs: 15000})},
		{name: "no floor and no baseline: rates not judged", cfg: rateConfig(), events: n(1, Event{Kind: Settled, Tokens: 1 << 40})},
		{name: "admissions carry no spend", cfg: floorCfg, events: n(1, Event{Kind: Admitted, Tokens: 1 << 40})},
		{name: "unknown kind ignored", cfg: denyCfg, events: n(10, Event{Kind: 99})},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newClock()
			d := newDetector(t, tt.cfg, c)
			var got []Decision
			for i, ev := range tt.events {
				if dec, ok := d.Observe("x", ev); ok {
					got = append(got, dec)
					assert.Equal(t, len(tt.events)-1, i, "fires on the last event, got event %d", i)
				}
			}
			if tt.wantDetector == "" {
				assert.Empty(t, got)
				return
			}
			require.Len(t, got, 1)
			assert.Equal(t, tt.wantDetector, got[0].Detector)
			assert.Equal(t, tt.wantReason, got[0].Reason)
		})
	}
}

func TestCountsSlideOutOfTheWindow(t *testing.T) {
	t.Parallel()
	c := newClock()
	d := newDetector(t, Config{Denials: 5, Clamp: testClamp}, c)
	// One denial every 10s: a 30s window never holds more than 3.
	for range 100 {
		_, ok := d.Observe("x", Event{Kind: Denied})
		require.False(t, ok)
		c.Advance(10 * time.Second)
	}
	// Five within 29s do fire.
	for i := range 5 {
		_, ok := d.Observe("x", Event{Kind: Denied})
		assert.Equal(t, i == 4, ok, "event %d", i)
		c.Advance(7 * time.Second)
	}
}

func TestBaselineAndFloor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		floor      float64
		history    time.Duration // at 20 tokens/s
		burst      int64         // tokens/s for a minute after
		wantReason string        // "" = no decision
	}{
		{name: "new tenant, no floor: never rate-clamped", history: 0, burst: 1e6},
		{name: "history shorter than the baseline, no floor", history: 9 * time.Minute, burst: 1e6},
		{name: "new tenant judged against the floor", floor: 100, history: 0, burst: 2000,
			wantReason: "tokens rate 10.7× floor (1067/s vs min_rate 100/s over 30s; baseline below floor or not yet known)"},
		{name: "baseline below the floor: floor wins", floor: 100, history: 15 * time.Minute, burst: 500},
		{name: "baseline above the floor: baseline wins", floor: 10, history: 15 * time.Minute, burst: 400,
			wantReason: "tokens rate 10.5× baseline (210/s vs 20/s over 30s)"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := newClock()
			cfg := rateConfig()
			cfg.MinRate.TokensPerSecond = tt.floor
			d := newDetector(t, cfg, c)
			require.Empty(t, feed(d, c, "x", 20, tt.history))
			got := feed(d, c, "x", tt.burst, time.Minute)
			if tt.wantReason == "" {
				assert.Empty(t, got)
				return
			}
			require.Len(t, got, 1)
			assert.Equal(t, tt.wantReason, got[0].Reason)
		})
	}
}

func TestLiftedStartsCooldown(t *testing.T) {
	t.Parallel()
	c := newClock()
	cfg := rateConfig()
	cfg.Cooldown = 2 * time.Minute
	cfg.Clamp.Duration = time.Hour
	d := newDetector(t, cfg, c)
	require.Empty(t, feed(d, c, "a", 200, 15*time.Minute))
	require.Len(t, feed(d, c, "a", 4000, 15*time.Second), 1)
	// Long enough under the clamp that the whole baseline range is
	// clamped time: only the baseline frozen at the decision is left.
	require.Empty(t, feed(d, c, "a", 4000, 15*time.Minute))
	_, known := d.tenants["a"].baselineLocked()
	require.True(t, known, "frozen baseline stands in")
	d.Lifted("a")
	lift := c.Now()
	// The operator accepted the new level: no decision during the
	// cool-down, and after it the baseline learns 4000/s rather than
	// comparing with the old 200/s.
	got := feed(d, c, "a", 4000, 30*time.Minute)
	assert.Empty(t, got, "an operator's lift is respected")
	base, known := d.tenants["a"].baselineLocked()
	require.True(t, known)
	assert.InDelta(t, 4000, base[0], 0.001, "baseline learned after the lift")
	// A real jump from the new level is still caught.
	got = feed(d, c, "a", 80000, time.Minute)
	require.Len(t, got, 1)
	assert.Greater(t, got[0].At.Sub(lift), cfg.Cooldown)
}

func TestCooldownBlocksEarlyDecision(t *testing.T) {
	t.Parallel()
	c := newClock()
	cfg := Config{Denials: 5, Cooldown: 2 * time.Minute, Clamp: testClamp}
	d := newDetector(t, cfg, c)
	deny := func() bool { _, ok := d.Observe("a", Event{Kind: Denied}); return ok }
	for range 4 {
		require.False(t, deny())
	}
	require.True(t, deny())
	c.Advance(time.Minute)
	d.Lifted("a")
	lift := c.Now()
	for c.Now().Before(lift.Add(cfg.Cooldown)) {
		for range 10 {
			require.False(t, deny(), "at %s after the lift", c.Now().Sub(lift))
		}
		c.Advance(time.Second)
	}
	assert.True(t, deny(), "re-armed when the cool-down ends")
}

func TestClampedByOperatorSuppresses(t *testing.T) {
	t.Parallel()
	c := newClock()
	d := newDetector(t, Config{Denials: 5, Clamp: testClamp}, c)
	until := c.Now().Add(5 * time.Minute)
	d.Clamped("a", until)
	for c.Now().Before(until) {
		_, ok := d.Observe("a", Event{Kind: Denied})
		require.False(t, ok, "no auto clamp over an operator's clamp")
		c.Advance(time.Second)
	}
	dec, ok := d.Observe("a", Event{Kind: Denied})
	require.True(t, ok)
	assert.Equal(t, until, dec.At)

	// A clamp already over changes nothing.
	d.Clamped("b", c.Now())
	for range 4 {
		d.Observe("b", Event{Kind: Denied})
	}
	_, ok = d.Observe("b", Event{Kind: Denied})
	assert.True(t, ok)
}

func TestCheckWithoutEvent(t *testing.T) {
	t.Parallel()
	c := newClock()
	d := newDetector(t, Config{Denials: 3, Clamp: testClamp}, c)
	_, ok := d.Check("nobody")
	assert.False(t, ok, "unknown tenant")
	for range 3 {
		d.Observe("a", Event{Kind: Denied})
	}
	c.Advance(10 * time.Minute)
	d.Lifted("a")
	c.Advance(10 * time.Minute)
	_, ok = d.Check("a")
	assert.False(t, ok, "old denials slid out of the window")
}

func TestConfigurePerTenant(t *testing.T) {
	t.Parallel()
	c := newClock()
	d := newDetector(t, Config{}, c) // default: no detector
	require.NoError(t, d.Configure("strict", Config{Denials: 2, Clamp: testClamp}))
	for range 10 {
		_, ok := d.Observe("loose", Event{Kind: Denied})
		require.False(t, ok)
	}
	_, ok := d.Observe("strict", Event{Kind: Denied})
	require.False(t, ok)
	dec, ok := d.Observe("strict", Event{Kind: Denied})
	require.True(t, ok)
	assert.Equal(t, "strict", dec.Tenant)

	// Reconfiguring an existing tenant takes effect; a new window shape
	// drops its history.
	require.NoError(t, d.Configure("loose", Config{Denials: 11, Clamp: testClamp}))
	_, ok = d.Observe("loose", Event{Kind: Denied})
	assert.True(t, ok, "11 denials in the same window with the same shape")
	require.NoError(t, d.Configure("loose2", Config{}))
	for range 10 {
		d.Observe("loose2", Event{Kind: Denied})
	}
	require.NoError(t, d.Configure("loose2", Config{Window: 20 * time.Second, Denials: 11, Clamp: testClamp}))
	_, ok = d.Observe("loose2", Event{Kind: Denied})
	assert.False(t, ok, "history dropped with the new window")

	err := d.Configure("bad", Config{Window: -time.Second})
	require.Error(t, err)
	assert.Contains(t, err.Error(), `tenant "bad": abuse.window must be >= 1s`)

	d.Forget("strict")
	_, ok = d.Observe("strict", Event{Kind: Denied})
	assert.False(t, ok, "forgotten tenant falls back to the default config")
}

func TestDecisionModelsAreACopy(t *testing.T) {
	t.Parallel()
	c := newClock()
	d := newDetector(t, Config{Denials: 1, Clamp: Clamp{Models: []string{"small"}}}, c)
	dec, ok := d.Observe("a", Event{Kind: Denied})
	require.True(t, ok)
	dec.Clamp.Models[0] = "changed"
	assert.Equal(t, []string{"small"}, d.def.cfg.Clamp.Models)
	assert.Equal(t, 10*time.Minute, dec.Clamp.Duration, "default duration")
}

func TestConcurrentObserveOneDecisionPerTenant(t *testing.T) {
	t.Parallel()
	c := newClock()
	d := newDetector(t, Config{Denials: 50, Clamp: testClamp}, c)
	const tenants, workers, each = 4, 8, 200
	var mu sync.Mutex
	count := map[string]int{}
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := range each {
				name := fmt.Sprintf("t%d", (w+i)%tenants)
				if dec, ok := d.Observe(name, Event{Kind: Denied}); ok {
					mu.Lock()
					count[dec.Tenant]++
					mu.Unlock()
				}
				if i%50 == 0 {
					d.Check(name)
					c.Advance(time.Second)
				}
			}
		})
	}
	wg.Wait()
	assert.Equal(t, map[string]int{"t0": 1, "t1": 1, "t2": 1, "t3": 1}, count)
}

func TestObserveDoesNotAllocate(t *testing.T) {
	c := newClock()
	d := newDetector(t, Config{SpendRateFactor: 10, GPUMsRateFactor: 10, Denials: 1 << 40,
		MaxCapBurst: MaxCapBurst{Count: 1 << 40}, DisconnectShare: DisconnectShare{Share: 1, MinCount: 1 << 40},
		MinRate: Rates{TokensPerSecond: 1e12}, Clamp: testClamp}, c)
	d.Observe("a", Event{Kind: Admitted})
	allocs := testing.AllocsPerRun(1000, func() {
		d.Observe("a", Event{Kind: Settled, Tokens: 100, USDMicros: 10, GPUMs: 500})
		d.Observe("a", Event{Kind: Admitted, AtCap: true})
		c.Advance(300 * time.Millisecond)
	})
	assert.Zero(t, allocs, "allocations per Observe pair")
}
