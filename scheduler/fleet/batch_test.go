package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/scheduler/peers"
	"github.com/sluicehq/sluice/vllm"
)

// scrapeRW installs a scrape of r showing running and waiting at now, and
// reports whether it confirmed r's batch.
func scrapeRW(r *Replica, running, waiting int64, now time.Time) (confirmed bool) {
	if o := r.Obs.Load(); o == nil || !o.OK {
		r.Obs.Store(&Obs{OK: true})
	}
	m := &vllm.Metrics{Running: vllm.Value{V: float64(running), OK: true}, Waiting: vllm.Value{V: float64(waiting), OK: true}}
	return r.Install(m, r.MarkScrape(now), now).Confirmed
}

// TestLearnedBatch: a replica configured (or defaulted) to 256 sequences
// that runs 8 keeps the excess waiting in vLLM. Two scrapes in a row with
// waiting requests and running flat teach Sluice the batch of 8, and it
// dispatches only into that room. One such scrape, or running still
// growing, teaches nothing (it only stops dispatch until the next scrape:
// TestOneFullScrapeStopsDispatch).
func TestLearnedBatch(t *testing.T) {
	set, r := sizingSet(256)
	now := time.Unix(1_800_000_000, 0)
	for range 12 {
		set.Take(Route{}, 10, nil)
	}
	scrapeRW(r, 8, 4, now)
	assert.Zero(t, r.batch.learned.Load(), "one scrape with waiting requests is not proof")
	scrapeRW(r, 10, 2, now.Add(time.Second))
	assert.Zero(t, r.batch.learned.Load(), "running grew: the batch was still filling")
	scrapeRW(r, 10, 3, now.Add(2*time.Second))
	assert.Equal(t, int64(10), r.BatchLimit(), "waiting twice with running flat: the batch is 10")
	scrapeRW(r, 8, 4, now.Add(3*time.Second))
	assert.Equal(t, int64(10), r.batch.learned.Load(), "running fell while requests wait (preemptions): the 10 it ran stand")
	assert.Equal(t, int64(8), r.BatchLimit(), "stopped at the 8 running until the next scrape")
	scrapeRW(r, 8, 4, now.Add(4*time.Second))
	assert.Equal(t, int64(8), r.BatchLimit(), "a pair at 8: the batch shrank")
	assert.False(t, set.Fits(Route{}, 10), "12 in flight, batch 8: no room until the queue inside vLLM drains")

	// A transient (a burst of prefills held back by the token budget)
	// followed by a scrape with nothing waiting teaches nothing.
	set2, r2 := sizingSet(256)
	set2.Take(Route{}, 10, nil)
	scrapeRW(r2, 3, 40, now)
	scrapeRW(r2, 43, 0, now.Add(time.Second))
	assert.Equal(t, int64(256), r2.BatchLimit())
	assert.Zero(t, r2.batch.learned.Load())
	scrapeRW(r2, 0, 5, now.Add(2*time.Second))
	scrapeRW(r2, 0, 5, now.Add(3*time.Second))
	assert.Equal(t, int64(1), r2.BatchLimit(), "never below one")
}

// TestLearnedBatchRecurs: short requests drain what waits within a scrape
// interval, so a full scrape is followed by one with nothing waiting and
// the consecutive pair never forms. A full scrape at exactly the running
// count of a recent one, with no scrape between them showing more
// running, teaches the batch and confirms it; a scrape between that shows
// room past it, a different count, or more than recurScrapes between
// teaches nothing.
func TestLearnedBatchRecurs(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	at := func(i int) time.Time { return now.Add(time.Duration(i) * 200 * time.Millisecond) }

	_, r := sizingSet(256)
	scrapeRW(r, 8, 4, at(0))
	scrapeRW(r, 8, 0, at(1))
	assert.Zero(t, r.Learned(), "drained: one full scrape is not proof")
	scrapeRW(r, 7, 0, at(2))
	assert.True(t, scrapeRW(r, 8, 3, at(3)), "the recurrence confirms the batch (what waits is taken back)")
	assert.Equal(t, int64(8), r.Learned(), "full again at 8, nothing between ran more")

	_, r = sizingSet(256)
	scrapeRW(r, 8, 4, at(0))
	scrapeRW(r, 10, 0, at(1))
	scrapeRW(r, 8, 2, at(2))
	assert.Zero(t, r.Learned(), "10 ran with nothing waiting between: the first was a transient")

	_, r = sizingSet(256)
	scrapeRW(r, 8, 4, at(0))
	scrapeRW(r, 6, 0, at(1))
	scrapeRW(r, 7, 2, at(2))
	assert.Zero(t, r.Learned(), "full at 8 and then at 7, not in a row")

	_, r = sizingSet(256)
	scrapeRW(r, 8, 4, at(0))
	for i := 1; i <= recurScrapes; i++ {
		scrapeRW(r, 6, 0, at(i))
	}
	scrapeRW(r, 8, 4, at(recurScrapes+1))
	assert.Zero(t, r.Learned(), "more than recurScrapes apart")
	scrapeRW(r, 6, 0, at(recurScrapes+2))
	scrapeRW(r, 8, 1, at(recurScrapes+3))
	assert.Equal(t, int64(8), r.Learned())
}

// TestOneFullScrapeStopsDispatch: before any batch is learned, one scrape
// that shows requests waiting for room stops dispatch at the running count
// it shows until the next scrape, so a flood does not keep filling vLLM's
// FCFS queue for the second scrape interval that learning takes. A next
// scrape with nothing waiting (a transient: prefills held back by the
// token budget) or one that cannot be read lifts the stop.
func TestOneFullScrapeStopsDispatch(t *testing.T) {
	set, r := sizingSet(256)
	now := time.Unix(1_800_000_000, 0)
	for range 20 {
		set.Take(Route{}, 10, nil)
	}
	scrapeRW(r, 16, 4, now)
	assert.Equal(t, int64(16), r.BatchLimit(), "16 run, 4 wait: no more until the next scrape")
	assert.Zero(t, r.batch.learned.Load(), "not learned from one scrape")
	assert.False(t, set.Fits(Route{}, 10), "20 in flight, 16 running: a 21st would wait inside vLLM")
	for range 5 {
		set.Leave(r, 10, 1, false, now)
	}
	assert.True(t, set.Fits(Route{}, 10), "15 in flight: room under the running count")

	scrapeRW(r, 15, 0, now.Add(time.Second))
	assert.Equal(t, int64(256), r.BatchLimit(), "nothing waiting: the stop is lifted")
	assert.Zero(t, r.batch.learned.Load())

	scrapeRW(r, 15, 3, now.Add(2*time.Second))
	assert.Equal(t, int64(15), r.BatchLimit())
	r.Install(&vllm.Metrics{}, r.MarkScrape(now.Add(3*time.Second)), now.Add(3*time.Second))
	assert.Equal(t, int64(256), r.BatchLimit(), "a scrape without counts does not hold an old stop")

	// Over a learned batch, a full scrape stops a probe at once.
	_, r2 := sizingSet(32)
	scrapeRW(r2, 8, 3, now)
	scrapeRW(r2, 8, 3, now.Add(time.Second))
	scrapeRW(r2, 8, 0, now.Add(time.Second+probeHold))
	assert.Equal(t, int64(9), r2.BatchLimit(), "probing upwards")
	scrapeRW(r2, 8, 1, now.Add(2*time.Second+probeHold))
	assert.Equal(t, int64(8), r2.BatchLimit(), "the probe waits inside vLLM: stopped at the 8 running")
	assert.Zero(t, r2.ProbeExcess(), "nothing above the confirmed batch is dispatched, so nothing is kept out of the reserve")
}

// TestLearnedBatchProbesUp: a learned batch is probed upwards once
// probeHold has passed since it was last confirmed: each scrape at the
// learned batch with nothing waiting raises it by an eighth (at least
// one), back to max_num_seqs (then forgotten); a probe past the real
// batch is caught by the next pair of full scrapes.
func TestLearnedBatchProbesUp(t *testing.T) {
	_, r := sizingSet(32)
	now := time.Unix(1_800_000_000, 0)
	scrapeRW(r, 8, 3, now)
	scrapeRW(r, 8, 3, now.Add(time.Second))
	assert.Equal(t, int64(8), r.BatchLimit())

	at := now.Add(2 * time.Second)
	scrapeRW(r, 8, 0, at)
	assert.Equal(t, int64(8), r.BatchLimit(), "within probeHold of the confirmation")
	at = now.Add(time.Second + probeHold)
	scrapeRW(r, 5, 0, at)
	assert.Equal(t, int64(8), r.BatchLimit(), "below the batch: nothing to learn")
	assert.Zero(t, r.ProbeExcess())
	scrapeRW(r, 8, 0, at.Add(time.Second))
	assert.Equal(t, int64(9), r.BatchLimit(), "at the batch, nothing waiting: +1")
	assert.Equal(t, int64(1), r.ProbeExcess(), "the ninth is a probe until confirmed")
	scrapeRW(r, 9, 1, at.Add(2*time.Second))
	scrapeRW(r, 9, 1, at.Add(3*time.Second))
	assert.Equal(t, int64(9), r.BatchLimit(), "confirmed at 9")
	assert.Zero(t, r.ProbeExcess())

	// The real batch grew (a restart with a larger --max-num-seqs).
	at = at.Add(3*time.Second + probeHold)
	var got []int64
	for i := range 12 {
		scrapeRW(r, r.BatchLimit(), 0, at.Add(time.Duration(i)*time.Second))
		got = append(got, r.BatchLimit())
	}
	assert.Equal(t, []int64{10, 11, 12, 13, 14, 15, 16, 18, 20, 22, 24, 27}, got)
	for i := range 6 {
		scrapeRW(r, r.BatchLimit(), 0, at.Add(time.Duration(12+i)*time.Second))
	}
	assert.Equal(t, int64(32), r.BatchLimit(), "back at max_num_seqs")
	assert.Equal(t, int64(0), r.batch.learned.Load(), "forgotten")
}

// TestLearnedBatchBoundsShare: instances sharing a replica split its
// learned batch, not the configured max_num_seqs.
func TestLearnedBatchBoundsShare(t *testing.T) {
	_, r := sizingSet(256)
	now := time.Unix(1_800_000_000, 0)
	scrapeRW(r, 8, 6, now)
	scrapeRW(r, 8, 6, now.Add(time.Second))
	assert.Equal(t, int64(8), r.SeqLimit(0))
	mine := []peers.Report{{Replica: "r", InFlight: 8, Queued: 8}}
	ApplyShares("a", []*Replica{r}, []string{"r"}, nil, DefaultReserve, mine, map[string][]peers.Entry{"r": {{Instance: "b", InFlight: 8, Queued: 8}}})
	assert.Equal(t, int64(4), r.Share.Load(), "half of the learned 8, not of 256")
}

// TestRampWhileLearning: an unlearned replica is sent at most Ramp more
// sequences than a scrape has shown it run with nothing waiting (at least
// rampMin more), so a flood overfills it by that much at most; each scrape
// that shows it running them all raises the limit, up to max_num_seqs. A
// learned batch ends the ramp; Ramp 0 sends up to max_num_seqs at once.
func TestRampWhileLearning(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	r := &Replica{Name: "r", MaxSeqs: 256, Ramp: 0.5}
	assert.Equal(t, int64(rampMin), r.BatchLimit(), "nothing seen yet: rampMin")
	var limits []int64
	for range 12 {
		scrapeRW(r, r.BatchLimit(), 0, now) // it runs all it is sent
		limits = append(limits, r.BatchLimit())
	}
	assert.Equal(t, []int64{8, 12, 18, 27, 41, 62, 93, 140, 210, 256, 256, 256}, limits, "half again per scrape")
	scrapeRW(r, 100, 0, now) // less than seen: the limit stays
	assert.Equal(t, int64(256), r.BatchLimit())

	// Its real batch is 16: 16 run with nothing waiting, the limit is 24,
	// so at most 8 wait; the pair of full scrapes then learns 16.
	r = &Replica{Name: "r", MaxSeqs: 256, Ramp: 0.5}
	scrapeRW(r, 16, 0, now)
	assert.Equal(t, int64(24), r.BatchLimit())
	scrapeRW(r, 16, 8, now.Add(time.Second))
	scrapeRW(r, 16, 8, now.Add(2*time.Second))
	assert.Equal(t, int64(16), r.BatchLimit(), "learned")
	scrapeRW(r, 16, 0, now.Add(3*time.Second))
	assert.Equal(t, int64(16), r.BatchLimit(), "a learned batch is probed after probeHold, not ramped")

	off := &Replica{Name: "r", MaxSeqs: 256}
	assert.Equal(t, int64(256), off.BatchLimit(), "upstream.learn_ramp: 0")
}

// TestRampSparesATenantAlone: the ramp keeps an overfill from other
// tenants, so a request whose tenant is alone on its pool (Route.Alone)
// may fill an unlearned replica up to max_num_seqs at once; a learned
// batch and a stop bind it as they bind anyone.
func TestRampSparesATenantAlone(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	set, r := sizingSet(256)
	r.Ramp = 0.5
	for range rampMin {
		set.Take(Route{}, 10, nil)
	}
	assert.False(t, set.Fits(Route{}, 10), "the ramp: rampMin with nothing seen")
	assert.True(t, set.Fits(Route{Alone: true}, 10), "alone: up to max_num_seqs")
	for range 60 {
		set.Take(Route{Alone: true}, 10, nil)
	}
	assert.Equal(t, int64(64), r.Count.Load())
	var key PoolKey
	key.Set(r.Slot)
	assert.Equal(t, int64(256), set.FleetOf(key, true, 0).SeqsCap)
	assert.Equal(t, int64(rampMin), set.FleetOf(key, false, 0).SeqsCap)

	scrapeRW(r, 16, 48, now)
	assert.False(t, set.Fits(Route{Alone: true}, 10), "a scrape with requests waiting stops it too")
	scrapeRW(r, 16, 48, now.Add(time.Second))
	assert.Equal(t, int64(16), r.BatchLimitAlone(), "and a learned batch binds it")
}

// TestExcess: what this instance has on a replica past its room, which it
// may take back (lifecycle/takeback.go): alone, its requests beyond the
// learned batch; sharing the replica, its own beyond its share, however
// many the others keep waiting there.
func TestExcess(t *testing.T) {
	now := time.Unix(1_800_000_000, 0)
	set, r := sizingSet(256)
	for range 21 {
		set.Take(Route{}, 10, nil)
	}
	assert.False(t, scrapeRW(r, 16, 5, now), "one full scrape confirms nothing: take nothing back")
	assert.True(t, scrapeRW(r, 16, 5, now.Add(time.Second)), "the pair's second scrape")
	assert.Equal(t, int64(16), r.Learned())
	assert.Equal(t, int64(5), r.Excess(), "21 sent, 16 run")
	assert.False(t, scrapeRW(r, 16, 0, now.Add(2*time.Second)))

	r.Share.Store(8)
	r.Count.Store(8)
	assert.Zero(t, r.Excess(), "within its share: the waiting are another instance's")
	r.Count.Store(13)
	assert.Equal(t, int64(5), r.Excess())
}
