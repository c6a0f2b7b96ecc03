package scheduler

import (
	"context"
	"errors"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// The outbox ends, by id, ledger records whose ending the store did not
// acknowledge: retried every second (and at shutdown) until definite. A
// never-dispatched hold ends with Release (a Release of an unknown id
// leaves a tombstone, so an ambiguous Reserve that never applied cannot
// apply later); a dispatched one with Settle (Settle is idempotent by id).
// The record's lease is the backstop if the process dies first.

// outboxOp says how an outbox entry ends its record.
type outboxOp uint8

const (
	opRelease outboxOp = iota + 1 // never dispatched: Release
	opSettle                      // dispatched (or maybe): Settle actual
	// opReplay: an ambiguous Reserve of an Idempotency-Key's id. Another
	// attempt may hold that id (on this instance or another), so it is
	// not released blind: the same attempt (same nonce) is replayed, and
	// only a record it turns out to own is released.
	opReplay
)

// outboxEntry is one pending ending.
type outboxEntry struct {
	op      outboxOp
	reserve *ledger.ReserveRequest // opReplay: the attempt to replay
	ref     ledger.Ref
	actual  ledger.Amounts
	src     ledger.Source
	reqID   string
}

// outbox holds the pending endings.
type outbox struct {
	mu      sync.Mutex // guards pending
	pending []outboxEntry
	kick    chan struct{} // size 1: there is work
}

func (o *outbox) add(e outboxEntry) {
	o.mu.Lock()
	o.pending = append(o.pending, e)
	o.mu.Unlock()
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// kickNow wakes the outbox loop (owed outage usage to charge).
func (o *outbox) kickNow() {
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

func (o *outbox) take() []outboxEntry {
	o.mu.Lock()
	defer o.mu.Unlock()
	p := o.pending
	o.pending = nil
	return p
}

func (o *outbox) putBack(keep []outboxEntry) {
	if len(keep) == 0 {
		return
	}
	o.mu.Lock()
	o.pending = append(keep, o.pending...)
	o.mu.Unlock()
}

// len reports the pending endings (tests, /readyz).
func (o *outbox) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.pending)
}

// queueRelease hands the ending of c's never-dispatched hold to the outbox.
func (s *Server) queueRelease(c *call) {
	s.leases.untrack(c)
	s.outbox.add(outboxEntry{op: opRelease, ref: c.ref, reqID: c.reqID})
}

// queueReplay hands the ending of an ambiguous keyed Reserve to the outbox.
func (s *Server) queueReplay(c *call, rr ledger.ReserveRequest) {
	s.leases.untrack(c)
	rr.Scopes = slices.Clone(rr.Scopes) // off the call's array, which reserve reuses
	s.outbox.add(outboxEntry{op: opReplay, reserve: &rr, ref: c.ref, reqID: c.reqID})
}

// queueSettle hands the settlement of c to the outbox.
func (s *Server) queueSettle(c *call, actual ledger.Amounts, src ledger.Source) {
	s.leases.untrack(c)
	s.outbox.add(outboxEntry{op: opSettle, ref: c.ref, actual: actual, src: src, reqID: c.reqID})
}

// outboxLoop retries pending endings every second until they land, and
// charges owed outage usage.
func (s *Server) outboxLoop(ctx context.Context) error {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return nil
		case <-t.C:
		case <-s.outbox.kick:
		}
		s.flushOutbox(ctx)
		s.chargeOutages(ctx)
	}
}

// flushOutbox tries every pending ending once, bounded per entry.
func (s *Server) flushOutbox(ctx context.Context) {
	var keep []outboxEntry
	for _, e := range s.outbox.take() {
		if !s.endRecord(ctx, &e) {
			keep = append(keep, e)
		}
	}
	s.outbox.putBack(keep)
}

// endRecord applies one outbox entry; it reports whether the entry is done
// (definite outcome) or must be retried (store error).
func (s *Server) endRecord(ctx context.Context, e *outboxEntry) bool {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if e.op == opReplay {
		g, err := s.led.Reserve(sctx, *e.reserve)
		s.noteLedger("reserve", err)
		switch {
		case err == nil && !g.Replayed:
			// Ours (it applied then, or now): release it.
			e.op, e.reserve = opRelease, nil
			return s.endRecord(ctx, e)
		case ledger.IsStoreError(err):
			return false
		}
		// Another attempt's record, a final one, or a refusal: nothing
		// of ours to end.
		return true
	}
	if e.op == opRelease {
		err := s.led.Release(sctx, e.ref, s.owner)
		s.noteLedger("release", err)
		switch {
		case err == nil, errors.Is(err, ledger.ErrAlreadyFinal), errors.Is(err, ledger.ErrNotFound):
			return true
		case errors.Is(err, ledger.ErrDispatched):
			// An ambiguous MarkDispatched applied: nothing was sent, so
			// end it with a zero NotSent settlement (LEDGER §4).
			e.op, e.actual, e.src = opSettle, ledger.Amounts{}, ledger.SourceNotSent
			return false
		case ledger.IsStoreError(err):
			return false
		}
		s.log.Error("outbox release refused; the lease will expire it", "request_id", e.reqID, "err", err)
		return true
	}
	_, err := s.led.Settle(sctx, e.ref, e.actual, e.src)
	s.noteLedger("settle", err)
	switch {
	case err == nil, errors.Is(err, ledger.ErrAlreadyFinal):
		// AlreadyFinal: ended meanwhile (lease expiry charged it).
		return true
	case ledger.IsStoreError(err):
		return false
	}
	s.log.Error("outbox settle refused", "request_id", e.reqID, "err", err)
	return true
}
