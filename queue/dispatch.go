package queue

// Next picks the next request: the highest band with an eligible flow, the
// flow with the smallest counter there (ties: eligible first), and its head
// (FIFO or EDF). Expired heads met on the way are expired (reported through
// OnExpire), so an entry is never handed out at or after its deadline. pred
// sees each candidate, with the mutex held (it must be quick and must not
// call the Queue), and answers [Dispatch], [Park] or [Block]. A parked
// tenant leaves the pick, so Next consults each tenant at most once per
// call and never spins.
//
// On Dispatch the entry's predicted cost is charged to its flow and Next
// returns it with true; the caller then owns it and must call exactly one
// of [Queue.Release] (it went out) or [Queue.Requeue] (it could not take a
// slot). Next returns false when nothing is eligible or pred blocked.
func (q *Queue[T]) Next(pred func(Item[T]) Verdict) (Item[T], bool) {
	return q.NextView(func(it Item[T], _ View[T]) Verdict { return pred(it) })
}

// View reads tenants' live counts from inside a predicate of
// [Queue.NextView], where the mutex is held and the Queue may not be
// called. It is valid only during that predicate call.
type View[T any] struct{ q *Queue[T] }

// Queued is the tenant's number of queued entries (0 for unknown tenants).
func (v View[T]) Queued(tenant string) int {
	if t := v.q.tenants[tenant]; t != nil {
		return t.depth
	}
	return 0
}

// Pending is the tenant's number of dispatched entries not yet released or
// requeued: handed out by Next but not yet counted as running by the caller.
func (v View[T]) Pending(tenant string) int {
	if t := v.q.tenants[tenant]; t != nil {
		return t.pending
	}
	return 0
}

// NextView is [Queue.Next] with a predicate that may also read every
// tenant's live counts through a [View], so that a share-aware predicate
// sees dispatches its caller has not yet recorded.
func (q *Queue[T]) NextView(pred func(Item[T], View[T]) Verdict) (Item[T], bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	view := View[T]{q: q}
	now := q.clock.Now()
	nowN := now.UnixNano()
	for b := range q.bands {
		bd := &q.bands[b]
		for bd.heap.len() > 0 {
			f := bd.heap.top().p
			n := f.entries.top().p
			if n.dl <= nowN {
				q.expireLocked(n, nowN)
				continue
			}
			if tc := &f.t.cfg; tc.Order == OrderFIFO && (tc.ShedAfter > 0 || tc.LIFOAfter > 0) {
				// The operator's opt-in standing-queue policies: shed what
				// has waited ShedAfter, and once the head has waited
				// LIFOAfter serve the newest, which can still start in time.
				waited := nowN - n.arr.UnixNano()
				if tc.ShedAfter > 0 && waited >= int64(tc.ShedAfter) {
					n.why = ReasonShed
					q.expireLocked(n, nowN)
					continue
				}
				if tc.LIFOAfter > 0 && waited > int64(tc.LIFOAfter) {
					if n = f.newest(); n.dl <= nowN {
						q.expireLocked(n, nowN)
						continue
					}
				}
			}
			it := q.itemOf(n)
			switch pred(it, view) {
			case Dispatch:
				q.dispatchLocked(n, nowN)
				return it, true
			case Park:
				q.parkLocked(f.t, nowN)
			default:
				return Item[T]{}, false
			}
		}
	}
	return Item[T]{}, false
}

// newest returns the flow's latest arrival (largest sequence). It is
// among the heap's leaves, so this scans at most the last level.
func (f *flow[T]) newest() *node[T] {
	h := f.entries.s
	best := 0
	if len(h) > 1 {
		best = (len(h)-2)>>heapShift + 1
	}
	for i := best + 1; i < len(h); i++ {
		if h[i].s > h[best].s {
			best = i
		}
	}
	return h[best].p
}

func (q *Queue[T]) dispatchLocked(n *node[T], nowN int64) {
	f := n.f
	t := f.t
	bd := &q.bands[f.band]
	q.unlinkLocked(n, nowN)
	n.state = stateDispatched
	t.pending++
	bd.lastV = f.v
	f.v += float64(n.cost) / t.cfg.Weight
	f.charged += n.cost
	t.charged += n.cost
	if q.fpos[f.id] >= 0 {
		bd.heap.setKey(int(q.fpos[f.id]), f.v)
	}
	t.dispatched++
	t.rate.add(nowN, n.cost)
	q.rate.add(nowN, n.cost)
	if bd.heap.len() > 0 && bd.heap.top().k > rebaseAt {
		q.rebaseLocked(int(f.band), bd.heap.top().k)
	}
}

// rebaseLocked shifts every counter of band b down by base, which keeps
// their order and differences.
func (q *Queue[T]) rebaseLocked(b int, base float64) {
	for _, t := range q.tenants {
		if f := t.flows[b]; f != nil {
			f.v -= base
		}
	}
	h := &q.bands[b].heap
	for i := range h.s {
		h.s[i].k -= base
	}
	q.bands[b].lastV -= base
	q.bands[b].rebased += base
}

// Release ends the Queue's interest in a dispatched entry (it went out);
// its Handle becomes stale. It reports false for a handle that is not a
// dispatched entry.
func (q *Queue[T]) Release(h Handle[T]) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := h.n
	if n == nil || n.gen != h.gen || n.state != stateDispatched {
		return false
	}
	t := n.f.t
	t.pending--
	q.freeLocked(n)
	q.maybeDropLocked(t)
	return true
}

// Requeue puts a dispatched entry back at its tenant's head (its place by
// arrival, or by deadline under EDF), undoes its charge, and parks the
// tenant (until [Queue.Unpark] or the park backoff). Use it when the slot
// could not be taken after [Queue.Next]. Bounds are not re-checked: the
// entry held its place before. The Handle stays the same, so Cancel still
// works. An entry whose deadline passed meanwhile is expired by the next
// Tick or Next. It reports false for a handle that is not dispatched.
func (q *Queue[T]) Requeue(h Handle[T]) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	n := h.n
	if n == nil || n.gen != h.gen || n.state != stateDispatched {
		return false
	}
	t := n.f.t
	nowN := q.clock.Now().UnixNano()
	t.pending--
	q.undoDispatchLocked(n)
	t.counters.Requeued++
	n.state = stateQueued
	q.parkLocked(t, nowN)
	q.insertLocked(n, nowN, false)
	q.signalReady()
	return true
}

// undoDispatchLocked takes back the charge dispatchLocked made for n: its
// flow's counter and the charged and dispatched counts.
func (q *Queue[T]) undoDispatchLocked(n *node[T]) {
	f := n.f
	t := f.t
	f.v -= float64(n.cost) / t.cfg.Weight
	f.charged -= n.cost
	t.charged -= n.cost
	if q.fpos[f.id] >= 0 {
		q.bands[f.band].heap.setKey(int(q.fpos[f.id]), f.v)
	}
	t.dispatched--
}

// Reconcile adjusts a flow's counter at completion by (actual − predicted)
// weighted: a request that used less is refunded, one that used more is
// charged the difference. Aborted requests pass what they consumed. It
// reports false when the tenant is gone (removed and drained).
func (q *Queue[T]) Reconcile(tenant string, band int, predicted, actual int64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tenants[tenant]
	if t == nil || band < 0 || band >= NumBands || t.flows[band] == nil {
		return false
	}
	f := t.flows[band]
	d := actual - predicted
	f.v += float64(d) / t.cfg.Weight
	f.charged += d
	t.charged += d
	if q.fpos[f.id] >= 0 {
		q.bands[f.band].heap.setKey(int(q.fpos[f.id]), f.v)
	}
	return true
}
