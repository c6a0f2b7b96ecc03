package gate

import (
	"math"
	"time"
)

// A tenant's arrival and service rates as the gate reads them: averaged
// over seconds to minutes, corrected for how long the tenant has been
// active, and read from its recent arrivals alone while it is young or
// its last arrivals surge.

// youngEvents and youngSpan bound when a young tenant's arrival rate is
// read directly, as its arrivals since it became active over the time
// since (youngRate): from this many arrival events spanning at least
// this long. The forecast's and the sustain test's rates average over
// seconds from at least forecastWindow of activity, to bound the noise of
// a first burst, and so read a flood that starts at a fraction of its
// rate for its first second: a flood starting beside light tenants that
// hold most of the pool took what they had free within it, and their
// next peaks waited for its completions (fairgen -fairgen.onset=late:
// the isolation rows held on none of 100 draws). A burst is one event
// (or, sent request by request, a few milliseconds of them); four spread
// over a tenth of a second are no single burst.
const (
	youngEvents = 4
	youngSpan   = 100 * time.Millisecond
)

// rateNow is the arrival rate, divided by the part of the window the
// tenant has been active for (at least the window, to bound the noise of
// its first arrivals: one burst after a pause read as a flood with one
// second).
func (m *gateMem) rateNow(nowN int64) float64 {
	return m.activeRate(m.rate, forecastWindow, nowN)
}

// youngRate is a young tenant's arrival rate read directly, its arrivals
// after its first event over the time since it became active, once it has
// arrived in youngEvents events over youngSpan and for less than
// forecastWindow; 0 otherwise.
func (g *Gate) youngRate(m *gateMem, nowN int64) float64 {
	age := time.Duration(nowN - m.firstN)
	if g.NoYoung || m.youngEv < youngEvents || age >= forecastWindow || m.lastArrN-m.firstN < int64(youngSpan) {
		return 0
	}
	return float64(m.youngArr) / age.Seconds()
}

// surgeEvents and surgeShare bound when a tenant's arrival rate is read
// from its last arrivals alone (surgeRate): its last surgeEvents arrival
// events, spanning at least youngSpan and begun within forecastWindow,
// offering more than surgeShare times its weighted share. A tenant that
// sends a request every few seconds and then floods is not young, and the
// averaged rates read its flood at a fraction of its rate for seconds
// (fairgen -fairgen.onset=trickle: isolation row b held on 8 of 100
// draws; 50 with the surge). A light tenant's Poisson cluster reads so
// too, now and then: 8 events over 3 times the share cost about one draw
// in four of row b with its flood from the start; over 5 times, one in
// 100. What the reading makes heavy stays heavy while it reads so and
// for attackWindow after while its load is above its claim (Assess): with
// the open-ended hysteresis of the averaged load, three tenants at exactly
// their share, one read as a flood once, lost a quarter of their
// throughput (TestGateOverloadStaysBusy, seed 3).
const (
	surgeEvents = 8
	surgeShare  = 5.0
)

// surgeRate is a tenant's arrival rate over its last surgeEvents events
// (the arrivals after the first of them, over the time since it) where
// they span at least youngSpan, began less than forecastWindow ago and
// offer more than surgeShare times its weighted share (at the last
// assessment); 0 otherwise.
func (g *Gate) surgeRate(m *gateMem, nowN int64) float64 {
	if g.NoSurge || m.evLen < surgeEvents {
		return 0
	}
	oldest, newest := m.evAt, (m.evAt+surgeEvents-1)%surgeEvents
	t0 := m.evN[oldest]
	if m.evN[newest]-t0 < int64(youngSpan) || nowN-t0 >= int64(forecastWindow) {
		return 0
	}
	var arr int64
	for i, a := range m.evArr {
		if i != oldest {
			arr += a
		}
	}
	r := float64(arr) / time.Duration(nowN-t0).Seconds()
	if r*g.svcOf(m)*m.size <= surgeShare*m.share {
		return 0
	}
	return r
}

// sustRateNow is the arrival rate over sustainWindow, corrected the same
// way (at least forecastWindow of activity too: a young closed-loop flood
// read at a fraction of its rate would be served as light).
func (m *gateMem) sustRateNow(nowN int64) float64 {
	return m.activeRate(m.sustRate, sustainWindow, nowN)
}

// activeRate is rate, an arrival rate averaged with time constant tau,
// divided by the part of tau the tenant has been active for (since firstN,
// at least forecastWindow).
func (m *gateMem) activeRate(rate float64, tau time.Duration, nowN int64) float64 {
	age := max(float64(nowN-m.firstN)/float64(time.Second), forecastWindow.Seconds())
	if age > 10*tau.Seconds() {
		return rate // the correction is below 5e-5
	}
	return rate / (1 - math.Exp(-age/tau.Seconds()))
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

// svcOf is m's mean service time, or the pool's for a tenant that has
// completed nothing here yet, or the replicas' own (FleetLoad.Svc) while
// nothing has completed here (0: none known). Without the replicas' an
// instance whose only tenant starts to flood beside other instances'
// tenants forecasts it at nothing until its first completion, a service
// time in which it takes the room their peaks need.
func (g *Gate) svcOf(m *gateMem) float64 {
	switch {
	case m.svc > 0:
		return m.svc
	case g.svc > 0 || g.NoFleetSvc:
		return g.svc
	}
	return g.fleetSvc
}

// observe folds l's arrivals and completions since m's last sample into
// m's arrival rate and service time, and the pool's; hold is
// server.reserve_hold (holdFor).
func (g *Gate) observe(m *gateMem, l TenantLoad, nowN int64, hold time.Duration) {
	dt := max(float64(nowN-m.lastN)/float64(time.Second), 0)
	tau := forecastWindow.Seconds()
	if da := l.Arrived - m.arrived; da > 0 && m.rate*tau < 0.01 && (m.lastArrN == 0 || nowN-m.lastArrN > int64(peakWindow)) {
		m.firstN = nowN // back after idling longer than a peak window: a young estimate
		m.youngEv, m.youngArr = 0, 0
	}
	if da := l.Arrived - m.arrived; da > 0 {
		if m.youngEv > 0 {
			m.youngArr += da // after its first event: a first burst is no rate
		}
		m.youngEv++
		m.evN[m.evAt], m.evArr[m.evAt] = nowN, da // the ring of its last events (surgeRate)
		m.evAt = (m.evAt + 1) % surgeEvents
		m.evLen = min(m.evLen+1, surgeEvents)
	}
	// An exponentially weighted count of arrivals per second: each adds
	// 1/τ and the sum decays with τ.
	m.rate = m.rate*math.Exp(-dt/tau) + float64(max(l.Arrived-m.arrived, 0))/tau
	st := sustainWindow.Seconds()
	m.sustRate = m.sustRate*math.Exp(-dt/st) + float64(max(l.Arrived-m.arrived, 0))/st
	// The long-run rate: over the hold, from when it was first seen (at
	// least 10 s, to bound the noise of its first arrivals).
	hs := hold.Seconds()
	decay := math.Exp(-dt / hs)
	m.longRate = m.longRate*decay + float64(max(l.Arrived-m.arrived, 0))/hs
	m.longEvents *= decay
	if l.Arrived > m.arrived {
		m.longEvents += 1 / hs
		// Its mean gap: the larger of the recent one and the long-run one.
		// The recent rate alone says a tenant that sent a few requests
		// close together and then paused as usual is gone.
		m.lastArrN = nowN
		mean := 1 / max(min(m.rateNow(nowN), m.longRateNow(nowN, hold)), 1e-9)
		// A tenant that sends bursts pauses between bursts, not requests.
		mean = max(mean, 1/max(m.longEvents/m.longCorrection(nowN, hold), 1e-9))
		m.goneAfter = int64(min(idleGaps*mean, hs) * float64(time.Second))
	}
	m.arrived = l.Arrived
	if dn := l.Served - m.served; dn > 0 {
		mean := (l.ServedSec - m.servedSec) / float64(dn)
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
	m.served, m.servedSec = l.Served, l.ServedSec
}

// steadyFrac bounds a steady light tenant (steadyVar): its demand peak is
// above its long-run load by less than this part of a Poisson deviation
// of the peak. A Poisson tenant's peak over the peak window is two or
// three deviations above its mean, and one sending a request now and then
// peaks a whole request above it.
const steadyFrac = 0.25

// steadyVar is the variance of a steady light tenant's demand, as a
// fraction of the pool, in place of a Poisson count's (size·peak): a
// closed loop's fixed clients or a batch job's workers ask what they hold
// and never more, so their peak over the peak window is their long-run
// load (arrivals over server.reserve_hold times the service time), and
// the margin a Poisson tenant needs over its peak would be room they
// cannot use. Beside a flood on a batch of eight, a loop of three that
// reads light held the flood's floor request off for three deviations of
// what it held (five sequences, with two free), and the flood ran nothing
// while the replica decoded 0.48 of what vLLM alone did
// (TestFairgenBusy). ok is false for any other tenant: its peak is above
// its load by steadyFrac of a deviation or more.
func (g *Gate) steadyVar(m *gateMem, peak float64, nowN int64, hold time.Duration) (v float64, ok bool) {
	if g.NoSteady || peak <= 0 {
		return 0, false
	}
	d := max(peak-m.longRateNow(nowN, hold)*g.svcOf(m)*m.size, 0)
	if d*d >= steadyFrac*steadyFrac*m.size*peak {
		return 0, false
	}
	return d * d, true
}
