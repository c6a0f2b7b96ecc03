package fleet

import (
	"maps"
	"math/bits"
	"slices"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/scheduler/gate"
)

// Pools. Tenants compete only for the replicas they can use, so the
// dispatch gate keeps one share computation and one reserve per pool (the
// load table is gate.Pools, keyed by PoolKey): a flood of model A is
// measured against A's replicas alone (an idle model B neither holds it
// back nor lends it room that is not A's), and B's light tenants are
// reserved for on B's. The set owns the keys, because a pool is a set of
// its members, and the pool's room (FleetOf, RoomOutside), because that is
// read under the set's lock like the replica choice.

// PoolKey identifies a pool: a bit per replica, its Slot (the lowest free
// when it joined; slots past the 256th share the last bit, which can only
// merge pools, never split one). Comparable, so it keys gate.Pools.
type PoolKey [4]uint64

// Set adds the replica in slot i to the key.
func (k *PoolKey) Set(i int) {
	b := min(i, 255)
	k[b/64] |= 1 << (b % 64)
}

// Has reports whether the replica in slot i is in the key's pool.
func (k PoolKey) Has(i int) bool {
	b := min(i, 255)
	return k[b/64]&(1<<(b%64)) != 0
}

// Replicas is how many replicas the key's pool has.
func (k PoolKey) Replicas() int {
	n := 0
	for _, w := range k {
		n += bits.OnesCount64(w)
	}
	return n
}

// PoolKeyOf is model's pool: the replicas serving it, plus every replica
// that shares a served model with one of them, transitively. Partly
// overlapping pools (an adapter loaded on some of a base model's replicas)
// are one pool, so a flood of one cannot fill the replicas the other's
// light tenants need without the gate seeing them. Before any replica's
// models are known every replica serves every model: one pool, the fleet.
//
// Pools change only when a replica's model list does, so the keys are
// memoised per list state (poolCache): computing one is O(replicas²).
func (s *Set) PoolKeyOf(model string) PoolKey {
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
	keys := map[string]PoolKey{}
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

// PoolOf is the pool r belongs to: PoolKeyOf its first served model (the
// pools partition the replicas), or the whole fleet's while no replica's
// models are known; a replica whose own models are not known yet where
// others' are is a pool of its own.
func (s *Set) PoolOf(r *Replica) PoolKey {
	if ms := r.Served(); len(ms) > 0 {
		return s.PoolKeyOf(ms[0])
	}
	if !s.anyKnown() {
		return s.PoolKeyOf("")
	}
	var k PoolKey
	k.Set(r.Slot)
	return k
}

// maxCachedPools bounds the memoised models (only served ones reach it).
const maxCachedPools = 1024

// poolCache is PoolKeyOf's memo for one state of the replicas' model lists.
// Immutable.
type poolCache struct {
	set   *Members    // the members it was computed for
	lists []modelList // per replica, in set order
	keys  map[string]PoolKey
}

// modelList identifies a replica's reported model list: Obs is immutable
// and a poll that did not re-read /v1/models carries the slice over, so
// the same backing array is the same list.
type modelList struct {
	first *string
	n     int
}

func listOf(r *Replica) modelList {
	o := r.Obs.Load()
	if o == nil || len(o.Models) == 0 {
		return modelList{}
	}
	return modelList{&o.Models[0], len(o.Models)}
}

func (c *poolCache) current(reps []*Replica) bool {
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

func (s *Set) computePoolKey(reps []*Replica, model string) PoolKey {
	var k PoolKey
	known := s.anyKnown()
	served := make([][]string, len(reps))
	var models []string
	for i, r := range reps {
		served[i] = r.Served()
		if s.serves(r, model, known) {
			k.Set(r.Slot)
			models = append(models, served[i]...)
		}
	}
	if !known {
		return k
	}
	for grown := true; grown; {
		grown = false
		for i, r := range reps {
			if k.Has(r.Slot) || !slices.ContainsFunc(served[i], func(m string) bool { return slices.Contains(models, m) }) {
				continue
			}
			k.Set(r.Slot)
			models = append(models, served[i]...)
			grown = true
		}
	}
	return k
}

// FleetOf sums the load and capacity of the pool's replicas that can take
// work, under the set's lock: one state, as the replica choice sees it
// for a request of a tenant alone on the pool or not (Route.Alone). The
// sequence capacity is each replica's batch limit, not this instance's
// share of it: the gate's fractions are of the batch, so that a tenant's
// peak reads the same whatever the shares were when it was seen; the
// share binds a heavy tenant in Take. PeerWeight is the mean over the
// pool's replicas of the weight only other instances report there, Svc
// the mean of the service times they report (Replica.ServiceTime).
//
// A request runs on one replica, so token room on a replica below one
// request of size (the one the gate decides for) is no room for it:
// those slivers count as load. Summed as room, two KV-limited replicas
// each a little short of one more request read as a request's room to
// spare, and the gate let a heavy request take the light tenants'
// reserve that no replica could hold (fairgen, two replicas: a light
// tenant waited for a completion on 11 more seeds of 500; on one replica
// the same sliver cost 7).
func (s *Set) FleetOf(key PoolKey, alone bool, size int64) gate.FleetLoad {
	s.mu.Lock()
	defer s.mu.Unlock()
	var f gate.FleetLoad
	n, timed := 0, 0
	for _, r := range s.List() {
		if !key.Has(r.Slot) {
			continue
		}
		k, load, seqs, st := s.RoomOf(r)
		if st >= gpu.StateDraining || k <= 0 {
			continue
		}
		n++
		f.PeerWeight += float64(r.PeerWeight.Load())
		f.Seqs += seqs
		f.SeqsCap += r.seqLimit(seqs, alone, true) // the gate reads the batch; the share binds in Take
		f.Probe += r.ProbeExcess()
		f.Tokens += load
		if free := k - load; free > 0 && size > 0 {
			f.Tokens += free % size
		}
		f.TokensCap += k
		if svc := r.ServiceTime(); svc > 0 {
			f.Svc += svc
			timed++
		}
	}
	if n > 0 {
		f.PeerWeight /= float64(n) // the pool's replicas' mean
	}
	if timed > 0 {
		f.Svc /= float64(timed)
	}
	return f
}

// RoomOutside reports whether a replica outside key can take one more
// request of size tokens (so blocking the queue for key's pool would idle
// it).
func (s *Set) RoomOutside(key PoolKey, size int64) bool {
	s.mu.Lock()
	defer s.mu.Unlock()
	for _, r := range s.List() {
		if key.Has(r.Slot) {
			continue
		}
		k, load, seqs, st := s.RoomOf(r)
		if st < gpu.StateDraining && k > 0 && seqs < r.SeqLimit(seqs) && load+size <= k {
			return true
		}
	}
	return false
}
