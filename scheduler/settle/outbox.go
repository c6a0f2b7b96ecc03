package settle

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

	"github.com/sluicehq/sluice/internal/atomicfile"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// The outbox is the pending-writes log: every write the ledger owes this
// process and has not acknowledged, in one file (config.StatePaths.Pending,
// one JSON line per write) retried by one loop (Settler.Loop) every second
// and at shutdown until definite. Two kinds of writes wait in it:
//
//   - Endings, by id, of ledger records whose ending the store did not
//     acknowledge. A never-dispatched hold ends with Release (a Release of
//     an unknown id leaves a tombstone, so an ambiguous Reserve that never
//     applied cannot apply later); a dispatched one with Settle (Settle is
//     idempotent by id).
//   - Owed outage charges (outage.go): usage admitted on an outage
//     allowance, charged once the ledger answers (Charge is idempotent by
//     id). A charge's line is written, and fsynced, when it is admitted and
//     again when its usage is known (the last line of an id wins); a line
//     saying it is no longer owed (opChargeDone, fsynced too) follows when
//     it is charged or refunded, so a restart never bills a refunded call.
//
// Each ending is appended as a line when queued, and the file is rewritten
// with what is left after a pass that ended one. With a networked ledger
// every Settle is also written there before it is sent (writeAhead), so a
// process killed while a Settle was in flight, or with endings pending (a
// store outage is when they pile up), settles them when it starts again,
// with the usage it had: without the file the records' leases end them, a
// dispatched one charged its whole hold when its window closes. Settle is
// idempotent by id, so a restart that re-sends one that had landed only
// replays it; the lines of landed Settles are dropped when the file is
// emptied (nothing pending, in flight or owed at a pass) or rewritten
// (past compactAt bytes). The endings' appends and rewrites are not
// fsynced: they survive a killed process, not a lost machine, and the
// lease stays the backstop. An owed charge has no lease behind it, so its
// lines, and a rewrite that keeps one, are fsynced.
//
// Older versions kept the owed charges in a JSON document (outage.json)
// and the endings in outbox.jsonl; load reads both once, writes what they
// hold into the log, and removes them (docs/upgrading.md).

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
	// opCharge: an owed outage charge (the line's charge); the last line
	// of an id wins.
	opCharge
	// opChargeDone: the outage charge of the line's ref is no longer owed
	// (charged, or refunded because the call never ran).
	opChargeDone
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
	Charge  *OwedCharge            `json:"charge,omitempty"` // opCharge
}

func (e *outboxEntry) line() outboxLine {
	return outboxLine{Op: e.op, Reserve: e.reserve, Ref: e.ref, Owner: e.owner, Actual: e.actual, Source: e.src, ReqID: e.reqID}
}

func (l *outboxLine) entry() outboxEntry {
	return outboxEntry{op: l.Op, reserve: l.Reserve, ref: l.Ref, owner: l.Owner, actual: l.Actual, src: l.Source, reqID: l.ReqID}
}

// outbox holds the pending endings.
type outbox struct {
	mu      sync.Mutex // guards pending, taken, inflight, f, written, dirty
	pending []outboxEntry
	taken   int           // entries a pass has taken from pending and not yet put back: still unacknowledged
	kick    chan struct{} // size 1: there is work

	path     string                          // outboxFile, set by load; "" keeps the entries in memory only
	f        *os.File                        // path, open for appending
	ahead    bool                            // write Settles ahead (a networked ledger), set after load
	inflight map[ledger.RequestID]aheadEntry // Settles written ahead and not yet answered
	written  int64                           // bytes appended since the file was last rewritten or emptied
	dirty    bool                            // the file holds ended entries (a failed rewrite, a charge no longer owed)
	charges  map[ledger.RequestID][]byte     // the owed outage charges' last lines, with a file
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

// load takes the writes a previous process left in paths.Pending, and in
// the files of older versions (paths.LegacyOutbox, paths.LegacyOutage),
// and opens the log for appending. It returns the owed outage charges,
// each chargeable now: a call still running then is charged at its hold.
// A line that does not parse (a write cut by a crash) is skipped, and
// said. What the older files held is written into the log (fsynced)
// before they are removed, so a crash in between reads it twice, which
// the ids make harmless.
func (o *outbox) load(paths config.StatePaths, log *slog.Logger) (map[ledger.RequestID]*OwedCharge, error) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.path, o.log = paths.Pending, log
	owed := map[ledger.RequestID]*OwedCharge{}
	if o.path == "" {
		return owed, nil
	}
	b, err := os.ReadFile(o.path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("pending-writes log: %w", err)
	}
	o.readLines(o.path, b, owed)
	var legacy []string
	if lb, err := os.ReadFile(paths.LegacyOutbox); err == nil {
		o.readLines(paths.LegacyOutbox, lb, owed)
		legacy = append(legacy, paths.LegacyOutbox)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("pending endings of an older version: %w", err)
	}
	if ob, err := os.ReadFile(paths.LegacyOutage); err == nil {
		var list []*OwedCharge
		if err := json.Unmarshal(ob, &list); err != nil {
			return nil, fmt.Errorf("outage charges %s are corrupt: %w", paths.LegacyOutage, err)
		}
		for _, ch := range list {
			owed[ch.Req.Ref.ID] = ch
		}
		legacy = append(legacy, paths.LegacyOutage)
	} else if !errors.Is(err, os.ErrNotExist) {
		return nil, fmt.Errorf("outage charges of an older version: %w", err)
	}
	o.charges = make(map[ledger.RequestID][]byte, len(owed))
	for id, ch := range owed {
		if ch.Running {
			ch.Running, ch.Source = false, ledger.SourceHeld
		}
		line, err := chargeLine(ch)
		if err != nil {
			return nil, fmt.Errorf("pending-writes log: %w", err)
		}
		o.charges[id] = line
	}
	o.inflight = map[ledger.RequestID]aheadEntry{}
	o.written = int64(len(b))
	if len(legacy) > 0 {
		// Migrate: the log first, then the older files go.
		if err := atomicfile.Replace(o.path, o.liveLines(), true); err != nil {
			return nil, fmt.Errorf("pending-writes log: moving the older files in: %w", err)
		}
		for _, f := range legacy {
			if err := os.Remove(f); err != nil {
				return nil, fmt.Errorf("pending-writes log: %s moved in, not removed: %w", f, err)
			}
		}
		o.written = 0
		log.Info("pending-writes log: moved in the files of an older version", "from", legacy, "to", o.path,
			"pending_endings", len(o.pending), "owed_outage_charges", len(owed))
	}
	if len(o.pending) > 0 || len(owed) > 0 {
		log.Info("pending-writes log: writes left by the previous process", "pending_endings", len(o.pending), "owed_outage_charges", len(owed))
		select {
		case o.kick <- struct{}{}:
		default:
		}
	}
	if o.f, err = os.OpenFile(o.path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600); err != nil {
		return nil, fmt.Errorf("pending-writes log: %w", err)
	}
	return owed, nil
}

// readLines adds the lines of b (read from path) to the pending endings
// and to owed.
func (o *outbox) readLines(path string, b []byte, owed map[ledger.RequestID]*OwedCharge) {
	sc := bufio.NewScanner(bytes.NewReader(b))
	sc.Buffer(nil, 1<<20)
	for sc.Scan() {
		var l outboxLine
		err := json.Unmarshal(sc.Bytes(), &l)
		switch {
		case err != nil || l.Op < opRelease || l.Op > opChargeDone || (l.Op == opCharge && l.Charge == nil):
			o.log.Warn("pending-writes log: skipping an unreadable entry", "path", path, "err", err)
		case l.Op == opCharge:
			owed[l.Charge.Req.Ref.ID] = l.Charge
		case l.Op == opChargeDone:
			delete(owed, l.Ref.ID)
		default:
			o.pending = append(o.pending, l.entry())
		}
	}
}

func chargeLine(ch *OwedCharge) ([]byte, error) {
	b, err := json.Marshal(outboxLine{Op: opCharge, Ref: ch.Req.Ref, ReqID: ch.ReqID, Charge: ch})
	return append(b, '\n'), err
}

// putCharge appends (and fsyncs) the line of an owed outage charge; an
// error means a restart would not find it.
func (o *outbox) putCharge(ch *OwedCharge) error {
	line, err := chargeLine(ch)
	if err != nil {
		return err
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.f == nil {
		return nil // memory only
	}
	if err := o.appendSynced(line); err != nil {
		return err
	}
	o.charges[ch.Req.Ref.ID] = line
	return nil
}

// dropCharge appends (and fsyncs) that the outage charge id is no longer
// owed; an error means a restart may charge it again (a replay by id, or
// a refunded call billed at its hold).
func (o *outbox) dropCharge(ref ledger.Ref, reqID string) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.f == nil {
		return nil
	}
	if _, ok := o.charges[ref.ID]; !ok {
		return nil
	}
	b, err := json.Marshal(outboxLine{Op: opChargeDone, Ref: ref, ReqID: reqID})
	if err != nil {
		return err
	}
	if err := o.appendSynced(append(b, '\n')); err != nil {
		return err
	}
	delete(o.charges, ref.ID)
	o.dirty = true // the charge's lines are dead: the next pass rewrites
	return nil
}

// appendSynced appends line and fsyncs the file (o.mu held, o.f set).
func (o *outbox) appendSynced(line []byte) error {
	n, err := o.f.Write(line)
	o.written += int64(n)
	if err != nil {
		return err
	}
	return o.f.Sync()
}

// liveLines is the log as a rewrite leaves it: the pending endings, the
// Settles in flight and the owed charges (o.mu held).
func (o *outbox) liveLines() []byte {
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
	for _, line := range o.charges {
		buf.Write(line)
	}
	return buf.Bytes()
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
		o.log.Error("pending-writes log: entry not persisted; a restart leaves it to the lease", "request_id", e.reqID, "err", err)
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

// compact brings the file down to the writes still pending, in flight or
// owed: it rewrites it when a pass ended or changed one (changed), an
// earlier rewrite failed or a charge stopped being owed (dirty) or the
// appended lines passed compactAt, and empties it when nothing is
// pending, in flight or owed. Both hold o.mu, so a Settle waits for them:
// the rewrite is one write of the live lines and a rename, fsynced only
// when it keeps an owed charge (the endings' appends are not).
func (o *outbox) compact(changed bool) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.dirty = o.dirty || changed
	if o.f == nil || (!o.dirty && o.written == 0) {
		return
	}
	if len(o.pending) == 0 && len(o.inflight) == 0 && len(o.charges) == 0 {
		if err := o.f.Truncate(0); err != nil {
			o.log.Error("pending-writes log not emptied; ended entries may be retried after a restart", "err", err)
			return
		}
		o.written, o.dirty = 0, false
		return
	}
	if !o.dirty && o.written < compactAt {
		return
	}
	live := o.liveLines()
	if err := atomicfile.Replace(o.path, live, len(o.charges) > 0); err != nil {
		o.log.Error("pending-writes log not rewritten; ended entries may be retried after a restart", "err", err)
		return
	}
	f, err := os.OpenFile(o.path, os.O_WRONLY|os.O_APPEND, 0o600)
	if err != nil {
		o.log.Error("pending-writes log: reopen", "err", err)
		return
	}
	_ = o.f.Close()
	o.f, o.dirty, o.written = f, false, int64(len(live))
}

// kickNow wakes the loop (owed outage usage to charge).
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
	o.taken += len(p)
	return p
}

// putBack ends a pass that took n entries: what it could not end goes
// back ahead of what was added meanwhile.
func (o *outbox) putBack(n int, keep []outboxEntry) {
	o.mu.Lock()
	o.pending = append(keep, o.pending...)
	o.taken -= n
	o.mu.Unlock()
}

// len reports the pending endings, those a pass is retrying included
// (tests, /readyz).
func (o *outbox) len() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.pending) + o.taken
}

// count is every ending not yet acknowledged: pending, being retried and
// in flight.
func (o *outbox) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.pending) + o.taken + len(o.inflight)
}

// QueueRelease hands the ending of a never-dispatched hold to the log:
// Release by id until definite.
func (s *Settler) QueueRelease(ref ledger.Ref, reqID string) {
	s.outbox.add(outboxEntry{op: opRelease, ref: ref, owner: s.owner, reqID: reqID})
}

// QueueReplay hands the ending of an ambiguous keyed Reserve rr of ref to
// the log.
func (s *Settler) QueueReplay(ref ledger.Ref, rr ledger.ReserveRequest, reqID string) {
	rr.Scopes = slices.Clone(rr.Scopes) // off the call's array, which reserve reuses
	s.outbox.add(outboxEntry{op: opReplay, reserve: &rr, ref: ref, owner: rr.Owner, reqID: reqID})
}

// QueueSettle hands the settlement of ref to the log.
func (s *Settler) QueueSettle(ref ledger.Ref, actual ledger.Amounts, src ledger.Source, reqID string) {
	s.outbox.add(outboxEntry{op: opSettle, ref: ref, actual: actual, src: src, reqID: reqID})
}

// WriteAhead persists the Settle of ref before it is sent (see
// outbox.writeAhead); the caller reports the answer with Landed or, on a
// store error, QueueSettle with the same values.
func (s *Settler) WriteAhead(ref ledger.Ref, actual ledger.Amounts, src ledger.Source, reqID string) {
	s.outbox.writeAhead(outboxEntry{op: opSettle, ref: ref, actual: actual, src: src, reqID: reqID})
}

// Landed: the store answered the Settle written ahead for id definitely.
func (s *Settler) Landed(id ledger.RequestID) { s.outbox.landed(id) }

// Flush tries every pending ending once, bounded per entry.
func (s *Settler) Flush(ctx context.Context) {
	var keep []outboxEntry
	changed := false // an entry ended, or goes on as another operation
	taken := s.outbox.take()
	for _, e := range taken {
		op := e.op
		if s.endRecord(ctx, &e) {
			changed = true
			continue
		}
		keep = append(keep, e)
		changed = changed || e.op != op
	}
	s.outbox.putBack(len(taken), keep)
	s.outbox.compact(changed)
}

// endRecord applies one outbox entry; it reports whether the entry is done
// (definite outcome) or must be retried (store error).
func (s *Settler) endRecord(ctx context.Context, e *outboxEntry) bool {
	sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	if e.op == opReplay {
		g, err := s.led.Reserve(sctx, *e.reserve)
		s.note("reserve", err)
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
		s.note("release", err)
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
	s.note("settle", err)
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
