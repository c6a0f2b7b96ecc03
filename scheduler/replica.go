package scheduler

import (
	"context"

	"github.com/sluicehq/sluice/scheduler/fleet"
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
		WaitingOn: s.Pools().WaitingOn, Wake: s.Wake, Now: s.now, Log: s.log})
}
