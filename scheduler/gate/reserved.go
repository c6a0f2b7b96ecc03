package gate

import "time"

// verdict is decide, noting a heavy verdict's reserve for Reserved.
func (g *Gate) verdict(m *gateMem, held float64) (light bool, reserve float64) {
	light, reserve = g.decide(m, held)
	if !light {
		g.noteKept(reserve, g.snap.at)
	}
	return light, reserve
}

// reservedFor is the span Reserved reads: a held flood is assessed at
// each completion and wake, far more often, and its verdicts alternate
// between its one-request floor's small reserve and the full one.
const reservedFor = 5 * time.Second

// keptSpan is the most a heavy verdict reserved within one reservedFor.
type keptSpan struct {
	most   float64
	startN int64
}

// noteKept counts a heavy verdict's reserve at nowN in the current span,
// starting a new one (the current becoming the previous) after
// reservedFor.
func (g *Gate) noteKept(reserve float64, nowN int64) {
	if g.kept[0].startN == 0 || nowN-g.kept[0].startN >= int64(reservedFor) {
		g.kept[1], g.kept[0] = g.kept[0], keptSpan{startN: nowN}
	}
	g.kept[0].most = max(g.kept[0].most, reserve)
	g.keptN = nowN
}

// Reserved is the most of the pool a heavy verdict kept free for the
// light tenants (its reserve) over the last reservedFor or two, or 0 when
// no heavy tenant was assessed in the reservedFor before nowN: what
// isolation costs the heavy tenants at most, for the operator to weigh
// against server.reserve_cap (sluice_replica_reserve_ratio).
func (g *Gate) Reserved(nowN int64) float64 {
	if g.keptN == 0 || nowN-g.keptN > int64(reservedFor) {
		return 0
	}
	r := g.kept[0].most
	if nowN-g.kept[1].startN < 2*int64(reservedFor) {
		r = max(r, g.kept[1].most)
	}
	return r
}

// steadyRange is how many requests a steady tenant's demand may move by
// over the peak window (Steady): a closed loop's clients between their
// requests, two at once now and then on a loaded host.
const steadyRange = 2

// Steady reports whether tenant, light at the last assessment, is
// steady at nowN: its demand peak is its long-run load (a closed loop's
// fixed clients: steadyVar, by which its reserve keeps no Poisson noise
// for it), and its demand over the peak window has moved by steadyRange
// requests at most. The share split across instances keeps such a claim
// no margin either (fleet.SplitPool). The second test, where the reserve
// reads the first alone: alone at an instance of a fleet a tenant is
// assessed only at its own arrivals, and a Poisson tenant's few samples
// there read steady now and then (fairgen seed 246 with two instances:
// its p99 TTFT 0.88 s against 20 ms, its claim reported steady for
// seconds). Read here, at the exchange, not at each assessment, which it
// would slow by a fifth (BenchmarkGateAssess, 12 tenants).
func (g *Gate) Steady(tenant string, nowN int64) bool {
	m := g.mem[tenant]
	if m == nil || m.lightPeak <= 0 {
		return false
	}
	if _, ok := g.steadyVar(m, m.lightPeak, nowN, g.holdFor()); !ok {
		return false
	}
	low := m.lowCur
	if m.lowPrev >= 0 && (low < 0 || m.lowPrev < low) {
		low = m.lowPrev
	}
	return low >= 0 && max(m.peakCur, m.peakPrev)-low <= steadyRange*m.size*(1+1e-9)
}
