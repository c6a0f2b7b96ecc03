package ledger

import (
	"bytes"
	"container/heap"
	"encoding/binary"
	"errors"
	"fmt"
	"hash/crc32"
	"io"
	"os"
	"slices"
	"sync"
	"time"
)

// Journal format. Each entry is
//
//	u32 length of body | u32 CRC-32C of body | body
//
// and body is u8 op, i64 ledger time (ms), [16] tenant ScopeKey, then the
// op's integers and hashed ids (little endian). No raw id is ever written.
// Replay re-executes every entry at its ledger time; the state machine is
// deterministic, so the rebuilt state is the acknowledged one.
//
// Format 2 (every entry written now) sets opV2 in the op byte and follows
// the tenant with u8 the number of dimensions of every Amounts in the entry,
// so a journal written before a dimension was added still replays (missing
// dimensions read as 0); Reserve and Charge entries (and snapshot records)
// also carry the per-attempt nonce after the policy version (after the
// digest). Format 1 entries (no flag) have legacyDims dimensions and no
// nonce. An entry with more dimensions than this build knows is refused.
const (
	opOpen    uint8 = 1 // start-up: retention; RESERVED → EXPIRED, DISPATCHED → UNRESOLVED
	opReserve uint8 = 2
	opMark    uint8 = 3
	opExtend  uint8 = 4
	opSettle  uint8 = 5
	opRelease uint8 = 6
	opReclaim uint8 = 7
	opResolve uint8 = 8
	opAdjust  uint8 = 9
	// Snapshot entries (written by compaction at start-up; see compact.go).
	opSnapTenant uint8 = 10
	opSnapScope  uint8 = 11
	opSnapRecord uint8 = 12
	opRetention  uint8 = 13 // tombstone retention (head of an online compaction)
	opCharge     uint8 = 14 // Charge: encoded like opReserve (ttl holds At in ms, Held the amounts)
	opGrow       uint8 = 15 // Grow: id, owner, the hold it grows from, the hold it grows to

	opV2 uint8 = 0x80 // format 2 flag in the op byte

	// flagRequestDigest in a Reserve entry's dispatch byte (bit 0: Dispatch)
	// says a RequestDigest follows the nonce. Entries without one are
	// written as before, so a journal without request digests stays
	// readable by earlier builds.
	flagRequestDigest uint8 = 0x02

	maxEntry   = 1 << 16 // a longer length field is corruption, not a torn tail
	legacyDims = 7       // dimensions of a format 1 entry (before gpu_joules)
)

var castagnoli = crc32.MakeTable(crc32.Castagnoli)

// entry is one applied transition (and the in-memory argument bundle of the
// *Locked operations).
type entry struct {
	op     uint8
	time   int64 // ledger time, ms
	ref    Ref
	owner  Owner
	req    *ReserveRequest
	ttl    int64 // lease ttl ms (Reserve, Extend); window ms (Adjust)
	actual Amounts
	grow   Amounts // Grow: the hold it grows to (actual: the hold it grows from)
	src    Source
	max    int64 // Reclaim max; Adjust delta; Open retention ms
	scope  ScopeKey
	dim    Dim
	raw    []byte // snapshot payload
	v1     bool   // decoded from a format 1 entry (snapshot payloads: no nonce)
	dims   int    // dimensions of the entry's Amounts (decode only)
	lazy   bool   // set by an operation whose entry need not be fsynced before it returns
}

func (e *entry) encode(b []byte) []byte {
	start := len(b)
	b = append(b, 0, 0, 0, 0, 0, 0, 0, 0)
	b = append(b, e.op|opV2)
	b = binary.LittleEndian.AppendUint64(b, uint64(e.time))
	b = append(b, e.ref.Tenant[:]...)
	b = append(b, byte(NumDims))
	i64 := func(v int64) { b = binary.LittleEndian.AppendUint64(b, uint64(v)) }
	switch e.op {
	case opOpen, opReclaim, opRetention:
		i64(e.max)
	case opReserve, opCharge:
		r := e.req
		b = append(b, r.Ref.ID[:]...)
		b = append(b, r.Owner[:]...)
		i64(e.ttl)
		d := byte(0)
		if r.Dispatch {
			d = 1
		}
		if r.RequestDigest != 0 {
			d |= flagRequestDigest
		}
		b = append(b, d)
		b = binary.LittleEndian.AppendUint64(b, r.PolicyVersion)
		b = binary.LittleEndian.AppendUint64(b, r.Attempt)
		if r.RequestDigest != 0 {
			b = binary.LittleEndian.AppendUint64(b, r.RequestDigest)
		}
		for _, v := range r.Held {
			i64(v)
		}
		b = append(b, byte(len(r.Scopes)))
		for _, s := range r.Scopes {
			b = append(b, byte(s.Kind))
			b = append(b, s.Key[:]...)
			b = binary.LittleEndian.AppendUint16(b, uint16(len(s.Limits)))
			for _, l := range s.Limits {
				b = append(b, byte(l.Dim), byte(l.Mode))
				i64(l.Window.Milliseconds())
				i64(l.Max)
			}
		}
	case opMark, opRelease:
		b = append(b, e.ref.ID[:]...)
		b = append(b, e.owner[:]...)
	case opExtend:
		b = append(b, e.ref.ID[:]...)
		b = append(b, e.owner[:]...)
		i64(e.ttl)
	case opGrow:
		b = append(b, e.ref.ID[:]...)
		b = append(b, e.owner[:]...)
		for _, v := range e.actual {
			i64(v)
		}
		for _, v := range e.grow {
			i64(v)
		}
	case opSettle:
		b = append(b, e.ref.ID[:]...)
		for _, v := range e.actual {
			i64(v)
		}
		b = append(b, byte(e.src))
	case opResolve:
		b = append(b, e.ref.ID[:]...)
	case opAdjust:
		b = append(b, e.scope[:]...)
		b = append(b, byte(e.dim))
		i64(e.ttl)
		i64(e.max)
	case opSnapTenant, opSnapScope, opSnapRecord:
		b = append(b, e.raw...)
	}
	body := b[start+8:]
	binary.LittleEndian.PutUint32(b[start:], uint32(len(body)))
	binary.LittleEndian.PutUint32(b[start+4:], crc32.Checksum(body, castagnoli))
	return b
}

var errShort = errors.New("entry too short")

type reader struct {
	b    []byte
	err  error
	dims int // dimensions per Amounts in this entry
}

func (r *reader) take(n int) []byte {
	if r.err != nil || len(r.b) < n {
		r.err = errShort
		return make([]byte, n)
	}
	v := r.b[:n]
	r.b = r.b[n:]
	return v
}
func (r *reader) u8() uint8   { return r.take(1)[0] }
func (r *reader) i64() int64  { return int64(binary.LittleEndian.Uint64(r.take(8))) }
func (r *reader) u16() uint16 { return binary.LittleEndian.Uint16(r.take(2)) }
func (r *reader) id16(dst []byte) {
	copy(dst, r.take(16))
}

// amounts reads r.dims values into a; dimensions the entry predates stay 0.
func (r *reader) amounts(a *Amounts) {
	for d := range r.dims {
		a[d] = r.i64()
	}
}

func decodeEntry(body []byte) (entry, error) {
	r := &reader{b: body}
	var e entry
	e.op = r.u8()
	e.time = r.i64()
	r.id16(e.ref.Tenant[:])
	if e.op&opV2 != 0 {
		e.op &^= opV2
		r.dims = int(r.u8())
		if r.err == nil && (r.dims < legacyDims || r.dims > int(NumDims)) {
			return e, fmt.Errorf("entry with %d dimensions, this build knows %d", r.dims, NumDims)
		}
	} else {
		e.v1, r.dims = true, legacyDims
	}
	e.dims = r.dims
	switch e.op {
	case opOpen, opReclaim, opRetention:
		e.max = r.i64()
	case opReserve, opCharge:
		q := &ReserveRequest{}
		q.Ref.Tenant = e.ref.Tenant
		r.id16(q.Ref.ID[:])
		r.id16(q.Owner[:])
		e.ttl = r.i64()
		q.LeaseTTL = time.Duration(e.ttl) * time.Millisecond
		flags := r.u8()
		q.Dispatch = flags&1 != 0
		q.PolicyVersion = uint64(r.i64())
		if !e.v1 {
			q.Attempt = uint64(r.i64())
		}
		if flags&flagRequestDigest != 0 {
			q.RequestDigest = uint64(r.i64())
		}
		r.amounts(&q.Held)
		ns := int(r.u8())
		if ns > MaxScopes {
			return e, fmt.Errorf("reserve entry with %d scopes", ns)
		}
		q.Scopes = make([]Scope, ns)
		for i := range q.Scopes {
			s := &q.Scopes[i]
			s.Kind = Kind(r.u8())
			r.id16(s.Key[:])
			nl := int(r.u16())
			if nl > len(r.b) {
				return e, errShort
			}
			s.Limits = make([]Limit, nl)
			for j := range s.Limits {
				l := &s.Limits[j]
				l.Dim, l.Mode = Dim(r.u8()), Mode(r.u8())
				l.Window = time.Duration(r.i64()) * time.Millisecond
				l.Max = r.i64()
			}
		}
		e.ref.ID = q.Ref.ID
		e.req = q
	case opMark, opRelease:
		r.id16(e.ref.ID[:])
		r.id16(e.owner[:])
	case opExtend:
		r.id16(e.ref.ID[:])
		r.id16(e.owner[:])
		e.ttl = r.i64()
	case opGrow:
		r.id16(e.ref.ID[:])
		r.id16(e.owner[:])
		r.amounts(&e.actual)
		r.amounts(&e.grow)
	case opSettle:
		r.id16(e.ref.ID[:])
		r.amounts(&e.actual)
		e.src = Source(r.u8())
	case opResolve:
		r.id16(e.ref.ID[:])
	case opAdjust:
		r.id16(e.scope[:])
		e.dim = Dim(r.u8())
		e.ttl = r.i64()
		e.max = r.i64()
	case opSnapTenant, opSnapScope, opSnapRecord:
		e.raw = r.b
		r.b = nil
	default:
		return e, fmt.Errorf("unknown op %d", e.op)
	}
	if r.err != nil {
		return e, r.err
	}
	if len(r.b) != 0 {
		return e, fmt.Errorf("%d trailing bytes", len(r.b))
	}
	return e, nil
}

// journalFile is what the journal needs of its file once open; tests wrap
// it to count and block fsyncs.
type journalFile interface {
	Write(b []byte) (int, error)
	Sync() error
	Close() error
}

// defaultLazySync bounds how long an entry no call waits for stays written
// but not fsynced when Fsync.Interval is 0.
const defaultLazySync = 5 * time.Millisecond

// journal is the append-only log. Each append is written to the file at once,
// under the tenant's lock (so each tenant's entries are in apply order, and a
// process that dies loses nothing it acknowledged: the kernel holds what was
// written). Durability against the machine going down is group commit:
// waitDurable makes a caller wait for an fsync covering its entry. A caller
// that finds no fsync in flight starts one at once; callers that arrive while
// one is in flight wait for the next, which one of them starts and which
// covers them all. Entries no call waits for (see Memory.finishLazy) ride the
// next fsync, and one is started for them within lazyAfter when none comes.
type journal struct {
	f         journalFile
	lazyAfter time.Duration
	afterFunc func(time.Duration, func()) // time.AfterFunc; tests inject their own
	truncated int64                       // bytes of torn tail dropped at open
	path      string

	mu      sync.Mutex // guards the fields below
	cond    *sync.Cond
	buf     []byte // encoding scratch
	written uint64 // entries written to the file
	durable uint64 // entries covered by a finished fsync
	syncing bool   // an fsync (or a compaction) is in flight
	waiters int    // callers waiting in waitDurable
	wanted  uint64 // the highest seq a caller has waited for
	armed   bool   // a lazy-sync timer is pending
	kick    bool   // the timer fired during an fsync: start another after it
	err     error
	size    int64 // bytes in the file
}

// openJournal reads and validates path, truncates a torn tail and returns the
// decoded entries and the journal opened for appending.
func openJournal(path string, interval time.Duration) (*journal, []entry, error) {
	if interval <= 0 {
		interval = defaultLazySync
	}
	data, err := os.ReadFile(path)
	if err != nil && !errors.Is(err, os.ErrNotExist) {
		return nil, nil, fmt.Errorf("read journal %s: %w: %w", path, ErrUnavailable, err)
	}
	entries, good, err := parseJournal(data)
	if err != nil {
		return nil, nil, fmt.Errorf("journal %s: %w", path, err)
	}
	f, err := os.OpenFile(path, os.O_CREATE|os.O_RDWR, 0o600)
	if err != nil {
		return nil, nil, fmt.Errorf("open journal %s: %w: %w", path, ErrUnavailable, err)
	}
	j := &journal{f: f, lazyAfter: interval, afterFunc: afterFunc, truncated: int64(len(data) - good), path: path, size: int64(good)}
	j.cond = sync.NewCond(&j.mu)
	if j.truncated > 0 {
		if err := f.Truncate(int64(good)); err != nil {
			_ = f.Close()
			return nil, nil, fmt.Errorf("truncate torn tail of %s: %w: %w", path, ErrUnavailable, err)
		}
		if err := f.Sync(); err != nil {
			_ = f.Close()
			return nil, nil, fmt.Errorf("sync %s: %w: %w", path, ErrUnavailable, err)
		}
	}
	if _, err := f.Seek(int64(good), io.SeekStart); err != nil {
		_ = f.Close()
		return nil, nil, fmt.Errorf("seek %s: %w: %w", path, ErrUnavailable, err)
	}
	return j, entries, nil
}

// parseJournal returns the entries and the length of the valid prefix. A
// torn last entry ends the prefix; a bad entry followed by more data is
// ErrCorrupt.
func parseJournal(data []byte) ([]entry, int, error) {
	var out []entry
	off := 0
	for off < len(data) {
		rest := data[off:]
		if len(rest) < 8 {
			return out, off, nil // torn header
		}
		n := int(binary.LittleEndian.Uint32(rest))
		if n == 0 || n > maxEntry {
			if allZero(rest) {
				return out, off, nil // preallocated or zero-filled tail
			}
			return nil, 0, fmt.Errorf("offset %d: entry length %d: %w", off, n, ErrCorrupt)
		}
		if 8+n > len(rest) {
			return out, off, nil // torn body
		}
		body := rest[8 : 8+n]
		if crc32.Checksum(body, castagnoli) != binary.LittleEndian.Uint32(rest[4:]) {
			if 8+n == len(rest) {
				return out, off, nil // torn last entry
			}
			return nil, 0, fmt.Errorf("offset %d: checksum mismatch: %w", off, ErrCorrupt)
		}
		e, err := decodeEntry(body)
		if err != nil {
			return nil, 0, fmt.Errorf("offset %d: %w: %w", off, ErrCorrupt, err)
		}
		out = append(out, e)
		off += 8 + n
	}
	return out, off, nil
}

func allZero(b []byte) bool { return len(bytes.TrimLeft(b, "\x00")) == 0 }

func afterFunc(d time.Duration, f func()) { time.AfterFunc(d, f) }

// append writes e to the file and returns its sequence number. A failed
// write fails the journal: that call and every later one get the error.
func (j *journal) append(e *entry) uint64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.buf = e.encode(j.buf[:0])
	j.written++
	if j.err == nil {
		if _, err := j.f.Write(j.buf); err != nil {
			j.err = fmt.Errorf("journal write: %w", err)
		} else {
			j.size += int64(len(j.buf))
		}
	}
	return j.written
}

// waitDurable returns once an fsync has covered entry seq, or the journal's
// error.
func (j *journal) waitDurable(seq uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.durable < seq {
		if j.err != nil {
			return j.err
		}
		j.wanted = max(j.wanted, seq)
		if j.syncing {
			j.waiters++
			j.cond.Wait()
			j.waiters--
			continue
		}
		j.syncLocked()
	}
	return nil
}

// lazy reports whether entry seq reached the file, and makes sure an fsync
// will cover it: the next one any caller starts, or the lazy timer's.
func (j *journal) lazy(seq uint64) error {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.durable >= seq {
		return nil
	}
	if j.err != nil {
		return j.err
	}
	if !j.syncing {
		j.armLocked()
	} // else the fsync in flight arms it when it ends (afterSyncLocked)
	return nil
}

// syncLocked fsyncs everything written so far; j.mu is held on entry and on
// return, and released during the fsync.
func (j *journal) syncLocked() {
	j.syncing = true
	target, f := j.written, j.f
	j.mu.Unlock()
	err := f.Sync()
	j.mu.Lock()
	j.syncing = false
	if err != nil {
		if j.err == nil {
			j.err = fmt.Errorf("journal fsync: %w", err)
		}
	} else if target > j.durable {
		j.durable = target
	}
	j.cond.Broadcast()
	j.afterSyncLocked()
}

// afterSyncLocked leaves what an fsync did not cover to the next one: a
// waiter woken by the broadcast starts it, or the lazy timer does.
func (j *journal) afterSyncLocked() {
	if j.err != nil || j.written <= j.durable {
		j.kick = false
		return
	}
	if j.wanted > j.durable {
		return // a caller still waiting starts the next fsync, covering all written
	}
	if j.kick {
		j.kick = false
		go j.flush()
		return
	}
	j.armLocked()
}

func (j *journal) armLocked() {
	if j.armed {
		return
	}
	j.armed = true
	j.afterFunc(j.lazyAfter, j.fire)
}

// fire is the lazy timer: it fsyncs what no caller waited for.
func (j *journal) fire() {
	j.mu.Lock()
	defer j.mu.Unlock()
	j.armed = false
	if j.err != nil || j.written <= j.durable {
		return
	}
	if j.syncing {
		j.kick = true
		return
	}
	j.syncLocked()
}

// flush starts an fsync unless one is in flight (whose end arms the timer
// for anything it leaves).
func (j *journal) flush() {
	j.mu.Lock()
	defer j.mu.Unlock()
	if j.err == nil && j.written > j.durable && !j.syncing {
		j.syncLocked()
	}
}

func (j *journal) close() error {
	j.mu.Lock()
	defer j.mu.Unlock()
	for j.syncing {
		j.cond.Wait()
	}
	var err error
	if j.written > j.durable && j.err == nil {
		if err = j.f.Sync(); err == nil {
			j.durable = j.written
		}
	}
	if j.err == nil {
		j.err = errors.New("journal closed")
	}
	return errors.Join(err, j.f.Close())
}

// apply re-executes one journal entry during replay.
func (m *Memory) apply(e *entry) error {
	switch e.op {
	case opOpen:
		return m.applyOpen(e)
	case opRetention:
		m.retention = e.max
		return nil
	case opSnapTenant, opSnapScope, opSnapRecord:
		return m.applySnapshot(e)
	}
	t := m.tenant(e.ref.Tenant, true)
	t.mu.Lock()
	defer t.mu.Unlock()
	e.time = t.now(e.time)
	var err error
	switch e.op {
	case opReserve:
		if err = e.req.Validate(0); err == nil {
			_, _, err = m.reserveLocked(t, e)
		}
	case opCharge:
		var ev UsageEvent
		_, _, err = m.chargeLocked(t, e, &ev)
	case opMark:
		_, err = m.markLocked(t, e)
	case opExtend:
		_, _, err = m.extendLocked(t, e)
	case opGrow:
		_, err = m.growLocked(t, e)
	case opSettle:
		var ev UsageEvent
		_, _, _, err = m.settleLocked(t, e, &ev)
	case opRelease:
		_, err = m.releaseLocked(t, e)
	case opReclaim:
		var evs []UsageEvent
		_, _, err = m.reclaimLocked(t, e, &evs)
	case opResolve:
		var ev UsageEvent
		_, _, err = m.resolveLocked(t, e, &ev)
	case opAdjust:
		_, err = m.adjustLocked(t, e)
	default:
		err = fmt.Errorf("unknown op %d", e.op)
	}
	return err
}

// applyOpen is the start-up transition: it sets the tombstone retention and
// turns every RESERVED record EXPIRED and every DISPATCHED one UNRESOLVED, in
// request-id order so replay is deterministic.
func (m *Memory) applyOpen(e *entry) error {
	m.retention = e.max
	m.mu.RLock()
	ts := make([]*tenantState, 0, len(m.tenants))
	for _, t := range m.tenants {
		ts = append(ts, t)
	}
	m.mu.RUnlock()
	for _, t := range ts {
		if err := m.openTenant(t, e.time); err != nil {
			return err
		}
	}
	return nil
}

func (m *Memory) openTenant(t *tenantState, clock int64) error {
	t.mu.Lock()
	defer t.mu.Unlock()
	if len(t.leases) == 0 {
		return nil
	}
	now := t.now(clock)
	open := slices.Clone(t.leases)
	slices.SortFunc(open, func(a, b *record) int { return bytes.Compare(a.id[:], b.id[:]) })
	for _, rec := range open {
		if err := m.reclaimCheck(t, rec); err != nil {
			return fmt.Errorf("tenant %s: %w: %w", t.key, ErrCorrupt, err)
		}
	}
	t.seq++
	t.hwm = now
	for _, rec := range open {
		t.unlink(rec)
		if rec.state == Reserved {
			t.releaseHold(rec)
			rec.state = Expired
			t.entomb(rec, now, m.retention)
			continue
		}
		t.freeSlot(rec)
		rec.state = Unresolved
		heap.Push(&t.unres, rec)
	}
	return nil
}
