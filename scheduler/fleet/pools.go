package scheduler

import (
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/gate"
)

// Per-pool fair shares. Tenants compete only for the replicas they can
// use, so the dispatch gate (scheduler/gate, fed by dispatch.go) keeps
// one share computation and one reserve per pool: a flood of model A is
// measured against A's replicas alone (an idle model B neither holds it
// back nor lends it room that is not A's), and B's light tenants are
// reserved for on B's.

// poolKey identifies a pool: a bit per replica, its slot (the lowest
// free when it joined; slots past the 256th share the last bit, which can
// only merge pools, never split one).
type poolKey [4]uint64

func (k *poolKey) set(i int) {
	b := min(i, 255)
	k[b/64] |= 1 << (b % 64)
}

func (k poolKey) has(i int) bool {
	b := min(i, 255)
	return k[b/64]&(1<<(b%64)) != 0
}

// poolKeyOf is model's pool: the replicas serving it, plus every replica
// that shares a served model with one of them, transitively. Partly
// overlapping pools (an adapter loaded on some of a base model's replicas)
// are one pool, so a flood of one cannot fill the replicas the other's
// light tenants need without the gate seeing them. Before any replica's
// models are known every replica serves every model: one pool, the fleet.
//
// Pools change only when a replica's model list does, so the keys are
// memoised per list state (poolCache): computing one is O(replicas²).
func (s *replicaSet) poolKeyOf(model string) poolKey {
	c := s.pools.Load()
	set := s.Current()
	reps := set.List()
	if c != nil && c.set == set && c.current(reps) {
		if k, ok := c.keys[model]; ok {
			return k
		}
	}
	// The lists are taken before computing: a list read meanwhile then
	// invalidates the entry instead of hiding under it.
	lists := make([]modelList, len(reps))
	for i, r := range reps {
		lists[i] = listOf(r)
	}
	k := s.computePoolKey(reps, model)
	keys := map[string]poolKey{}
	if c != nil && c.set == set && slices.Equal(c.lists, lists) {
		if len(c.keys) >= maxCachedPools {
			return k
		}
		keys = maps.Clone(c.keys)
	}
	keys[model] = k
	s.pools.Store(&poolCache{set: set, lists: lists, keys: keys})
	return k
}

// maxCachedPools bounds the memoised models (only served ones reach it).
const maxCachedPools = 1024

// poolCache is poolKeyOf's memo for one state of the replicas' model lists.
// Immutable.
type poolCache struct {
	set   *fleet.Members // the members it was computed for
	lists []modelList    // per replica, in set order
	keys  map[string]poolKey
}

// modelList identifies a replica's reported model list: replicaObs is
// immutable and a poll that did not re-read /v1/models carries the slice
// over, so the same backing array is the same list.
type modelList struct {
	first *string
	n     int
}

func listOf(r *fleet.Replica) modelList {
	o := r.Obs.Load()
	if o == nil || len(o.Models) == 0 {
		return modelList{}
	}
	return modelList{&o.Models[0], len(o.Models)}
}

func (c *poolCache) current(reps []*fleet.Replica) bool {
	if len(c.lists) != len(reps) {
		return false
	}
	for i, r := range reps {
		if listOf(r) != c.lists[i] {
			return false
		}
	}
	return true
}

func (s *replicaSet) computePoolKey(reps []*fleet.Replica, model string) poolKey {
	var k poolKey
	known := s.AnyKnown()
	served := make([][]string, len(reps))
	var models []string
	for i, r := range reps {
		served[i] = r.Served()
		if s.Serves(r, model, known) {
			k.set(r.Slot)
			models = append(models, served[i]...)
		}
	}
	if !known {
		return k
	}
	for grown := true; grown; {
		grown = false
		for i, r := range reps {
			if k.has(r.Slot) || !slices.ContainsFunc(served[i], func(m string) bool { return slices.Contains(models, m) }) {
				continue
			}
			k.set(r.Slot)
			models = append(models, served[i]...)
			grown = true
		}
	}
	return k
}

// fleetOf sums the load and capacity of the pool's replicas that can take
// work.
func (s *replicaSet) fleetOf(key poolKey) gate.FleetLoad {
	s.Lock()
	defer s.Unlock()
	var f gate.FleetLoad
	for _, r := range s.List() {
		if !key.has(r.Slot) {
			continue
		}
		k, load, seqs, st := s.RoomOf(r)
		if st >= gpu.StateDraining || k <= 0 {
			continue
		}
		f.Seqs += seqs
		f.SeqsCap += r.SeqLimit(seqs)
		f.Probe += r.ProbeExcess()
		f.Tokens += load
		f.TokensCap += k
	}
	return f
}

// roomOutside reports whether a replica outside key can take one more
// request of size tokens (so blocking the queue for key's pool would idle
// it).
func (s *replicaSet) roomOutside(key poolKey, size int64) bool {
	s.Lock()
	defer s.Unlock()
	for _, r := range s.List() {
		if key.has(r.Slot) {
			continue
		}
		k, load, seqs, st := s.RoomOf(r)
		if st < gpu.StateDraining && k > 0 && seqs < r.SeqLimit(seqs) && load+size <= k {
			return true
		}
	}
	return false
}

// spot is where a call counts in its pool's load.
type spot uint8

const (
	spotNone   spot = iota
	spotQueued      // in the tenant's queue
	spotHeld        // replica room reserved (dispatching or running)
)

// poolTable is every pool's per-tenant load and gate memory. The load
// moves with the call (move), under mu; the gate memory is touched only by
// the dispatch predicate, which also holds mu while it reads the loads.
type poolTable struct {
	mu    sync.Mutex
	pools map[poolKey]*pool
	now   func() time.Time // the server's clock, for service times
}

type pool struct {
	tenants map[string]*poolTenant
	gate    gate.Gate
	loads   []gate.TenantLoad // reused by belowFairShare
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

func (p *poolTable) getLocked(k poolKey) *pool {
	if p.pools == nil {
		p.pools = map[poolKey]*pool{}
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
		pl = &pool{tenants: map[string]*poolTenant{}}
		p.pools[k] = pl
	}
	return pl
}

// move counts c at to in its pool (c.pool, fixed at admission, so what is
// added is what is removed). Moving to where it is is a no-op, so every
// ending may move it to spotNone.
func (p *poolTable) move(c *call, to spot) {
	p.mu.Lock()
	defer p.mu.Unlock()
	p.moveLocked(c, to)
}

func (p *poolTable) moveLocked(c *call, to spot) {
	from := c.spot
	if from == to {
		return
	}
	pl := p.getLocked(c.pool)
	name := c.t.Name
	pt := pl.tenants[name]
	if pt == nil {
		pt = &poolTenant{}
		pl.tenants[name] = pt
	}
	switch from {
	case spotNone:
		pt.arrived++ // admitted (a requeue comes from spotHeld)
	case spotQueued:
		pt.queued--
	case spotHeld:
		pt.held--
		pt.tokens -= c.size
		if to == spotNone && c.sent && p.now != nil {
			// Ran upstream: its time holding room is a service time.
			// c.sent is the request goroutine's, which makes this move.
			pt.served++
			pt.servedSec += p.now().Sub(c.heldAt).Seconds()
		}
	}
	switch to {
	case spotQueued:
		pt.queued++
	case spotHeld:
		pt.held++
		pt.tokens += c.size
		if p.now != nil {
			c.heldAt = p.now()
		}
	}
	c.spot = to
	// Entries stay (their counts are cumulative): one per tenant and pool.
}

// queuedOn is how many requests are queued in the pools the replica in
// slot i serves.
func (p *poolTable) queuedOn(i int) int64 {
	p.mu.Lock()
	defer p.mu.Unlock()
	var n int64
	for k, pl := range p.pools {
		if !k.has(i) {
			continue
		}
		for _, pt := range pl.tenants {
			n += pt.queued
		}
	}
	return n
}

// parkFull records that tenant was parked because k's pool was full.
func (p *poolTable) parkFull(k poolKey, tenant string) {
	pl := p.getLocked(k)
	if !slices.Contains(pl.parked, tenant) {
		pl.parked = append(pl.parked, tenant)
	}
}

// unparkFull lets the tenants parked on k's full pool compete again.
func (p *poolTable) unparkFull(k poolKey, q *queue.Queue[*call]) {
	p.mu.Lock()
	pl := p.pools[k]
	var names []string
	if pl != nil && len(pl.parked) > 0 {
		names = slices.Clone(pl.parked)
		pl.parked = pl.parked[:0]
	}
	p.mu.Unlock()
	for _, n := range names {
		q.Unpark(n)
	}
}

// idle reports whether nothing is queued on or holding room in the pool.
func (pl *pool) idle() bool {
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
