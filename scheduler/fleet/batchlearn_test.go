package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
)

// floodLearn runs a flood at one request per 10 ms into a replica that
// runs 16 sequences and keeps the rest in its FCFS queue, nothing
// completing, scraped as vllm.Poller schedules it: every tick (fast),
// each replica due after learn while LearningBatch says so, else after
// every (within half a tick). It returns when the batch was learned after
// the replica first had a request waiting, and the most that ever waited.
func floodLearn(t *testing.T, tick, learn, every time.Duration) (learnedAfter time.Duration, mostWaiting int64) {
	t.Helper()
	const batch = 16
	set, r := sizingSet(256)
	t0 := time.Unix(1_800_000_000, 0)
	var last, fullAt time.Duration = -time.Hour, -1
	for at := time.Duration(0); at <= 3*time.Second; at += 10 * time.Millisecond {
		if at%tick == 0 {
			iv := every
			if r.LearningBatch() {
				iv = learn
			}
			if at-last >= iv-tick/2 {
				last = at
				n := r.Count.Load()
				scrapeRW(r, min(n, batch), max(n-batch, 0), t0.Add(at))
				if r.Learned() > 0 {
					assert.Equal(t, int64(batch), r.Learned())
					return at - fullAt, mostWaiting
				}
			}
		}
		if set.Fits(Route{}, 10) {
			set.Take(Route{}, 10, nil)
		}
		if w := r.Count.Load() - batch; w > 0 {
			mostWaiting = max(mostWaiting, w)
			if fullAt < 0 {
				fullAt = at
			}
		}
	}
	t.Fatal("batch not learned in 3 s")
	return 0, 0
}

// TestLearnScrapeInterval: a replica whose batch is unknown and that this
// instance keeps busy is scraped every learn_scrape_interval, so its batch
// is learned within two of them of its first waiting request, and a flood
// puts about one fast interval of dispatches into vLLM's queue; at the
// scrape interval alone, learning takes two seconds and the queue holds
// the flood's first second.
func TestLearnScrapeInterval(t *testing.T) {
	tick := 200 * time.Millisecond
	after, waiting := floodLearn(t, tick, tick, time.Second)
	assert.LessOrEqual(t, after, 2*tick, "learned within two fast intervals of filling")
	assert.LessOrEqual(t, waiting, int64(tick/(10*time.Millisecond))+1, "at most a fast interval of the flood waits inside vLLM")

	after, waiting = floodLearn(t, tick, time.Second, time.Second)
	assert.Greater(t, after, time.Second, "at the scrape interval: the pair takes two")
	assert.Greater(t, waiting, int64(80))
}

// TestLearningBatch: which replicas are scraped fast.
func TestLearningBatch(t *testing.T) {
	set, r := sizingSet(256)
	now := time.Unix(1_800_000_000, 0)
	assert.False(t, r.LearningBatch(), "idle")
	var seqs []int64
	for range 4 {
		_, s := set.Take(Route{}, 10, nil)
		seqs = append(seqs, s)
	}
	assert.True(t, r.LearningBatch(), "busy, batch unknown")
	scrapeRW(r, 4, 0, now)
	assert.False(t, r.LearningBatch(), "it has run all 4 with nothing waiting")
	set.Take(Route{}, 10, nil)
	assert.True(t, r.LearningBatch(), "more in flight than it was seen to run")
	scrapeRW(r, 4, 1, now.Add(time.Second))
	scrapeRW(r, 4, 1, now.Add(2*time.Second))
	assert.Equal(t, int64(4), r.Learned())
	assert.False(t, r.LearningBatch(), "learned")
	for _, s := range seqs {
		set.Leave(r, 10, s, false, now)
	}
	scrapeRW(r, 1, 0, now.Add(3*time.Second))
	assert.False(t, r.LearningBatch())
}
