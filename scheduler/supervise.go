package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
)

// One supervisor: Server.Run runs every long-lived loop of the process,
// the server's own and those the process attaches (the ledger's, the
// poller's, the GPU monitor's, the audit trail's, …), each wrapped by
// Supervise, so a loop that fails while it should run fails /readyz,
// naming itself, is logged, and its error is returned by Run.
//
// The loops stop in two steps. The server's own (queue expiry, dispatch,
// lease heartbeats, the pending-writes log's retries, readiness, clamps,
// admin state) stop after the drain, and the pending-writes log gets its
// last pass; the attached ones stop after that pass, because it needs
// them (the ledger's loop, the audit trail).

// attached holds the loops the process hands to Run.
type attached struct {
	mu      sync.Mutex
	loops   []loop
	started bool
}

type loop struct {
	name string
	run  func(context.Context) error
}

// Attach hands a background loop of the process to Run, which supervises
// it with the server's own and stops it after the last settlements. Call
// it before Run; it panics after, since the loop would never start.
func (s *Server) Attach(name string, run func(context.Context) error) {
	s.attached.mu.Lock()
	defer s.attached.mu.Unlock()
	if s.attached.started {
		panic("scheduler: Attach(" + name + ") after Run started")
	}
	s.attached.loops = append(s.attached.loops, loop{name, run})
}

// Supervise wraps a background loop for an errgroup: a loop that fails
// while ctx is live fails readiness (/readyz names it) and is logged; one
// that ends because ctx did is not a failure.
func (s *Server) Supervise(ctx context.Context, name string, run func(context.Context) error) func() error {
	return func() error {
		err := run(ctx)
		if err == nil || ctx.Err() != nil {
			return nil
		}
		err = fmt.Errorf("%s loop: %w", name, err)
		s.loopErr.CompareAndSwap(nil, &err)
		s.m.Ready.Set(0)
		s.log.Error("background loop failed", "loop", name, "err", err)
		return err
	}
}

// supervise is Run: every loop until ctx ends, the drain, the last pass
// of the pending-writes log, then the attached loops' stop.
func (s *Server) supervise(ctx context.Context) error {
	core, stopCore := context.WithCancel(context.WithoutCancel(ctx))
	defer stopCore()
	proc, stopProc := context.WithCancel(context.WithoutCancel(ctx))
	defer stopProc()
	s.attached.mu.Lock()
	s.attached.started = true
	procLoops := s.attached.loops
	s.attached.mu.Unlock()

	var own, others loopGroup
	for _, l := range []loop{
		{"queue", s.Queue().Run},
		{"dispatch", s.DispatchLoop},
		{"heartbeat", s.settler.Heartbeat},
		{"outbox", s.settler.Loop},
		{"ready", s.readyLoop},
		{"clamps", s.clampLoop},
		{"admin", s.admin.Watch},
	} {
		own.Go(s.Supervise(core, l.name, l.run))
	}
	for _, l := range procLoops {
		others.Go(s.Supervise(proc, l.name, l.run))
	}
	<-ctx.Done()
	s.StartDrain()
	s.Drain(s.pol.Load().Cfg.Server.DrainTimeout)
	stopCore()
	err := own.Wait()
	s.settler.Pass(context.WithoutCancel(ctx))
	s.settler.LogOwedAtExit(s.boot.Paths().Pending)
	stopProc()
	return errors.Join(err, others.Wait())
}

// loopGroup runs loops and returns all their errors, not the first only.
type loopGroup struct {
	wg   sync.WaitGroup
	mu   sync.Mutex
	errs []error
}

func (g *loopGroup) Go(f func() error) {
	g.wg.Go(func() {
		if err := f(); err != nil {
			g.mu.Lock()
			g.errs = append(g.errs, err)
			g.mu.Unlock()
		}
	})
}

func (g *loopGroup) Wait() error {
	g.wg.Wait()
	g.mu.Lock()
	defer g.mu.Unlock()
	return errors.Join(g.errs...)
}
