package gate

import (
	"maps"
	"slices"
	"sync"
	"time"
)

// Key identifies a pool (the replicas serving a model, fleet.PoolKey):
// comparable, and it says whether the replica in a slot is in the pool.
type Key interface {
	comparable
	Has(slot int) bool
	Replicas() int // how many replicas the pool has
}

// Spot is where a request counts in its pool's load.
type Spot uint8

const (
	SpotNone   Spot = iota
	SpotQueued      // in the tenant's queue
	SpotHeld        // replica room reserved (dispatching or running)
)

// Place is where one request counts in the pools' loads. The request keeps
// it (the table never holds a request); Pools' methods change it.
type Place[K Key] struct {
	// Pool is the pool its share is counted in: fixed at admission, so
	// what is added is what is removed; only Repool changes it.
	Pool   K
	Spot   Spot      // guarded by the table's lock
	HeldAt time.Time // when it last took replica room; guarded by the table's lock
}

// Pools is every pool's per-tenant load and gate memory. A load moves with
// its request (Move), under the table's lock; the gate memory is touched
// only by the dispatch predicate, which holds the same lock (Lock) while it
// reads the loads and decides, so no move lands between its reads and its
// verdict. Lock order: the queue mutex, then this lock, then the replica
// set's. The zero value is empty and ready; Now is the server's clock, for
// service times (nil: none are measured).
type Pools[K Key] struct {
	mu    sync.Mutex
	pools map[K]*Pool
	Now   func() time.Time
}

// Pool is one pool's loads and gate. Its methods are called with the
// table's lock held.
type Pool struct {
	tenants map[string]*poolTenant
	Gate    Gate
	loads   []TenantLoad // reused by Assess
	// parked are tenants parked because the pool was full while another
	// had room; the pool's next completion lets them compete again.
	parked []string
}

// poolTenant is one tenant's load on one pool.
type poolTenant struct {
	held   int64 // requests holding replica room
	queued int64 // requests queued
	tokens int64 // replica room held (input + allowed output)
	// Cumulative, for the gate's forecast: admissions, requests that ran
	// and settled, and their seconds from dispatch to settlement.
	arrived, served int64
	servedSec       float64
}

// Lock holds the table still for the dispatch predicate's decision.
func (p *Pools[K]) Lock() { p.mu.Lock() }

// Unlock ends Lock.
func (p *Pools[K]) Unlock() { p.mu.Unlock() }

// PoolLocked is k's pool, made on first use; the table's lock is held.
func (p *Pools[K]) PoolLocked(k K) *Pool {
	if p.pools == nil {
		p.pools = map[K]*Pool{}
	}
	pl := p.pools[k]
	if pl == nil {
		if len(p.pools) >= 64 {
			// Models moved between replicas: forget pools nothing uses.
			for k2, o := range p.pools {
				if o.idle() {
					delete(p.pools, k2)
				}
			}
		}
		pl = &Pool{tenants: map[string]*poolTenant{}}
		p.pools[k] = pl
	}
	return pl
}

// Move counts a request of tenant holding size tokens of replica room at
// to in its pool (at.Pool). Moving to where it is is a no-op, so every
// ending may move it to SpotNone. ran says it ran upstream: read only when
// it leaves SpotHeld for SpotNone, where its time holding room is a
// service time; the caller reads it where it may (the request goroutine's
// own flag, false from the dispatch predicate).
func (p *Pools[K]) Move(at *Place[K], tenant string, size int64, ran bool, to Spot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.MoveLocked(at, tenant, size, ran, to)
}

// MoveLocked is Move with the table's lock held (the dispatch predicate).
func (p *Pools[K]) MoveLocked(at *Place[K], tenant string, size int64, ran bool, to Spot) {
	from := at.Spot
	if from == to {
		return
	}
	pl := p.PoolLocked(at.Pool)
	pt := pl.tenants[tenant]
	if pt == nil {
		pt = &poolTenant{}
		pl.tenants[tenant] = pt
	}
	switch from {
	case SpotNone:
		pt.arrived++ // admitted (a requeue comes from SpotHeld)
	case SpotQueued:
		pt.queued--
	case SpotHeld:
		pt.held--
		pt.tokens -= size
		if to == SpotNone && ran && p.Now != nil {
			pt.served++
			pt.servedSec += p.Now().Sub(at.HeldAt).Seconds()
		}
	}
	switch to {
	case SpotQueued:
		pt.queued++
	case SpotHeld:
		pt.held++
		pt.tokens += size
		if p.Now != nil {
			at.HeldAt = p.Now()
		}
	}
	at.Spot = to
	// Entries stay (their counts are cumulative): one per tenant and pool.
}

// Repool counts a queued request in pool k when its pool changed while it
// waited (a replica joined or left, a model list changed), as an arrival
// there; one no longer queued keeps its pool. Only the dispatch predicate
// repools, so at.Pool is read before the lock is taken.
func (p *Pools[K]) Repool(at *Place[K], k K, tenant string, size int64) {
	if k == at.Pool {
		return
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	if at.Spot != SpotQueued {
		return
	}
	p.MoveLocked(at, tenant, size, false, SpotNone)
	at.Pool = k
	p.MoveLocked(at, tenant, size, false, SpotQueued)
}

// WaitingOn is this instance's demand on the replica in slot i beyond
// its requests in flight: the requests queued in the pools the replica
// serves, and the room their gates keep for light tenants' demand peaks
// (Gate.Kept; with Now set).
func (p *Pools[K]) WaitingOn(i int) int64 {
	var n int64
	p.demandOn(i, func(_ int64, _ string, _ int, pt *poolTenant, g *Gate, kept int64) {
		n += pt.queued + kept
	})
	return n
}

// Demand is one tenant's demand on a replica, in requests (DemandOn).
type Demand struct {
	// Asked is its averaged demand as its gate last assessed it
	// (Gate.Asked; what it holds and queues where the gate has not).
	Asked float64
	// Asks is what it asks now: what it holds and queues, and the room
	// kept for its peak.
	Asks float64
	// Queued is the part of Asks queued.
	Queued float64
	// Held is the part of Asks holding replica room (in flight).
	Held float64
	// Steady: its gate reads it light and steady (Gate.Steady), in every
	// pool the replica serves where it has demand.
	Steady bool
	// Stands: its gate lets it through as no flood while its queue has
	// stood, in a pool the replica serves (Gate.Stands).
	Stands bool
}

// DemandOn visits every tenant with demand on the replica in slot i, in
// the pools the replica serves, each pool's spread evenly over its
// replicas (Key.Replicas), since a pool's request may go to any of them.
// Tenants come in name order, each once.
func (p *Pools[K]) DemandOn(i int, visit func(tenant string, d Demand)) {
	var by map[string]Demand
	p.demandOn(i, func(nowN int64, name string, replicas int, pt *poolTenant, g *Gate, kept int64) {
		now := pt.held + pt.queued + kept
		if now == 0 {
			return
		}
		asked, ok := g.Asked(name)
		if !ok {
			asked = float64(pt.held + pt.queued)
		}
		if by == nil {
			by = map[string]Demand{}
		}
		d, seen := by[name]
		d.Steady = nowN != 0 && g.Steady(name, nowN) && (d.Steady || !seen)
		d.Held += float64(pt.held) / float64(replicas)
		d.Asked += asked / float64(replicas)
		d.Asks += float64(now) / float64(replicas)
		d.Queued += float64(pt.queued) / float64(replicas)
		d.Stands = d.Stands || g.Stands(name)
		by[name] = d
	})
	for _, name := range slices.Sorted(maps.Keys(by)) {
		visit(name, by[name])
	}
}

// demandOn calls f for every tenant of every pool the replica in slot i
// serves, with the pool's replica count, its gate and the room the gate
// keeps for the tenant.
func (p *Pools[K]) demandOn(i int, f func(nowN int64, name string, replicas int, pt *poolTenant, g *Gate, kept int64)) {
	p.mu.Lock()
	defer p.mu.Unlock()
	var nowN int64
	if p.Now != nil {
		nowN = p.Now().UnixNano()
	}
	for k, pl := range p.pools {
		if !k.Has(i) {
			continue
		}
		n := max(k.Replicas(), 1)
		for name, pt := range pl.tenants {
			var kept int64
			if p.Now != nil {
				kept = pl.Gate.Kept(nowN, name, pt.held)
			}
			f(nowN, name, n, pt, &pl.Gate, kept)
		}
	}
}

// ReservedOn is the most any pool the replica in slot i serves keeps free
// for its light tenants beside a heavy tenant at nowN (Gate.Reserved), as
// a fraction of that pool.
func (p *Pools[K]) ReservedOn(i int, nowN int64) float64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var r float64
	for k, pl := range p.pools {
		if k.Has(i) {
			r = max(r, pl.Gate.Reserved(nowN))
		}
	}
	return r
}

// Load is tenant's load on k's pool (weight left 0); nothing when k has
// no pool yet.
func (p *Pools[K]) Load(k K, tenant string) TenantLoad {
	p.mu.Lock()
	defer p.mu.Unlock()
	if pl := p.pools[k]; pl != nil {
		return pl.Load(tenant, 0)
	}
	return TenantLoad{Name: tenant}
}

// ParkFullLocked records that tenant was parked because k's pool was full
// (the table's lock is held: the dispatch predicate).
func (p *Pools[K]) ParkFullLocked(k K, tenant string) {
	pl := p.PoolLocked(k)
	if !slices.Contains(pl.parked, tenant) {
		pl.parked = append(pl.parked, tenant)
	}
}

// UnparkFull forgets the tenants parked on k's full pool and returns them,
// for the caller to let compete again (outside the table's lock).
func (p *Pools[K]) UnparkFull(k K) []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	pl := p.pools[k]
	var names []string
	if pl != nil && len(pl.parked) > 0 {
		names = slices.Clone(pl.parked)
		pl.parked = pl.parked[:0]
	}
	return names
}

// UnparkAll forgets the tenants parked on every full pool and returns them
// (the members changed: their pools may have).
func (p *Pools[K]) UnparkAll() []string {
	p.mu.Lock()
	defer p.mu.Unlock()
	var names []string
	for _, pl := range p.pools {
		names = append(names, pl.parked...)
		pl.parked = pl.parked[:0]
	}
	return names
}

// Load is tenant's load on the pool as the gate sees it.
func (pl *Pool) Load(tenant string, weight float64) TenantLoad {
	l := TenantLoad{Name: tenant, Weight: weight}
	if pt := pl.tenants[tenant]; pt != nil {
		l.Held, l.Queued, l.Tokens = pt.held, pt.queued, pt.tokens
		l.Arrived, l.Served, l.ServedSec = pt.arrived, pt.served, pt.servedSec
	}
	return l
}

// Assess is the pool's Gate.Assess of cand among n tenants, the i-th's
// name and weight from tenant(i) (the policy's order), with Hold set to
// hold, Standing to standing, Margin to margin (server.reserve_margin,
// 0 none) and Cap to maxReserve (server.reserve_cap, 0 none kept free):
// light, or heavy and the fraction of the pool it must leave free.
// A cand not among them (removed by a reload) is light with nothing
// reserved: its queued work drains freely.
func (pl *Pool) Assess(nowN int64, cand string, n int, tenant func(i int) (string, float64), f FleetLoad, hold, standing time.Duration, minReserve, margin, maxReserve float64) (light bool, reserve float64) {
	loads := pl.loads[:0]
	at := -1
	for i := range n {
		name, w := tenant(i)
		if name == cand {
			at = len(loads)
		}
		loads = append(loads, pl.Load(name, w))
	}
	pl.loads = loads
	pl.Gate.Hold, pl.Gate.Standing, pl.Gate.Margin = hold, standing, margin
	if margin <= 0 {
		pl.Gate.Margin = -1 // Gate's zero is the default
	}
	pl.Gate.Cap = maxReserve
	if maxReserve <= 0 {
		pl.Gate.Cap = -1
	}
	if at < 0 {
		return true, 0
	}
	return pl.Gate.Assess(nowN, loads, at, f, minReserve)
}

// QueuedBesides reports whether a tenant other than except has requests
// queued on the pool for which usable is true.
func (pl *Pool) QueuedBesides(except string, usable func(tenant string) bool) bool {
	for name, pt := range pl.tenants {
		if pt.queued > 0 && name != except && usable(name) {
			return true
		}
	}
	return false
}

// idle reports whether nothing is queued on or holding room in the pool.
func (pl *Pool) idle() bool {
	if len(pl.parked) > 0 {
		return false
	}
	for _, pt := range pl.tenants {
		if pt.held != 0 || pt.queued != 0 {
			return false
		}
	}
	return true
}
