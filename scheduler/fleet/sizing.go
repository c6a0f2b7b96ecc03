package fleet

import (
	"math"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/vllm"
)

// A replica's batch between scrapes (SCHEDULING §7). vLLM's running +
// waiting counts every sequence in the batch: this instance's, another
// instance's, and those of requests whose abort the replica ignored
// (vllm#54947). This instance knows its own exactly (Replica.Count), so
// the estimate is its own now, plus what the last scrape showed that was
// not its own then (foreign), plus aborted requests still held (below):
//
//	seqs = count + max(0, scraped − count at the scrape) + held
//
// Taking the larger of the own count and the scrape instead hides every
// request sent since the scrape behind the others' sequences: two
// instances sharing a replica each filled it to its max_num_seqs.
//
// An aborted request leaves count at once. Whether its slot is free is a
// question of trust: a replica that ignores aborts keeps running it. A
// replica is trusted until a scrape shows more sequences than this
// instance can account for (its own, at most, over the scrape's flight,
// and aborts within lingerGrace that vLLM may not have reached yet); from
// then on, for distrustFor, an abort of a request the installed scrape
// may show is held (counted) until the next scrape, which shows it either
// gone or as foreign. Another instance's sequences look the same as
// ignored aborts, so a shared replica is always distrusted: aborts there
// wait for a scrape, as they did before trust existed. Trust's price: the
// first aborts a replica ignores free their slots at once, so new work can
// enter a batch still full of them until a scrape at least lingerGrace
// later shows them (at most once per distrustFor). Holding every abort
// instead costs a disconnect storm its survivors' latency on replicas that
// honour aborts.
//
// What remains inexact: a request sent before the scrape that vLLM had
// not queued yet when it rendered (in flight, or in its tokenizer) is in
// count at the scrape but not in the scrape, so foreign is one short until
// the next scrape; and another instance's sequences that end are seen
// only at the next scrape.

const (
	// lingerGrace is how long after Sluice let an aborted request go a
	// scrape may still show it without the replica being suspected: vLLM
	// frees it at its next engine step.
	lingerGrace = time.Second
	// distrustFor is how long a replica seen with sequences this instance
	// cannot account for has its aborted requests' slots held.
	distrustFor = 10 * time.Minute
)

// batchScrape is a scrape as the estimate reads it. Immutable.
type batchScrape struct {
	sentAt int64 // batch.sent as it answered: later requests are not in it
	// foreign is what it showed beyond this instance's own (running +
	// waiting less this instance's requests in flight as it answered).
	foreign int64
}

// batch is this instance's account of a replica's batch between scrapes.
type batch struct {
	sent atomic.Int64 // requests given room, ever: each one's seq
	held atomic.Int64 // aborts held until the next scrape (leave)
	scr  atomic.Pointer[batchScrape]

	mu            sync.Mutex // orders leave against install; guards below
	distrustUntil time.Time
	lingering     recentCount // aborted requests let go, by time

	// learned is the batch the replica really runs, learned from its
	// scrapes (learnBatch); 0 while none is learned (max_num_seqs rules).
	learned atomic.Int64
	// confirmed is the learned batch as a proof (learnBatch) last set
	// it; learned above it is a probe not yet confirmed.
	confirmed atomic.Int64
	// full: the last scrape showed waiting requests, with fullRunning
	// running; confirmedAt is when a proof (below) last set learned.
	full        bool
	fullRunning int64
	confirmedAt time.Time
	// recur is the running count of the last full scrape while no scrape
	// since has shown more running, for the recurLeft scrapes after it
	// (recurScrapes); 0 none.
	recur     int64
	recurLeft int
	// stop is fullRunning (at least 1) while the last scrape showed
	// requests waiting for room, else 0: BatchLimit until the next scrape.
	stop atomic.Int64
	// roomSeen is the most running a scrape showed with nothing waiting:
	// sequences the replica is known to run side by side (LearningBatch).
	roomSeen atomic.Int64
}

// Seqs estimates the sequences in r's batch. Reads in this order (count,
// held, scrape) against install's (scrape, then held reset) and leave's
// (held, then count), so that a concurrent change only ever overestimates.
func (r *Replica) Seqs(scraped bool) int64 {
	n := r.Count.Load()
	held := r.batch.held.Load()
	if !scraped {
		return n
	}
	if sc := r.batch.scr.Load(); sc != nil {
		n += sc.foreign
	}
	return n + held
}

// Installed is what installing a scrape did.
type Installed struct {
	// Distrusted: the scrape made a trusted replica distrusted (above).
	Distrusted bool
	// Confirmed: it confirmed the replica's batch (learnBatch), so what
	// still waits inside the replica is out of order
	// (lifecycle/takeback.go). After one full scrape alone it may be a
	// transient, and taking it back then would also keep the proof from
	// ever forming (the next scrape would find nothing waiting), so that a
	// probe past the batch would go on being sent and taken back every
	// other scrape instead of being confirmed away.
	Confirmed bool
}

// Install makes a scrape that just answered the estimate's; mark was
// read as it was asked for.
func (r *Replica) Install(m *vllm.Metrics, mark ScrapeMark, now time.Time) (in Installed) {
	count0, sent0, start := mark.count, mark.sent, mark.start
	b := &r.batch
	b.mu.Lock()
	defer b.mu.Unlock()
	if !m.Running.OK {
		b.scr.Store(nil)
		b.held.Store(0)
		b.stop.Store(0) // a replica that cannot be read is not held back on an old reading
		return in
	}
	seqs := int64(m.Running.V + m.Waiting.V)
	// Only waiting for room means full: requests deferred for a LoRA
	// budget, a KV transfer or a grammar wait with room to spare.
	in.Confirmed = r.learnBatch(int64(m.Running.V), int64(m.CapacityWaiting().V), now)
	sc := &batchScrape{sentAt: b.sent.Load(), foreign: max(0, seqs-r.Count.Load())}
	// The most of this instance's own the scrape can show: what was in
	// flight as it was asked for, what was sent during its flight, and
	// aborts vLLM may not have reached.
	own := count0 + (sc.sentAt - sent0) + b.lingering.since(start.Add(-lingerGrace))
	if seqs > own {
		in.Distrusted = !now.Before(b.distrustUntil)
		b.distrustUntil = now.Add(distrustFor)
	}
	b.scr.Store(sc)
	// Every abort held until now is in this scrape (as foreign: count no
	// longer has it) or gone from the replica.
	b.held.Store(0)
	return in
}

// The batch a replica really runs (SCHEDULING §7, "The real batch").
// max_num_seqs in the config (default 256) is an upper bound, not a
// promise: a replica started with a smaller --max-num-seqs, or one whose
// KV cache or token budget admits fewer, keeps the excess in its own FCFS
// queue, where no fairness applies. vLLM publishes its counts after each
// step's scheduling pass (vllm/v1/core/sched/scheduler.py: make_stats, from
// update_from_output, which ends each step of vllm/v1/engine/core.py), so
// num_requests_waiting counts only
// requests that pass could not admit: a replica that shows waiting
// requests is full, and its running count then is its batch.
//
// One scrape is not proof: a burst of long prompts can leave requests
// waiting for the step's token budget for a few steps while the batch
// still has room. So a batch is learned from two scrapes in a row that
// both show waiting requests, the second with no more running than the
// first (running flat or falling: the replica admits nothing more):
// learned = the first's running count, within [1, max_num_seqs]. Short
// requests rarely give that pair: what waits drains within an interval,
// so the scrape after a full one shows nothing waiting, the stop lifts,
// and the ramp (or a probe) overfills again. So a full scrape at exactly
// the running count of one at most recurScrapes before it, with no scrape
// between them showing more running, is proof as well: a transient
// recurs at the same count by chance, a batch by its nature. A learned batch
// is probed upwards, since a replica's batch can grow (a restart with a
// larger --max-num-seqs, a KV-bound batch whose long requests ended):
// once probeHold has passed since the last confirmation, each scrape
// that shows the replica running at the learned batch with nothing
// waiting raises it by an eighth (at least one). A probe past the real
// batch leaves one or a few requests waiting inside vLLM for two scrapes,
// after which the pair confirms the batch again; at a steady overload
// that is two scrape intervals in every probeHold. Reaching max_num_seqs
// forgets the learned batch.
const probeHold = 30 * time.Second

// recurScrapes is how many scrapes apart two full ones at the same
// running count may be and still prove the batch (above): the ramp
// overfills again at the second scrape after a stop lifts.
const recurScrapes = 4

// One scrape that shows requests waiting for room stops dispatch there
// at its running count (stop) until the next scrape, learned batch or
// not: whatever is sent to a replica that already keeps requests in its
// FCFS queue waits behind them, and an unknown batch would otherwise be
// overfilled for the two scrape intervals the pair takes. What is sent
// that way runs only after the queue drains and then holds the batch for
// a whole service time: a flood that fills vLLM's queue in its first two
// seconds holds most of the batch against light tenants for the next
// five. The stop also ends a probe upwards at its first full scrape. Its
// price, when the waiting was a transient (a burst of prefills held back
// for the token budget), is at most one scrape interval without new work
// for a replica that has queued work to admit.

// LearnBatch applies a scrape's running and waiting counts to r's learned
// batch alone, without the estimate between scrapes that Install also
// makes: the discrete-event models of the gate, whose replica has no
// /metrics, use it. It reports whether the scrape confirmed the batch.
func (r *Replica) LearnBatch(running, waiting int64, now time.Time) (confirmed bool) {
	r.batch.mu.Lock()
	defer r.batch.mu.Unlock()
	return r.learnBatch(running, waiting, now)
}

// learnBatch applies one scrape's running and waiting counts to r's
// learned batch, and reports whether they confirmed it. b.mu is held.
func (r *Replica) learnBatch(running, waiting int64, now time.Time) (confirmed bool) {
	b := &r.batch
	if b.recur > 0 {
		if b.recurLeft--; b.recurLeft < 0 {
			b.recur = 0
		}
	}
	if waiting <= 0 {
		b.stop.Store(0)
		b.full = false
		if running > b.recur {
			b.recur = 0 // room past it: that full scrape was a transient
		}
		if running > b.roomSeen.Load() {
			b.roomSeen.Store(running)
		}
		l := b.learned.Load()
		if l > 0 && running >= l && now.Sub(b.confirmedAt) >= probeHold {
			if l += max(1, l/8); l >= r.MaxSeqs {
				l = 0
				b.confirmed.Store(0)
			}
			b.learned.Store(l)
		}
		return false
	}
	learn, proof := int64(0), false
	switch {
	case b.full && running <= b.fullRunning:
		// The larger of the pair: a batch that fell while requests wait
		// (preemptions as the KV cache fills) ran the first count a scrape
		// ago; the KV sizing (gpu, overcommit) answers the rest. A batch
		// that really shrank shows the smaller count in the next pair.
		learn, proof = b.fullRunning, true
	case b.recur > 0 && running == b.recur:
		learn, proof = running, true
	}
	if proof {
		b.learned.Store(min(max(learn, 1), r.MaxSeqs))
		b.confirmed.Store(b.learned.Load())
		b.confirmedAt = now
	}
	b.full, b.fullRunning = true, running
	b.recur, b.recurLeft = running, recurScrapes
	b.stop.Store(min(max(running, 1), r.MaxSeqs))
	return proof
}

// While a replica's batch is unknown, a flood overfills it until the pair
// of full scrapes: on a scrape interval of a second, two seconds of
// dispatches past the batch wait in vLLM's FCFS queue, and the light
// tenants' requests sent after them wait behind them. So a replica that is
// learning its batch is scraped every upstream.learn_scrape_interval
// (the centre's ScrapeFast): its batch is not learned, and this instance has more
// requests in flight there than any scrape has shown it run with nothing
// waiting, so that the next scrape may find it full. The stop then lasts
// one fast interval and the pair takes two. An idle replica, a learned one
// and one that has shown room for all it is sent (max_num_seqs right, the
// load below it) are scraped every upstream.scrape_interval. The pair's
// guard against a transient (running flat or falling across it) spans
// fewer engine steps at the fast cadence; a batch learned too low from one
// is probed back up after probeHold.

// LearningBatch reports whether r is to be scraped fast (above).
func (r *Replica) LearningBatch() bool {
	n := r.Count.Load()
	return n > 0 && r.batch.learned.Load() == 0 && n > r.batch.roomSeen.Load()
}

// NextSeq counts a request given room on r: its seq in the batch account.
func (r *Replica) NextSeq() int64 { return r.batch.sent.Add(1) }

// Learned is r's learned batch; 0 while none is learned.
func (r *Replica) Learned() int64 { return r.batch.learned.Load() }

// ScrapeMark is this instance's counts on a replica as a scrape of it was
// asked for: Install reads the answer against them.
type ScrapeMark struct {
	count, sent int64
	start       time.Time
}

// Sent is the requests given room on the replica before the scrape was
// asked for: seqs up to it may be in the scrape.
func (m ScrapeMark) Sent() int64 { return m.sent }

// MarkScrape reads r's counts as its /metrics is asked for at now.
func (r *Replica) MarkScrape(now time.Time) ScrapeMark {
	return ScrapeMark{count: r.Count.Load(), sent: r.batch.sent.Load(), start: now}
}

// The ramp (upstream.learn_ramp). While a replica's batch is unknown,
// every request sent past what it really runs waits in vLLM's FCFS queue
// until a scrape shows it, and then holds a slot for a whole service time
// once it starts: the stop (above) ends the overfill only at the next
// scrape, and a flood sends a batch's worth in less. So an unlearned
// replica is sent at most Ramp more sequences than a scrape has shown it
// run with nothing waiting (roomSeen), at least rampMin more: a replica
// that runs them all without waiting raises roomSeen at the next scrape,
// so the limit grows by that fraction every learn_scrape_interval (from
// none to 256 in about 2 s at 0.5 and 200 ms) and an overfill is at most
// the fraction of the batch. The price is that first climb: a burst past
// the highest the replica has been seen to run waits in Sluice's queue
// for the scrapes that show the room, where it would have run at once.
// A learned batch is probed upwards by probeHold instead.
//
// The ramp keeps an overfill from other tenants, so it binds only where
// there are others: a tenant alone on its pool (Route.Alone) is sent up to
// max_num_seqs at once, as without Sluice. What it overfills is what the
// ramp exists to prevent only for a tenant that comes while it waits
// inside the replica, and the scrape that confirms the batch takes it back
// (lifecycle/takeback.go): the newcomer waits at most the two learning
// scrapes that proof takes, plus a completion if the batch is full.
// Binding a lone tenant too would make its burst wait for the climb, with
// no one to protect: 64 streams into a replica of 64 had TTFT p50 786 ms
// so, 51 ms unbound (TestRampBindsOnlyBesideOthers: a lone burst all runs).
const rampMin = 4

// BatchLimit is the most sequences r runs: its learned batch, else
// max_num_seqs, within the ramp while none is learned; below either while
// the last scrape showed requests waiting for room (stop).
func (r *Replica) BatchLimit() int64 { return r.batchLimit(true) }

// BatchLimitAlone is BatchLimit for a tenant alone on its pool: without
// the ramp (above).
func (r *Replica) BatchLimitAlone() int64 { return r.batchLimit(false) }

func (r *Replica) batchLimit(ramp bool) int64 {
	lim := r.MaxSeqs
	if l := r.batch.learned.Load(); l > 0 {
		lim = min(l, lim)
	} else if ramp && r.Ramp > 0 {
		seen := r.batch.roomSeen.Load()
		lim = min(lim, seen+max(rampMin, int64(math.Ceil(float64(seen)*r.Ramp))))
	}
	if st := r.batch.stop.Load(); st > 0 {
		lim = min(st, lim)
	}
	return lim
}

// Excess is how many of this instance's requests on r are past its room
// there: beyond its share where other instances use r too (share.go),
// else the batch estimate beyond the batch limit. Requests waiting inside
// a replica that another instance overfilled are that instance's to take
// back, not this one's.
func (r *Replica) Excess() int64 {
	if sh, ok := r.shareCap(); ok {
		return max(r.Count.Load()-sh, 0)
	}
	return max(r.Seqs(true)-r.BatchLimit(), 0)
}

// ProbeExcess is how far r's batch limit is above its confirmed batch: a
// probe upwards that no scrape has confirmed yet. The dispatch gate keeps
// these sequences out of the light tenants' reserve (gate.FleetLoad.FitsBeyond): a probe
// past the real batch waits in vLLM's FCFS queue, and a light request sent
// after it would wait behind it.
func (r *Replica) ProbeExcess() int64 {
	l, c := r.batch.learned.Load(), r.batch.confirmed.Load()
	if l <= 0 || c <= 0 {
		return 0
	}
	return max(r.BatchLimit()-c, 0)
}

// Leave takes request seq off r's count. mayRun: it was sent and did not
// complete, so a replica that ignores aborts may still run it.
func (r *Replica) Leave(seq int64, mayRun bool, now time.Time) {
	if mayRun {
		b := &r.batch
		b.mu.Lock()
		b.lingering.add(now)
		if sc := b.scr.Load(); sc != nil && seq <= sc.sentAt && now.Before(b.distrustUntil) {
			b.held.Add(1)
		}
		b.mu.Unlock()
	}
	r.Count.Add(-1)
}

// Distrusted reports whether r's aborts are held until a scrape.
func (r *Replica) Distrusted(now time.Time) bool {
	r.batch.mu.Lock()
	defer r.batch.mu.Unlock()
	return now.Before(r.batch.distrustUntil)
}

// batchSeqTokens bounds one sequence's tokens in a batch-sized replica's
// token bound while its context length is unknown.
const batchSeqTokens = 1 << 24

// BatchTokens is the token bound of a replica sized on its batch:
// max_num_seqs sequences of the context length at most, so that the
// sequence limit, not tokens, decides its room (SCHEDULING §7).
func (r *Replica) BatchTokens() int64 {
	per := r.MaxModelLen.Load()
	if per <= 0 {
		per = batchSeqTokens
	}
	return max(r.MaxSeqs, 1) * per
}

// recentCount counts events in 100 ms buckets over the last 1.6 s.
type recentCount struct {
	at [16]int64 // bucket number (unix ns / width) of n[i]
	n  [16]int64
}

const recentWidth = int64(100 * time.Millisecond)

func (c *recentCount) add(now time.Time) {
	b := now.UnixNano() / recentWidth
	i := b % int64(len(c.at))
	if c.at[i] != b {
		c.at[i], c.n[i] = b, 0
	}
	c.n[i]++
}

// since counts the events in buckets that end after t.
func (c *recentCount) since(t time.Time) int64 {
	from := t.UnixNano() / recentWidth
	var n int64
	for i, b := range c.at {
		if b >= from {
			n += c.n[i]
		}
	}
	return n
}
