package scheduler

import (
	"context"
	"math"

	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/peers"
)

// shareInterval is how often demand and fair-share service are exchanged
// with the other instances.
const shareInterval = fleet.ShareInterval

// ShareStale bounds the age of the news shares are made from
// (fleet.ShareStale).
const ShareStale = fleet.ShareStale

// ShareLoop splits shared replicas' batches with the other instances until
// ctx ends (fleet.ShareLoop).
func (s *Server) ShareLoop(ctx context.Context, ex fleet.PeerExchange) error {
	return fleet.ShareLoop(ctx, s.reps, ex, fleet.ShareDeps{
		WaitingOn: s.Pools().WaitingOn, TenantsOn: s.tenantsOn, Wake: s.Wake, Now: s.now, Log: s.log, Reserve: s.shareReserve})
}

// shareReserve is what the split keeps light tenants, from the settings
// as they are now (they reload): server.reserve_margin, headroom and
// reserve_cap bind it as they bind the dispatch gate.
func (s *Server) shareReserve() fleet.Reserve {
	srv := &s.pol.Load().Cfg.Server
	return fleet.Reserve{Margin: srv.Margin(), Headroom: srv.Headroom, Cap: srv.Cap()}
}

// tenantsOn appends each tenant's demand on the replica in slot to out, in
// thousandths of a request (rounded up, so that a little demand is not
// reported as none), with its weight; a tenant removed by a reload while
// its requests finish counts at weight 1. Its queued part counts only
// what its concurrency lets start: the rest waits for its own requests,
// not for room, and reported as waiting it would take a flood's
// instance's floor (fleet.Split) for room it cannot use.
func (s *Server) tenantsOn(slot int, out []peers.TenantDemand) []peers.TenantDemand {
	pol := s.pol.Load()
	milli := func(v float64) int64 { return int64(math.Ceil(v*1000 - 1e-6)) }
	s.Pools().DemandOn(slot, func(tenant string, d gate.Demand) {
		w := int64(1)
		if t := pol.Tenants[tenant]; t != nil {
			w = int64(max(t.Cfg.Weight, 1))
			if lim := int64(t.Cfg.Concurrency); lim > 0 {
				d.Queued = min(d.Queued, float64(max(lim-t.RT.Inflight.Load(), 0)))
			}
		}
		claim := milli(d.Asks)
		out = append(out, peers.TenantDemand{Tenant: tenant, Weight: w, Load: milli(d.Asked), Claim: claim, Queued: milli(d.Queued),
			Held: min(milli(d.Held), claim), Steady: d.Steady, Stands: d.Stands})
	})
	return out
}
