package fleet

import (
	"math"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/gpu"
)

// Replica is one upstream vLLM server and this instance's load on it.
type Replica struct {
	Name    string
	URL     string
	MaxSeqs int64
	// Ramp is upstream.learn_ramp: how far past what it has been seen to
	// run an unlearned replica is sent (sizing.go); 0: up to MaxSeqs.
	Ramp float64
	// prioritySched: the replica runs --scheduling-policy priority, so
	// requests carry their band as vLLM's priority.
	PrioritySched bool
	Clock         *gpu.Clock // nil without a GPU monitor
	// upLatency is sluice_upstream_latency_seconds{replica=name}, looked up
	// once rather than per request; nil for replicas built by tests.
	UpLatency prometheus.Observer
	// pinned is the config's models list: it restricts what is routed
	// here and stands in until /v1/models answers. nil: no restriction.
	Pinned []string
	// Slot is the replica's bit in the centre's pool keys, unique among
	// the members; Gone: it left the fleet (discovery) and takes no new
	// work while what runs there finishes (members.go).
	Slot int
	Gone atomic.Bool

	MaxModelLen atomic.Int64 // from /v1/models or config; 0 unknown
	Load        atomic.Int64 // L_r: input + allowed output of in-flight requests
	Count       atomic.Int64 // in-flight requests
	Finished    atomic.Int64 // requests that completed normally (usage final)
	// Share is this instance's cap on its requests here while other
	// instances use the replica too (share.go); 0: none, NoSeqs: a cap of
	// none. Peers is how many other instances reported demand here.
	Share, Peers atomic.Int64
	// split is how the share split last classified this instance's
	// tenants here (share.go): Share does not bind the light ones; nil
	// while no other instance reports demand here. PeerWeight is the
	// weight of the tenants only other instances report here.
	split      atomic.Pointer[ShareOf]
	PeerWeight atomic.Int64
	Obs        atomic.Pointer[Obs]
	// modelsAt is when /v1/models last answered (unix ns).
	ModelsAt atomic.Int64
	// pollFail and modelsFail are the last failed poll and /v1/models
	// read, for the status page (scrapeerr.go).
	pollFail, modelsFail atomic.Pointer[scrapeFail]
	// prefix is what Sluice recently sent here (affinity.go); guarded by
	// Set.mu.
	prefix *prefixIndex
	// batch is this instance's account of the replica's batch between
	// scrapes (sizing.go).
	batch batch
	// latency is the replica's mean service time from its own latency
	// histogram (latency.go).
	latency latency

	// PolledAt is the poll time of the last scrape the centre's Observe
	// fed to the GPU monitor. Only Observe's goroutine touches it,
	// BatchWarned (the warning that the replica is sized on its batch was
	// logged) and AuthWarned (that it refused the credential, until it
	// accepts one).
	PolledAt                time.Time
	BatchWarned, AuthWarned bool
}

// Obs is the last scrape of a replica's /metrics as the gate needs
// it. Immutable.
type Obs struct {
	OK      bool
	Running int64
	Waiting int64 // all of vllm:num_requests_waiting
	// deferred is the waiting requests held back by a transient
	// constraint, not room (vllm:num_requests_waiting_by_reason).
	Deferred int64
	KVUsage  float64
	// loras is the LoRA adapters of the replica's running requests
	// (vllm:lora_requests_info): resident, so a request for one of them
	// neither loads an adapter nor waits for a LoRA slot.
	LoRAs []string
	// models is what /v1/models listed (base models, then LoRA adapters).
	Models []string
	// parents maps a LoRA adapter to its base model (vLLM's "parent").
	Parents map[string]string
	// finishedAt is the replica's finished count when the scrape was taken
	// in: a poll that timed out while it rose is excused (the centre's Observe).
	FinishedAt int64
	// sizing is where the replica's capacity comes from (gpu.Sizing*).
	Sizing string
}

// ModelRefresh is how often a replica's /v1/models is read again, so that
// LoRA adapters loaded or unloaded at run time are routed.
const ModelRefresh = 30 * time.Second

// Served is the models routed to r: what /v1/models listed, restricted to
// the config's list when there is one; the config's list alone until
// /v1/models answers.
func (r *Replica) Served() []string {
	var reported []string
	if o := r.Obs.Load(); o != nil {
		reported = o.Models
	}
	switch {
	case len(r.Pinned) == 0:
		return reported
	case len(reported) == 0:
		return r.Pinned
	}
	out := make([]string, 0, len(r.Pinned))
	for _, m := range r.Pinned {
		if slices.Contains(reported, m) {
			out = append(out, m)
		}
	}
	return out
}

// CapacityFunc reports a replica's K_r, base capacity, state and KV usage.
type CapacityFunc func(name string) (k, base int64, state gpu.State)

// Set chooses a replica with room for a request (SCHEDULING §7) among
// the pool of replicas serving its model.
type Set struct {
	// members is the replicas, replaced whole when one joins or leaves
	// (members.go); readers take one list and use it throughout.
	members  atomic.Pointer[Members]
	Capacity CapacityFunc
	pools    atomic.Pointer[poolCache] // PoolKeyOf's memo (pools.go)

	mu     sync.Mutex // serializes Take (choice + reserve), MarkGone, Reap and Lock; guards cursor
	cursor int
}

// NewSet is an empty set whose replicas' capacity comes from capacity.
func NewSet(capacity CapacityFunc) *Set { return &Set{Capacity: capacity} }

// Route is what the replica choice needs to know about a request.
type Route struct {
	Model string
	// Prefix is the prompt's chunk hashes for affinity routing; nil
	// routes by least load alone.
	Prefix []uint64
	// Alone: the request's tenant is the only one its pool has seen
	// lately (gate.Gate.Alone), so the ramp does not bind it (sizing.go).
	Alone bool
	// Tenant is the request's tenant: one the share split holds light
	// fleet-wide is not capped by this instance's share of a replica
	// (share.go, ShareOf.Light).
	Tenant string
	// Light: the dispatch gate holds the tenant light on its pool. The
	// share does not bind it on a replica whose split has not classified
	// it yet (share.go, Replica.unshared).
	Light bool
	// NoShare asks whether a replica has room with this instance's share
	// set aside (Fits): whether the share, not the replica, keeps room
	// from a tenant it does not bind.
	NoShare bool
}

// anyKnown reports whether some replica's models are known (from
// /v1/models or config). Until then every replica is taken to serve every
// model, so that a fleet is usable before its first scrape answers.
func (s *Set) anyKnown() bool {
	for _, r := range s.List() {
		if len(r.Served()) > 0 {
			return true
		}
	}
	return false
}

// DefaultModel is the model a request without "model" gets: vLLM serves
// its first --served-model-name then, so Sluice routes it to the replicas
// whose first model is the first known replica's (in config order).
func (s *Set) DefaultModel() string {
	for _, r := range s.List() {
		if ms := r.Served(); len(ms) > 0 {
			return ms[0]
		}
	}
	return ""
}

// serves reports whether model may be routed to r. known is anyKnown().
func (s *Set) serves(r *Replica, model string, known bool) bool {
	if !known {
		return true
	}
	ms := r.Served()
	if model == "" {
		return len(ms) > 0 && ms[0] == s.DefaultModel()
	}
	return slices.Contains(ms, model)
}

// Pool returns the replicas serving model, in config order. It allocates:
// the per-request checks loop over the members with serves instead.
func (s *Set) Pool(model string) []*Replica {
	known := s.anyKnown()
	reps := s.List()
	out := make([]*Replica, 0, len(reps))
	for _, r := range reps {
		if s.serves(r, model, known) {
			out = append(out, r)
		}
	}
	return out
}

// RoomOf computes r's effective capacity and load. Load counts what vLLM
// itself reports when that is more than what this instance sent: requests
// another instance (or a replica that ignored an abort) keeps running still
// occupy KV. The batch's sequences are the estimate between scrapes
// (sizing.go).
func (s *Set) RoomOf(r *Replica) (k, load, seqs int64, st gpu.State) {
	k, base, st := s.Capacity(r.Name)
	if r.Gone.Load() {
		st = max(st, gpu.StateDraining)
	}
	load = r.Load.Load()
	o := r.Obs.Load()
	ok := o != nil && o.OK
	seqs = r.Seqs(ok)
	// A batch-sized replica's base is a bound, not its KV cache: a KV
	// usage fraction of it says nothing.
	if ok && o.Sizing != gpu.SizingBatch {
		if kv := int64(o.KVUsage * float64(base)); kv > load {
			load = kv
		}
	}
	return k, load, seqs, st
}

// Take picks the least normalized-load replica of rt's pool that fits a
// request of size tokens and reserves the room, skipping exclude (a replica
// already tried). It returns nil when nothing fits now, else also the
// request's seq there (its number among those given room: Leave needs
// it). Fair shares are the centre's dispatch gate's: every request
// that passes it may use any room.
func (s *Set) Take(rt Route, size int64, exclude *Replica) (*Replica, int64) {
	return s.pick(rt, size, exclude, true)
}

// Fits reports whether some replica of rt's pool has room, without
// reserving it.
func (s *Set) Fits(rt Route, size int64) bool {
	var none *Replica
	r, _ := s.pick(rt, size, none, false)
	return r != none
}

func (s *Set) pick(rt Route, size int64, exclude *Replica, reserve bool) (*Replica, int64) {
	s.mu.Lock()
	defer s.mu.Unlock()
	var best, none *Replica
	var bestScore float64
	known := s.anyKnown()
	reps := s.List()
	n := len(reps)
	var candBuf [8]candidate
	cands := candBuf[:0] // with a prefix: every replica with room
	var loadSum float64
	up := 0
	for i := range n {
		r := reps[(s.cursor+i)%n]
		if r == exclude || !s.serves(r, rt.Model, known) {
			continue
		}
		k, load, seqs, st := s.RoomOf(r)
		if st >= gpu.StateDraining || k <= 0 {
			continue
		}
		up++
		loadSum += float64(load) / float64(k)
		if seqs >= r.seqLimit(seqs, rt.Alone, r.unshared(rt)) || load+size > k {
			continue
		}
		score := float64(load+size) / float64(k)
		bias := 0.0
		if st == gpu.StateDegraded {
			bias = 0.01 // ties within 1% go to healthy replicas
		}
		if !loraResident(r, rt.Model) {
			bias += loraBias
		}
		score += bias
		if best == none || score < bestScore {
			best, bestScore = r, score
		}
		if len(rt.Prefix) > 0 {
			cands = append(cands, candidate{r: r, after: float64(load+size) / float64(k), step: float64(size) / float64(k), bias: bias})
		}
	}
	if len(cands) > 1 {
		best = affinityPick(cands, rt.Prefix, (loadSum+cands[0].step)/float64(up))
	}
	if best != none && reserve && len(rt.Prefix) > 0 {
		if best.prefix == nil {
			best.prefix = &prefixIndex{}
		}
		best.prefix.add(rt.Prefix)
	}
	var seq int64
	if best != none && reserve {
		best.Load.Add(size)
		best.Count.Add(1)
		seq = best.NextSeq()
		s.cursor = (s.cursor + 1) % n
	}
	return best, seq
}

// loraBias is the load (a fraction of capacity) a replica where a
// request's LoRA adapter is not known resident must be below the others
// by to win it: loading an adapter costs the request time, and on a
// replica whose LoRA slots (--max-loras) are taken it waits deferred.
const loraBias = 0.1

// loraResident reports whether model is not a LoRA adapter at r, or one
// r's last scrape showed among its running requests' adapters.
func loraResident(r *Replica, model string) bool {
	o := r.Obs.Load()
	if o == nil || model == "" || o.Parents[model] == "" {
		return true
	}
	return slices.Contains(o.LoRAs, model)
}

// Release returns the room of a request that never reached r.
func (s *Set) Release(r *Replica, size int64) {
	r.Load.Add(-size)
	r.Count.Add(-1)
}

// Leave returns the room of request seq, which was sent to r. mayRun: it
// did not complete, so r may still run it (Replica.Leave).
func (s *Set) Leave(r *Replica, size, seq int64, mayRun bool, now time.Time) {
	r.Load.Add(-size)
	r.Leave(seq, mayRun, now)
}

// Up reports whether r can take work at all.
func (s *Set) Up(r *Replica) bool {
	k, _, st := s.Capacity(r.Name)
	return st < gpu.StateDraining && k > 0 && !r.Gone.Load()
}

// AnyUp reports whether some replica can take work at all.
func (s *Set) AnyUp() bool {
	return slices.ContainsFunc(s.List(), s.Up)
}

// AnyUpFor reports whether some replica serving model can take work.
func (s *Set) AnyUpFor(model string) bool {
	known := s.anyKnown()
	for _, r := range s.List() {
		if s.serves(r, model, known) && s.Up(r) {
			return true
		}
	}
	return false
}

// MaxCapacity is the largest K_r among replicas serving model that can
// take work; 0 when none is known yet.
func (s *Set) MaxCapacity(model string) int64 {
	var m int64
	known := s.anyKnown()
	for _, r := range s.List() {
		if !s.serves(r, model, known) {
			continue
		}
		if k, _, st := s.Capacity(r.Name); st < gpu.StateDraining && k > m && !r.Gone.Load() {
			m = k
		}
	}
	return m
}

// MaxModelLen is the smallest known context length among replicas serving
// model (0 when unknown): a request must fit wherever it lands.
func (s *Set) MaxModelLen(model string) int64 {
	var m int64
	known := s.anyKnown()
	for _, r := range s.List() {
		if !s.serves(r, model, known) {
			continue
		}
		if v := r.MaxModelLen.Load(); v > 0 && (m == 0 || v < m) {
			m = v
		}
	}
	return m
}

// KnowsModel reports whether a replica serves model. It is also true while
// no replica has reported its models, or while a replica that is up has
// not yet (its first /v1/models is under way): the request then waits for
// a replica or gets 503, not a 404 that a moment later would be wrong. A
// replica that is down and has no models in config serves nothing.
func (s *Set) KnowsModel(model string) bool {
	reps := s.List()
	if !s.anyKnown() || slices.ContainsFunc(reps, func(r *Replica) bool { return s.serves(r, model, true) }) {
		return true
	}
	return slices.ContainsFunc(reps, func(r *Replica) bool { return len(r.Served()) == 0 && s.Up(r) })
}

// ModelEntry is one model of the fleet as /v1/models shows it.
type ModelEntry struct {
	ID          string
	Parent      string // base model of a LoRA adapter; "" for a base model
	MaxModelLen int64
}

// Models lists every model some replica serves, in config order, each
// once, with the smallest context length among its replicas.
func (s *Set) Models() []ModelEntry {
	var out []ModelEntry
	at := map[string]int{}
	for _, r := range s.List() {
		var parents map[string]string
		if o := r.Obs.Load(); o != nil {
			parents = o.Parents
		}
		mml := r.MaxModelLen.Load()
		for _, m := range r.Served() {
			i, seen := at[m]
			if !seen {
				at[m] = len(out)
				out = append(out, ModelEntry{ID: m, Parent: parents[m], MaxModelLen: mml})
				continue
			}
			if e := &out[i]; mml > 0 && (e.MaxModelLen == 0 || mml < e.MaxModelLen) {
				e.MaxModelLen = mml
			}
		}
	}
	return out
}

// GPUHold is the GPU-ms hold of a request for model: the largest
// coefficients among the estimators of the replicas serving it (a 70B pool
// and a 7B pool learn different costs), times the margin. Without a pool
// it is the fleet-wide hold.
func (s *Set) GPUHold(mon Holds, model string, in, out int64) int64 {
	var a, b float64
	found := false
	known := s.anyKnown()
	for _, r := range s.List() {
		if !s.serves(r, model, known) {
			continue
		}
		if est := mon.Estimator(r.Name); est != nil {
			ra, rb := est.Coefficients()
			a, b, found = max(a, ra), max(b, rb), true
		}
	}
	if !found {
		return mon.Hold(in, out)
	}
	return int64(math.Ceil((a*float64(in) + b*float64(out)) * mon.Config().GPUMsMargin))
}

// Holds is what GPUHold needs of the GPU monitor.
type Holds interface {
	Config() gpu.Config
	Estimator(name string) *gpu.Estimator
	Hold(in, out int64) int64
}
