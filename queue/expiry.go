package queue

import (
	"context"
	"runtime"
	"time"
)

func (q *Queue[T]) expireLocked(n *node[T], nowN int64) {
	t := n.f.t
	q.unlinkLocked(n, nowN)
	if n.why == ReasonShed {
		t.counters.Shed++
	} else {
		t.counters.Expired++
	}
	it := q.itemOf(n)
	it.RetryAfter = q.retryAfterLocked(t, BoundTenantDepth, nowN)
	q.freeLocked(n)
	q.maybeDropLocked(t)
	if q.onExpire != nil {
		q.onExpire(it)
	}
}

func (q *Queue[T]) parkLocked(t *tenant[T], nowN int64) {
	if t.parked {
		return
	}
	t.parked = true
	t.counters.Parks++
	for _, f := range t.flows {
		if f != nil && q.fpos[f.id] >= 0 {
			q.bands[f.band].heap.remove(int(q.fpos[f.id]))
		}
	}
	if q.cfg.ParkBackoff > 0 {
		t.until = nowN + int64(q.cfg.ParkBackoff)
		q.parks.push(t.until, 0, t, 0)
		if t.pidx == 0 {
			q.signalRearm()
		}
	}
}

func (q *Queue[T]) unparkLocked(t *tenant[T], nowN int64) {
	if !t.parked {
		return
	}
	t.parked = false
	if t.pidx >= 0 {
		q.parks.remove(t.pidx)
	}
	for _, f := range t.flows {
		if f != nil && f.entries.len() > 0 {
			q.joinLocked(f, nowN, false)
		}
	}
	q.signalReady()
}

// Unpark lets a parked tenant compete again (call it after a local
// completion frees one of its slots). Its flows rejoin with the lift rule:
// time spent parked earns no credit. Unknown or unparked tenants are
// ignored.
func (q *Queue[T]) Unpark(tenant string) {
	q.mu.Lock()
	defer q.mu.Unlock()
	if t := q.tenants[tenant]; t != nil {
		q.unparkLocked(t, q.clock.Now().UnixNano())
	}
}

// Tick expires every entry whose deadline is at or before the clock's now
// (reporting each through OnExpire), ends due park backoffs, and returns
// the next time something falls due (ok false when nothing is pending).
// [Queue.Run] calls it; tests with a manual clock call it directly.
func (q *Queue[T]) Tick() (next time.Time, ok bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	nowN := q.clock.Now().UnixNano()
	for q.deadlines.len() > 0 && q.deadlines.top().k <= nowN {
		q.expireLocked(q.deadlines.top().p, nowN)
	}
	for q.parks.len() > 0 && q.parks.top().k <= nowN {
		q.unparkLocked(q.parks.top().p, nowN)
	}
	var nextN int64
	if q.deadlines.len() > 0 {
		nextN, ok = q.deadlines.top().k, true
	}
	if q.parks.len() > 0 {
		if u := q.parks.top().k; !ok || u < nextN {
			nextN, ok = u, true
		}
	}
	if !ok {
		return time.Time{}, false
	}
	return time.Unix(0, nextN), true
}

// Run drives expiry and park backoffs with one runtime timer armed at the
// earliest due time, re-armed whenever an earlier one appears (and, with
// [Config.ExpirySpin], a short poll before each due time). It returns nil
// when ctx is cancelled. Call it once, from the program's errgroup.
func (q *Queue[T]) Run(ctx context.Context) error {
	tm := time.NewTimer(time.Hour)
	defer tm.Stop()
	for {
		next, ok := q.Tick()
		if !ok {
			tm.Stop()
		} else {
			d := next.Sub(q.clock.Now())
			spin := q.expirySpin()
			if spin > 0 && d <= spin {
				if q.spinUntil(ctx, next) {
					return nil
				}
				continue
			}
			tm.Reset(d - spin)
		}
		select {
		case <-ctx.Done():
			return nil
		case <-tm.C:
		case <-q.rearm:
		}
	}
}

func (q *Queue[T]) expirySpin() time.Duration {
	q.mu.Lock()
	defer q.mu.Unlock()
	return q.cfg.ExpirySpin
}

// spinUntil yields until the clock reaches due, an earlier due time is
// signalled, or ctx ends (reported as true).
func (q *Queue[T]) spinUntil(ctx context.Context, due time.Time) bool {
	for q.clock.Now().Before(due) {
		select {
		case <-ctx.Done():
			return true
		case <-q.rearm:
			return false
		default:
		}
		runtime.Gosched()
	}
	return false
}
