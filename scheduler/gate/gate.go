package gate

import (
	"cmp"
	"math"
	"slices"
	"time"
)

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
// fleet under them; only a tenant asking several times its share is heavy,
// or more than the whole pool: a tenant whose claim is nearly the pool
// (the others ask little) is no peer near its share when it asks for more
// than all of it, and as light it would hold the whole batch against the
// others' reserved peaks.
const lightMargin = 3.0

// LightMargin is lightMargin, for the split of a shared replica's batch
// across instances (fleet.SeqShare), which classifies tenants as the gate
// does.
const LightMargin = lightMargin

// idleGaps is how many of its mean inter-arrival gaps an idle light
// tenant may be silent before its peak stops being reserved, within
// server.reserve_hold. A Poisson tenant is silent that long with
// probability e^-10, so one still sending keeps its reserve; one that has
// left lends its share within seconds, where holding it for peakWindow
// would keep a lone flood below the pool's capacity for half a minute
// after the others left. One that comes back is served as when it first came.
const idleGaps = 10.0

// sustainWindow is the time constant of the arrival rate that tells a
// flood from a burst: a heavy tenant is held by the light tenants' reserve
// only while its offered load at this rate is above its weighted share.
// It must be long against a burst (one of B requests adds B per
// sustainWindow to the rate) and short against a flood's onset: a tenant
// that starts offering R pools passes a share s within about
// sustainWindow × s / R (2.5 s for a quarter at twice the pool).
const sustainWindow = 20 * time.Second

// defaultStandingQueue is server.standing_queue's default: how long a
// heavy tenant's queue must have stood before its weighted share bounds it
// where its arrivals read as no flood (decide): long against a burst's
// drain, short against a closed-loop flood's hold on the reserve. In the
// fairness model (seeds 1–500, one instance, open loops / every heavy
// tenant a closed loop, before the one-request floor in decide): 2 s
// 448 / 389, 5 s 451 / 392, 10 s 451 / 390, 20 s 452 / 374.
const defaultStandingQueue = 5 * time.Second

// burstyShare is the part of its weighted share that a tenant's arrivals
// over server.reserve_hold may offer for it to count as bursty rather
// than a flood: the isolation contract's light tenant (below half its
// share), measured on the arrivals a flood cannot hide (a flood arrives
// at its rate whatever it is given). One burst lifts its rate over
// sustainWindow above its share for seconds, and its queue stands while
// it is held, so without this a tenant sending a few requests at once
// every half minute was held at the light tenants' reserve as a flood:
// on a four-sequence pool (fairness model, seed 692) its bursts waited
// seconds past what the replica alone gave them. A bursty tenant must
// also ask no more than it did before its queue last drained: the
// long-run rate of a tenant that was idle, or light, for a minute reads
// below half its share for seconds after it starts to flood, and read
// alone it let the isolation rows' flood fill the free room at its onset
// (TestFloodAfterIdleIsHeld). In the fairness model (seeds 1–500 /
// 501–1000 / 1001–1500 as drawn, every heavy tenant a closed loop, two
// instances everywhere): without it 427 / 411 / 402 / 378 / 409 of 500
// hold every invariant, with it 427 / 413 / 404 / 377 / 409 (with the
// long-run rate alone, 427 / 415 / 410 / 375 / 409).
const burstyShare = 0.5

// forecastWindow is the time constant of the arrival rate behind the light
// tenants' forecast: a few seconds of arrivals, so that a tenant that
// starts is forecast within about one service time.
const forecastWindow = 3 * time.Second

// forecastK is the margin over the forecast, in Poisson standard
// deviations: the forecast is a mean, a peak is already a high draw.
const forecastK = 2.0

// floorK is the room, in Poisson standard deviations of what the light
// tenants hold now, that a heavy tenant's floor request must leave them.
// More reads better on the fairness model's isolation rows only by
// starving the flood: at 5, TestGateFloodGivesWay's flood completes 3
// requests in a minute, below its floor's 10.
const floorK = 3.0

// burstK is server.reserve_margin's default: the reserve's margin over
// the light tenants' recent peak, in standard deviations of a Poisson
// count of that size. The reserve binds only heavy tenants, whose
// throughput is all it costs; a light request that finds it short waits
// for a completion, seconds on a small pool. In the fairness model (seeds
// 1–500 / 501–1000 / 1001–1500 as drawn, then two instances everywhere):
// 1 held 423 / 407 / 397 / 401; 1.5 424 / 408 / 402 / 405; 2 427 / 411 /
// 402 / 409; 2.5 428 / 412 / 403 / 407 and 3 426 / 412 / 403 / 407, with
// light requests lost on more seeds.
const burstK = 2.0

// BurstK is server.reserve_margin's default, for the configuration and
// for the split of a shared replica's batch across instances
// (fleet.SeqShare), which reserves for light tenants as the gate does.
const BurstK = burstK

func (g *Gate) burstK() float64 {
	if g.Margin != 0 {
		return max(g.Margin, 0)
	}
	return burstK
}

// Options are the gate's tuning knobs; the zero value is the gate Sluice
// runs. The switches turn one mechanism off, so that a test can show what
// it is for.
type Options struct {
	Window     time.Duration // averaging time constant; 0: shareWindow
	PeakWindow time.Duration // span of the light tenants' peak; 0: peakWindow
	NoFloor    bool          // no one-request floor for heavy tenants
	NoBacklog  bool          // no reserve for light tenants with a backlog
	NoForecast bool          // reserve from the light tenants' peaks alone
	NoSticky   bool          // no heavy hysteresis, idle tenants' peaks unreserved
	NoPool     bool          // heavy only above lightMargin × its claim, not above the pool
	NoSustain  bool          // a heavy tenant held by the reserve whatever its arrival rate
	NoStanding bool          // a heavy tenant not sustained let through past its share with a standing queue
	NoBursty   bool          // a tenant within burstyShare of its share over the hold held as any heavy one
	NoYoung    bool          // a young tenant's rate read only from the averaged rates (youngRate)
	NoSurge    bool          // a tenant's last arrivals not read alone (surgeRate)
	NoFleetSvc bool          // no service time from the replicas' reports (FleetLoad.Svc) before its own
	NoLatch    bool          // a surge makes a tenant heavy only while it reads so, not for attackWindow after
	NoSteady   bool          // a steady light tenant's noise reserved as a Poisson count's (steadyVar)
}

// Gate is the dispatch gate's memory for one pool: each tenant's averaged
// demand and the light tenants' recent demand peak. Only the dispatch
// predicate changes it (under the queue mutex and the load table's lock),
// and the share exchange reads it under the table's lock
// (Pools.WaitingOn), so it has no lock of its own. The zero value is ready
// to use.
type Gate struct {
	Options
	// Hold is server.reserve_hold, set by the caller before Assess; 0:
	// defaultReserveHold.
	Hold time.Duration
	// Standing is server.standing_queue, set by the caller before
	// Assess; 0: defaultStandingQueue.
	Standing time.Duration
	// Margin is server.reserve_margin, set by the caller before Assess:
	// the reserve's margin over the light tenants' peak, in Poisson
	// standard deviations. 0: burstK; negative: none.
	Margin float64
	// Cap is server.reserve_cap, set by the caller before Assess: the most
	// of the pool the reserve keeps free. 0: the whole pool; negative:
	// none.
	Cap  float64
	mem  map[string]*gateMem
	cls  []gateCls // reused by Assess
	idx  []int     // reused by waterLevel
	snap gateSnap  // the last full assessment
	svc  float64   // mean service time on the pool (s), 0 unknown
	// fleetSvc is FleetLoad.Svc at the last assessment: the replicas' own
	// mean service time, whoever sent what they completed.
	fleetSvc float64
	// kept is what heavy verdicts reserved over the current and the
	// previous span (Reserved); keptN is the last one's time.
	kept  [2]keptSpan
	keptN int64
}

// defaultReserveHold is server.reserve_hold's default.
const defaultReserveHold = 2 * time.Minute

// peakWindow is the span of the light tenants' demand peak (Options.PeakWindow).
func (g *Gate) peakWindow() time.Duration {
	if g.PeakWindow > 0 {
		return g.PeakWindow
	}
	return peakWindow
}

// standingFor is how long a heavy tenant's queue stands before its share
// bounds it (decide).
func (g *Gate) standingFor() time.Duration {
	if g.Standing > 0 {
		return g.Standing
	}
	return defaultStandingQueue
}

// holdFor is the longest a quiet light tenant's peak stays reserved.
func (g *Gate) holdFor() time.Duration {
	if g.Hold > 0 {
		return g.Hold
	}
	return defaultReserveHold
}

type gateMem struct {
	avg   float64 // demand fraction averaged with time constant window
	last  float64 // demand fraction at the previous sample
	lastN int64
	heavy bool    // at the last assessment
	load  float64 // gateCls.load at the last assessment
	held  float64 // gateCls.held at the last assessment
	// lightPeak is its peak as the reserve counts it, at the last
	// assessment that read it light and present (0: none): what Steady
	// reads it steady by.
	lightPeak float64
	// sustained: its arrivals over sustainWindow (or its recent ones,
	// read alone while it is young or surging: youngRate, surgeRate) offer
	// more than its weighted share (at the last assessment); a heavy
	// tenant that is not sustained is not held by the reserve. offered is
	// that load, as a fraction of the pool.
	sustained bool
	offered   float64
	// share is its weighted share of the pool among the tenants present
	// (at the last assessment): what a heavy tenant that is not sustained
	// may hold beyond the reserve while its queue stands.
	share float64
	// queuedSince is when its queue last became non-empty; 0 while empty.
	queuedSince int64
	// burstMax is the most requests it has held and queued since its
	// queue last drained; prevMax the most of an earlier such span that
	// ended (its queue drained) within the hold, at prevMaxN (0: none).
	burstMax, prevMax int64
	prevMaxN          int64
	// bursty: its arrivals over the hold offer at most burstyShare of its
	// share, and it asks no more now than it did before its queue last
	// drained (at the last assessment); a bursty tenant is no flood,
	// whatever its recent rate or its standing queue say.
	bursty bool
	// rate is the arrival rate (per second) averaged over forecastWindow,
	// counted from firstN (when it last became active); svc the mean
	// service time of its completed requests (s, 0 unknown).
	rate, svc       float64
	sustRate        float64 // the arrival rate averaged over sustainWindow
	reqTokens       float64 // tokens of one of its requests in flight, on average
	size            float64 // one of its requests as a fraction of the pool, at the last assessment
	arrived, served int64
	servedSec       float64
	firstN          int64
	// youngEv counts its arrival events (samples with arrivals) since
	// firstN, and youngArr its arrivals in those after the first.
	youngEv, youngArr int64
	// evN and evArr are the times and arrivals of its last surgeEvents
	// arrival events, a ring whose oldest is at evAt once evLen is full.
	evN, evArr  [surgeEvents]int64
	evAt, evLen int
	// heavyLoad: heavy by its load, with the hysteresis (heavy is that,
	// or its last arrivals read as a surge now or within attackWindow).
	heavyLoad bool
	// surgedN is when its last arrivals last read as a surge above its
	// claim's bound (0: never).
	surgedN int64
	// The demand's peak over the last half to whole peak window, in two
	// half-window buckets, and its least in the same (-1: none sampled).
	peakCur, peakPrev float64
	lowCur, lowPrev   float64
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
	forecast                  float64 // λ·W as a fraction of the pool, at its request size
	load                      float64 // max(avg, forecast): what classifies it
	surge                     float64 // its surgeRate's offered load, as a fraction of the pool (0: none)
	m                         *gateMem
}

// Assess updates the averages with loads (sampled at nowN), classifies
// loads[cand] and returns the reserve it must respect when heavy.
// minReserve (server.headroom) is the least reserve while any light tenant
// other than the candidate has demand.
func (g *Gate) Assess(nowN int64, loads []TenantLoad, cand int, f FleetLoad, minReserve float64) (light bool, reserve float64) {
	w := g.Window
	if w <= 0 {
		w = shareWindow
	}
	if g.mem == nil || len(g.mem) > 2*len(loads)+16 {
		// Forget tenants removed by reloads.
		old := g.mem
		g.mem = make(map[string]*gateMem, len(loads))
		for _, l := range loads {
			if m := old[l.Name]; m != nil {
				g.mem[l.Name] = m
			}
		}
	}
	seqsCap, tokensCap := float64(max(f.SeqsCap, 1)), float64(max(f.TokensCap, 1))
	hold := g.holdFor()
	g.fleetSvc = f.Svc
	cs := g.cls[:0]
	for i, l := range loads {
		held := max(float64(l.Held)/seqsCap, float64(l.Tokens)/tokensCap)
		demand := max(float64(l.Held+l.Queued)/seqsCap, held)
		if l.Held > 0 && l.Queued > 0 {
			// Its queue in tokens too, at the mean size of what it holds: on
			// a pool whose KV cache binds before its sequences (max_num_seqs
			// left out), a flood's queue in sequences is a small fraction.
			demand = max(demand, float64(l.Tokens)/tokensCap*float64(l.Held+l.Queued)/float64(l.Held))
		}
		m := g.mem[l.Name]
		if m == nil {
			m = &gateMem{lastN: nowN, firstN: nowN, seenN: nowN, arrived: l.Arrived, served: l.Served, servedSec: l.ServedSec}
			g.mem[l.Name] = m
		}
		g.observe(m, l, nowN, hold)
		if l.Queued == 0 && m.queuedSince != 0 {
			// A span of queueing ends: the most it asked is what a burst
			// of it asks, for the hold.
			if m.burstMax >= m.prevMax || nowN-m.prevMaxN >= int64(hold) {
				m.prevMax, m.prevMaxN = m.burstMax, nowN
			}
			m.burstMax = 0
		}
		m.burstMax = max(m.burstMax, l.Held+l.Queued)
		if l.Queued == 0 {
			m.queuedSince = 0
		} else if m.queuedSince == 0 {
			m.queuedSince = nowN
		}
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
		if l.Held > 0 {
			// Remembered while it holds none: a flood held at nothing
			// still sends requests of that size.
			m.reqTokens = float64(l.Tokens) / float64(l.Held)
		}
		m.size = max(1/seqsCap, m.reqTokens/tokensCap)
		cs = append(cs, gateCls{avg: m.avg, demand: demand, held: held, weight: max(l.Weight, 1e-9), active: active, m: m})
	}
	for i := range cs {
		// λ·W requests of its size, with the pool's (or the replicas')
		// mean service time for a tenant that has completed nothing here
		// yet (svcOf). Counted in sequences alone, a pool whose KV cache
		// binds would read it at a fraction of what it asks for.
		m := cs[i].m
		cs[i].forecast = max(min(m.rateNow(nowN), longK*m.longRateNow(nowN, hold)), g.youngRate(m, nowN)) * g.svcOf(m) * m.size
		// What it asks for: its averaged demand, or its offered load (λ·W)
		// when that is more. The average of a tenant that has just started
		// lags its offered load by a service time or more (its in-flight
		// count takes that long to build up): without the forecast a flood
		// would count as light for those seconds and the light tenants'
		// share as smaller than it is.
		cs[i].load = cs[i].avg
		if !g.NoForecast {
			cs[i].load = max(cs[i].avg, cs[i].forecast)
		}
		m.load, m.held = cs[i].load, cs[i].held
		cs[i].surge = g.surgeRate(m, nowN) * g.svcOf(m) * m.size
	}
	g.cls = cs
	level := g.waterLevel(cs)
	// Each tenant's demand peak over the last half to whole peak window.
	pw := g.peakWindow()
	var lightPeak, lightForecast, lightHeld, backlogNeed, heavyHeld float64
	// The variances of the light tenants' Poisson counts as fractions of
	// the pool: a count of mean μ requests of size s each is a fraction
	// of mean s·μ and variance s·(s·μ).
	var peakVar, forecastVar, heldVar float64
	// What steady light tenants' clients will ask back of what they do
	// not hold now (their peak less their held): their requests'
	// successors, not noise.
	var steadyGap float64
	others, lightWaiting := false, false
	present, sole := 0, ""
	var presentW float64
	for i, x := range cs {
		m := x.m
		// A tenant's peak is kept while it may only be pausing (goneAfter),
		// at least for the peak window.
		half := max(int64(pw), m.goneAfter) / 2
		if nowN-m.peakStart >= half {
			if nowN-m.peakStart >= 2*half {
				m.peakPrev, m.lowPrev = 0, -1
			} else {
				m.peakPrev, m.lowPrev = m.peakCur, m.lowCur
			}
			m.peakCur, m.lowCur, m.peakStart = 0, -1, nowN
		}
		m.peakCur = max(m.peakCur, x.demand)
		if m.lowCur < 0 || x.demand < m.lowCur {
			m.lowCur = x.demand
		}
		if x.demand > 0 || m.peakCur > 0 || m.peakPrev > 0 {
			present, sole = present+1, loads[i].Name
			presentW += x.weight
		}
		// Heavy above lightMargin × its claim, or with its averaged demand
		// above the whole pool (a claim is at most the pool); once heavy,
		// until it is back within its claim. The pool bound reads what the
		// tenant holds and queues, not the forecast: a Poisson cluster of
		// long requests forecasts more than the pool for a tenant asking
		// a third of it, which as heavy would wait for a reserve kept for
		// tenants with nothing to send.
		// Its last arrivals read as a surge above that bound make it heavy
		// for as long as they do, without the hysteresis: a light tenant's
		// Poisson cluster that reads so now and then must not keep it
		// heavy while its load stays near its claim.
		over := x.load > lightMargin*x.weight*level || (x.avg > 1 && !g.NoPool)
		m.heavyLoad = over || (m.heavyLoad && x.load > x.weight*level && !g.NoSticky)
		surging := x.surge > lightMargin*x.weight*level
		if surging {
			m.surgedN = nowN
		}
		// A surge read within the last attackWindow keeps it heavy while
		// its load is above its claim: a flood's last arrivals read below
		// the surge's bound now and then (a Poisson lull), and its averaged
		// load takes about that long to pass the bound on its own.
		latched := m.surgedN > 0 && nowN-m.surgedN < int64(attackWindow) && x.load > x.weight*level && !g.NoLatch
		m.heavy = m.heavyLoad || surging || latched
		// The sums cover every light tenant: they are used only for a heavy
		// candidate, which is never among them.
		if x.active && !m.heavy && loads[i].Queued > 0 {
			lightWaiting = true
		}
		if !x.active && m.lastArrN > 0 && nowN-m.lastArrN > m.goneAfter {
			m.peakCur, m.peakPrev = 0, 0 // gone: its share is lent
		}
		m.lightPeak = 0
		if m.heavy {
			heavyHeld += x.held
			continue
		}
		if !x.active && (g.NoSticky || max(m.peakCur, m.peakPrev) == 0) {
			continue
		}
		// A light tenant's claim is capped at its margin over its max-min
		// share, so no single tenant can reserve the fleet. Kept with a
		// backlog too: alone at an instance of a fleet a tenant is
		// assessed only with its next request queued, and the split reads
		// it there (Steady).
		peak := min(max(m.peakCur, m.peakPrev), lightMargin*x.weight*level)
		m.lightPeak = peak
		if loads[i].Queued > 0 {
			// A light tenant with a backlog is reserved what it lacks of
			// its max-min share, no noise on top: its queue says the room
			// it had was not enough (a flood that took the room while it
			// was piling up must give it back), and more than its share
			// would starve a heavy peer of what the level leaves it.
			if !g.NoBacklog {
				backlogNeed += max(0, min(x.demand, x.weight*level)-x.held)
			}
			continue
		}
		lightPeak += peak
		// Its noise as a Poisson count's, or as a steady tenant's.
		f := min(x.forecast, lightMargin*x.weight*level)
		vp, vf, vh := m.size*peak, m.size*f, m.size*x.held
		if v, ok := g.steadyVar(m, peak, nowN, hold); ok {
			vp, vf, vh = v, v, v
			steadyGap += max(peak-x.held, 0)
		}
		peakVar += vp
		if !g.NoForecast {
			lightForecast += f
			forecastVar += vf
		}
		lightHeld += x.held
		heldVar += vh
		others = others || x.demand > 0 || m.peakPrev > 0
	}
	// A tenant heavy by its demand now (a burst, or a backlog that built
	// while it was held) but whose arrivals over sustainWindow offer no
	// more than its weighted share is no flood. Held at the light tenants'
	// reserve, a burst that vLLM alone serves at once would wait for
	// seconds, and where the reserve leaves less room than its arrivals
	// need its backlog only grows. A flood keeps arriving, and a closed
	// loop's arrivals are its completions, so either is held while it runs
	// above its share. A bursty tenant is no flood either (burstyShare):
	// its rate over the reserve hold, not one burst's, says what it
	// offers; a queue that drained within the hold says it is no closed
	// loop held at its floor (whose long-run rate reads no more than the
	// floor it is given), and asking no more than it did then says it is
	// no flood starting (whose long-run rate lags it by seconds).
	// The share is of every tenant present on the pool, those only other
	// instances serve too: counted among this instance's tenants alone, a
	// flood beside one light tenant here reads as within half the pool
	// while it takes far more than its share of the whole.
	presentW += f.PeerWeight
	for _, x := range cs {
		m := x.m
		svc := g.svcOf(m)
		m.offered = max(max(m.sustRateNow(nowN), g.youngRate(m, nowN))*svc*m.size, x.surge)
		m.share = 1
		if presentW > 0 {
			m.share = x.weight / presentW
		}
		m.bursty = !g.NoBursty && m.prevMaxN > 0 && nowN-m.prevMaxN < int64(hold) && m.burstMax <= m.prevMax &&
			m.longRateNow(nowN, hold)*svc*m.size <= burstyShare*m.share
		m.sustained = g.NoSustain || svc == 0 || presentW == 0 || (m.offered > m.share && !m.bursty)
	}
	g.snap = gateSnap{at: nowN, level: level, lightPeak: lightPeak, lightForecast: lightForecast, lightHeld: lightHeld, backlogNeed: backlogNeed,
		peakVar: peakVar, forecastVar: forecastVar, heldVar: heldVar, steadyGap: steadyGap,
		heavyHeld: heavyHeld, others: others, lightWaiting: lightWaiting, minReserve: minReserve,
		present: present, sole: sole, ok: true}
	return g.verdict(g.mem[loads[cand].Name], cs[cand].held)
}

// gateSnap is the last full assessment, reused for assessEvery.
type gateSnap struct {
	at                   int64
	level                float64
	lightPeak, lightHeld float64
	backlogNeed          float64
	heavyHeld            float64 // held by heavy tenants
	lightForecast        float64
	// The variances of the light tenants' peak, forecast and held counts,
	// as fractions of the pool.
	peakVar, forecastVar, heldVar float64
	steadyGap                     float64 // Assess's: kept for a steady tenant's next request
	others, lightWaiting          bool
	minReserve                    float64
	// present counts the tenants with demand or a demand peak kept (they
	// may only be pausing); sole names one of them.
	present int
	sole    string
	ok      bool
}

// assessEvery bounds how often the O(tenants) assessment runs: averages
// move on a scale of seconds, so a millisecond-old level and reserve are as
// good, and a burst of dispatches costs O(1) each.
const assessEvery = time.Millisecond

// Fresh reports whether the last assessment may be reused at nowN for a
// tenant the gate already knows.
func (g *Gate) Fresh(nowN int64, tenant string) bool {
	return g.snap.ok && nowN-g.snap.at < int64(assessEvery) && nowN >= g.snap.at && g.mem[tenant] != nil
}

// DecideFresh classifies a known tenant from the last assessment and its
// current load.
func (g *Gate) DecideFresh(l TenantLoad, f FleetLoad) (light bool, reserve float64) {
	held := max(float64(l.Held)/float64(max(f.SeqsCap, 1)), float64(l.Tokens)/float64(max(f.TokensCap, 1)))
	return g.verdict(g.mem[l.Name], held)
}

// Alone reports whether tenant is the only one the pool has seen lately
// at the last assessment: no other has demand, or a demand peak kept while
// it may only be pausing. The ramp of an unlearned replica binds only
// where there are others (fleet.Route.Alone).
func (g *Gate) Alone(tenant string) bool {
	sn := &g.snap
	return !sn.ok || sn.present == 0 || (sn.present == 1 && sn.sole == tenant)
}

// WithinShare reports whether tenant's averaged demand is within its
// max-min fair share at the last assessment.
func (g *Gate) WithinShare(tenant string, weight float64) bool {
	m := g.mem[tenant]
	return m == nil || !g.snap.ok || m.load <= max(weight, 1e-9)*g.snap.level
}

// Kept is how many requests' room the gate keeps for tenant's demand peak
// at nowN beyond the held it holds now: a light tenant's peak, as a count
// of its requests, less held, while it may only be pausing (goneAfter
// since its last arrival); nothing for a heavy tenant. Another instance
// sharing the pool's replicas knows nothing of these peaks unless they are
// reported (fleet.DemandReports): with nothing held there its share would
// be the whole batch, and a light tenant's request after a pause would
// wait for one of its completions.
func (g *Gate) Kept(nowN int64, tenant string, held int64) int64 {
	m := g.mem[tenant]
	// As Assess keeps it in the reserve: a tenant whose only arrival was
	// its first (lastArrN unset) is not gone, and its peak lasts until the
	// window rotates it out, which Assess does only when it next runs.
	if m == nil || m.heavy || (m.lastArrN > 0 && nowN-m.lastArrN > m.goneAfter) {
		return 0
	}
	pw := g.peakWindow()
	if half := max(int64(pw), m.goneAfter) / 2; nowN-m.peakStart >= 2*half {
		return 0
	}
	peak := max(m.peakCur, m.peakPrev)
	if peak <= 0 || m.size <= 0 {
		return 0
	}
	return max(int64(math.Ceil(peak/m.size-1e-9))-held, 0)
}

// Asked is tenant's averaged demand at the last assessment (what classifies
// it as light or heavy), as a count of its requests; false when the gate has
// not assessed it. The share split across instances classifies by it: light
// within lightMargin of its max-min level. A tenant heavy by its demand that
// the gate lets through as no flood (noFlood: it is bursty, or its arrivals
// offer no more than its weighted share and it holds less than that or its
// queue has not stood) asks lightMargin times what its arrivals offer
// instead, so that the split holds it light by the same test. One the gate
// holds asks its averaged demand: a closed-loop flood capped at a request or
// two arrives at its completions' pace, and asking three times that, the
// split held it light, lifted its cap and let its whole queue start at once
// (fairgen seed 81 with closed loops and two instances: a light tenant's p99
// TTFT 1.48 s against 20 ms alone; 0.26 s asking so, where the flood still
// reads as no flood while it holds nothing). Held there by its backlog, a
// burst's queue only grew (fairgen seed 494 with two instances, the light
// tenants without the flood: capped at one request of six, 28.5 s against
// 0.41 s direct); asking its offered load alone, closed-loop floods near
// their shares read light and took more (TestFleetFairShareTwoInstances
// 1.32).
func (g *Gate) Asked(tenant string) (float64, bool) {
	m := g.mem[tenant]
	if m == nil || m.size <= 0 {
		return 0, false
	}
	if m.heavy && g.noFlood(m, m.held) {
		return min(m.load, lightMargin*m.offered) / m.size, true
	}
	return m.load / m.size, true
}

// Stands reports whether the gate lets tenant through as no flood while
// its queue has stood for server.standing_queue, at the last assessment:
// heavy by its demand, within its weighted share by its arrivals
// (noFlood), the state in which decide bounds it at that share, holding
// it by the reserve past it. The reserve keeps room only for this
// instance's light tenants, so where they are at another instance of a
// fleet the share split binds such a tenant instead (fleet.SplitPool). A
// closed-loop flood reads so: its arrivals are its completions, within
// any share it is given. So does a light tenant starved behind one, its
// queue standing because others hold the room: the split binds only
// where its part is a request or more, which binding cannot starve.
func (g *Gate) Stands(tenant string) bool {
	m := g.mem[tenant]
	if m == nil || !m.heavy || m.queuedSince == 0 || g.NoStanding {
		return false
	}
	return g.snap.at-m.queuedSince >= int64(g.standingFor()) && g.noFlood(m, m.held)
}

// State is what the gate remembers of one tenant, for traces.
type State struct {
	Heavy             bool    // at the last assessment
	Sustained         bool    // its arrivals offer more than its weighted share (a heavy one is held)
	Load              float64 // what classified it at the last assessment
	PeakCur, PeakPrev float64 // its demand peak, in two half-window buckets
	PeakStart         int64   // when the current bucket started
	GoneAfter         int64   // how long it may be idle and still hold its peak (ns)
	LongRate          float64 // its arrival rate over the reserve hold (per second)
}

// State returns what the gate remembers of tenant; false when it has not
// seen it.
func (g *Gate) State(tenant string) (State, bool) {
	m := g.mem[tenant]
	if m == nil {
		return State{}, false
	}
	return State{Heavy: m.heavy, Sustained: m.sustained, Load: m.load, PeakCur: m.peakCur, PeakPrev: m.peakPrev, PeakStart: m.peakStart, GoneAfter: m.goneAfter, LongRate: m.longRate}, true
}

// decide is the verdict for a tenant as m classifies it, holding the
// fraction held of the pool.
func (g *Gate) decide(m *gateMem, held float64) (light bool, reserve float64) {
	sn := &g.snap
	if !m.heavy {
		return true, 0
	}
	if g.noFlood(m, held) {
		// No flood: it runs beyond the reserve, up to its weighted share
		// (at least one request) once its queue has stood for
		// server.standing_queue. A closed loop's arrivals are its
		// completions, so a closed-loop flood held to its share reads as
		// within it: let through whole, it took the light tenants'
		// reserve too (fairgen with every heavy tenant a closed loop:
		// 452 → 331 of 500 seeds). Its queue never drains; a burst's
		// does between bursts, and one capped at its share while it
		// drains read 0.54 s against 0.41 s direct (seed 494). Without
		// the one request, a bursting light tenant whose share is below
		// a request, its queue standing behind a closed loop the gate
		// holds light, was held as a flood and lost requests to its
		// max_wait (seed 478).
		return true, 0
	}
	if !sn.lightWaiting && held == 0 && sn.heavyHeld == 0 && !g.NoFloor {
		// One heavy request in flight on the pool, unless a light one
		// waits, and only where it leaves the light tenants room for their
		// Poisson noise over what they hold now: it runs a whole service
		// time. One per pool, not per heavy tenant: two floods each keeping
		// one in flight took half of a four-sequence batch from light
		// tenants whose peaks were reserved.
		return false, min(floorK*math.Sqrt(sn.heldVar)+sn.steadyGap, g.reserveCap())
	}
	// The peak plus its Poisson noise (k·√(peak/s) requests of size s) covers a
	// burst a little above the recent ones.
	reserve = sn.lightPeak + g.burstK()*math.Sqrt(sn.peakVar)
	if f := sn.lightForecast; f > 0 {
		reserve = max(reserve, f+forecastK*math.Sqrt(sn.forecastVar))
	}
	reserve += sn.backlogNeed - sn.lightHeld
	if sn.others {
		reserve = max(reserve, sn.minReserve)
	}
	return false, min(max(reserve, 0), g.reserveCap())
}

// reserveCap is the most of the pool a heavy tenant must leave free
// (Cap): what the light tenants' isolation may cost it.
func (g *Gate) reserveCap() float64 {
	if g.Cap != 0 {
		return max(g.Cap, 0)
	}
	return 1
}

// noFlood reports whether a heavy tenant, as m classifies it holding the
// fraction held of the pool, is let through beyond the reserve (decide):
// it is bursty, or its arrivals offer no more than its weighted share and
// it holds less than that share (at least one request) or its queue has
// not stood for server.standing_queue.
func (g *Gate) noFlood(m *gateMem, held float64) bool {
	return !m.sustained && (m.bursty || g.NoStanding || held+m.size <= max(m.share, m.size)+1e-9 || m.queuedSince == 0 || g.snap.at-m.queuedSince < int64(g.standingFor()))
}

// waterLevel is the max-min fair level of the averaged demands: the λ with
// Σ min(avg_i, w_i·λ) = 1 over active tenants, +Inf when the demands fit
// (nobody is heavy then). A tenant is light when avg_i ≤ w_i·λ: it asks
// for no more than its max-min fair share.
func (g *Gate) waterLevel(cs []gateCls) float64 {
	// A tenant asks for its average or, while its demand is above it (still
	// rising), its demand now: a light tenant whose requests are piling up
	// claims its share before its average catches up, so a flood is not
	// light for those seconds. While its last arrivals read as a surge it
	// asks what they offer: a flood's first arrivals beside tenants that
	// ask less than the pool would otherwise find no level at all.
	ask := func(x gateCls) float64 {
		return max(x.load, x.demand, x.surge)
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
