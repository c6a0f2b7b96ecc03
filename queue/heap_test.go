package queue

import (
	"math/rand/v2"
	"slices"
	"testing"

	"github.com/stretchr/testify/require"
)

type hnode struct {
	id  int
	idx int
}

// TestHeapAgainstModel drives a dheap with random pushes, removals at any
// position, key changes and re-heapifies, and checks positions, the heap
// property and the popped order against a sorted model.
func TestHeapAgainstModel(t *testing.T) {
	t.Parallel()
	r := rand.New(rand.NewPCG(9, 9))
	var pos []int32 // dense index, as the band and deadline heaps keep
	h := dheap[int64, *hnode]{setIdx: func(n *hnode, x int32, i int) {
		n.idx = i
		pos[x] = int32(i)
	}}
	h.init() // empty is fine
	live := map[*hnode]bool{}
	var seq uint64
	check := func() {
		if len(h.s) != len(live) {
			require.Failf(t, "size", "heap has %d, model %d", len(h.s), len(live))
		}
		for i := range h.s {
			if h.s[i].p.idx != i || int(pos[h.s[i].x]) != i || int(h.s[i].x) != h.s[i].p.id {
				require.Failf(t, "index", "element at %d records %d", i, h.s[i].p.idx)
			}
			if i > 0 && h.s[i].less(&h.s[(i-1)>>heapShift]) {
				require.Failf(t, "heap property", "at %d", i)
			}
		}
	}
	for range 5_000 {
		switch k := r.IntN(10); {
		case k < 5:
			seq++
			n := &hnode{id: len(pos)}
			pos = append(pos, -1)
			h.push(r.Int64N(100), seq, n, int32(n.id))
			live[n] = true
		case k < 7 && h.len() > 0:
			i := r.IntN(h.len())
			n := h.remove(i)
			require.Equal(t, -1, n.idx)
			require.Equal(t, int32(-1), pos[n.id])
			delete(live, n)
		case k < 9 && h.len() > 0:
			h.setKey(r.IntN(h.len()), r.Int64N(100))
		case h.len() > 0:
			for i := range h.s {
				h.s[i].k = r.Int64N(100)
			}
			h.init()
		}
		check()
	}
	// Drain in order.
	var model []hitem[int64, *hnode]
	model = append(model, h.s...)
	slices.SortFunc(model, func(a, b hitem[int64, *hnode]) int {
		if a.less(&b) {
			return -1
		}
		return 1
	})
	for _, want := range model {
		got := h.top()
		require.Equal(t, want.k, got.k)
		require.Equal(t, want.s, got.s)
		h.remove(0)
	}
	require.Zero(t, h.len())
}
