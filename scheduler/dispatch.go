package scheduler

import (
	"cmp"
	"context"
	"math"
	"slices"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// Work-conserving fair dispatch (the bound is in queue/doc.go, "Work
// conservation").
//
// The queue decides which request goes next (bands, then weighted virtual
// counters); this gate decides only whether it may start now. Everything
// below is per pool (pools.go: the replicas serving the request's model):
// a tenant's demand, the level, the reserve and the room are its pool's,
// so tenants compete only for replicas they can both use.
//
//   - Each tenant's load on the pool is what it asks for: its demand (in
//     flight + queued, as a fraction of the pool's sequences or tokens)
//     averaged with time constant shareWindow, or its offered load λ·W
//     (arrival rate over forecastWindow × its mean service time) when that
//     is more. The average of a tenant that has just started lags its
//     offered load by a service time (its in-flight count takes that long
//     to build up, and a flood's queue is shed at 2 s), which made a new
//     flood light for seconds and the light tenants' share look smaller
//     than it is. The max-min fair level λ of the loads (Σ min(load_i,
//     w_i·λ) = 1) says what each tenant may claim. While the loads fit the
//     pool nobody is heavy and every request may use any room: a lone
//     tenant, or tenants that together do not fill the pool, get all of it.
//   - A tenant whose load is more than lightMargin × its claim is heavy,
//     and stays heavy until its load is within its claim (hysteresis: a
//     light tenant pausing between requests raises the level, which must
//     not turn a flood light for a moment and let it fill the pool).
//   - A heavy tenant may start work only outside the reserve: what the
//     light tenants will hold, less what they hold now, at least
//     server.headroom while one is active. What they will hold is the
//     larger of their demand peaks over the last peakWindow (plus burstK
//     Poisson standard deviations) and their summed offered load (plus
//     forecastK). A light tenant idle right now keeps its peak reserved
//     until it ages out; one with a backlog is reserved what it lacks of
//     its claim, no more (a heavy peer keeps what the level leaves it).
//   - With no heavy request in flight on the pool a heavy tenant may start
//     one, unless a light tenant waits, where that leaves the light
//     tenants floorK standard deviations of room over what they hold:
//     squeezed, never starved, and the floor costs their peaks one slot,
//     not a share (a quarter of its share did: the victims' p99 wait in
//     the flood preset doubled).
//   - An idle tenant's peak is kept while it may only be pausing: idleGaps
//     of its mean gaps between arrivals (between bursts, for a tenant that
//     sends several at once), the larger of its recent and its long-run
//     mean gap (over server.reserve_hold), at most server.reserve_hold; the
//     peak kept spans at least peakWindow. After that its share is lent; when it
//     returns its new demand enters the reserve at once, heavy tenants stop
//     starting work, and the next completions go to it.
//   - The forecast's rate is at most longK × the long-run rate: one burst
//     of a light tenant is not forecast as a flood.
//   - A full pool parks a tenant above its share when another pool has room
//     (the queue goes on to that pool's requests), and blocks the queue
//     for one within its share (full).
//
// Per-tenant `concurrency` is an operator limit on top, never needed for
// isolation. Shares are tested in dispatch_test.go (a discrete-event run of
// the real queue and gate, one or two pools).

// shareWindow is the time constant of the averaged demand that classifies
// tenants. It must be long against one request's service time (a flood
// must stay heavy while its requests run): 10 s is about four 128-token
// decodes at 20 ms a step.
const shareWindow = 10 * time.Second

// attackWindow is the averaging time constant while demand rises: a new
// flood must turn heavy within a fraction of one service time.
const attackWindow = time.Second

// peakWindow is how long a light tenant's demand peak stays reserved: long
// enough to cover its Poisson bursts, short enough that an idle tenant's
// share is lent to the others within half a minute.
const peakWindow = 30 * time.Second

// lightMargin is how far above its max-min fair share a tenant's averaged
// demand may be and still count as light. Peers near their share (Poisson
// noise, a short backlog) must stay light, or the reserve would idle the
// fleet under them; only a tenant asking several times its share is heavy.
const lightMargin = 3.0

// idleGaps is how many of its mean inter-arrival gaps an idle light
// tenant may be silent before its peak stops being reserved, within
// server.reserve_hold. A Poisson tenant is silent that long with
// probability e^-10, so one still sending keeps its reserve; one that has
// left lends its share within seconds instead of half a minute (a lone
// flood used to run below the pool's capacity for peakWindow after the
// others left). One that comes back is served as when it first came.
const idleGaps = 10.0

// forecastWindow is the time constant of the arrival rate behind the light
// tenants' forecast: a few seconds of arrivals, so that a tenant that
// starts is forecast within about one service time.
const forecastWindow = 3 * time.Second

// forecastK is the margin over the forecast, in Poisson standard
// deviations: the forecast is a mean, a peak is already a high draw.
const forecastK = 2.0

// floorK is the room, in Poisson standard deviations of what the light
// tenants hold now, that a heavy tenant's floor request must leave them.
const floorK = 3.0

// burstK is the reserve's margin over the light tenants' recent peak, in
// standard deviations of a Poisson count of that size.
const burstK = 1.0

func (g *shareGate) burstK() float64 {
	if g.k != 0 {
		return max(g.k, 0)
	}
	return burstK
}

// dispatchLoop hands queued calls to replicas with room. It never spins:
// it waits for new work (queue Ready) or freed room (wake).
func (s *Server) dispatchLoop(ctx context.Context) {
	for {
		s.dispatchPass()
		select {
		case <-ctx.Done():
			return
		case <-s.q.Ready():
		case <-s.wake:
		}
	}
}

// dispatchPass delivers every queued call the predicate admits now. The
// loop runs it on each wake; admit runs it inline (dispatchInline). The
// queue's mutex serialises passes and NextView hands each entry out once.
func (s *Server) dispatchPass() {
	for {
		it, ok := s.q.NextView(s.admissible)
		if !ok {
			return
		}
		it.Payload.dispatched <- it.Payload.rep
	}
}

// admissible is the queue's dispatch predicate (queue mutex held): the
// tenant must be under its operator caps (concurrency, inflight_tokens),
// a heavy tenant must leave its pool's light tenants' reserve free, and a
// replica of the pool must have room, which it reserves.
func (s *Server) admissible(it queue.Item[*call], v queue.View[*call]) queue.Verdict {
	c := it.Payload
	t := c.t
	if cur := s.pol.Load().Tenants[t.Name]; cur != nil {
		t = cur // clamps and reloads apply from the next dispatch
	}
	if lim := t.Cfg.Concurrency; (lim > 0 && t.RT.Inflight.Load()+int64(v.Pending(t.Name)) >= int64(lim)) || c.keyAtCap() {
		return queue.Park
	}
	if lim := t.Cfg.InflightTokens; lim > 0 && t.RT.InflightTokens.Load()+c.size > lim {
		return queue.Park
	}
	s.repool(c)
	f := s.reps.fleetOf(c.pool)
	s.pools.mu.Lock()
	defer s.pools.mu.Unlock()
	light, reserve := s.belowFairShare(c, f)
	if !light && !f.fitsBeyond(c.size, reserve) {
		if s.reps.Fits(c.route, c.size) {
			// Room exists, but the light tenants need it: skip this
			// tenant so that they can use it.
			return queue.Park
		}
		return s.full(c, true)
	}
	rep, seq := s.reps.Take(c.route, c.size, nil)
	if rep == nil {
		return s.full(c, !s.pools.getLocked(c.pool).gate.withinShare(t.Name, float64(t.Cfg.Weight)))
	}
	c.rep, c.seq = rep, seq
	s.pools.moveLocked(c, spotHeld)
	return queue.Dispatch
}

// full is the verdict when c's pool has no room (pools.mu held). A tenant
// asking more than its max-min share of the pool (above) is parked when
// another pool has room, so the queue goes on to requests for that pool;
// it competes again at its pool's next completion. One within its share
// blocks the queue until the next completion instead (a short wait: it is
// not backlogged on average): parking would lift its counter to the band
// minimum, and that credit is what makes it the next pick.
func (s *Server) full(c *call, above bool) queue.Verdict {
	if !above || !s.reps.roomOutside(c.pool, 1) {
		return queue.Block
	}
	s.pools.parkFull(c.pool, c.t.Name)
	return queue.Park
}

// belowFairShare classifies the call's tenant on its pool (light: its
// averaged demand there is within its weighted split) and returns the
// fraction of the pool reserved for the pool's light tenants, which a
// heavy tenant must leave free. f is the pool's load; pools.mu is held.
func (s *Server) belowFairShare(c *call, f fleetLoad) (light bool, reserve float64) {
	pol := s.pol.Load()
	pl := s.pools.getLocked(c.pool)
	g := &pl.gate
	nowN := s.now().UnixNano()
	if t := pol.Tenants[c.t.Name]; t != nil && g.fresh(nowN, t.Name) {
		return g.decideFresh(pl.load(t.Name, float64(t.Cfg.Weight)), f)
	}
	loads := g.loads[:0]
	cand := -1
	for _, t := range pol.Order {
		if t.Name == c.t.Name {
			cand = len(loads)
		}
		loads = append(loads, pl.load(t.Name, float64(t.Cfg.Weight)))
	}
	g.loads = loads
	g.hold = pol.Cfg.Server.ReserveHold
	if cand < 0 {
		return true, 0 // removed by a reload: its queued work drains freely
	}
	return g.assess(nowN, loads, cand, f, pol.Cfg.Server.Headroom)
}

// load is tenant's load on the pool as the gate sees it.
func (pl *pool) load(tenant string, weight float64) tenantLoad {
	l := tenantLoad{name: tenant, weight: weight}
	if pt := pl.tenants[tenant]; pt != nil {
		l.held, l.queued, l.tokens = pt.held, pt.queued, pt.tokens
		l.arrived, l.served, l.servedSec = pt.arrived, pt.served, pt.servedSec
	}
	return l
}

// tenantLoad is one tenant's load as the gate sees it.
type tenantLoad struct {
	name   string
	weight float64
	held   int64 // requests in flight or being dispatched
	queued int64 // requests queued
	tokens int64 // in-flight tokens (input + allowed output)
	// Cumulative: requests that arrived, requests that ran and their
	// service seconds (dispatch to settlement), for the forecast.
	arrived, served int64
	servedSec       float64
}

// fleetLoad is the summed room of a pool's replicas that take work.
type fleetLoad struct {
	seqs, seqsCap     int64
	tokens, tokensCap int64
	// probe: sequences of seqsCap that are an unconfirmed probe of a
	// learned batch (fleet.Replica.ProbeExcess).
	probe int64
}

// fitsBeyond reports whether one more request of size tokens fits the fleet
// with the fraction reserve of its sequences and tokens kept free, within
// the confirmed batches: sequences that only probe a learned batch upwards
// are kept free too while anything is reserved, so that the reserve is
// room the replicas really run.
func (f fleetLoad) fitsBeyond(size int64, reserve float64) bool {
	if reserve <= 0 {
		return true // the replica choice (take) decides
	}
	keepSeqs := int64(math.Ceil(reserve*float64(f.seqsCap)-1e-9)) + f.probe
	keepTokens := int64(math.Ceil(reserve*float64(f.tokensCap) - 1e-9))
	return f.seqs+1+keepSeqs <= f.seqsCap && f.tokens+size+keepTokens <= f.tokensCap
}

// shareGate is the dispatch gate's memory: each tenant's averaged demand
// and the light tenants' recent demand peak. Only the dispatch predicate
// touches it (under the queue mutex), so it has no lock of its own.
type shareGate struct {
	window     time.Duration // averaging time constant; 0: shareWindow
	peakWindow time.Duration // span of the light tenants' peak; 0: peakWindow
	noFloor    bool          // no one-request floor for heavy tenants (tests)
	noBacklog  bool          // no reserve for light tenants with a backlog (tests)
	noForecast bool          // reserve from the light tenants' peaks alone (tests)
	noSticky   bool          // no heavy hysteresis, idle tenants' peaks unreserved (tests)
	k          float64       // 0: burstK; negative: none (tests)
	mem        map[string]*gateMem
	loads      []tenantLoad  // reused by belowFairShare
	cls        []gateCls     // reused by assess
	idx        []int         // reused by waterLevel
	snap       gateSnap      // the last full assessment
	svc        float64       // mean service time on the pool (s), 0 unknown
	hold       time.Duration // server.reserve_hold; 0: defaultReserveHold
}

// defaultReserveHold is server.reserve_hold's default.
const defaultReserveHold = 2 * time.Minute

// holdFor is the longest a quiet light tenant's peak stays reserved.
func (g *shareGate) holdFor() time.Duration {
	if g.hold > 0 {
		return g.hold
	}
	return defaultReserveHold
}

type gateMem struct {
	avg   float64 // demand fraction averaged with time constant window
	last  float64 // demand fraction at the previous sample
	lastN int64
	heavy bool    // at the last assessment
	load  float64 // gateCls.load at the last assessment
	// rate is the arrival rate (per second) averaged over forecastWindow,
	// counted from firstN (when it last became active); svc the mean
	// service time of its completed requests (s, 0 unknown).
	rate, svc       float64
	arrived, served int64
	servedSec       float64
	firstN          int64
	// The demand's peak over the last half to whole peak window, in two
	// half-window buckets.
	peakCur, peakPrev float64
	peakStart         int64
	// lastArrN is its last arrival; goneAfter how long after it, idle, the
	// tenant counts as gone (idleGaps of its mean gaps then).
	lastArrN, goneAfter int64
	// longRate is its arrival rate averaged over the reserve hold, counted
	// from seenN (when the gate first saw it).
	longRate float64
	// longEvents counts its arrival events (samples with arrivals: a
	// burst is one) per second the same way.
	longEvents float64
	seenN      int64
}

// gateCls is one tenant's classification inputs.
type gateCls struct {
	avg, demand, held, weight float64
	active                    bool
	forecast                  float64 // λ·W as a fraction of the pool's sequences
	load                      float64 // max(avg, forecast): what classifies it
	m                         *gateMem
}

// rateNow is the arrival rate, divided by the part of the window the
// tenant has been active for (at least the window, to bound the noise of
// its first arrivals: one burst after a pause read as a flood with one
// second).
func (m *gateMem) rateNow(nowN int64) float64 {
	age := max(float64(nowN-m.firstN)/float64(time.Second), forecastWindow.Seconds())
	if age > 10*forecastWindow.Seconds() {
		return m.rate // the correction is below 5e-5
	}
	return m.rate / (1 - math.Exp(-age/forecastWindow.Seconds()))
}

// longRateNow is the long-run arrival rate over hold, divided by the part
// of it the tenant has been seen for (at least 10 s, to bound the noise of
// its first arrivals).
func (m *gateMem) longRateNow(nowN int64, hold time.Duration) float64 {
	return m.longRate / m.longCorrection(nowN, hold)
}

// longCorrection is the part of hold the tenant has been seen for.
func (m *gateMem) longCorrection(nowN int64, hold time.Duration) float64 {
	age := max(float64(nowN-m.seenN)/float64(time.Second), 10)
	return 1 - math.Exp(-age/hold.Seconds())
}

// longK bounds the forecast's rate by this multiple of the long-run rate:
// a tenant that sends a few requests close together now and then is not
// forecast to keep sending at that pace, while a flood that starts is
// forecast at several times its share within a second or two.
const longK = 4.0

// observe folds l's arrivals and completions since m's last sample into
// m's arrival rate and service time, and the pool's.
func (g *shareGate) observe(m *gateMem, l tenantLoad, nowN int64) {
	dt := max(float64(nowN-m.lastN)/float64(time.Second), 0)
	tau := forecastWindow.Seconds()
	if da := l.arrived - m.arrived; da > 0 && m.rate*tau < 0.01 && (m.lastArrN == 0 || nowN-m.lastArrN > int64(peakWindow)) {
		m.firstN = nowN // back after idling longer than a peak window: a young estimate
	}
	// An exponentially weighted count of arrivals per second: each adds
	// 1/τ and the sum decays with τ.
	m.rate = m.rate*math.Exp(-dt/tau) + float64(max(l.arrived-m.arrived, 0))/tau
	// The long-run rate: over the hold, from when it was first seen (at
	// least 10 s, to bound the noise of its first arrivals).
	hold := g.holdFor().Seconds()
	decay := math.Exp(-dt / hold)
	m.longRate = m.longRate*decay + float64(max(l.arrived-m.arrived, 0))/hold
	m.longEvents *= decay
	if l.arrived > m.arrived {
		m.longEvents += 1 / hold
		// Its mean gap: the larger of the recent one and the long-run one.
		// The recent rate alone says a tenant that sent a few requests
		// close together and then paused as usual is gone.
		m.lastArrN = nowN
		mean := 1 / max(min(m.rateNow(nowN), m.longRateNow(nowN, g.holdFor())), 1e-9)
		// A tenant that sends bursts pauses between bursts, not requests.
		mean = max(mean, 1/max(m.longEvents/m.longCorrection(nowN, g.holdFor()), 1e-9))
		m.goneAfter = int64(min(idleGaps*mean, g.holdFor().Seconds()) * float64(time.Second))
	}
	m.arrived = l.arrived
	if dn := l.served - m.served; dn > 0 {
		mean := (l.servedSec - m.servedSec) / float64(dn)
		a := 1 - math.Pow(0.9, float64(dn)) // about the last ten completions
		m.svc += a * (mean - m.svc)
		if m.svc == a*mean {
			m.svc = mean // the first
		}
		if g.svc == 0 {
			g.svc = mean
		} else {
			g.svc += a * (mean - g.svc)
		}
	}
	m.served, m.servedSec = l.served, l.servedSec
}

// assess updates the averages with loads (sampled at nowN), classifies
// loads[cand] and returns the reserve it must respect when heavy.
// minReserve (server.headroom) is the least reserve while any light tenant
// other than the candidate has demand.
func (g *shareGate) assess(nowN int64, loads []tenantLoad, cand int, f fleetLoad, minReserve float64) (light bool, reserve float64) {
	w := g.window
	if w <= 0 {
		w = shareWindow
	}
	if g.mem == nil || len(g.mem) > 2*len(loads)+16 {
		// Forget tenants removed by reloads.
		old := g.mem
		g.mem = make(map[string]*gateMem, len(loads))
		for _, l := range loads {
			if m := old[l.name]; m != nil {
				g.mem[l.name] = m
			}
		}
	}
	seqsCap, tokensCap := float64(max(f.seqsCap, 1)), float64(max(f.tokensCap, 1))
	cs := g.cls[:0]
	for i, l := range loads {
		held := max(float64(l.held)/seqsCap, float64(l.tokens)/tokensCap)
		demand := max(float64(l.held+l.queued)/seqsCap, held)
		if l.held > 0 && l.queued > 0 {
			// Its queue in tokens too, at the mean size of what it holds: on
			// a pool whose KV cache binds before its sequences (max_num_seqs
			// left out), a flood's queue in sequences is a small fraction.
			demand = max(demand, float64(l.tokens)/tokensCap*float64(l.held+l.queued)/float64(l.held))
		}
		m := g.mem[l.name]
		if m == nil {
			m = &gateMem{lastN: nowN, firstN: nowN, seenN: nowN, arrived: l.arrived, served: l.served, servedSec: l.servedSec}
			g.mem[l.name] = m
		}
		g.observe(m, l, nowN)
		// Integrate the previous sample over the elapsed time (demand is
		// piecewise constant between dispatch decisions).
		if dt := nowN - m.lastN; dt > 0 {
			// Fast attack, slow decay: a flood is heavy within about a
			// second, while a tenant's past demand fades over the window.
			tau := float64(w)
			if m.last > m.avg {
				tau = float64(attackWindow)
			}
			a := math.Exp(-float64(dt) / tau)
			m.avg = a*m.avg + (1-a)*m.last
			m.lastN = nowN
		}
		m.last = demand
		// Only tenants with work now claim a share: one that left stops
		// shaping the level at once (its average still decays).
		active := demand > 0 || i == cand
		cs = append(cs, gateCls{avg: m.avg, demand: demand, held: held, weight: max(l.weight, 1e-9), active: active, m: m})
	}
	for i := range cs {
		// λ·W, with the pool's mean service time for a tenant that has
		// completed nothing here yet.
		m := cs[i].m
		svc := m.svc
		if svc == 0 {
			svc = g.svc
		}
		cs[i].forecast = min(m.rateNow(nowN), longK*m.longRateNow(nowN, g.holdFor())) * svc / seqsCap
		// What it asks for: its averaged demand, or its offered load (λ·W)
		// when that is more. The average of a tenant that has just started
		// lags its offered load by a service time or more (its in-flight
		// count takes that long to build up, and a flood's queue is shed at
		// 2 s): without the forecast a flood would count as light for those
		// seconds and the light tenants' share as smaller than it is.
		cs[i].load = cs[i].avg
		if !g.noForecast {
			cs[i].load = max(cs[i].avg, cs[i].forecast)
		}
		m.load = cs[i].load
	}
	g.cls = cs
	level := g.waterLevel(cs)
	// Each tenant's demand peak over the last half to whole peak window.
	pw := g.peakWindow
	if pw <= 0 {
		pw = peakWindow
	}
	var lightPeak, lightForecast, lightHeld, backlogNeed, heavyHeld float64
	others, lightWaiting := false, false
	for i, x := range cs {
		m := x.m
		// A tenant's peak is kept while it may only be pausing (goneAfter),
		// at least for the peak window.
		half := max(int64(pw), m.goneAfter) / 2
		if nowN-m.peakStart >= half {
			if nowN-m.peakStart >= 2*half {
				m.peakPrev = 0
			} else {
				m.peakPrev = m.peakCur
			}
			m.peakCur, m.peakStart = 0, nowN
		}
		m.peakCur = max(m.peakCur, x.demand)
		// Heavy above lightMargin × its claim; once heavy, until it is back
		// within its claim.
		m.heavy = x.load > lightMargin*x.weight*level || (m.heavy && x.load > x.weight*level && !g.noSticky)
		// The sums cover every light tenant: they are used only for a heavy
		// candidate, which is never among them.
		if x.active && !m.heavy && loads[i].queued > 0 {
			lightWaiting = true
		}
		if !x.active && m.lastArrN > 0 && nowN-m.lastArrN > m.goneAfter {
			m.peakCur, m.peakPrev = 0, 0 // gone: its share is lent
		}
		if m.heavy {
			heavyHeld += x.held
			continue
		}
		if !x.active && (g.noSticky || max(m.peakCur, m.peakPrev) == 0) {
			continue
		}
		if loads[i].queued > 0 {
			// A light tenant with a backlog is reserved what it lacks of
			// its max-min share, no noise on top: its queue says the room
			// it had was not enough (a flood that took the room while it
			// was piling up must give it back), and more than its share
			// would starve a heavy peer of what the level leaves it.
			if !g.noBacklog {
				backlogNeed += max(0, min(x.demand, x.weight*level)-x.held)
			}
			continue
		}
		// A light tenant's claim is capped at its margin over its max-min
		// share, so no single tenant can reserve the fleet.
		lightPeak += min(max(m.peakCur, m.peakPrev), lightMargin*x.weight*level)
		if !g.noForecast {
			lightForecast += min(x.forecast, lightMargin*x.weight*level)
		}
		lightHeld += x.held
		others = others || x.demand > 0 || m.peakPrev > 0
	}
	g.snap = gateSnap{at: nowN, level: level, lightPeak: lightPeak, lightForecast: lightForecast, lightHeld: lightHeld, backlogNeed: backlogNeed,
		heavyHeld: heavyHeld, others: others, lightWaiting: lightWaiting, seqsCap: seqsCap, minReserve: minReserve, ok: true}
	return g.decide(g.mem[loads[cand].name].heavy, cs[cand].held)
}

// gateSnap is the last full assessment, reused for assessEvery.
type gateSnap struct {
	at                   int64
	level                float64
	lightPeak, lightHeld float64
	backlogNeed          float64
	heavyHeld            float64 // held by heavy tenants
	lightForecast        float64
	others, lightWaiting bool
	seqsCap, minReserve  float64
	ok                   bool
}

// assessEvery bounds how often the O(tenants) assessment runs: averages
// move on a scale of seconds, so a millisecond-old level and reserve are as
// good, and a burst of dispatches costs O(1) each.
const assessEvery = time.Millisecond

// fresh reports whether the last assessment may be reused at nowN for a
// tenant the gate already knows.
func (g *shareGate) fresh(nowN int64, tenant string) bool {
	return g.snap.ok && nowN-g.snap.at < int64(assessEvery) && nowN >= g.snap.at && g.mem[tenant] != nil
}

// decideFresh classifies a known tenant from the last assessment and its
// current load.
func (g *shareGate) decideFresh(l tenantLoad, f fleetLoad) (light bool, reserve float64) {
	held := max(float64(l.held)/float64(max(f.seqsCap, 1)), float64(l.tokens)/float64(max(f.tokensCap, 1)))
	return g.decide(g.mem[l.name].heavy, held)
}

// withinShare reports whether tenant's averaged demand is within its
// max-min fair share at the last assessment.
func (g *shareGate) withinShare(tenant string, weight float64) bool {
	m := g.mem[tenant]
	return m == nil || !g.snap.ok || m.load <= max(weight, 1e-9)*g.snap.level
}

// decide is the verdict for a tenant classified heavy or not, holding the
// fraction held of the pool.
func (g *shareGate) decide(heavy bool, held float64) (light bool, reserve float64) {
	sn := &g.snap
	if !heavy {
		return true, 0
	}
	if !sn.lightWaiting && held == 0 && sn.heavyHeld == 0 && !g.noFloor {
		// One heavy request in flight on the pool, unless a light one
		// waits, and only where it leaves the light tenants room for their
		// Poisson noise over what they hold now: it runs a whole service
		// time. One per pool, not per heavy tenant: two floods each keeping
		// one in flight took half of a four-sequence batch from light
		// tenants whose peaks were reserved.
		return false, min(floorK*math.Sqrt(sn.lightHeld*sn.seqsCap)/sn.seqsCap, 1)
	}
	// The peak plus its Poisson noise (k·√(peak·S) requests) covers a
	// burst a little above the recent ones.
	reserve = sn.lightPeak + g.burstK()*math.Sqrt(sn.lightPeak*sn.seqsCap)/sn.seqsCap
	if f := sn.lightForecast; f > 0 {
		reserve = max(reserve, f+forecastK*math.Sqrt(f*sn.seqsCap)/sn.seqsCap)
	}
	reserve += sn.backlogNeed - sn.lightHeld
	if sn.others {
		reserve = max(reserve, sn.minReserve)
	}
	return false, min(max(reserve, 0), 1)
}

// waterLevel is the max-min fair level of the averaged demands: the λ with
// Σ min(avg_i, w_i·λ) = 1 over active tenants, +Inf when the demands fit
// (nobody is heavy then). A tenant is light when avg_i ≤ w_i·λ: it asks
// for no more than its max-min fair share.
func (g *shareGate) waterLevel(cs []gateCls) float64 {
	// A tenant asks for its average or, while its demand is above it (still
	// rising), its demand now: a light tenant whose requests are piling up
	// claims its share before its average catches up, so a flood is not
	// light for those seconds.
	ask := func(x gateCls) float64 {
		return max(x.load, x.demand)
	}
	idx := g.idx[:0]
	var sum, weights float64
	for i, x := range cs {
		if x.active {
			idx = append(idx, i)
			sum += ask(x)
			weights += x.weight
		}
	}
	g.idx = idx
	if sum <= 1 || weights <= 0 {
		return math.Inf(1)
	}
	slices.SortFunc(idx, func(a, b int) int { return cmp.Compare(ask(cs[a])/cs[a].weight, ask(cs[b])/cs[b].weight) })
	left := 1.0
	for _, i := range idx {
		x := cs[i]
		// Every remaining tenant gets w·left/weights unless it asks less.
		if lv := left / weights; ask(x)/x.weight <= lv {
			left -= ask(x)
			weights -= x.weight
			continue
		}
		return left / weights
	}
	return math.Inf(1)
}
