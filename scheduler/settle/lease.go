package settle

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
	mu     sync.Mutex // guards m, period and every Lease
	m      map[*Lease]struct{}
	period time.Duration // the armed heartbeat period
	kick   chan struct{} // size 1: a shorter lease appeared, re-arm
}

// Lease is one record's lease as this instance last saw it acknowledged.
// The call that holds the record keeps it (no allocation per call) and
// hands it to Track and Untrack; its fields are the room's, guarded by
// the room's lock.
type Lease struct {
	ref      ledger.Ref              // the record
	cancel   context.CancelCauseFunc // fences the call: cancel(ledger.ErrLeaseLost)
	lastGood time.Time               // send time of the last acknowledged Reserve or Extend
	ttl      time.Duration           // the ttl that acknowledgement granted
	fence    *time.Timer             // fires fenceAt(lastGood, ttl); nil once stopped
}

// extendParallelism bounds concurrent Extends in one round.
const extendParallelism = 64

// fenceMargin is how long before the lease's end a call is fenced: the
// upstream abort must reach the replica before another instance can see the
// record UNRESOLVED and reuse its slot.
func fenceMargin(ttl time.Duration) time.Duration { return min(2*time.Second, ttl/6) }

// extendTimeout bounds one Extend; a round stays shorter than its period.
func extendTimeout(ttl time.Duration) time.Duration { return min(time.Second, ttl/6) }

// Track starts keeping the lease of ref, granted for ttl by a Reserve sent
// at sent, in l; cancel fences the call that holds it.
func (s *Settler) Track(l *Lease, ref ledger.Ref, cancel context.CancelCauseFunc, sent time.Time, ttl time.Duration) {
	s.leases.track(l, ref, cancel, sent, ttl)
}

// Untrack stops keeping l (its record reached a terminal state, or the
// pending-writes log owns its ending now).
func (s *Settler) Untrack(l *Lease) { s.leases.untrack(l) }

// Rearm wakes the heartbeat to re-arm with a shorter period (a reload
// shortened lease_ttl).
func (s *Settler) Rearm() { s.leases.rearm() }

func (l *leases) track(e *Lease, ref ledger.Ref, cancel context.CancelCauseFunc, sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.m == nil {
		l.m = map[*Lease]struct{}{}
	}
	*e = Lease{ref: ref, cancel: cancel, lastGood: sent, ttl: ttl}
	e.fence = time.AfterFunc(sent.Add(ttl-fenceMargin(ttl)).Sub(l.now()), func() { cancel(ledger.ErrLeaseLost) })
	l.m[e] = struct{}{}
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

func (l *leases) untrack(e *Lease) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[e]; ok {
		e.fence.Stop()
		delete(l.m, e)
	}
}

// acked records an acknowledged extension sent at sent and re-arms the fence.
func (l *leases) acked(e *Lease, sent time.Time, ttl time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	if _, ok := l.m[e]; !ok || sent.Before(e.lastGood) {
		return
	}
	e.lastGood, e.ttl = sent, ttl
	e.fence.Reset(sent.Add(ttl - fenceMargin(ttl)).Sub(l.now()))
}

// tracked is one lease as a heartbeat round extends it.
type tracked struct {
	e   *Lease
	ref ledger.Ref
}

// snapshot returns the tracked leases and the shortest ttl among them.
func (l *leases) snapshot() ([]tracked, time.Duration) {
	l.mu.Lock()
	defer l.mu.Unlock()
	out := make([]tracked, 0, len(l.m))
	var short time.Duration
	for e := range l.m {
		out = append(out, tracked{e: e, ref: e.ref})
		if short == 0 || e.ttl < short {
			short = e.ttl
		}
	}
	return out, short
}

// fence cancels e's call with ErrLeaseLost if its lease is still tracked
// (a call that ended meanwhile keeps its own outcome).
func (l *leases) fence(e *Lease) {
	l.mu.Lock()
	_, ok := l.m[e]
	cancel := e.cancel
	l.mu.Unlock()
	if ok {
		cancel(ledger.ErrLeaseLost)
	}
}

// Heartbeat extends every tracked lease each period, a third of the
// shortest lease in force (the lease_ttl in force or a tracked call's
// older one), so a reload of ledger.lease_ttl applies from the next
// round.
func (s *Settler) Heartbeat(ctx context.Context) error {
	due := s.now()
	for {
		ttl := s.ttl()
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

// extendAll runs one heartbeat round. Every lease is extended to the
// lease_ttl in force.
func (s *Settler) extendAll(ctx context.Context) {
	all, _ := s.leases.snapshot()
	ttl := s.ttl()
	var g errgroup.Group
	g.SetLimit(extendParallelism)
	for _, l := range all {
		g.Go(func() error {
			sent := s.now()
			ectx, cancel := context.WithTimeout(ctx, extendTimeout(ttl))
			_, err := s.led.Extend(ectx, l.ref, s.owner, ttl)
			cancel()
			s.note("extend", err)
			switch {
			case err == nil:
				s.leases.acked(l.e, sent, ttl)
			case errors.Is(err, ledger.ErrLeaseLost), errors.Is(err, ledger.ErrNotFound), errors.Is(err, ledger.ErrAlreadyFinal):
				// The record is no longer this call's: stop at once.
				s.leases.fence(l.e)
			}
			// A store error leaves the fence timer to decide.
			return nil
		})
	}
	_ = g.Wait()
}
