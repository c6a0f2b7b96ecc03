package queue

import "cmp"

// hitem is one heap slot: the key is stored inline (k, then s to break
// ties), so sifting compares without touching the element.
type hitem[K cmp.Ordered, P any] struct {
	k K
	s uint64
	p P
	x int32 // the element's slot in a dense position index, if the heap uses one
}

func (a *hitem[K, P]) less(b *hitem[K, P]) bool {
	return a.k < b.k || (a.k == b.k && a.s < b.s)
}

// Heap arity: 2^heapShift children per node.
const (
	heapShift = 2
	heapArity = 1 << heapShift
)

// dheap is an indexed d-ary min-heap (d = heapArity). Every element's
// position is recorded through setIdx (-1 once removed), so remove and
// setKey are O(log n). setIdx gets the element and its dense index x; a heap
// whose elements are scattered in memory records positions in a dense
// array indexed by x, so sifting does not touch the elements at all.
type dheap[K cmp.Ordered, P any] struct {
	s      []hitem[K, P]
	setIdx func(p P, x int32, i int)
}

func (h *dheap[K, P]) len() int { return len(h.s) }

func (h *dheap[K, P]) top() *hitem[K, P] { return &h.s[0] }

func (h *dheap[K, P]) push(k K, s uint64, p P, x int32) {
	h.s = append(h.s, hitem[K, P]{k: k, s: s, p: p, x: x})
	h.up(len(h.s) - 1)
}

// remove deletes the element at position i and returns it.
func (h *dheap[K, P]) remove(i int) P {
	n := len(h.s) - 1
	p, x := h.s[i].p, h.s[i].x
	if i != n {
		h.s[i] = h.s[n]
	}
	h.s[n] = hitem[K, P]{}
	h.s = h.s[:n]
	if i != n {
		if !h.down(i) {
			h.up(i)
		}
	}
	h.setIdx(p, x, -1)
	return p
}

// setKey changes the key of the element at i and restores the heap.
func (h *dheap[K, P]) setKey(i int, k K) {
	h.s[i].k = k
	if !h.down(i) {
		h.up(i)
	}
}

// init re-heapifies after many keys changed (for example a new order).
func (h *dheap[K, P]) init() {
	for i := range h.s {
		h.setIdx(h.s[i].p, h.s[i].x, i)
	}
	if len(h.s) < 2 {
		return
	}
	for i := (len(h.s) - 2) >> heapShift; i >= 0; i-- {
		h.down(i)
	}
}

func (h *dheap[K, P]) up(i int) {
	e := h.s[i]
	for i > 0 {
		p := (i - 1) >> heapShift
		if !e.less(&h.s[p]) {
			break
		}
		h.s[i] = h.s[p]
		h.setIdx(h.s[i].p, h.s[i].x, i)
		i = p
	}
	h.s[i] = e
	h.setIdx(e.p, e.x, i)
}

// down sifts the element at i down and reports whether it moved.
func (h *dheap[K, P]) down(i0 int) bool {
	n := len(h.s)
	i := i0
	e := h.s[i]
	for {
		c := i<<heapShift + 1
		if c >= n {
			break
		}
		best := c
		end := min(c+heapArity, n)
		for j := c + 1; j < end; j++ {
			if h.s[j].less(&h.s[best]) {
				best = j
			}
		}
		if !h.s[best].less(&e) {
			break
		}
		h.s[i] = h.s[best]
		h.setIdx(h.s[i].p, h.s[i].x, i)
		i = best
	}
	h.s[i] = e
	h.setIdx(e.p, e.x, i)
	return i > i0
}
