package scheduler

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"os"
	"slices"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// The outbox ends, by id, ledger records whose ending the store did not
// acknowledge: retried every second (and at shutdown) until definite. A
// never-dispatched hold ends with Release (a Release of an unknown id
// leaves a tombstone, so an ambiguous Reserve that never applied cannot
// apply later); a dispatched one with Settle (Settle is idempotent by id).
//
// Where the outage charges are persisted (outageFile), pending endings are
// too (outboxFile): each is appended as a JSON line when queued, and the
// file is rewritten with what is left after a pass that ended one. With a
// networked ledger every Settle is also written there before it is sent
// (writeAhead), so a process killed while a Settle was in flight, or with
// endings pending (a store outage is when they pile up), settles them
// when it starts again, with the usage it had: without the file the
// records' leases end them, a dispatched one charged its whole hold when
// its window closes. Settle is idempotent by id, so a restart that
// re-sends one that had landed only replays it; the lines of landed
// Settles are dropped when the file is emptied (nothing pending or in
// flight at a pass) or rewritten (past compactAt bytes). The appends and
// rewrites are not fsynced: they survive a killed process, not a lost
// machine. The lease stays the backstop.

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
	owner   ledger.Owner // opRelease: the hold's owner (a restarted process has another)
	actual  ledger.Amounts
	src     ledger.Source
	reqID   string
}

// outboxLine is an entry as outboxFile keeps it.
type outboxLine struct {
	Op      outboxOp               `json:"op"`
	Reserve *ledger.ReserveRequest `json:"reserve,omitempty"`
	Ref     ledger.Ref             `json:"ref"`
	Owner   ledger.Owner           `json:"owner"`
	Actual  ledger.Amounts         `json:"actual"`
	Source  ledger.Source          `json:"source"`
	ReqID   string                 `json:"request_id"`
}

func (e *outboxEntry) line() outboxLine {
	return outboxLine{Op: e.op, Reserve: e.reserve, Ref: e.ref, Owner: e.owner, Actual: e.actual, Source: e.src, ReqID: e.reqID}
}

func (l *outboxLine) entry() outboxEntry {
	return outboxEntry{op: l.Op, reserve: l.Reserve, ref: l.Ref, owner: l.Owner, actual: l.Actual, src: l.Source, reqID: l.ReqID}
}

// outbox holds the pending endings.
type outbox struct {
	mu      sync.Mutex // guards pending, inflight, f, written, dirty
	pending []outboxEntry
	kick    chan struct{} // size 1: there is work

	path     string                          // outboxFile, set by load; "" keeps the entries in memory only
	f        *os.File                        // path, open for appending
	ahead    bool                            // write Settles ahead (a networked ledger), set after load
	inflight map[ledger.RequestID]aheadEntry // Settles written ahead and not yet answered
	written  int64                           // bytes appended since the file was last rewritten or emptied
	dirty    bool                            // the last rewrite failed: the file holds ended entries
	log      *slog.Logger
}

// aheadEntry is a Settle in flight, with its line as the file has it.
type aheadEntry struct {
	e    outboxEntry
	line []byte
}

// compactAt is how many bytes of appended lines a pass lets the file grow
// to before it rewrites it with what is pending or in flight: a restart
// re-sends at most about this much of landed Settles (some 300), each a
// replay. Below it, a pass empties the file whenever nothing is pending or
// in flight, which at light load is every pass.
const compactAt = 64 << 10

// outboxFile is where pending endings are kept across a restart (see
// config.StatePaths); "" keeps them in memory only.
func outboxFile(cfg *config.File) string { return cfg.Paths().Outbox }

// load takes the endings a previous process left in path and opens it for
// appending. A line that does not parse (a write cut by a crash) is
// skipped, and said.
func (o *outbox) load(path string, log *slog.Logger) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.path, o.log = path, log
	if path == "" {
		return nil
	}
	b, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return fmt.Errorf("outbox: %w", err)
	}
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l outboxLine
		if err := json.Unmarshal(sc.Bytes(), &l); err != nil || l.Op < opRelease || l.Op > opReplay {
			log.Warn("outbox: skipping an unreadable entry", "path", path, "err", err)
			continue
		}
		o.pending = append(o.pending, l.entry())
	}
	if len(o.pending) > 0 {
		log.Info("outbox: endings left by the previous process", "count", len(o.pending))
		select {
		case o.kick <- struct{}{}:
		default:
		}
	}
	if o.f, err = os.OpenFile(path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
		return fmt.Errorf("outbox: %w", err)
	}
	o.inflight = map[ledger.RequestID]aheadEntry{}
	o.written = int64(len(b))
	return nil
}

// appendLine appends e's line to the file (o.mu held, o.f set) and returns
// it; nil when it could not be written.
func (o *outbox) appendLine(e *outboxEntry) []byte {
	b, err := json.Marshal(e.line())
	if err == nil {
		b = append(b, '\n')
		_, err = o.f.Write(b)
		o.written += int64(len(b))
	}
	if err != nil {
		o.log.Error("outbox: entry not persisted; a restart leaves it to the lease", "request_id", e.reqID, "err", err)
		return nil
	}
	return b
}

// writeAhead persists a Settle before it is sent, where the outbox has a
// file and the ledger is a networked store: one append, not fsynced
// (BenchmarkOutboxWriteAhead: about 4 µs). The caller reports the store's
// answer with landed or, on a store error, hands the same entry to add. The
// embedded ledger's Settle is a function call that either applied or did
// not when the process dies, so it is not written ahead.
func (o *outbox) writeAhead(e outboxEntry) {
	if !o.ahead || o.path == "" { // both set before any call
		return
	}
	o.mu.Lock()
	if o.f != nil {
		if b := o.appendLine(&e); b != nil {
			o.inflight[e.ref.ID] = aheadEntry{e: e, line: b}
		}
	}
	o.mu.Unlock()
}

// landed: the store answered the Settle written ahead for id definitely.
// Its line stays in the file until the next rewrite or emptying; a restart
// before then replays it.
func (o *outbox) landed(id ledger.RequestID) {
	if !o.ahead || o.path == "" {
		return
	}
	o.mu.Lock()
	delete(o.inflight, id)
	o.mu.Unlock()
}

func (o *outbox) add(e outboxEntry) {
	o.mu.Lock()
	o.pending = append(o.pending, e)
	a, ok := o.inflight[e.ref.ID]
	delete(o.inflight, e.ref.ID) // pending now, whatever its answer was
	if (!ok || a.e.op != e.op || a.e.actual != e.actual || a.e.src != e.src) && o.f != nil {
		o.appendLine(&e) // the file has no line of this entry yet
	}
	o.mu.Unlock()
	select {
	case o.kick <- struct{}{}:
	default:
	}
}

// compact brings the file down to the entries still pending or in flight:
// it rewrites it when a pass ended or changed one (changed), an earlier
// rewrite failed (dirty) or the appended lines passed compactAt, and
// empties it when nothing is pending or in flight. Both hold o.mu, so a
// Settle waits for them: the rewrite is one write of the live lines and a
// rename, not fsynced (the appends are not either).
func (o *outbox) compact(changed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dirty = o.dirty || changed
	if o.f == nil || (!o.dirty && o.written == 0) {
		return
	}
	if len(o.pending) == 0 && len(o.inflight) == 0 {
		if err := o.f.Truncate(0); err != nil {
			o.log.Error("outbox: not emptied; ended entries may be retried after a restart", "err", err)
			return
		}
		o.written, o.dirty = 0, false
		return
	}
	if !o.dirty && o.written < compactAt {
		return
	}
	var buf bytes.Buffer
	for i := range o.pending {
		b, err := json.Marshal(o.pending[i].line())
		if err != nil {
			continue
		}
		buf.Write(b)
		buf.WriteByte('\n')
	}
	for _, a := range o.inflight {
		buf.Write(a.line)
	}
	if err := replaceFile(o.path, buf.Bytes(), false); err != nil {
		o.log.Error("outbox: not rewritten; ended entries may be retried after a restart", "err", err)
		return
	}
	f, err := os.OpenFile(o.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		o.log.Error("outbox: reopen", "err", err)
		return
	}
	_ = o.f.Close()
	o.f, o.dirty, o.written = f, false, int64(buf.Len())
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

// count is every ending not yet acknowledged: pending and in flight.
func (o *outbox) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.pending) + len(o.inflight)
}

// queueRelease hands the ending of c's never-dispatched hold to the outbox.
func (s *Server) queueRelease(c *call) {
	s.leases.untrack(c)
	s.outbox.add(outboxEntry{op: opRelease, ref: c.ref, owner: s.owner, reqID: c.reqID})
}

// queueReplay hands the ending of an ambiguous keyed Reserve to the outbox.
func (s *Server) queueReplay(c *call, rr ledger.ReserveRequest) {
	s.leases.untrack(c)
	rr.Scopes = slices.Clone(rr.Scopes) // off the call's array, which reserve reuses
	s.outbox.add(outboxEntry{op: opReplay, reserve: &rr, ref: c.ref, owner: rr.Owner, reqID: c.reqID})
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
	changed := false // an entry ended, or goes on as another operation
	for _, e := range s.outbox.take() {
		op := e.op
		if s.endRecord(ctx, &e) {
			changed = true
			continue
		}
		keep = append(keep, e)
		changed = changed || e.op != op
	}
	s.outbox.putBack(keep)
	s.outbox.compact(changed)
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
		err := s.led.Release(sctx, e.ref, e.owner)
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
	case errors.Is(err, ledger.ErrNotFound):
		// A line a previous process wrote ahead of a Settle that landed,
		// whose tombstone has aged out since: nothing left to end.
		s.log.Info("outbox settle: record gone", "request_id", e.reqID)
		return true
	case ledger.IsStoreError(err):
		return false
	}
	s.log.Error("outbox settle refused", "request_id", e.reqID, "err", err)
	return true
}
