package lifecycle

import (
	"context"
	"sync"
	"sync/atomic"
	"time"
)

// ledgerOpTimeout bounds one ledger call.
const ledgerOpTimeout = 5 * time.Second

// opCtx is context.WithTimeout(context.WithoutCancel(parent), d) whose
// timer starts only when Done is first called. The embedded ledger only
// asks Err, which compares the clock with the deadline, so its three calls
// per request (reserve, mark dispatched, settle) start and stop no runtime
// timer; a ledger that waits on Done (Redis, fakes) gets a
// real timer context, created on that first call, and a context derived
// from this one registers with it directly (Value hands out its cancelCtx),
// never through a watcher goroutine. Its deadline is a context's, so it is
// on the runtime's clock (time.Now), not the server's: a context's timer
// and every Deadline reader (go-redis, net) measure against that one.
type opCtx struct {
	parent   context.Context // WithoutCancel of the request's context
	deadline time.Time

	once     sync.Once
	real     atomic.Pointer[context.Context] // set by Done
	stop     context.CancelFunc
	canceled atomic.Bool
}

func newOpCtx(parent context.Context, d time.Duration) (*opCtx, context.CancelFunc) {
	c := &opCtx{parent: context.WithoutCancel(parent), deadline: time.Now().Add(d)}
	return c, c.cancel
}

// ledgerOp bounds one of the call's ledger calls, which must finish even
// when the client left; end it with cancel. The call's WithoutCancel is made
// once for its three or four ledger calls, no cancel closure is made, and
// the first len(c.ops) contexts live in the call itself: three allocations
// fewer per call than newOpCtx. A slot is never reused, so a ledger that
// kept its context past the call's return still holds its own.
func (c *call) ledgerOp() *opCtx {
	if c.detached == nil {
		c.detached = context.WithoutCancel(c.ctx)
	}
	var o *opCtx
	if int(c.nops) < len(c.ops) {
		o = &c.ops[c.nops]
		c.nops++
	} else {
		o = new(opCtx)
	}
	o.parent, o.deadline = c.detached, time.Now().Add(ledgerOpTimeout)
	return o
}

func (c *opCtx) Deadline() (time.Time, bool) { return c.deadline, true }

func (c *opCtx) Done() <-chan struct{} {
	c.once.Do(func() {
		r, stop := context.WithDeadline(c.parent, c.deadline)
		c.stop = stop
		c.real.Store(&r)
		if c.canceled.Load() {
			stop()
		}
	})
	return (*c.real.Load()).Done()
}

func (c *opCtx) Err() error {
	if r := c.real.Load(); r != nil {
		return (*r).Err()
	}
	if c.canceled.Load() {
		return context.Canceled
	}
	if time.Until(c.deadline) <= 0 { // the monotonic clock alone: one clock read, not two
		return context.DeadlineExceeded
	}
	return nil
}

// Value answers from the timer context once it exists, so that the context
// package finds its cancelCtx (Cause, children); before, from the parent
// (whose WithoutCancel hides the request's own).
func (c *opCtx) Value(key any) any {
	if r := c.real.Load(); r != nil {
		return (*r).Value(key)
	}
	return c.parent.Value(key)
}

func (c *opCtx) cancel() {
	c.canceled.Store(true)
	if c.real.Load() != nil {
		c.once.Do(func() {}) // wait for a Done still creating it
		c.stop()
	}
}
