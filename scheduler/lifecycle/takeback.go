package lifecycle

import (
	"cmp"
	"errors"
	"slices"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/policy"
)

// Taking back (SCHEDULING §7, "Taking back"). A request sent past a
// replica's real batch waits in vLLM's FCFS queue, where no fairness
// applies: when it starts it holds a slot for a whole service time, ahead
// of lighter tenants' requests that Sluice would have sent first. That
// happens whenever the batch was unknown or grew smaller (a flood
// overfills an unlearned replica within one scrape interval), and for a
// probe past it. So when a scrape confirms a replica's batch (the second
// of a pair that shows requests waiting for room, or a recurrence:
// fleet/sizing.go), this instance takes back the newest of its own
// requests there that have had no first event (vLLM sends it with the
// first output: Engine.first), as many as wait and no more than it has
// there past its room (fleet.Replica.Excess), of tenants above their fair
// share of the pool. Each goes back to its place in its tenant's queue,
// with its deadline and its ledger record (still DISPATCHED, so no
// second MarkDispatched), and its replica room, in-flight counts and
// dispatch charge are given back; the dispatch gate then sends it again
// when the light tenants' reserve allows. The abort reaches vLLM as the
// closed connection, and vLLM drops a waiting request without running it.
//
// The newest unstarted requests are the waiting ones under vLLM's FCFS
// order, but not exactly: one whose prefill started between the scrape
// and the abort loses that prefill, which it then runs again (charged
// once, by the attempt that runs). A light tenant's requests are never
// taken back (they would only wait longer), nor is anything on one
// scrape with requests waiting: it may be a transient (a burst of prefills
// waiting for the step's token budget), and the proof that learns the
// batch (fleet/sizing.go, Installed.Confirmed) is what tells them apart.

// errTakenBack is the cause that aborts an attempt taken back.
var errTakenBack = errors.New("taken back: the replica kept it waiting")

// takeBackOn reports whether upstream.take_back_waiting is on.
func takeBackOn(pol *policy.Snapshot) bool {
	p := pol.Cfg.Upstream.TakeBackWaiting
	return p == nil || *p
}

// TakeBackWaiting takes back up to waiting of this instance's requests on
// r (sent before its scrape was asked for: seq ≤ sentBefore) that have had
// no first event, newest first, of tenants above their fair share (above).
// The scrape hook calls it for a scrape that confirmed r's batch with
// requests waiting. It reports how many it took back.
func (e *Engine) TakeBackWaiting(r *fleet.Replica, waiting, sentBefore int64) int {
	if waiting <= 0 || !takeBackOn(e.pol.Load()) {
		return 0
	}
	type cand struct {
		c   *call
		seq int64
	}
	var cs []cand
	e.mu.Lock()
	for c := range e.unstarted {
		if c.rep == r && c.seq <= sentBefore {
			cs = append(cs, cand{c, c.seq})
		}
	}
	e.mu.Unlock()
	if len(cs) == 0 {
		return 0
	}
	slices.SortFunc(cs, func(a, b cand) int { return cmp.Compare(b.seq, a.seq) })
	cs = cs[:min(int64(len(cs)), waiting)]
	pol := e.pol.Load()
	e.pools.Lock()
	heavy := cs[:0]
	for _, x := range cs {
		w := float64(x.c.t.Cfg.Weight)
		if t := pol.Tenants[x.c.t.Name]; t != nil {
			w = float64(t.Cfg.Weight)
		}
		if !e.pools.PoolLocked(x.c.place.Pool).Gate.WithinShare(x.c.t.Name, w) {
			heavy = append(heavy, x)
		}
	}
	e.pools.Unlock()
	n := 0
	e.mu.Lock()
	for _, x := range heavy {
		// Only while still unstarted: first unregisters under e.mu before
		// it reads the cause, so a stream that started is never aborted.
		if cancel, ok := e.unstarted[x.c]; ok {
			delete(e.unstarted, x.c)
			cancel(errTakenBack)
			n++
		}
	}
	e.mu.Unlock()
	if n > 0 {
		e.m.UpstreamAborts.WithLabelValues(r.Name, "taken_back").Add(float64(n))
	}
	return n
}

// takeBack queues c again after its attempt was taken back (execute
// returned errTakenBack): what await counted at its dispatch is undone,
// and the queue puts it back at its place with its deadline. A tenant
// removed meanwhile ends it (not run, not charged).
func (e *Engine) takeBack(c *call) error {
	now := e.now()
	if c.rep.Clock != nil {
		c.rep.Clock.End(now, c.ticket) // it did not run: no GPU time of its own
	}
	// It may still hold its slot until vLLM reads the abort (mayRun).
	e.reps.Leave(c.rep, c.size, c.seq, true, now)
	c.t.RT.Inflight.Add(-1)
	c.keyInflight(-1)
	c.t.RT.InflightTokens.Add(-c.size)
	seriesOf(c.t, e.m).inflight.Dec()
	c.stream, c.peeked, c.sent = nil, peeked{}, false
	e.to(c, phaseTakenBack)
	e.mu.Lock()
	delete(e.running, c)
	e.queued[c] = struct{}{}
	e.mu.Unlock()
	e.movePool(c, gate.SpotQueued)
	c.t.RT.Queued.Add(1) // await counts it out again
	it, err := e.q.TakeBack(c.queueRequest(), c.qplace)
	if err != nil {
		c.t.RT.Queued.Add(-1)
		e.movePool(c, gate.SpotNone)
		return err
	}
	c.handle = it.Handle
	e.Wake() // its room is free for what the gate sends now
	return nil
}

// settleTakenBack ends a call taken back that did not start again: its
// ledger record is DISPATCHED, so it settles at zero as not sent, where a
// call that never left the queue is released.
func (e *Engine) settleTakenBack(c *call) {
	e.settle(c, ledger.Amounts{}, ledger.SourceNotSent)
}
