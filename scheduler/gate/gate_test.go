package gate

import (
	"fmt"
	"math"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestWaterLevel(t *testing.T) {
	var g Gate
	cls := func(ws []float64, avgs ...float64) []gateCls {
		var cs []gateCls
		for i, a := range avgs {
			cs = append(cs, gateCls{avg: a, load: a, weight: ws[i], active: true})
		}
		return cs
	}
	ones := []float64{1, 1, 1, 1}
	assert.InDelta(t, 0.4, g.waterLevel(cls(ones, 0.2, 0.2, 0.2, 5)), 1e-12, "victims satisfied, the flood gets the rest")
	assert.True(t, math.IsInf(g.waterLevel(cls(ones, 0.2, 0.3, 0.4)), 1), "demands fit: nobody is heavy")
	assert.InDelta(t, 1.0/3, g.waterLevel(cls([]float64{2, 1}, 5, 5)), 1e-12, "2λ + λ = 1")
	assert.InDelta(t, 0.25, g.waterLevel(cls(ones, 1, 1, 1, 1)), 1e-12)
	inactive := cls(ones, 0.9, 0.9)
	inactive[1].active = false
	assert.True(t, math.IsInf(g.waterLevel(inactive), 1), "inactive tenants claim nothing")
}

func TestFitsBeyond(t *testing.T) {
	f := FleetLoad{Seqs: 27, SeqsCap: 32, Tokens: 0, TokensCap: 1000}
	assert.True(t, f.FitsBeyond(10, 0.1), "27 + 1 + ⌈3.2⌉ = 32 seqs, 10 + 100 tokens")
	f.Seqs = 28
	assert.False(t, f.FitsBeyond(10, 0.1), "the 29th sequence would eat the reserve")
	f.Seqs = 0
	assert.False(t, f.FitsBeyond(901, 0.1), "901 tokens + 100 reserved > 1000")
	assert.True(t, f.FitsBeyond(900, 0.1))
	assert.True(t, FleetLoad{Seqs: 32, SeqsCap: 32}.FitsBeyond(1, 0), "no reserve: the replica choice decides")
	// A learned batch of 8 probed to 9: the reserve is kept within the 8
	// the replica is known to run, so a heavy request never takes the
	// probe's sequence while light tenants have room reserved.
	p := FleetLoad{Seqs: 7, SeqsCap: 9, TokensCap: 1000, Probe: 1}
	assert.False(t, p.FitsBeyond(1, 0.1), "7 + 1 + ⌈0.9⌉ + 1 probed > 9")
	p.Seqs = 6
	assert.True(t, p.FitsBeyond(1, 0.1))
	assert.True(t, FleetLoad{Seqs: 8, SeqsCap: 9, Probe: 1}.FitsBeyond(1, 0), "no reserve: the probe goes ahead")
}

// BenchmarkGateAssess: one dispatch decision's share computation with
// every tenant active. full: the O(tenants) assessment (update averages and
// peaks, water level, reserve) each time; burst: decisions 10 µs apart, as
// in a dispatch burst, where the assessment is reused for assessEvery and
// only the candidate's load is read (amortized per decision).
func BenchmarkGateAssess(b *testing.B) {
	for _, n := range []int{12, 1000} {
		for _, mode := range []struct {
			name string
			step time.Duration
		}{{"full", time.Millisecond}, {"burst", 10 * time.Microsecond}} {
			b.Run(fmt.Sprintf("tenants=%d/%s", n, mode.name), func(b *testing.B) {
				loads := make([]TenantLoad, n)
				for i := range loads {
					loads[i] = TenantLoad{Name: fmt.Sprintf("t%04d", i), Weight: float64(1 + i%3), Held: int64(i % 5), Queued: int64(i % 7), Tokens: int64(100 * (i % 5))}
				}
				f := FleetLoad{Seqs: 200, SeqsCap: 256, Tokens: 20000, TokensCap: 1 << 20}
				var g Gate
				now := time.Now().UnixNano()
				b.ReportAllocs()
				i := 0
				for b.Loop() {
					now += int64(mode.step)
					if c := loads[i%n]; g.Fresh(now, c.Name) {
						g.DecideFresh(c, f)
					} else {
						g.Assess(now, loads, i%n, f, 0.1)
					}
					i++
				}
			})
		}
	}
}

// floodBeside samples a flood (4× a 32-sequence pool: 28 held, 100
// queued, or none held with floodHeld 0) and a light tenant holding 4
// sequences every 100 ms for 5 s, with no arrivals (no forecast), and
// returns the time of the last sample and the loads.
func floodBeside(g *Gate, floodHeld int64) (int64, []TenantLoad) {
	loads := []TenantLoad{
		{Name: "flood", Weight: 1, Held: floodHeld, Queued: 128 - floodHeld},
		{Name: "light", Weight: 1, Held: 4},
	}
	f := FleetLoad{Seqs: floodHeld + 4, SeqsCap: 32, TokensCap: 1 << 20}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for range 50 {
		now += int64(100 * time.Millisecond)
		g.Assess(now, loads, 0, f, 0)
	}
	return now, loads
}

// TestAssessReservesTheLightPeakAndItsNoise: the flood (load 4, level
// 0.875) is heavy and must leave the light tenant's peak (4 of 32) plus
// two Poisson standard deviations (2·√4 = 4 sequences), less the 4 it
// holds: 4/32 of the pool. The light tenant is never held back.
func TestAssessReservesTheLightPeakAndItsNoise(t *testing.T) {
	var g Gate
	now, loads := floodBeside(&g, 28)
	f := FleetLoad{Seqs: 32, SeqsCap: 32, TokensCap: 1 << 20}
	light, reserve := g.Assess(now, loads, 0, f, 0)
	assert.False(t, light, "the flood")
	assert.InDelta(t, 4.0/32, reserve, 1e-12, "peak 4/32 + 2·√(4)/32 − held 4/32")
	light, reserve = g.Assess(now, loads, 1, f, 0)
	assert.True(t, light)
	assert.Zero(t, reserve)
	assert.False(t, g.WithinShare("flood", 1))
	assert.True(t, g.WithinShare("light", 1))
	assert.True(t, g.WithinShare("unknown", 1), "a tenant the gate has not seen")

	// server.headroom is the least reserve while the light tenant has
	// demand; a negative Margin (server.reserve_margin: 0) drops the noise
	// margin.
	_, reserve = g.Assess(now, loads, 0, f, 0.2)
	assert.InDelta(t, 0.2, reserve, 1e-12)
	g2 := Gate{Margin: -1}
	now, loads = floodBeside(&g2, 28)
	_, reserve = g2.Assess(now, loads, 0, f, 0)
	assert.Zero(t, reserve, "the peak alone, all of it held")
	g4 := Gate{Margin: 4}
	now, loads = floodBeside(&g4, 28)
	_, reserve = g4.Assess(now, loads, 0, f, 0)
	assert.InDelta(t, 8.0/32, reserve, 1e-12, "peak 4/32 + 4·√(4)/32 − held 4/32")

	// server.reserve_cap bounds it, headroom included; negative (0 in
	// the configuration) keeps nothing free.
	gc := Gate{Cap: 0.1}
	now, loads = floodBeside(&gc, 28)
	_, reserve = gc.Assess(now, loads, 0, f, 0.2)
	assert.InDelta(t, 0.1, reserve, 1e-12)
	g0 := Gate{Cap: -1}
	now, loads = floodBeside(&g0, 28)
	_, reserve = g0.Assess(now, loads, 0, f, 0.2)
	assert.Zero(t, reserve)
}

// TestAssessNoiseInTheRequestsThePoolHolds: on a pool whose KV cache
// binds before its sequences (max_num_seqs left at 256, room for three
// requests of 1,000 tokens), the light tenant's peak of one request is a
// third of the pool, and its Poisson deviation is one request too: the
// flood must leave room for two more. Counted in the pool's 256
// sequences, the noise would be 2·√(1/3 · 1/256) ≈ 0.07 of the pool, no
// room at all, and the light tenant's second request would wait for a
// completion.
func TestAssessNoiseInTheRequestsThePoolHolds(t *testing.T) {
	var g Gate
	loads := []TenantLoad{
		{Name: "flood", Weight: 1, Held: 2, Queued: 100, Tokens: 2000},
		{Name: "light", Weight: 1, Held: 1, Tokens: 1000},
	}
	f := FleetLoad{Seqs: 3, SeqsCap: 256, Tokens: 3000, TokensCap: 3000}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for range 50 {
		now += int64(100 * time.Millisecond)
		g.Assess(now, loads, 1, f, 0)
	}
	light, reserve := g.Assess(now, loads, 0, f, 0)
	assert.False(t, light, "the flood")
	assert.InDelta(t, 2.0/3, reserve, 1e-9, "peak 1/3 + 2·√(1/3 · 1/3) − held 1/3: two requests")
	f.Tokens, f.Seqs = 2000, 2
	assert.False(t, f.FitsBeyond(1000, reserve), "the flood may not take the light tenant's second request's room")
}

// TestForecastInTheRequestsThePoolHolds: a tenant arriving at 2 per
// second with requests of 1 s (λ·W = 2 requests) on a pool whose KV cache
// holds three of them (max_num_seqs left at 256) offers two thirds of the
// pool, not 2/256: its size is remembered from when it held one.
func TestForecastInTheRequestsThePoolHolds(t *testing.T) {
	var g Gate
	l := TenantLoad{Name: "t", Weight: 1, Held: 1, Tokens: 1000}
	f := FleetLoad{SeqsCap: 256, TokensCap: 3000}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	g.Assess(now, []TenantLoad{l}, 0, f, 0)
	l.Held, l.Tokens = 0, 0
	for range 40 {
		now += int64(500 * time.Millisecond)
		l.Arrived++
		l.Served++
		l.ServedSec++
		g.Assess(now, []TenantLoad{l}, 0, f, 0)
	}
	st, ok := g.State("t")
	assert.True(t, ok)
	// The rate is an exponential average of discrete arrivals: just after
	// one it reads a few per cent above their mean.
	assert.InDelta(t, 2.0/3, st.Load, 0.1, "2 requests of a third of the pool")
}

// TestKept: what another instance must leave free on the pool's
// replicas is the room this gate keeps for its light tenants' peaks:
// a light tenant that held two of 32 sequences and holds none now keeps
// two while it may be pausing, and none once it counts as gone; the
// flood keeps nothing.
func TestKept(t *testing.T) {
	var g Gate
	loads := []TenantLoad{
		{Name: "flood", Weight: 1, Held: 28, Queued: 100},
		{Name: "light", Weight: 1, Held: 2},
	}
	f := FleetLoad{Seqs: 30, SeqsCap: 32, TokensCap: 1 << 20}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for range 50 {
		now += int64(100 * time.Millisecond)
		loads[1].Arrived++
		g.Assess(now, loads, 1, f, 0)
	}
	loads[1].Held = 0
	g.Assess(now, loads, 0, f, 0)
	assert.Equal(t, int64(2), g.Kept(now, "light", 0), "its peak of two")
	assert.Zero(t, g.Kept(now, "flood", 0), "the flood's nothing")
	assert.Equal(t, int64(1), g.Kept(now, "light", 1), "less what it holds")
	assert.Zero(t, g.Kept(now, "light", 3))
	assert.Zero(t, g.Kept(now, "unseen", 0))
	st, _ := g.State("light")
	assert.Positive(t, st.GoneAfter)
	assert.Equal(t, int64(2), g.Kept(now+st.GoneAfter, "light", 0), "pausing")
	assert.Zero(t, g.Kept(now+st.GoneAfter+1, "light", 0), "gone: its room is lent")
}

// TestKeptAfterOneRequest: a tenant whose only request so far has come
// and gone keeps its peak as Assess keeps it in the reserve (it has no
// gap to be gone after yet), until the peak window rotates it out, even
// with no assessment in between: an instance whose only tenant is that one
// assesses nothing while it is quiet. Reporting nothing for it left the
// batch to the other instance's floods, and its second request, 16 s
// later, waited for a completion (fairgen seed 36 with two instances).
func TestKeptAfterOneRequest(t *testing.T) {
	var g Gate
	f := FleetLoad{Seqs: 1, SeqsCap: 4, TokensCap: 1 << 20}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	g.Assess(now, []TenantLoad{{Name: "once", Weight: 1, Queued: 1, Arrived: 1}}, 0, f, 0)
	st, _ := g.State("once")
	require.Zero(t, st.GoneAfter, "one arrival: no gap known")
	later := now + int64(16*time.Second)
	assert.Equal(t, int64(1), g.Kept(later, "once", 0), "its one request's room, 16 s on")
	assert.Zero(t, g.Kept(now+int64(peakWindow), "once", 0), "rotated out after a whole peak window")
}

// TestHeavyAbovePool: a tenant asking two and a half pools (15 of 16
// held, 25 queued) while the only other tenant is pausing has a claim of
// the whole pool, so it is within lightMargin of it; it is heavy all the
// same, because it asks more than the whole pool, and leaves the pausing
// tenant's kept peak (1 of 16, plus two Poisson deviations) free. Without
// the rule (NoPool) it is light and may take the last sequence.
func TestHeavyAbovePool(t *testing.T) {
	run := func(g *Gate) (bool, float64) {
		loads := []TenantLoad{
			{Name: "big", Weight: 4, Held: 15, Queued: 25},
			{Name: "sporadic", Weight: 1, Held: 1},
		}
		f := FleetLoad{Seqs: 16, SeqsCap: 16, TokensCap: 1 << 20}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
		for i := range 60 {
			if i == 50 {
				loads[1].Held = 0 // pausing: its peak is kept
				loads[0].Held, f.Seqs = 15, 15
			}
			now += int64(100 * time.Millisecond)
			g.Assess(now, loads, 1, f, 0)
		}
		return g.Assess(now, loads, 0, f, 0)
	}
	var g Gate
	light, reserve := run(&g)
	assert.False(t, light, "asks 2.5 pools")
	assert.InDelta(t, 3.0/16, reserve, 1e-12, "the kept peak 1/16 + 2·√1/16")
	assert.False(t, FleetLoad{Seqs: 15, SeqsCap: 16, TokensCap: 1 << 20}.FitsBeyond(1, reserve), "the last sequence is the pausing tenant's")

	g2 := Gate{Options: Options{NoPool: true}}
	light, reserve = run(&g2)
	assert.True(t, light, "within 3× a claim of the whole pool")
	assert.Zero(t, reserve)
}

// TestBurstIsNotHeld: a tenant asking more than the pool by its backlog
// (14 requests on 8 sequences) whose arrivals offer less than its weighted
// share (2/s of 0.4 s requests: 0.1 of the pool against 2/3) is no flood:
// the reserve kept for the other tenant's peak does not hold it. The same
// backlog arriving at 40/s (2 pools) is held, and so is the slow one
// without the rule (NoSustain): held at 2 of its share of 5, a bursting
// tenant's queue grows while the pool stands idle (fairness sweep seed
// 494). What the burst asks in the demand report (Asked) is its offered
// load, so that the split across instances does not hold it either.
func TestBurstIsNotHeld(t *testing.T) {
	run := func(g *Gate, perTick int64) (bool, float64) {
		loads := []TenantLoad{
			{Name: "burst", Weight: 4, Held: 2, Queued: 12},
			{Name: "steady", Weight: 2, Held: 4},
		}
		f := FleetLoad{Seqs: 6, SeqsCap: 8, TokensCap: 1 << 20}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
		for i := range 300 { // 30 s of 100 ms samples
			now += int64(100 * time.Millisecond)
			if i == 100 { // the steady tenant's peak of 4 is kept
				loads[1].Held, f.Seqs = 1, 3
			}
			if i%5 == 0 { // every 500 ms
				loads[0].Arrived += perTick
				loads[0].Served++
				loads[0].ServedSec += 0.4
				loads[1].Arrived++
				loads[1].Served++
				loads[1].ServedSec += 0.4
			}
			g.Assess(now, loads, 1, f, 0)
		}
		return g.Assess(now, loads, 0, f, 0)
	}
	var g Gate
	light, reserve := run(&g, 1)
	assert.True(t, light, "offers 0.1 of the pool, its share is 2/3")
	assert.Zero(t, reserve)
	st, _ := g.State("burst")
	assert.True(t, st.Heavy, "heavy by its demand")
	assert.False(t, st.Sustained)
	asked, ok := g.Asked("burst")
	require.True(t, ok)
	assert.InDelta(t, 3*0.8, asked, 0.15, "it asks lightMargin times what its arrivals offer (2/s of 0.4 s requests), not its backlog of 14")

	var flood Gate
	light, reserve = run(&flood, 20)
	assert.False(t, light, "offers 2 pools")
	assert.Positive(t, reserve)
	asked, _ = flood.Asked("burst")
	assert.Greater(t, asked, 8.0, "a flood asks its averaged demand")

	held := Gate{Options: Options{NoSustain: true}}
	light, reserve = run(&held, 1)
	assert.False(t, light)
	assert.False(t, FleetLoad{Seqs: 3, SeqsCap: 8, TokensCap: 1 << 20}.FitsBeyond(1, reserve), "held at 2 of its share of 5: the steady tenant's kept peak and noise keep the rest")
}

// TestBurstyTenantIsNoFlood: a tenant of weight 3 beside one of weight 2
// (its share 0.6 of a four-sequence pool) sends eight 4 s requests at
// once every minute and runs two at a time. 6.5 s into its third burst
// its rate over sustainWindow offers more than its share and its queue
// has stood past server.standing_queue, but over the reserve hold it
// offers about 0.19 of the pool, below half its share, and it asks no
// more than before its queue last drained: it is bursty, no flood, and
// the reserve kept for the other tenant's peak does not hold it. Without
// the rule (NoBursty) it is held at that reserve. Held too: the same
// arrivals with a queue that never drained (a closed loop held at its
// floor offers no more than the floor it is given), and a third burst of
// twelve, more than it asked before (a tenant turning into a flood reads
// within half its share over the hold for seconds).
func TestBurstyTenantIsNoFlood(t *testing.T) {
	run := func(g *Gate, drains bool, third int64) (bool, float64) {
		loads := []TenantLoad{
			{Name: "bursty", Weight: 3},
			{Name: "steady", Weight: 2, Held: 3},
		}
		f := FleetLoad{SeqsCap: 4, TokensCap: 1 << 20}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
		var queued int64
		for i := range 1265 { // 126.5 s of 100 ms samples
			now += int64(100 * time.Millisecond)
			if i == 100 { // the steady tenant's peak of 3 is kept
				loads[1].Held = 1
			}
			if i%600 == 0 { // a burst of eight every minute
				n := int64(8)
				if i == 1200 {
					n = third
				}
				loads[0].Arrived += n
				queued += n
			}
			if i%40 == 39 { // every 4 s two complete and two start
				if loads[0].Held > 0 {
					loads[0].Served += loads[0].Held
					loads[0].ServedSec += 4 * float64(loads[0].Held)
				}
				loads[0].Held = min(queued, 2)
				queued -= loads[0].Held
				loads[1].Arrived++
				loads[1].Served++
				loads[1].ServedSec += 4
			}
			loads[0].Queued = queued
			if !drains {
				loads[0].Queued = max(queued, 1)
			}
			f.Seqs = loads[0].Held + loads[1].Held
			g.Assess(now, loads, 1, f, 0)
		}
		return g.Assess(now, loads, 0, f, 0)
	}
	var g Gate
	light, reserve := run(&g, true, 8)
	st, _ := g.State("bursty")
	assert.True(t, st.Heavy, "heavy by its backlog")
	assert.True(t, light, "offers 0.19 of the pool over the hold, its share is 0.6")
	assert.Zero(t, reserve)

	held := Gate{Options: Options{NoBursty: true}}
	light, reserve = run(&held, true, 8)
	assert.False(t, light, "its burst's rate is above its share and its queue has stood")
	assert.False(t, FleetLoad{Seqs: 3, SeqsCap: 4, TokensCap: 1 << 20}.FitsBeyond(1, reserve), "held at the steady tenant's kept peak")

	var loop Gate
	light, _ = run(&loop, false, 8)
	assert.False(t, light, "a queue that never drained is no burst's")

	var grown Gate
	light, _ = run(&grown, true, 12)
	assert.False(t, light, "asks more than any burst of it did")
}

// lightSample is the i-th 100 ms sample of the light tenants of
// TestFloodAfterIdleIsHeld and floodAfterMinute: 28 sequences held for
// their first 10 s (the peak kept for them), from then 20 on average,
// moving between 18 and 22 as Poisson tenants' counts do (held at exactly
// their arrivals' load they would be a steady tenant, steadyVar), 8
// requests a second of 2.56 s each.
func lightSample(l *TenantLoad, i int) {
	if i >= 100 {
		l.Held = 18 + int64(i%5)
	}
	if i%10 == 0 {
		l.Arrived += 8
		l.Served += 8
		l.ServedSec += 8 * 2.56
	}
}

// TestFloodAfterIdleIsHeld: the isolation rows' shape (a pool of 32, the
// light tenants weighing three times the flood, holding 20 with a kept
// peak of 28) with the flood's tenant known to the gate, idle, for 70 s
// before it starts at 25 requests a second of 2.56 s each. Three seconds
// in, its arrivals over the reserve hold still offer less than half its
// share (the idle minute dilutes them), but it has never asked for room
// and given it back, so it is no burst: held at the light tenants'
// reserve. Counted bursty on the long-run rate alone, it filled the
// pool's free room at its onset and the rows' light tenants waited for
// its completions (3.5× and 6.8× their p99 TTFT alone).
func TestFloodAfterIdleIsHeld(t *testing.T) {
	g, loads, f, now := lightBesideFlood(Options{})
	for i := range 730 { // 73 s of 100 ms samples
		now += int64(100 * time.Millisecond)
		lightSample(&loads[0], i)
		if i >= 700 { // the flood, from 70 s: 2.5 a sample
			loads[1].Arrived += 2 + int64(i%2)
			loads[1].Held = 1
			loads[1].Queued = loads[1].Arrived - 1
		}
		f.Seqs = loads[0].Held + loads[1].Held
		g.Assess(now, loads, 0, f, 0)
	}
	light, reserve := g.Assess(now, loads, 1, f, 0)
	assert.False(t, light, "a flood three seconds in")
	assert.GreaterOrEqual(t, reserve, 8.0/32, "held at the light tenants' reserve: their kept peak of 28 less the 20 they hold, and its noise")
}

// TestSustainCountsOtherInstancesTenants: the weighted share a tenant's
// arrivals are held against is of every tenant on the pool, those only
// other instances of the fleet serve too (FleetLoad.PeerWeight). Offering
// 0.4 of the pool is below its share of 4/6 among this instance's tenants,
// and above 4/16 with tenants weighing 10 at the others (fairgen seed 330
// with two instances: a flood beside one light tenant, its peer flood at
// the other instance, read as a burst and let through the reserve).
func TestSustainCountsOtherInstancesTenants(t *testing.T) {
	run := func(peerWeight float64) State {
		var g Gate
		loads := []TenantLoad{
			{Name: "flood", Weight: 4, Held: 2, Queued: 12},
			{Name: "light", Weight: 2, Held: 1},
		}
		f := FleetLoad{Seqs: 3, SeqsCap: 8, TokensCap: 1 << 20, PeerWeight: peerWeight}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
		for i := range 300 { // 30 s of 100 ms samples
			now += int64(100 * time.Millisecond)
			if i%5 == 0 { // 8 requests a second of 0.4 s: 3.2 of 8 sequences
				loads[0].Arrived += 4
				loads[0].Served++
				loads[0].ServedSec += 0.4
			}
			g.Assess(now, loads, 0, f, 0)
		}
		st, _ := g.State("flood")
		return st
	}
	here := run(0)
	assert.True(t, here.Heavy)
	assert.False(t, here.Sustained, "0.4 of the pool, its share here 2/3")
	fleet := run(10)
	assert.True(t, fleet.Heavy)
	assert.True(t, fleet.Sustained, "0.4 of the pool, its share of the fleet's tenants 1/4")
}

// TestAssessFloorLetsOneHeavyRequestRun: with nothing of its own in
// flight, a heavy tenant may start one request where it leaves the light
// tenants floorK standard deviations over what they hold (3·√4 = 6 of 32
// sequences); without the floor it gets the ordinary reserve.
func TestAssessFloorLetsOneHeavyRequestRun(t *testing.T) {
	var g Gate
	now, loads := floodBeside(&g, 0)
	f := FleetLoad{Seqs: 4, SeqsCap: 32, TokensCap: 1 << 20}
	light, reserve := g.Assess(now, loads, 0, f, 0)
	assert.False(t, light)
	assert.InDelta(t, 6.0/32, reserve, 1e-12)
	assert.True(t, f.FitsBeyond(1, reserve), "4 held + 1 + 6 kept ≤ 32")

	loads[1].Queued = 1 // a light request waits: no floor
	light, reserve = g.Assess(now, loads, 0, f, 0)
	assert.False(t, light)
	assert.InDelta(t, 1.0/32, reserve, 1e-12, "a light tenant with a backlog is reserved what it lacks of its share: the one it queued")

	g2 := Gate{Options: Options{NoFloor: true}}
	now, loads = floodBeside(&g2, 0)
	_, reserve = g2.Assess(now, loads, 0, f, 0)
	assert.InDelta(t, 4.0/32, reserve, 1e-12, "peak 4/32 + 2·√(4)/32 − held 4/32")

	gc := Gate{Cap: 0.05} // server.reserve_cap
	now, loads = floodBeside(&gc, 0)
	_, reserve = gc.Assess(now, loads, 0, f, 0)
	assert.InDelta(t, 0.05, reserve, 1e-12, "the floor's room for noise, capped")
}

// TestFreshReusesTheAssessmentForAMillisecond: within assessEvery of the
// last assessment a known tenant is decided from it (O(1)); a tenant the
// gate has not seen, a later time or a clock that went back need a new
// one.
func TestFreshReusesTheAssessmentForAMillisecond(t *testing.T) {
	var g Gate
	now, loads := floodBeside(&g, 28)
	assert.True(t, g.Fresh(now, "flood"))
	assert.True(t, g.Fresh(now+int64(time.Millisecond)-1, "light"))
	assert.False(t, g.Fresh(now+int64(time.Millisecond), "flood"))
	assert.False(t, g.Fresh(now-1, "flood"))
	assert.False(t, g.Fresh(now, "unknown"))
	f := FleetLoad{Seqs: 32, SeqsCap: 32, TokensCap: 1 << 20}
	wantLight, wantReserve := g.Assess(now, loads, 0, f, 0)
	light, reserve := g.DecideFresh(loads[0], f)
	assert.Equal(t, wantLight, light)
	assert.InDelta(t, wantReserve, reserve, 1e-12)
}

// TestAlone: a tenant is alone on its pool while no other has demand or a
// demand peak kept (it may only be pausing), so an unlearned replica's
// ramp does not bind it (fleet.Route.Alone).
func TestAlone(t *testing.T) {
	var g Gate
	assert.True(t, g.Alone("flood"), "no assessment yet")
	f := FleetLoad{SeqsCap: 32, TokensCap: 1 << 20}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	loads := []TenantLoad{{Name: "flood", Weight: 1, Held: 8, Queued: 40}, {Name: "light", Weight: 1}}
	g.Assess(now, loads, 0, f, 0)
	assert.True(t, g.Alone("flood"))
	assert.False(t, g.Alone("light"), "the flood is there")

	loads[1].Held = 1
	now += int64(100 * time.Millisecond)
	g.Assess(now, loads, 1, f, 0)
	assert.False(t, g.Alone("flood"), "the light tenant has demand")
	loads[1].Held = 0
	now += int64(5 * time.Second)
	g.Assess(now, loads, 0, f, 0)
	assert.False(t, g.Alone("flood"), "its peak is kept while it may only be pausing")
	now += int64(2 * peakWindow)
	g.Assess(now, loads, 0, f, 0)
	assert.True(t, g.Alone("flood"), "gone")
}

// TestClosedLoopHeldAtItsShare: a closed loop's arrivals are its
// completions, so a closed-loop flood held near its share reads as no
// flood (not sustained). While its queue has stood for
// server.standing_queue it is let through beyond the reserve only up to
// its weighted share of the tenants present; past that the reserve holds
// it as a flood. A queue that has not stood that long (a burst draining)
// is let through.
func TestClosedLoopHeldAtItsShare(t *testing.T) {
	run := func(held int64, standing ...time.Duration) (bool, float64) {
		var g Gate
		if len(standing) > 0 {
			g.Standing = standing[0] // server.standing_queue
		}
		now, loads, f := standingLoop(t, &g, held)
		return g.Assess(now, loads, 0, f, 0)
	}
	light, _ := run(3)
	assert.True(t, light, "3 held, below its share of 4: let through")
	light, reserve := run(4)
	assert.False(t, light, "at its share with a standing queue: held as a flood")
	assert.Positive(t, reserve)
	light, _ = run(4, 40*time.Second)
	assert.True(t, light, "its queue has stood 30 s, server.standing_queue is 40 s: let through")
}

// lightBesideFlood is a gate with opts on a pool of 32 sequences, a light
// tenant of weight 3 holding 28 (lightSample moves it) and a silent
// tenant of weight 1 that floods later, and the clock they start at.
func lightBesideFlood(opts Options) (*Gate, []TenantLoad, FleetLoad, int64) {
	loads := []TenantLoad{
		{Name: "light", Weight: 3, Held: 28},
		{Name: "flood", Weight: 1},
	}
	f := FleetLoad{SeqsCap: 32, TokensCap: 1 << 20}
	return &Gate{Options: opts}, loads, f, time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
}

// floodAfterMinute runs a gate with opts for a minute of a light tenant of
// weight 3 holding 20 of 32 sequences (28 at first, its kept peak), 8
// requests a second of 2.56 s, beside a tenant of weight 1 that is silent
// or, with trickle, sends one such request every 3 s; then that tenant
// floods at one request every 40 ms, each let through. It returns the
// gate's verdict on the flood's n-th request and the flood's state then.
func floodAfterMinute(opts Options, trickle bool, n int) (light bool, reserve float64, st State) {
	g, loads, f, now := lightBesideFlood(opts)
	for i := range 600 { // 60 s of 100 ms samples
		now += int64(100 * time.Millisecond)
		lightSample(&loads[0], i)
		if trickle && i%30 == 0 {
			loads[1].Arrived++
			loads[1].Served++
			loads[1].ServedSec += 2.56
		}
		f.Seqs = loads[0].Held
		g.Assess(now, loads, 0, f, 0)
	}
	for range n {
		now += int64(40 * time.Millisecond)
		loads[1].Arrived++
		f.Seqs = loads[0].Held + loads[1].Held
		light, reserve = g.Assess(now, loads, 1, f, 0)
		loads[1].Held++
	}
	st, _ = g.State("flood")
	return light, reserve, st
}

// TestTightBurstIsNoYoungRate: a tenant back after a pause whose burst
// of ten arrives request by request within a few milliseconds is not read
// at that instant's rate; four events over youngSpan are.
func TestTightBurstIsNoYoungRate(t *testing.T) {
	var g Gate
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	loads := []TenantLoad{{Name: "burst", Weight: 1}}
	f := FleetLoad{SeqsCap: 32, TokensCap: 1 << 20}
	g.Assess(now, loads, 0, f, 0)
	for range 10 {
		now += int64(500 * time.Microsecond)
		loads[0].Arrived++
		g.Assess(now, loads, 0, f, 0)
	}
	m := g.mem["burst"]
	assert.Zero(t, g.youngRate(m, now), "ten requests within 5 ms")
	for range 3 {
		now += int64(40 * time.Millisecond)
		loads[0].Arrived++
		g.Assess(now, loads, 0, f, 0)
	}
	assert.InDelta(t, 12/0.1245, g.youngRate(m, now), 1e-6, "then three more 40 ms apart: twelve after its first in 124.5 ms")
	now += int64(forecastWindow)
	assert.Zero(t, g.youngRate(m, now), "no longer young")
}

// TestFloodIsHeldWithinItsFirstArrivals: a flood at twice the pool
// beside a light tenant holding most of it is held at the light tenant's
// reserve within its first arrivals, whether its tenant was silent for a
// minute (young: its fifth request, a fifth of a second in) or sent a
// request every few seconds (never young: its last eight arrivals read as
// a surge, a third of a second in). Read from the averaged rates alone it
// is let through, light by the water level or not sustained, while it
// takes the room the light tenant's next peak needs (fairgen
// -fairgen.onset=late and trickle, the isolation rows).
func TestFloodIsHeldWithinItsFirstArrivals(t *testing.T) {
	for _, c := range []struct {
		name    string
		trickle bool
		n       int
		without Options
	}{
		{"silent, then a flood", false, 5, Options{NoYoung: true}},
		{"a trickle, then a flood", true, 8, Options{NoSurge: true}},
	} {
		light, reserve, st := floodAfterMinute(Options{}, c.trickle, c.n)
		assert.False(t, light, "%s, %d requests in: %+v", c.name, c.n, st)
		assert.True(t, st.Heavy && st.Sustained, "%s: heavy and sustained: %+v", c.name, st)
		assert.GreaterOrEqual(t, reserve, 8.0/32, "%s: held at the light tenant's reserve, its kept peak of 28 less the 20 it holds", c.name)
		light, _, st = floodAfterMinute(c.without, c.trickle, c.n)
		assert.True(t, light || !st.Sustained, "%s, with %+v: its averaged rates read it below its share: %+v", c.name, c.without, st)
	}
}

// TestSurgeHeavyOnlyWhileItReads: a light tenant's Poisson cluster,
// eight requests within a fifth of a second, reads as a surge and makes
// it heavy while it does; three seconds on, at its usual rate, it is
// light again, though its load stays near its claim: the surge does not
// take the hysteresis of a load above its claim, only attackWindow of it.
func TestSurgeHeavyOnlyWhileItReads(t *testing.T) {
	run := func(opts Options) (during, after State) {
		g := Gate{Options: opts}
		loads := []TenantLoad{
			{Name: "a", Weight: 1, Held: 6}, {Name: "b", Weight: 1, Held: 6}, {Name: "c", Weight: 1, Held: 6},
			{Name: "flood", Weight: 1, Held: 14, Queued: 50},
		}
		f := FleetLoad{Seqs: 32, SeqsCap: 32, TokensCap: 1 << 20}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
		steady := func(samples int) {
			for i := range samples { // 100 ms samples: 2.5 a second each light tenant, 20 the flood
				now += int64(100 * time.Millisecond)
				if i%4 == 0 {
					for j := range 3 {
						loads[j].Arrived++
						loads[j].Served++
						loads[j].ServedSec += 2.56
					}
				}
				loads[3].Arrived += 2
				loads[3].Served++
				loads[3].ServedSec += 2.56
				g.Assess(now, loads, 0, f, 0)
			}
		}
		steady(600)
		for range 8 { // a's cluster
			now += int64(25 * time.Millisecond)
			loads[0].Arrived++
			g.Assess(now, loads, 0, f, 0)
		}
		during, _ = g.State("a")
		steady(40)
		after, _ = g.State("a")
		return during, after
	}
	during, after := run(Options{})
	assert.True(t, during.Heavy && during.Sustained, "read as a flood during its cluster: %+v", during)
	assert.False(t, after.Heavy, "light again after it: %+v", after)
	during, _ = run(Options{NoSurge: true})
	assert.False(t, during.Heavy, "its averaged rates: %+v", during)
}

// TestStands: a closed loop let through below its weighted share while
// its queue has stood stands (the share split across instances binds it
// at its part, fleet.SplitPool), holding requests or none (held at none
// by its instance's cap, or starved: the split tells them apart by its
// part); one whose queue has not stood for server.standing_queue and one
// held at its share by the reserve as a flood do not.
func TestStands(t *testing.T) {
	run := func(held int64, opts Options, standing ...time.Duration) bool {
		g := &Gate{Options: opts}
		if len(standing) > 0 {
			g.Standing = standing[0] // server.standing_queue
		}
		standingLoop(t, g, held)
		return g.Stands("loop")
	}
	assert.True(t, run(3, Options{}), "3 held, below its share of 4, its queue standing 30 s")
	assert.False(t, run(3, Options{}, 40*time.Second), "its queue has stood 30 s of server.standing_queue's 40")
	assert.True(t, run(0, Options{}), "holding nothing, its queue standing")
	assert.False(t, run(4, Options{}), "at its share: the reserve holds it as a flood")
	assert.False(t, run(3, Options{NoStanding: true}), "no standing rule")
	var g Gate
	assert.False(t, g.Stands("unknown"))
}

// standingLoop runs g for 30 s of a closed loop of weight 1 holding held
// of 8 sequences with 20 queued, its arrivals its completions (6 a second
// of 0.5 s requests: 3 of 8, below its half), beside a light tenant of
// weight 1 that holds one for 20 s and then pauses (its peak of one is
// kept). It returns the clock, the loads and the fleet as they end.
func standingLoop(t *testing.T, g *Gate, held int64) (int64, []TenantLoad, FleetLoad) {
	t.Helper()
	loads := []TenantLoad{
		{Name: "loop", Weight: 1, Held: held, Queued: 20},
		{Name: "light", Weight: 1, Held: 1},
	}
	f := FleetLoad{Seqs: held + 1, SeqsCap: 8, TokensCap: 1 << 20}
	now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
	for i := range 300 { // 30 s of 100 ms samples
		now += int64(100 * time.Millisecond)
		if i%5 == 0 {
			loads[0].Arrived += 3
			loads[0].Served += 3
			loads[0].ServedSec += 1.5
		}
		if i == 200 {
			loads[1].Held = 0
		}
		g.Assess(now, loads, 1, f, 0)
	}
	st, _ := g.State("loop")
	require.True(t, st.Heavy)
	require.False(t, st.Sustained, "its arrivals offer 3 of 8, its share is 4")
	return now, loads, f
}

// TestSteadyTenantReservesNoNoise: a light tenant holding three of eight
// sequences whose arrivals over the hold offer exactly that (a closed
// loop of three, 2 a second of 1.5 s) is steady: the flood beside it must
// leave no room beyond what it holds, so it gets its floor request and,
// holding that, the rest. Reserved as a Poisson count's, the noise of the
// three (3·√(3/8 · 1/8) ≈ 0.65 of the pool for the floor, 2·√… ≈ 0.43
// beyond the peak) kept the flood out of the two free sequences. A tenant
// holding three that arrives at half that pace (its load 1.5, its peak 3)
// is no steady tenant and keeps its margin. One of the loop's requests
// just ended, the floor leaves its sequence for the next.
func TestSteadyTenantReservesNoNoise(t *testing.T) {
	run := func(opts Options, perSecond int64, floodHeld int64, loopHeld ...int64) float64 {
		g := Gate{Options: opts}
		loads := []TenantLoad{
			{Name: "flood", Weight: 1, Held: floodHeld, Queued: 100},
			{Name: "loop", Weight: 1, Held: 3},
		}
		f := FleetLoad{Seqs: 3 + floodHeld, SeqsCap: 8, TokensCap: 1 << 20}
		now := time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
		for i := range 600 { // 60 s of 100 ms samples
			now += int64(100 * time.Millisecond)
			if i%10 == 0 {
				loads[1].Arrived += perSecond
				loads[1].Served += perSecond
				loads[1].ServedSec += 1.5 * float64(perSecond)
				loads[0].Arrived += 10 // the flood: 10 a second
			}
			g.Assess(now, loads, 1, f, 0)
		}
		if len(loopHeld) > 0 {
			loads[1].Held = loopHeld[0] // a request of it just ended
		}
		light, reserve := g.Assess(now, loads, 0, f, 0)
		require.False(t, light, "the flood")
		return reserve
	}
	// Its long-run rate reads a little below its pace (the hold's
	// correction for a tenant seen a minute): a few hundredths of a request.
	assert.Less(t, run(Options{}, 2, 0), 0.2/8, "the floor request: no noise kept")
	assert.Less(t, run(Options{}, 2, 1), 0.2/8, "beyond the floor: its peak, all of it held")
	assert.InDelta(t, 3*math.Sqrt(3.0/8/8), run(Options{NoSteady: true}, 2, 0), 1e-9, "as a Poisson count: the floor waits")
	assert.InDelta(t, 2*math.Sqrt(3.0/8/8), run(Options{NoSteady: true}, 2, 1), 1e-9)
	assert.InDelta(t, 2*math.Sqrt(3.0/8/8), run(Options{}, 1, 1), 1e-9, "half the pace: its load is below its peak")
	// Its next request is its ended one's successor: the floor request may
	// not take that sequence.
	assert.GreaterOrEqual(t, run(Options{}, 2, 0, 2), 1.0/8, "the floor leaves the loop's third sequence")
}

// TestReserved: what heavy verdicts kept free is shown for
// sluice_replica_reserve_ratio: the most over the current span and the
// last, nothing once no heavy tenant has been assessed for reservedFor,
// and never a light verdict's 0 or more than server.reserve_cap.
func TestReserved(t *testing.T) {
	var g Gate
	now, loads := floodBeside(&g, 28)
	f := FleetLoad{Seqs: 32, SeqsCap: 32, TokensCap: 1 << 20}
	assess := func(cand int, headroom float64) float64 {
		_, reserve := g.Assess(now, loads, cand, f, headroom)
		return reserve
	}
	assert.InDelta(t, 4.0/32, g.Reserved(now), 1e-12, "the flood's verdicts while sampled")
	now += 2*int64(reservedFor) + 1
	assert.Zero(t, g.Reserved(now), "no heavy tenant assessed for a span")
	require.Zero(t, assess(1, 0), "the light tenant")
	assert.Zero(t, g.Reserved(now), "a light verdict shows nothing")

	require.InDelta(t, 4.0/32, assess(0, 0), 1e-12)
	assert.InDelta(t, 4.0/32, g.Reserved(now), 1e-12)
	now += int64(time.Second)
	require.InDelta(t, 0.2, assess(0, 0.2), 1e-12, "server.headroom")
	require.Zero(t, assess(1, 0))
	assert.InDelta(t, 0.2, g.Reserved(now), 1e-12, "the most over the span")
	now += int64(reservedFor)
	require.InDelta(t, 4.0/32, assess(0, 0), 1e-12, "a new span")
	assert.InDelta(t, 0.2, g.Reserved(now), 1e-12, "the last span's most still shows")
	now += int64(reservedFor) - int64(time.Second) - 1
	assert.InDelta(t, 0.2, g.Reserved(now), 1e-12)
	now += 2
	assert.InDelta(t, 4.0/32, g.Reserved(now), 1e-12, "the last span is over two spans old")

	gc := Gate{Cap: 0.1}
	now, loads = floodBeside(&gc, 28)
	_, reserve := gc.Assess(now, loads, 0, f, 0.2)
	require.InDelta(t, 0.1, reserve, 1e-12)
	assert.InDelta(t, 0.1, gc.Reserved(now), 1e-12, "server.reserve_cap bounds it")
}

// TestSteadyForTheSplit: Steady, which the share split reads, says a
// closed loop holding three of eight beside a flood is steady, one or two
// of its clients now and then between requests or not, but not a
// tenant whose demand moved by more than a request over the peak window
// though its last assessment read its peak at its long-run load (a
// Poisson tenant sampled at its own arrivals alone at an instance), nor
// a heavy tenant, nor one the gate has not seen.
func TestSteadyForTheSplit(t *testing.T) {
	var now int64
	run := func(held func(i int) int64) *Gate {
		g := &Gate{}
		loads := []TenantLoad{
			{Name: "flood", Weight: 1, Held: 2, Queued: 100},
			{Name: "loop", Weight: 1},
		}
		f := FleetLoad{SeqsCap: 8, TokensCap: 1 << 20}
		now = time.Date(2026, 1, 1, 0, 0, 0, 0, time.UTC).UnixNano()
		for i := range 600 { // 60 s of 100 ms samples
			now += int64(100 * time.Millisecond)
			loads[1].Held = held(i)
			f.Seqs = 2 + loads[1].Held
			if i%10 == 0 {
				loads[1].Arrived += 2
				loads[1].Served += 2
				loads[1].ServedSec += 1.5 * 2
				loads[0].Arrived += 10
			}
			g.Assess(now, loads, 0, f, 0)
		}
		return g
	}
	g := run(func(int) int64 { return 3 })
	assert.True(t, g.Steady("loop", now))
	assert.False(t, g.Steady("flood", now), "heavy")
	assert.False(t, g.Steady("nobody", now))
	g = run(func(i int) int64 {
		switch {
		case i%7 == 0:
			return 2 // a client between its requests
		case i == 450:
			return 1 // two at once
		}
		return 3
	})
	assert.True(t, g.Steady("loop", now), "its demand moved by two requests")
	g = run(func(i int) int64 {
		if i == 450 {
			return 0 // a dip of three requests within the peak window
		}
		return 3
	})
	assert.False(t, g.Steady("loop", now), "its demand moved by three requests")
	_, ok := g.steadyVar(g.mem["loop"], g.mem["loop"].lightPeak, now, g.holdFor())
	assert.True(t, ok, "the reserve still reads its peak steady")
}
