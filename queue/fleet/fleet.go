// Package fleet merges the fair-share counters of Sluice instances that
// serve the same replicas, so that every instance orders its tenants by the
// service each tenant was charged anywhere in the fleet, not only here
// (SCHEDULING.md §9, "Fleet-wide fair share"). It does no I/O: a driver
// (scheduler/fairshare.go) reads the local flows from the queue
// ([queue.Queue.AppendFlows]), exchanges [Flow] reports with the other
// instances (scheduler/peers) and applies what [Merger.Merge] returns
// ([queue.Queue.AdjustFleet], [queue.Queue.SetFleetFloors]).
//
// # Model
//
// A flow's counter at an instance k is lifted + (S_k + R_k)/w: S_k its own
// charged service, R_k the other instances' service it has added, lifted
// every raise that was not service. Instances report S and lifted per
// flow; k adds the growth of each other's S since the last report it
// applied (a PN counter per instance: refunds are negative growth; a flow
// created again, its tenant removed and configured again, counts from 0)
// and
// adopts the largest lifted (a max register), so that a lift made at one
// instance is made once, not once per instance. Service of an instance
// that went away stays counted; its entries are forgotten after
// [ForgetAfter].
//
// The floor of a band is the least counter, in k's view, of a flow that is
// eligible (queued, not parked) at some instance. A flow that becomes
// eligible at k is lifted to at most the floor, so a tenant competing
// elsewhere (not idle) keeps its counter, while one idle or parked
// everywhere gets no credit.
//
// # Fleet fairness bound
//
// Let N be the number of instances and D the age of the oldest service an
// instance's view may lack: with exchange period P, D ≤ 2P (a report is up
// to P old when read, and is applied until the next exchange, P later).
// Let U_i bound the service one instance charges flow i within any window
// of length D (at most C_i·(1 + D·μ), μ the instance's dispatch rate). For
// flows i and j of one band that are both eligible at every instance
// throughout [t1 − D, t2], with S the fleet-wide charged service in
// [t1, t2]:
//
//	|S_i/w_i − S_j/w_j| ≤ (C_i + H_i + 2(N−1)·U_i)/w_i + (C_j + H_j + 2(N−1)·U_j)/w_j
//
// with C and H as in package queue's bound (a request's largest charge and
// the refund credit of requests in flight, fleet-wide). Without the
// exchange each instance keeps queue's bound for its own arrivals only and
// the fleet-wide difference can reach N times it plus every instance's
// uneven split of the tenants' traffic (a tenant that reaches more
// instances gets more).
//
// Proof. No flow becomes eligible at any instance in [t1 − D, t2], so no
// lift happens there and every lift before is in every view by t1: all
// instances agree on lifted_f for both flows. Let φ_f(t) = lifted_f +
// F_f(t)/w_f, with F_f the fleet-wide charged service; k's view is
// v^k_f = φ_f − u^k_f/w_f with |u^k_f| ≤ (N−1)·U_f the service of the
// others not yet applied at k, so |v^k_f − φ_f| ≤ ε_f = (N−1)·U_f/w_f.
// Take t in the interval and s the last dispatch of i anywhere at or before
// t, by instance k. Then v^k_i(s⁻) ≤ v^k_j(s) (i was picked at k's band
// minimum and j is eligible at k), so φ_i(s⁻) ≤ φ_j(s) + ε_i + ε_j. After
// s, φ_i rises by at most C_i/w_i (the dispatch at s and its
// reconciliation; reconciliations of earlier requests only lower it, their
// overruns being inside C_i), and φ_j falls by at most H_j/w_j (refunds).
// So φ_i(t) − φ_j(t) ≤ C_i/w_i + H_j/w_j + ε_i + ε_j, and symmetrically;
// the interval difference is φ_i − φ_j at t2 minus at t1 (lifted is
// constant), at most the sum of the two one-sided bounds. ∎
//
// The same step gives, for any topology and once D has passed since
// either flow was lifted: no instance hands a tenant a slot while its
// fleet counter leads that of a tenant queued there by more than
// C_i/w_i + ε_i + ε_j. What it cannot do is serve a tenant that is not
// queued at the instance: how a shared replica's batch is split between
// instances (§9, by the instances' demand) sets what a tenant alone on an
// instance gets.
//
// TestFleetBound (fleet_test.go) checks the bound over every interval of
// seeded runs of real queues exchanging through a model of the driver, over
// many shapes (instances, weights, costs, periods, refunds, tenants coming
// and going).
package fleet

import (
	"math"
	"time"

	"github.com/sluicehq/sluice/queue"
)

// Flow is one flow in an instance's report.
type Flow struct {
	Tenant string
	Band   int
	// Service is the instance's own net charged service, in cost units.
	Service float64
	// Lifted is the flow's lifted at the instance (cost units per weight).
	Lifted float64
	// Backlogged: the flow has queued entries at the instance.
	Backlogged bool
	// Gen tells apart the instance's flows of one name
	// ([queue.FlowState.Gen]): Service of a new one counts from 0.
	Gen int32
}

// Key names a flow.
type Key struct {
	Tenant string
	Band   int
}

// Adjustment is what to apply to one local flow
// ([queue.Queue.AdjustFleet]): others' service (cost units) and the
// fleet's lifted.
type Adjustment struct {
	Key
	Service float64
	Lifted  float64
}

// Result is one merge's outcome.
type Result struct {
	Adjust []Adjustment
	// Floor and HasFloor are the bands' fleet floors
	// ([queue.Queue.SetFleetFloors]).
	Floor    [queue.NumBands]float64
	HasFloor [queue.NumBands]bool
}

// ForgetAfter is how long the service last reported by an instance that
// stopped reporting is remembered: should it report again (an exchange
// that failed for a while), only its growth since counts.
const ForgetAfter = 10 * time.Minute

// Merger holds what one instance has applied of the others' reports. The
// zero value is ready; it is not safe for concurrent use.
type Merger struct {
	peers map[string]*peer
}

type peer struct {
	seen    time.Time
	service map[Key]applied // last applied Service per flow
}

type applied struct {
	service float64
	gen     int32
}

// Report is this instance's report from its flows.
func Report(local []queue.FlowState) []Flow {
	out := make([]Flow, 0, len(local))
	for _, f := range local {
		out = append(out, Flow{Tenant: f.Tenant, Band: f.Band, Service: float64(f.Charged), Lifted: f.Lifted, Backlogged: f.Backlogged, Gen: f.Gen})
	}
	return out
}

// Merge folds the others' latest reports (by instance id; this instance
// excluded) into the local flows: the adjustments to apply and the floors.
// weight is a tenant's local weight (false: unknown here, its flows are
// skipped). Reports of instances missing from others are kept for
// [ForgetAfter] from now, unapplied.
func (m *Merger) Merge(now time.Time, local []queue.FlowState, weight func(string) (float64, bool), others map[string][]Flow) Result {
	if m.peers == nil {
		m.peers = map[string]*peer{}
	}
	type view struct {
		counter, lifted float64
		w               float64
		backlogged      bool
		local           bool
	}
	views := make(map[Key]*view, len(local))
	for _, f := range local {
		views[Key{f.Tenant, f.Band}] = &view{counter: f.Counter, lifted: f.Lifted, w: f.Weight, backlogged: f.Backlogged, local: true}
	}
	adj := map[Key]*Adjustment{}
	get := func(k Key) (*view, *Adjustment) {
		v := views[k]
		if v == nil {
			w, ok := weight(k.Tenant)
			if !ok || w <= 0 || k.Band < 0 || k.Band >= queue.NumBands {
				return nil, nil
			}
			v = &view{w: w} // created by AdjustFleet at counter 0, lifted 0
			views[k] = v
		}
		a := adj[k]
		if a == nil {
			a = &Adjustment{Key: k, Lifted: math.Inf(-1)}
			adj[k] = a
		}
		return v, a
	}
	for id, flows := range others {
		p := m.peers[id]
		if p == nil {
			p = &peer{service: map[Key]applied{}}
			m.peers[id] = p
		}
		p.seen = now
		for _, f := range flows {
			k := Key{f.Tenant, f.Band}
			v, a := get(k)
			if v == nil || math.IsNaN(f.Service) || math.IsInf(f.Service, 0) || math.IsNaN(f.Lifted) {
				continue
			}
			last := p.service[k]
			if last.gen != f.Gen {
				last = applied{gen: f.Gen} // a new flow: its service counts from 0
			}
			a.Service += f.Service - last.service
			p.service[k] = applied{service: f.Service, gen: f.Gen}
			a.Lifted = max(a.Lifted, f.Lifted)
			v.backlogged = v.backlogged || f.Backlogged
		}
	}
	for id, p := range m.peers {
		if now.Sub(p.seen) > ForgetAfter {
			delete(m.peers, id)
		}
	}
	var r Result
	for k, v := range views {
		c := v.counter
		if a := adj[k]; a != nil {
			c += a.Service / v.w
			if a.Lifted > v.lifted {
				c += a.Lifted - v.lifted
			}
			if a.Service != 0 || a.Lifted > v.lifted {
				r.Adjust = append(r.Adjust, *a)
			}
		}
		if !v.backlogged {
			continue
		}
		if !r.HasFloor[k.Band] || c < r.Floor[k.Band] {
			r.Floor[k.Band], r.HasFloor[k.Band] = c, true
		}
	}
	return r
}
