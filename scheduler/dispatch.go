package scheduler

import (
	"context"

	"github.com/sluicehq/sluice/queue"
)

// dispatchLoop hands queued calls to replicas with room. It never spins:
// it waits for new work (queue Ready) or freed room (wake).
func (s *Server) dispatchLoop(ctx context.Context) {
	for {
		for {
			it, ok := s.q.Next(s.admissible)
			if !ok {
				break
			}
			it.Payload.dispatched <- it.Payload.rep
		}
		select {
		case <-ctx.Done():
			return
		case <-s.q.Ready():
		case <-s.wake:
		}
	}
}

// admissible is the queue's dispatch predicate (queue mutex held): the
// tenant must be under its local in-flight cap, and a replica must have
// room, which it reserves.
func (s *Server) admissible(it queue.Item[*call]) queue.Verdict {
	c := it.Payload
	t := c.t
	if cur := s.pol.Load().tenants[t.name]; cur != nil {
		t = cur // clamps and reloads apply from the next dispatch
	}
	if t.rt.inflight.Load() >= int64(t.cfg.Concurrency) || c.keyAtCap() {
		return queue.Park
	}
	if lim := t.cfg.InflightTokens; lim > 0 && t.rt.inflightTokens.Load()+c.size > lim {
		return queue.Park
	}
	rep := s.reps.choose(c.size, s.belowFairShare(c), nil)
	if rep == nil {
		if s.reps.fits(c.size, true) {
			// It would fit only in the light-tenant headroom: skip this
			// tenant so that tenants below their share can use it.
			return queue.Park
		}
		return queue.Block
	}
	c.rep = rep
	return queue.Dispatch
}

// belowFairShare reports whether the tenant's in-flight token share is below
// its weighted share among tenants with work in flight (SCHEDULING §6).
func (s *Server) belowFairShare(c *call) bool {
	var total, weights int64
	for _, t := range c.pol.order {
		if n := t.rt.inflightTokens.Load(); n > 0 || t.rt.queued.Load() > 0 || t == c.t {
			total += n
			weights += int64(t.cfg.Weight)
		}
	}
	if total == 0 || weights == 0 {
		return true
	}
	// At or below its share: a tenant alone uses the whole replica, so the
	// gate stays work-conserving.
	share := float64(c.t.rt.inflightTokens.Load()) / float64(total)
	return share <= float64(c.t.cfg.Weight)/float64(weights)
}
