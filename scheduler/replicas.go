package scheduler

import (
	"sync"
	"sync/atomic"

	"github.com/sluicehq/sluice/gpu"
)

// replica is one upstream vLLM server and this instance's load on it.
type replica struct {
	name    string
	url     string
	maxSeqs int64
	clock   *gpu.Clock // nil without a GPU monitor

	maxModelLen atomic.Int64 // from /v1/models or config; 0 unknown
	load        atomic.Int64 // L_r: input + allowed output of in-flight requests
	count       atomic.Int64 // in-flight requests
	finished    atomic.Int64 // requests that completed normally (usage final)
	obs         atomic.Pointer[replicaObs]
}

// replicaObs is the last scrape of a replica's /metrics as the gate needs
// it. Immutable.
type replicaObs struct {
	ok      bool
	running int64
	waiting int64
	kvUsage float64
	models  []string
	// finishedAt is the replica's finished count when the scrape was taken
	// in: requests that completed since have surely left the batch.
	finishedAt int64
}

// capacityFunc reports a replica's K_r, base capacity, state and KV usage.
type capacityFunc func(name string) (k, base int64, state gpu.State)

// replicaSet chooses a replica with room for a request (SCHEDULING §7).
type replicaSet struct {
	reps     []*replica
	capacity capacityFunc
	headroom float64

	mu     sync.Mutex // serializes choose+reserve; guards cursor
	cursor int
}

// room is one replica's free room as the gate sees it.
type room struct {
	k, load int64
	ok      bool
}

// roomOf computes r's effective capacity and load. Load counts what vLLM
// itself reports when that is more than what this instance sent: requests
// another instance (or a replica that ignored an abort) keeps running still
// occupy KV and batch slots.
func (s *replicaSet) roomOf(r *replica) (k, load, seqs int64, st gpu.State) {
	k, base, st := s.capacity(r.name)
	load = r.load.Load()
	seqs = r.count.Load()
	if o := r.obs.Load(); o != nil && o.ok {
		if kv := int64(o.kvUsage * float64(base)); kv > load {
			load = kv
		}
		// Less what completed since: without that, slots freed by normal
		// completions stay "full" until the next scrape (up to a scrape
		// interval of idle batch). Aborted requests are not subtracted: a
		// replica may ignore the abort (vLLM #54947) until a scrape shows
		// it let them go.
		if vs := o.running + o.waiting - (r.finished.Load() - o.finishedAt); vs > seqs {
			seqs = vs
		}
	}
	return k, load, seqs, st
}

// choose picks the least normalized-load replica that fits size tokens and
// reserves the room on it. light tenants (below their fair share) may use
// the headroom fraction; others may not. exclude skips replicas already
// tried. It returns nil when nothing fits now.
func (s *replicaSet) choose(size int64, light bool, exclude *replica) *replica {
	return s.pick(size, light, exclude, true)
}

// fits reports whether some replica has room, without reserving it.
func (s *replicaSet) fits(size int64, light bool) bool {
	return s.pick(size, light, nil, false) != nil
}

func (s *replicaSet) pick(size int64, light bool, exclude *replica, reserve bool) *replica {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best *replica
	var bestScore float64
	n := len(s.reps)
	for i := range n {
		r := s.reps[(s.cursor+i)%n]
		if r == exclude {
			continue
		}
		k, load, seqs, st := s.roomOf(r)
		// The headroom applies to batch slots as well as tokens: a flood
		// of short requests runs out of sequences long before KV.
		maxSeqs := r.maxSeqs
		limit := float64(k)
		if !light {
			limit *= 1 - s.headroom
			maxSeqs = max(1, int64(float64(r.maxSeqs)*(1-s.headroom)))
		}
		if st >= gpu.StateDraining || k <= 0 || seqs >= maxSeqs {
			continue
		}
		if float64(load+size) > limit {
			continue
		}
		score := float64(load+size) / float64(k)
		if st == gpu.StateDegraded {
			score += 0.01 // ties within 1% go to healthy replicas
		}
		if best == nil || score < bestScore {
			best, bestScore = r, score
		}
	}
	if best != nil && reserve {
		best.load.Add(size)
		best.count.Add(1)
		s.cursor = (s.cursor + 1) % n
	}
	return best
}

// release returns size tokens of room on r.
func (s *replicaSet) release(r *replica, size int64) {
	r.load.Add(-size)
	r.count.Add(-1)
}

// anyUp reports whether some replica can take work at all.
func (s *replicaSet) anyUp() bool {
	for _, r := range s.reps {
		if k, _, st := s.capacity(r.name); st < gpu.StateDraining && k > 0 {
			return true
		}
	}
	return false
}

// maxCapacity is the largest K_r among replicas that can take work; 0 when
// none is known yet.
func (s *replicaSet) maxCapacity() int64 {
	var m int64
	for _, r := range s.reps {
		if k, _, st := s.capacity(r.name); st < gpu.StateDraining && k > m {
			m = k
		}
	}
	return m
}

// maxModelLen is the smallest known context length among replicas serving
// model (0 when unknown): a request must fit wherever it lands.
func (s *replicaSet) maxModelLen() int64 {
	var m int64
	for _, r := range s.reps {
		if v := r.maxModelLen.Load(); v > 0 && (m == 0 || v < m) {
			m = v
		}
	}
	return m
}

// knowsModel reports whether a replica serves model; true when no replica
// has reported its models yet (the replica then answers 404 itself).
func (s *replicaSet) knowsModel(model string) bool {
	known := false
	for _, r := range s.reps {
		o := r.obs.Load()
		if o == nil || len(o.models) == 0 {
			continue
		}
		known = true
		for _, m := range o.models {
			if m == model {
				return true
			}
		}
	}
	return !known
}
