package queue

// dheap is an indexed d-ary min-heap. Every element records its own position
// through setIdx (-1 once removed), so remove and fix are O(d·log_d n).
// The function fields must be set before use; they are plain functions, so
// calls do not allocate.
type dheap[E any] struct {
	s      []E
	d      int
	less   func(a, b E) bool
	setIdx func(e E, i int)
}

func (h *dheap[E]) len() int { return len(h.s) }

func (h *dheap[E]) top() E { return h.s[0] }

func (h *dheap[E]) push(e E) {
	h.s = append(h.s, e)
	i := len(h.s) - 1
	h.setIdx(e, i)
	h.up(i)
}

// remove deletes the element at position i and returns it.
func (h *dheap[E]) remove(i int) E {
	var zero E
	n := len(h.s) - 1
	e := h.s[i]
	if i != n {
		h.s[i] = h.s[n]
		h.setIdx(h.s[i], i)
	}
	h.s[n] = zero
	h.s = h.s[:n]
	if i != n {
		if !h.down(i) {
			h.up(i)
		}
	}
	h.setIdx(e, -1)
	return e
}

// fix restores the heap after the key of the element at i changed.
func (h *dheap[E]) fix(i int) {
	if !h.down(i) {
		h.up(i)
	}
}

// init re-heapifies after many keys changed (for example a new order).
func (h *dheap[E]) init() {
	for i := range h.s {
		h.setIdx(h.s[i], i)
	}
	for i := (len(h.s) - 2) / h.d; i >= 0; i-- {
		h.down(i)
	}
}

func (h *dheap[E]) up(i int) {
	e := h.s[i]
	for i > 0 {
		p := (i - 1) / h.d
		if !h.less(e, h.s[p]) {
			break
		}
		h.s[i] = h.s[p]
		h.setIdx(h.s[i], i)
		i = p
	}
	h.s[i] = e
	h.setIdx(e, i)
}

// down sifts the element at i down and reports whether it moved.
func (h *dheap[E]) down(i0 int) bool {
	n := len(h.s)
	i := i0
	e := h.s[i]
	for {
		c := h.d*i + 1
		if c >= n {
			break
		}
		best := c
		end := c + h.d
		if end > n {
			end = n
		}
		for j := c + 1; j < end; j++ {
			if h.less(h.s[j], h.s[best]) {
				best = j
			}
		}
		if !h.less(h.s[best], e) {
			break
		}
		h.s[i] = h.s[best]
		h.setIdx(h.s[i], i)
		i = best
	}
	h.s[i] = e
	h.setIdx(e, i)
	return i > i0
}
