package scheduler

import (
	"cmp"
	"context"
	"slices"
	"time"

	"github.com/sluicehq/sluice/scheduler/peers"
)

// Splitting a shared replica's batch among instances (SCHEDULING §9).
// Without it an instance whose request completes refills the slot at once,
// while another instance sees the slot free only at its next scrape, by
// when it is taken again: the slots of a shared replica stay with the
// instances that hold them, however much the others have queued. So every
// instance of a Redis fleet reports, a few times a second, its requests in
// flight on each replica and what it has queued that the replica could
// serve (peers.Redis), and on a replica that others report too it takes at
// most its max-min fair share of max_num_seqs (seqShare): an instance
// needing less than an equal split keeps what it needs and the rest is
// split evenly. The cap limits only this instance's own requests: the
// batch estimate (sizing.go) still counts everything the replica runs.
//
// Handing slots over is not instant: an instance over its new share stops
// refilling, and the freed slot waits for the other's next scrape. Once
// the shares settle, each instance refills its own slots as before.

// peerExchange is what the split needs of the fleet (peers.Redis).
type PeerExchange interface {
	ID() string
	Key(url string) string // the replica's name in the exchange
	Exchange(ctx context.Context, reports []peers.Report) (map[string][]peers.Entry, error)
	Leave(ctx context.Context) error
}

// shareInterval is how often demand is exchanged.
const shareInterval = 250 * time.Millisecond

// ShareStale bounds the age of the news shares are made from: reports
// older than this are not counted, and this instance's shares lapse (no
// cap) when its exchange has failed for as long.
const ShareStale = 2 * time.Second

// seqShare is the most requests this instance may have in flight on a
// replica of maxSeqs sequences that others also use: its max-min fair
// share, with this instance's demand taken as unbounded (the cap is what it
// may take if it wants more) and each other's as its in flight plus queued
// (at most maxSeqs: no instance can use more, and a report cannot
// overflow the sums). Integer shares: the remainder goes one each to the
// claimants first by instance id, so that instances which all want more
// than an equal split agree and their shares sum to maxSeqs. Where one
// wants less, each counts its own demand as unbounded, so the caps may sum
// to more; the batch estimate (sizing.go) still keeps the replica within
// maxSeqs. At least 1, so no instance starves when there are more
// instances than sequences.
func SeqShare(maxSeqs int64, self string, others []peers.Entry) int64 {
	demand := func(e peers.Entry) int64 { return min(min(e.InFlight, maxSeqs)+min(e.Queued, maxSeqs), maxSeqs) }
	es := slices.Clone(others)
	slices.SortFunc(es, func(a, b peers.Entry) int { return cmp.Compare(demand(a), demand(b)) })
	remaining, k := maxSeqs, int64(len(es)+1)
	i := 0
	for ; i < len(es); i++ {
		d := demand(es[i])
		if d*k >= remaining { // d is at least the level: it and all after it claim the level
			break
		}
		remaining -= d
		k--
	}
	if remaining <= 0 {
		return 1
	}
	share := remaining / k
	rank := int64(0)
	for _, e := range es[i:] {
		if e.Instance < self {
			rank++
		}
	}
	if rank < remaining%k {
		share++
	}
	return max(share, 1)
}

// ShareLoop exchanges demand with the other instances every shareInterval
// and sets each replica's share, until ctx ends; then it withdraws this
// instance's reports.
func (s *Server) ShareLoop(ctx context.Context, ex PeerExchange) error {
	t := time.NewTicker(shareInterval)
	defer t.Stop()
	// Each replica's name in the exchange, for the members as they are
	// (replicas join and leave: membership.go).
	reps, keys := s.reps.List(), []string(nil)
	rekey := func() {
		reps = s.reps.List()
		keys = make([]string, len(reps))
		for i, r := range reps {
			keys[i] = ex.Key(r.URL)
		}
	}
	rekey()
	var lastOK time.Time
	failing := false
	for {
		select {
		case <-ctx.Done():
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			if err := ex.Leave(lctx); err != nil {
				s.log.Warn("withdrawing this instance's replica demand", "err", err)
			}
			s.applyShares(ex.ID(), reps, keys, nil)
			return nil
		case <-t.C:
		}
		if cur := s.reps.List(); len(cur) != len(reps) || (len(cur) > 0 && &cur[0] != &reps[0]) {
			rekey()
		}
		xctx, cancel := context.WithTimeout(ctx, ShareStale/2)
		got, err := ex.Exchange(xctx, s.demandReports(reps, keys))
		cancel()
		now := s.now()
		switch {
		case got != nil:
			lastOK = now
			s.applyShares(ex.ID(), reps, keys, got)
		case now.Sub(lastOK) >= ShareStale:
			s.applyShares(ex.ID(), reps, keys, nil) // no news: no caps, as without a fleet
		}
		if err != nil && !failing {
			s.log.Warn("exchanging replica demand with the other instances (shares lapse 2 s after the last exchange that answered)", "err", err)
		} else if err == nil && failing {
			s.log.Info("exchanging replica demand again")
		}
		failing = err != nil
	}
}

// demandReports is this instance's demand on each replica where it has
// any (keys: the replicas' names in the exchange): a replica it neither
// runs nor queues anything for is not reported, so it shares nothing there
// and the exchange stays small.
func (s *Server) demandReports(reps []*replica, keys []string) []peers.Report {
	var out []peers.Report
	for i, r := range reps {
		if in, q := r.Count.Load(), s.pools.queuedOn(r.Slot); in > 0 || q > 0 {
			out = append(out, peers.Report{Replica: keys[i], InFlight: in, Queued: q})
		}
	}
	return out
}

// applyShares sets each replica's share from the others' entries (nil:
// none anywhere). A share that grows or goes lets queued work through, so
// the dispatch loop is woken.
func (s *Server) applyShares(self string, reps []*replica, keys []string, got map[string][]peers.Entry) {
	wake := false
	for i, r := range reps {
		others := got[keys[i]]
		var share int64
		if len(others) > 0 {
			share = SeqShare(r.batchLimit(), self, others)
		}
		prev := r.Share.Swap(share)
		r.Peers.Store(int64(len(others)))
		wake = wake || (prev > 0 && (share == 0 || share > prev))
	}
	if wake {
		s.signal(s.wake)
	}
}

// seqLimit is the sequence count at which r has no room for this
// instance: its batch (learned, else max_num_seqs; sizing.go), or less
// where this instance's share (a replica shared with other instances)
// binds. seqs is the batch estimate.
func (r *replica) seqLimit(seqs int64) int64 {
	lim := r.batchLimit()
	if sh := r.Share.Load(); sh > 0 {
		return min(lim, seqs-r.Count.Load()+sh)
	}
	return lim
}
