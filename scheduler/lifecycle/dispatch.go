package lifecycle

import (
	"context"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/gate"
)

// Work-conserving fair dispatch (the bound is in queue/doc.go, "Work
// conservation").
//
// The queue decides which request goes next (bands, then weighted virtual
// counters); the fair-share gate (package scheduler/gate, whose doc says
// how it classifies tenants and sizes the reserve) decides only whether it
// may start now, from its pool's loads (gate.Pools, keyed by fleet.PoolKey:
// the replicas serving the request's model). A full pool parks a tenant above its share when
// another pool has room (the queue goes on to that pool's requests), and
// blocks the queue for one within its share (full).
//
// Per-tenant `concurrency` is an operator limit on top, never needed for
// isolation. Shares are tested in scheduler/gate (a discrete-event run of
// the real queue and gate, one or two pools, and the seeded fairness
// scenarios of fairgen_test.go).

// dispatchLoop hands queued calls to replicas with room. It never spins:
// it waits for new work (queue Ready) or freed room (wake).
func (e *Engine) dispatchLoop(ctx context.Context) {
	for {
		e.dispatchPass()
		select {
		case <-ctx.Done():
			return
		case <-e.q.Ready():
		case <-e.wake:
		}
	}
}

// dispatchPass delivers every queued call the predicate admits now. The
// loop runs it on each wake; admit runs it inline (dispatchInline). The
// queue's mutex serialises passes and NextView hands each entry out once.
func (e *Engine) dispatchPass() {
	for {
		it, ok := e.q.NextView(e.admissible)
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
func (e *Engine) admissible(it queue.Item[*call], v queue.View[*call]) queue.Verdict {
	c := it.Payload
	t := c.t
	if cur := e.pol.Load().Tenants[t.Name]; cur != nil {
		t = cur // clamps and reloads apply from the next dispatch
	}
	if lim := t.Cfg.Concurrency; (lim > 0 && t.RT.Inflight.Load()+int64(v.Pending(t.Name)) >= int64(lim)) || c.keyAtCap() {
		return queue.Park
	}
	if lim := t.Cfg.InflightTokens; lim > 0 && t.RT.InflightTokens.Load()+c.size > lim {
		return queue.Park
	}
	e.repool(c)
	// The table's lock is held from the loads read to the verdict acted on
	// (the reserved room counted as held), so no move lands in between.
	e.pools.Lock()
	defer e.pools.Unlock()
	rt := c.route
	rt.Alone = e.pools.PoolLocked(c.place.Pool).Gate.Alone(t.Name)
	f := e.reps.FleetOf(c.place.Pool, rt.Alone, c.size)
	light, reserve := e.belowFairShare(c, f)
	rt.Light = light
	if !light && !f.FitsBeyond(c.size, reserve) {
		if e.reps.Fits(rt, c.size) || e.roomBeyondShare(c, rt) {
			// Room exists, but the light tenants need it: skip this
			// tenant so that they can use it.
			return queue.Park
		}
		return e.full(c, true)
	}
	rep, seq := e.reps.Take(rt, c.size, nil)
	if rep == nil {
		if e.roomBeyondShare(c, rt) {
			// This instance's share of a replica other instances use
			// binds, not the replica: skip this tenant, so that one the
			// share does not bind uses the room.
			return queue.Park
		}
		return e.full(c, !e.pools.PoolLocked(c.place.Pool).Gate.WithinShare(t.Name, float64(t.Cfg.Weight)))
	}
	c.rep, c.seq = rep, seq
	e.pools.MoveLocked(&c.place, c.t.Name, c.size, false, gate.SpotHeld)
	return queue.Dispatch
}

// roomBeyondShare reports whether a replica of c's pool has room that
// only this instance's share keeps from c, and another tenant queued here
// may use it (othersMayUse). Both where the gate holds c and where the
// share does: blocking the queue there left a light tenant behind a held
// flood while the replica had room for it (fairgen, two instances: 24 of
// 500 seeds on 501-1000). The pools' lock is held.
func (e *Engine) roomBeyondShare(c *call, rt fleet.Route) bool {
	if rt.NoShare {
		return false
	}
	// The room first: one pass over the pool's replicas, where the scan of
	// its queued tenants takes the replica set's lock per tenant, and a
	// single instance (no share) never has such room.
	rt.NoShare = true
	return e.reps.Fits(rt, c.size) && e.othersMayUse(c)
}

// othersMayUse reports whether another tenant has requests queued on c's
// pool that this instance's share of its replicas may not bind (the split
// does not hold it heavy on all of them): only then is room the share
// keeps from c of use here. With none, parking c would only cost it its
// place (a lift): TestFleetFairShareTwoInstances read 1.40 so; and
// waiting for a light tenant to be reported there, a new tenant's first
// burst queued behind a heavy tenant the share bound (fairgen seeds 44 and
// 151 with two instances). The pools' lock is held.
func (e *Engine) othersMayUse(c *call) bool {
	return e.pools.PoolLocked(c.place.Pool).QueuedBesides(c.t.Name, func(tenant string) bool {
		return !e.reps.HeldHeavy(c.place.Pool, tenant)
	})
}

// full is the verdict when c's pool has no room (the pools' lock held). A
// tenant asking more than its max-min share of the pool (above) is parked
// when another pool has room, so the queue goes on to requests for that
// pool; it competes again at its pool's next completion. One within its share
// blocks the queue until the next completion instead (a short wait: it is
// not backlogged on average): parking would lift its counter to the band
// minimum, and that credit is what makes it the next pick.
func (e *Engine) full(c *call, above bool) queue.Verdict {
	if !above || !e.reps.RoomOutside(c.place.Pool, 1) {
		return queue.Block
	}
	e.pools.ParkFullLocked(c.place.Pool, c.t.Name)
	return queue.Park
}

// belowFairShare classifies the call's tenant on its pool (light: its
// averaged demand there is within its weighted split) and returns the
// fraction of the pool reserved for the pool's light tenants, which a
// heavy tenant must leave free. f is the pool's room; the pools' lock is
// held.
func (e *Engine) belowFairShare(c *call, f gate.FleetLoad) (light bool, reserve float64) {
	pol := e.pol.Load()
	pl := e.pools.PoolLocked(c.place.Pool)
	nowN := e.now().UnixNano()
	if t := pol.Tenants[c.t.Name]; t != nil && pl.Gate.Fresh(nowN, t.Name) {
		return pl.Gate.DecideFresh(pl.Load(t.Name, float64(t.Cfg.Weight)), f)
	}
	return pl.Assess(nowN, c.t.Name, len(pol.Order), func(i int) (string, float64) {
		return pol.Order[i].Name, float64(pol.Order[i].Cfg.Weight)
	}, f, pol.Cfg.Server.ReserveHold, pol.Cfg.Server.StandingQueue, pol.Cfg.Server.Headroom, pol.Cfg.Server.Margin(), pol.Cfg.Server.Cap())
}

// movePool counts c at to in its pool's load. The request goroutine's own:
// c.sent (whether it ran, for the pool's service times) is its to read.
func (e *Engine) movePool(c *call, to gate.Spot) {
	e.pools.Move(&c.place, c.t.Name, c.size, c.sent, to)
}

// repool counts a queued call in the pool its model has now when that
// changed while it waited (a replica joined or left, a model list
// changed), so that it is gated, parked and woken with the replicas that
// can serve it, not those it was admitted with: a pool whose replicas all
// left would never complete a request to wake it. Only the dispatch
// predicate writes c.place.Pool after admission.
func (e *Engine) repool(c *call) {
	e.pools.Repool(&c.place, e.reps.PoolKeyOf(c.req.Model), c.t.Name, c.size)
}
