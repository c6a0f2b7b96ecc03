package scheduler

import (
	"context"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/scheduler/fleet"
)

// replica is a replica of the fleet as the centre holds it: its fleet
// state, and this instance's account of its batch between scrapes
// (sizing.go), which the fleet's choice reads through fleet.Member.
type replica struct {
	fleet.Replica
	batch batch // the batch between scrapes (sizing.go)
	// polledAt is the poll time of the last scrape Observe fed to the
	// monitor; only Observe's goroutine touches it, batchWarned (the
	// warning that the replica is sized on its batch was logged) and
	// authWarned (that it refused the credential, until it accepts one).
	polledAt                time.Time
	batchWarned, authWarned bool
}

// Seqs is fleet.Member's batch estimate (sizing.go).
func (r *replica) Seqs(scraped bool) int64 { return r.seqs(scraped) }

// BatchLimit is fleet.Member's batch limit (sizing.go).
func (r *replica) BatchLimit() int64 { return r.batchLimit() }

// NextSeq counts a request given room on r: its seq in the batch account.
func (r *replica) NextSeq() int64 { return r.batch.sent.Add(1) }

// Leave is fleet.Member's leave (sizing.go).
func (r *replica) Leave(seq int64, mayRun bool, now time.Time) { r.leave(seq, mayRun, now) }

// seqLimit is the sequence count at which r has no room for this
// instance: its batch limit, or less where its share binds.
func (r *replica) seqLimit(seqs int64) int64 { return r.SeqLimit(r.batchLimit(), seqs) }

// replicaSet is the fleet's replica set with the centre's pool keys
// memoised beside it (pools.go).
type replicaSet struct {
	*fleet.Set[*replica]
	pools atomic.Pointer[poolCache] // poolKeyOf's memo
}

func newReplicaSet(capacity fleet.CapacityFunc) *replicaSet {
	return &replicaSet{Set: fleet.NewSet[*replica](capacity)}
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
