package scheduler

import (
	"context"
	"errors"
	"slices"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/peers"
)

func TestSeqShare(t *testing.T) {
	e := func(id string, in, q int64) peers.Entry { return peers.Entry{Instance: id, InFlight: in, Queued: q} }
	cases := []struct {
		name   string
		max    int64
		self   string
		others []peers.Entry
		want   int64
	}{
		{"two backlogged split evenly", 4, "a", []peers.Entry{e("b", 4, 9)}, 2},
		{"odd: the remainder to the first id", 5, "a", []peers.Entry{e("b", 5, 9)}, 3},
		{"odd: the second id gets the floor", 5, "b", []peers.Entry{e("a", 5, 9)}, 2},
		{"an other needing less keeps it, the rest is ours", 8, "a", []peers.Entry{e("b", 1, 1)}, 6},
		{"an idle other leaves all", 4, "a", []peers.Entry{e("b", 0, 0)}, 4},
		{"water-filling over three: a keeps 1, b and c split 9 (b first)", 10, "c", []peers.Entry{e("a", 1, 0), e("b", 20, 0)}, 4},
		{"water-filling over three, seen by b", 10, "b", []peers.Entry{e("a", 1, 0), e("c", 20, 0)}, 5},
		{"more instances than sequences: at least one", 2, "z", []peers.Entry{e("a", 9, 9), e("b", 9, 9), e("c", 9, 9)}, 1},
		{"others exactly at the level claim it", 6, "a", []peers.Entry{e("b", 3, 0)}, 3},
		{"a report past any sum counts as max_num_seqs", 4, "a", []peers.Entry{e("b", 1<<62, 1<<62)}, 2},
	}
	for _, c := range cases {
		t.Run(c.name, func(t *testing.T) {
			assert.Equal(t, c.want, SeqShare(c.max, c.self, c.others))
		})
	}
}

// TestSeqSharesSumToMax: instances computing from the same reports (each
// seeing the others) agree, and their shares sum to max_num_seqs when all
// want more than an equal split.
func TestSeqSharesSumToMax(t *testing.T) {
	ids := []string{"a", "b", "c"}
	for maxSeqs := int64(3); maxSeqs <= 11; maxSeqs++ {
		var sum int64
		for _, self := range ids {
			var others []peers.Entry
			for _, o := range ids {
				if o != self {
					others = append(others, peers.Entry{Instance: o, InFlight: maxSeqs, Queued: 5})
				}
			}
			sum += SeqShare(maxSeqs, self, others)
		}
		assert.Equal(t, maxSeqs, sum, "max_num_seqs %d", maxSeqs)
	}
}

// fakeExchange is a peerExchange whose answers the test sets.
type fakeExchange struct {
	mu      sync.Mutex
	answer  map[string][]peers.Entry
	err     error
	reports [][]peers.Report
	left    bool
}

func (f *fakeExchange) ID() string { return "self" }

func (f *fakeExchange) Key(url string) string { return url }

func (f *fakeExchange) Exchange(_ context.Context, r []peers.Report) (map[string][]peers.Entry, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.reports = append(f.reports, r)
	if f.err != nil {
		return nil, f.err
	}
	return f.answer, nil
}

func (f *fakeExchange) Leave(context.Context) error {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.left = true
	return nil
}

func (f *fakeExchange) set(answer map[string][]peers.Entry, err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.answer, f.err = answer, err
}

// TestShareLoop: the loop reports this instance's demand, caps a replica
// others report on, lifts the cap when the exchange has failed for
// ShareStale, and withdraws at the end.
func TestShareLoop(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		s := newTestServer(t, testConfig(t, "", ""), newFakeLedger(t), &fakeUpstream{})
		r1 := s.reps.List()[0]
		r1.MaxSeqs = 4
		r2 := &replica{Name: "r1", URL: "http://r1.invalid", MaxSeqs: 4, Slot: 1}
		s.reps.SetMembers(append(slices.Clone(s.reps.List()), r2))
		ex := &fakeExchange{}
		ex.set(map[string][]peers.Entry{r1.URL: {{Instance: "other", InFlight: 4, Queued: 3}}}, nil)
		r2.Count.Store(1)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error)
		go func() { done <- s.ShareLoop(ctx, ex) }()

		time.Sleep(shareInterval)
		synctest.Wait()
		assert.Equal(t, int64(2), r1.Share.Load(), "half of r1's four")
		assert.Equal(t, int64(1), r1.Peers.Load())
		assert.Equal(t, int64(0), r2.Share.Load(), "nobody else on r2")
		ex.mu.Lock()
		require.NotEmpty(t, ex.reports)
		assert.Equal(t, []peers.Report{{Replica: r2.URL, InFlight: 1}}, ex.reports[0], "only where there is demand")
		ex.mu.Unlock()

		// The cap binds own requests only: with two in flight here r1 has
		// no room for this instance, though the batch has four slots.
		r1.Count.Store(2)
		assert.Equal(t, int64(2), r1.seqLimit(2))
		r1.Count.Store(0)
		r2.Count.Store(0)

		ex.set(nil, errors.New("store down"))
		time.Sleep(ShareStale - shareInterval)
		synctest.Wait()
		assert.Equal(t, int64(2), r1.Share.Load(), "kept while the news is fresh enough")
		time.Sleep(2 * shareInterval)
		synctest.Wait()
		assert.Equal(t, int64(0), r1.Share.Load(), "lapsed: no news for ShareStale")

		cancel()
		require.NoError(t, <-done)
		assert.True(t, ex.left)
	})
}
