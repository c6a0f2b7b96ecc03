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
	rep := s.reps.choose(c.route, c.size, s.belowFairShare(c), nil)
	if rep == nil {
		if s.reps.fits(c.route, c.size, true) {
			// It would fit only in the light-tenant headroom: skip this
			// tenant so that tenants below their share can use it.
			return queue.Park
		}
		return queue.Block
	}
	c.rep = rep
	return queue.Dispatch
}

// belowFairShare reports whether the tenant's in-flight token share of its
// model's pool is below its weighted share among tenants with work on that
// pool (SCHEDULING §6).
func (s *Server) belowFairShare(c *call) bool {
	return s.reps.belowShare(c.req.Model, c.t.name, c.pol.weightOf)
}
