package queue

import "cmp"

// hitem is one heap slot: the key is stored inline (k, then s to break
// ties), so sifting compares without touching the element.
type hitem[K cmp.Ordered, P any] struct {
	k K
	s uint64
	p P
}

func (a *hitem[K, P]) less(b *hitem[K, P]) bool {
	return a.k < b.k || (a.k == b.k && a.s < b.s)
}

// Heap arity: 2^heapShift children per node.
const (
	heapShift = 2
	heapArity = 1 << heapShift
)

// dheap is an indexed d-ary min-heap (d = heapArity). Every element records its own
// position through setIdx (-1 once removed), so remove and fix are
// O(log n). setIdx must be a plain function, so calls do not allocate.
type dheap[K cmp.Ordered, P any] struct {
	s      []hitem[K, P]
	setIdx func(p P, i int)
}

func (h *dheap[K, P]) len() int { return len(h.s) }

func (h *dheap[K, P]) top() *hitem[K, P] { return &h.s[0] }

func (h *dheap[K, P]) push(k K, s uint64, p P) {
	h.s = append(h.s, hitem[K, P]{k: k, s: s, p: p})
	h.up(len(h.s) - 1)
}

// remove deletes the element at position i and returns it.
func (h *dheap[K, P]) remove(i int) P {
	n := len(h.s) - 1
	p := h.s[i].p
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
	h.setIdx(p, -1)
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
		h.setIdx(h.s[i].p, i)
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
		h.setIdx(h.s[i].p, i)
		i = p
	}
	h.s[i] = e
	h.setIdx(e.p, i)
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
		h.setIdx(h.s[i].p, i)
		i = best
	}
	h.s[i] = e
	h.setIdx(e.p, i)
	return i > i0
}
