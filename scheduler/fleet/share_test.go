package fleet

import (
	"testing"

	"github.com/stretchr/testify/assert"

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
