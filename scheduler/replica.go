package scheduler

import (
	"context"
	"sync/atomic"

	"github.com/sluicehq/sluice/scheduler/fleet"
)

// replicaSet is the fleet's replica set with the centre's pool keys
// memoised beside it (pools.go).
type replicaSet struct {
	*fleet.Set
	pools atomic.Pointer[poolCache] // poolKeyOf's memo
}

func newReplicaSet(capacity fleet.CapacityFunc) *replicaSet {
	return &replicaSet{Set: fleet.NewSet(capacity)}
}

// shareInterval is how often demand and fair-share service are exchanged
// with the other instances.
const shareInterval = fleet.ShareInterval

// ShareStale bounds the age of the news shares are made from
// (fleet.ShareStale).
const ShareStale = fleet.ShareStale

// ShareLoop splits shared replicas' batches with the other instances until
// ctx ends (fleet.ShareLoop).
func (s *Server) ShareLoop(ctx context.Context, ex fleet.PeerExchange) error {
	return fleet.ShareLoop(ctx, s.reps.Set, ex, fleet.ShareDeps{
		QueuedOn: s.pools.queuedOn, Wake: func() { s.signal(s.wake) }, Now: s.now, Log: s.log})
}
