package scheduler

import (
	"context"
	"errors"
	"sync"
	"time"

	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/ledger"
)

// Leases keep every ledger record this instance holds alive from its Reserve
// to its terminal transition, queued calls included (a queued call is
// RESERVED; its lease lapsing would free a hold another instance can then
// over-admit against). Each round extends every lease in parallel with
// bounded concurrency, so a round's length does not grow with the number of
// calls; and each call's fence is its own timer armed from the send time of
// its last acknowledged extension, so the fence fires before the lease can
// lapse whatever the rounds do (LEDGER.md I10).
type leases struct {
	now    func() time.Time
	mu     sync.Mutex // guards m, period and every leaseEntry
	m      map[*call]*leaseEntry
	period time.Duration // the armed heartbeat period
	kick   chan struct{} // size 1: a shorter lease appeared, re-arm
}

// leaseEntry is one call's lease as this instance last saw it acknowledged.
type leaseEntry struct {
	lastGood time.Time     // send time of the last acknowledged Reserve or Extend
	ttl      time.Duration // the ttl that acknowledgement granted
	fence    *time.Timer   // fires fenceAt(lastGood, ttl); nil once stopped
}

// extendParallelism bounds concurrent Extends in one round.
const extendParallelism = 64

// fenceMargin is how long before the lease's end a call is fenced: the
// upstream abort must reach the replica before another instance can see the
// record UNRESOLVED and reuse its slot.
func fenceMargin(ttl time.Duration) time.Duration { return min(2*time.Second, ttl/6) }

// extendTimeout bounds one Extend; a round stays shorter than its period.
func extendTimeout(ttl time.Duration) time.Duration { return min(time.Second, ttl/6) }

// track starts keeping c's lease, granted for ttl by a Reserve sent at sent.
func (l *leases) track(c *call, sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[*call]*leaseEntry{}
	}
	e := &c.lease
	*e = leaseEntry{lastGood: sent, ttl: ttl}
	e.fence = time.AfterFunc(sent.Add(ttl-fenceMargin(ttl)).Sub(l.now()), func() { c.cancel(ledger.ErrLeaseLost) })
	l.m[c] = e
	if l.period > 0 && ttl/3 < l.period {
		l.rearm()
	}
}

// rearm wakes the heartbeat to re-arm with a shorter period (a reload
// shortened lease_ttl, or a call came with a shorter lease).
func (l *leases) rearm() {
	select {
	case l.kick <- struct{}{}:
	default:
	}
}

// untrack stops keeping c's lease (its record reached a terminal state, or
// the outbox owns its ending now).
func (l *leases) untrack(c *call) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if e, ok := l.m[c]; ok {
		e.fence.Stop()
		delete(l.m, c)
	}
}

// acked records an acknowledged extension sent at sent and re-arms the fence.
func (l *leases) acked(c *call, sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	e, ok := l.m[c]
	if !ok || sent.Before(e.lastGood) {
		return
	}
	e.lastGood, e.ttl = sent, ttl
	e.fence.Reset(sent.Add(ttl - fenceMargin(ttl)).Sub(l.now()))
}

// snapshot returns the tracked calls and the shortest ttl among them.
func (l *leases) snapshot() ([]*call, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	calls := make([]*call, 0, len(l.m))
	var short time.Duration
	for c, e := range l.m {
		calls = append(calls, c)
		if short == 0 || e.ttl < short {
			short = e.ttl
		}
	}
	return calls, short
}

// fence cancels c with ErrLeaseLost if its lease is still tracked (a call
// that ended meanwhile keeps its own outcome).
func (l *leases) fence(c *call) {
	l.mu.Lock()
	_, ok := l.m[c]
	l.mu.Unlock()
	if ok {
		c.cancel(ledger.ErrLeaseLost)
	}
}

// heartbeatLoop extends every tracked lease each period, a third of the
// shortest lease in force (the current policy's lease_ttl or a tracked
// call's older one), so a reload of ledger.lease_ttl applies from the next
// round.
func (s *Server) heartbeatLoop(ctx context.Context) error {
	due := s.now()
	for {
		ttl := s.pol.Load().LeaseTTL
		if _, short := s.leases.snapshot(); short > 0 && short < ttl {
			ttl = short
		}
		s.leases.mu.Lock()
		s.leases.period = ttl / 3
		s.leases.mu.Unlock()
		next := due.Add(ttl / 3)
		t := time.NewTimer(next.Sub(s.now()))
		select {
		case <-ctx.Done():
			t.Stop()
			return nil
		case <-s.leases.kick:
			// Re-arm from the last round with the shorter period.
			t.Stop()
			continue
		case <-t.C:
		}
		due = s.now()
		s.extendAll(ctx)
	}
}

// extendAll runs one heartbeat round. Every call is extended to the
// current policy's lease_ttl.
func (s *Server) extendAll(ctx context.Context) {
	calls, _ := s.leases.snapshot()
	ttl := s.pol.Load().LeaseTTL
	var g errgroup.Group
	g.SetLimit(extendParallelism)
	for _, c := range calls {
		g.Go(func() error {
			sent := s.now()
			ectx, cancel := context.WithTimeout(ctx, extendTimeout(ttl))
			_, err := s.led.Extend(ectx, c.ref, s.owner, ttl)
			cancel()
			s.noteLedger("extend", err)
			switch {
			case err == nil:
				s.leases.acked(c, sent, ttl)
			case errors.Is(err, ledger.ErrLeaseLost), errors.Is(err, ledger.ErrNotFound), errors.Is(err, ledger.ErrAlreadyFinal):
				// The record is no longer this call's: stop at once.
				s.leases.fence(c)
			}
			// A store error leaves the fence timer to decide.
			return nil
		})
	}
	_ = g.Wait()
}
