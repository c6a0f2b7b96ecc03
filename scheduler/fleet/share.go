package fleet

import (
	"cmp"
	"context"
	"log/slog"
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
// serve, with the room its gates keep for light tenants' peaks
// (peers.Redis), and on a replica that others report too it takes at
// most its max-min fair share of max_num_seqs (SeqShare): an instance
// needing less than an equal split keeps what it needs and the rest is
// split evenly. The cap limits only this instance's own requests: the
// batch estimate (the centre's sizing) still counts everything the replica runs.
//
// Handing slots over is not instant: an instance over its new share stops
// refilling, and the freed slot waits for the other's next scrape. Once
// the shares settle, each instance refills its own slots as before.

// PeerExchange is what the split needs of the fleet (peers.Redis).
type PeerExchange interface {
	ID() string
	Key(url string) string // the replica's name in the exchange
	Exchange(ctx context.Context, reports []peers.Report) (map[string][]peers.Entry, error)
	Leave(ctx context.Context) error
}

// ShareInterval is how often demand is exchanged.
const ShareInterval = 250 * time.Millisecond

// ShareStale bounds the age of the news shares are made from: reports
// older than this are not counted, and this instance's shares lapse (no
// cap) when its exchange has failed for as long.
const ShareStale = 2 * time.Second

// SeqShare is the most requests this instance may have in flight on a
// replica of maxSeqs sequences that others also use: its max-min fair
// share, with this instance's demand taken as unbounded (the cap is what it
// may take if it wants more) and each other's as its in flight plus queued
// (at most maxSeqs: no instance can use more, and a report cannot
// overflow the sums). Integer shares: the remainder goes one each to the
// claimants first by instance id, so that instances which all want more
// than an equal split agree and their shares sum to maxSeqs. Where one
// wants less, each counts its own demand as unbounded, so the caps may sum
// to more; the batch estimate (the centre's sizing) still keeps the replica within
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

// ShareDeps is what the share split needs of the centre.
type ShareDeps struct {
	// WaitingOn is this instance's demand beyond its requests in flight
	// that the replica in slot could serve: its queued requests, and the
	// room its gates keep for light tenants' demand peaks (gate.Pools),
	// which another instance's share must leave free too. It is reported
	// as Queued.
	WaitingOn func(slot int) int64
	// Wake lets queued work through: a share grew or lapsed.
	Wake func()
	Now  func() time.Time
	Log  *slog.Logger
}

// ShareLoop exchanges demand with the other instances every ShareInterval
// and sets each replica's share, until ctx ends; then it withdraws this
// instance's reports.
func ShareLoop(ctx context.Context, set *Set, ex PeerExchange, d ShareDeps) error {
	t := time.NewTicker(ShareInterval)
	defer t.Stop()
	// Each replica's name in the exchange, for the members as they are
	// (replicas join and leave: members.go).
	reps, keys := set.List(), []string(nil)
	rekey := func() {
		reps = set.List()
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
				d.Log.Warn("withdrawing this instance's replica demand", "err", err)
			}
			if ApplyShares(ex.ID(), reps, keys, nil) {
				d.Wake()
			}
			return nil
		case <-t.C:
		}
		if cur := set.List(); len(cur) != len(reps) || (len(cur) > 0 && &cur[0] != &reps[0]) {
			rekey()
		}
		xctx, cancel := context.WithTimeout(ctx, ShareStale/2)
		got, err := ex.Exchange(xctx, DemandReports(reps, keys, d.WaitingOn))
		cancel()
		now := d.Now()
		wake := false
		switch {
		case got != nil:
			lastOK = now
			wake = ApplyShares(ex.ID(), reps, keys, got)
		case now.Sub(lastOK) >= ShareStale:
			wake = ApplyShares(ex.ID(), reps, keys, nil) // no news: no caps, as without a fleet
		}
		if wake {
			d.Wake()
		}
		if err != nil && !failing {
			d.Log.Warn("exchanging replica demand with the other instances (shares lapse 2 s after the last exchange that answered)", "err", err)
		} else if err == nil && failing {
			d.Log.Info("exchanging replica demand again")
		}
		failing = err != nil
	}
}

// DemandReports is this instance's demand on each replica where it has
// any (keys: the replicas' names in the exchange): a replica it neither
// runs, queues nor keeps room for anything on is not reported, so it
// shares nothing there and the exchange stays small.
func DemandReports(reps []*Replica, keys []string, waitingOn func(slot int) int64) []peers.Report {
	var out []peers.Report
	for i, r := range reps {
		if in, q := r.Count.Load(), waitingOn(r.Slot); in > 0 || q > 0 {
			out = append(out, peers.Report{Replica: keys[i], InFlight: in, Queued: q})
		}
	}
	return out
}

// ApplyShares sets each replica's share from the others' entries (nil:
// none anywhere). It reports whether a share grew or went: that lets
// queued work through, so the dispatch loop is to be woken.
func ApplyShares(self string, reps []*Replica, keys []string, got map[string][]peers.Entry) (wake bool) {
	for i, r := range reps {
		others := got[keys[i]]
		var share int64
		if len(others) > 0 {
			share = SeqShare(r.BatchLimit(), self, others)
		}
		prev := r.Share.Swap(share)
		r.Peers.Store(int64(len(others)))
		wake = wake || (prev > 0 && (share == 0 || share > prev))
	}
	return wake
}

// SeqLimit is the sequence count at which r has no room for this
// instance: its batch limit (sizing.go), or less where this instance's
// share (a replica shared with other instances) binds. seqs is the batch
// estimate.
func (r *Replica) SeqLimit(seqs int64) int64 { return r.seqLimit(seqs, false) }

// seqLimit is SeqLimit, without the ramp for a tenant alone on its pool.
func (r *Replica) seqLimit(seqs int64, alone bool) int64 {
	lim := r.batchLimit(!alone)
	if sh := r.Share.Load(); sh > 0 {
		return min(lim, seqs-r.Count.Load()+sh)
	}
	return lim
}
