package fleet

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm"
)

// scrapeShows installs a scrape of r showing seqs sequences, asked for and
// answered at now with nothing sent or ended during its flight.
func scrapeShows(r *Replica, seqs int64, now time.Time) (distrusted bool) {
	if o := r.Obs.Load(); o == nil || !o.OK {
		r.Obs.Store(&Obs{OK: true})
	}
	m := &vllm.Metrics{Running: vllm.Value{V: float64(seqs), OK: true}, Waiting: vllm.Value{OK: true}}
	return r.Install(m, r.MarkScrape(now), now).Distrusted
}

func sizingSet(maxSeqs int64) (*Set, *Replica) {
	r := &Replica{Name: "r", MaxSeqs: maxSeqs}
	return newSet(fixedCapacity(map[string]int64{"r": 1 << 20}), []*Replica{r}...), r
}

func seqsOf(set *Set, r *Replica) int64 {
	_, _, n, _ := set.RoomOf(r)
	return n
}

// TestForeignSequencesCountWithOwnSends: what a scrape shows beyond this
// instance's own stays counted while this instance sends more. Taking the
// larger of the own count and the scrape instead would let two instances
// sharing a replica each fill it to max_num_seqs.
func TestForeignSequencesCountWithOwnSends(t *testing.T) {
	set, r := sizingSet(4)
	now := time.Unix(1_800_000_000, 0)
	_, s1 := set.Take(Route{}, 10, nil)
	assert.True(t, scrapeShows(r, 3, now), "2 sequences not ours: distrusted from now on")
	assert.Equal(t, int64(3), seqsOf(set, r))

	_, s2 := set.Take(Route{}, 10, nil)
	assert.Equal(t, int64(4), seqsOf(set, r), "ours 2 + theirs 2 (the larger of the two would say max(2, 3) = 3)")
	assert.False(t, set.Fits(Route{}, 10), "full")

	set.Leave(r, 10, s1, false, now) // completed
	assert.Equal(t, int64(3), seqsOf(set, r), "a completion frees its slot before the next scrape")
	assert.True(t, set.Fits(Route{}, 10))

	// The next scrape shows one of theirs gone.
	scrapeShows(r, 2, now.Add(time.Second))
	assert.Equal(t, int64(2), seqsOf(set, r), "ours 1 + theirs 1")
	set.Leave(r, 10, s2, false, now)
	assert.Equal(t, int64(1), seqsOf(set, r), "theirs 1, until a scrape shows it gone")

	// A scrape that shows fewer than ours (sent, not yet queued by vLLM)
	// never counts below our own.
	set.Take(Route{}, 10, nil)
	set.Take(Route{}, 10, nil)
	scrapeShows(r, 0, now.Add(2*time.Second))
	assert.Equal(t, int64(2), seqsOf(set, r))
}

// TestAbortTrust: an abort frees its slot at once on a replica whose
// scrapes never showed more than this instance accounts for. Once one
// did, an abort of a request the last scrape may show holds its slot until
// the next scrape (vllm#54947: a replica may ignore it); one sent after
// that scrape leaves as it came (the next scrape shows it if it stayed).
func TestAbortTrust(t *testing.T) {
	set, r := sizingSet(4)
	now := time.Unix(1_800_000_000, 0)
	var seq [4]int64
	for i := range seq {
		_, seq[i] = set.Take(Route{}, 10, nil)
	}
	assert.False(t, scrapeShows(r, 4, now), "all four are ours")
	assert.False(t, set.Fits(Route{}, 10), "full")

	set.Leave(r, 10, seq[0], true, now) // aborted
	assert.Equal(t, int64(3), seqsOf(set, r), "trusted: the abort frees its slot at once")
	assert.False(t, r.Distrusted(now))

	// Inside lingerGrace vLLM may still show the aborted request: not
	// evidence.
	assert.False(t, scrapeShows(r, 4, now.Add(lingerGrace/2)), "the abort may not have reached vLLM yet")
	// Past it, the same count is a request this instance let go and the
	// replica kept: from now on aborts wait for a scrape.
	assert.True(t, scrapeShows(r, 4, now.Add(2*lingerGrace)))
	now = now.Add(2 * lingerGrace)
	assert.True(t, r.Distrusted(now))
	assert.Equal(t, int64(4), seqsOf(set, r), "3 ours + the ghost")

	set.Leave(r, 10, seq[1], true, now)
	assert.Equal(t, int64(4), seqsOf(set, r), "distrusted: an abort the scrape shows holds its slot")
	scrapeShows(r, 3, now.Add(100*time.Millisecond))
	assert.Equal(t, int64(3), seqsOf(set, r), "the next scrape shows it honoured: 2 ours + the ghost")

	_, fresh := set.Take(Route{}, 10, nil)
	assert.Equal(t, int64(4), seqsOf(set, r))
	set.Leave(r, 10, fresh, true, now)
	assert.Equal(t, int64(3), seqsOf(set, r), "sent after the scrape: no scrape shows it, it leaves at once")

	// Without evidence for distrustFor, aborts are trusted again.
	later := now.Add(distrustFor + time.Second)
	assert.False(t, scrapeShows(r, 2, later))
	assert.False(t, r.Distrusted(later))
	set.Leave(r, 10, seq[2], true, later)
	assert.Equal(t, int64(1), seqsOf(set, r))
}

// TestScrapeFlightIsNotEvidence: requests sent while a scrape was in
// flight may be in it; requests that ended during it too. Neither makes
// the replica suspect.
func TestScrapeFlightIsNotEvidence(t *testing.T) {
	set, r := sizingSet(8)
	now := time.Unix(1_800_000_000, 0)
	r.Obs.Store(&Obs{OK: true})
	_, s1 := set.Take(Route{}, 10, nil)
	mark := r.MarkScrape(now)
	// During the flight: two sent, the first completes.
	set.Take(Route{}, 10, nil)
	set.Take(Route{}, 10, nil)
	set.Leave(r, 10, s1, false, now)
	// The scrape rendered after the sends and before the completion: 3.
	m := &vllm.Metrics{Running: vllm.Value{V: 3, OK: true}, Waiting: vllm.Value{OK: true}}
	require.False(t, r.Install(m, mark, now).Distrusted)
	assert.Equal(t, int64(3), seqsOf(set, r), "2 ours + 1 that looks foreign until the next scrape")
	m.Running.V = 4
	assert.True(t, r.Install(m, r.MarkScrape(now), now).Distrusted, "4 with 2 ours, none ended: 2 not ours")
}

func TestRecentCount(t *testing.T) {
	var c recentCount
	t0 := time.Unix(1_800_000_000, 0)
	c.add(t0)
	c.add(t0.Add(50 * time.Millisecond))
	c.add(t0.Add(900 * time.Millisecond))
	assert.Equal(t, int64(3), c.since(t0))
	assert.Equal(t, int64(1), c.since(t0.Add(800*time.Millisecond)))
	c.add(t0.Add(1650 * time.Millisecond)) // reuses t0's bucket
	assert.Equal(t, int64(2), c.since(t0), "the bucket of t0 was overwritten")
	assert.Equal(t, int64(0), c.since(t0.Add(2*time.Second)))
}
