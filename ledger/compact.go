package ledger

import (
	"bytes"
	"context"
	"encoding/binary"
	"errors"
	"fmt"
	"os"
	"path/filepath"
	"slices"
	"time"

	"github.com/prometheus/client_golang/prometheus"
)

// Compaction. At every start, after replay and the restart transition, the
// journal is rewritten as one opOpen entry followed by a snapshot of the
// whole state (one entry per tenant, per scope and per record, heaps and the
// tombstone FIFO in their exact order, so later replays stay deterministic),
// written to a temporary file, fsynced and renamed over the journal. A crash
// before the rename leaves the old journal, which replays to the same state.

// sortedTenants returns every tenant in key order.
func (m *Memory) sortedTenants() []*tenantState {
	m.mu.RLock()
	ts := make([]*tenantState, 0, len(m.tenants))
	for _, t := range m.tenants {
		ts = append(ts, t)
	}
	m.mu.RUnlock()
	slices.SortFunc(ts, func(a, b *tenantState) int { return bytes.Compare(a.key[:], b.key[:]) })
	return ts
}

// appendSnapshot encodes the state of every tenant in ts; with lock it takes
// each tenant's lock, otherwise the caller holds them all.
func (m *Memory) appendSnapshot(b []byte, ts []*tenantState, lock bool) []byte {
	var raw []byte
	i64 := func(v int64) { raw = binary.LittleEndian.AppendUint64(raw, uint64(v)) }
	appendScope := func(k ScopeKey, s *scopeState) {
		raw = append(raw[:0], k[:]...)
		raw = append(raw, byte(s.kind))
		for _, v := range s.r {
			i64(v)
		}
		i64(s.n)
		raw = binary.LittleEndian.AppendUint16(raw, uint16(len(s.limits)))
		for _, l := range s.limits {
			raw = append(raw, byte(l.Dim), byte(l.Mode))
			i64(l.Window.Milliseconds())
			i64(l.Max)
		}
		raw = binary.LittleEndian.AppendUint16(raw, uint16(len(s.counters)))
		for _, c := range s.counters {
			raw = append(raw, byte(c.dim))
			i64(c.wms)
			i64(c.idx)
			i64(c.c)
			i64(int64(c.since))
			i64(c.purged)
			i64(c.adjust)
		}
	}
	// The global partition first (records point at its scopes), as scope
	// entries of the zero tenant. Lock order: tenants (held by the caller
	// when lock is false), then global.
	m.glob.mu.Lock()
	gkeys := make([]ScopeKey, 0, len(m.glob.scopes))
	for k := range m.glob.scopes {
		gkeys = append(gkeys, k)
	}
	slices.SortFunc(gkeys, func(a, b ScopeKey) int { return bytes.Compare(a[:], b[:]) })
	for _, k := range gkeys {
		appendScope(k, m.glob.scopes[k])
		b = (&entry{op: opSnapScope, time: m.glob.hwm, raw: raw}).encode(b)
	}
	m.glob.mu.Unlock()
	for _, t := range ts {
		if lock {
			t.mu.Lock()
		}
		raw = raw[:0]
		i64(int64(t.seq))
		i64(int64(t.pv))
		b = (&entry{op: opSnapTenant, time: t.hwm, ref: Ref{Tenant: t.key}, raw: raw}).encode(b)
		keys := make([]ScopeKey, 0, len(t.scopes))
		for k := range t.scopes {
			keys = append(keys, k)
		}
		slices.SortFunc(keys, func(a, b ScopeKey) int { return bytes.Compare(a[:], b[:]) })
		for _, k := range keys {
			appendScope(k, t.scopes[k])
			b = (&entry{op: opSnapScope, time: t.hwm, ref: Ref{Tenant: t.key}, raw: raw}).encode(b)
		}
		lists := [3][]*record{t.leases, t.unres, t.tombs[t.thead:]}
		for list, recs := range lists {
			for _, rec := range recs {
				raw = append(raw[:0], byte(list))
				raw = append(raw, rec.id[:]...)
				raw = append(raw, byte(rec.state))
				raw = append(raw, rec.owner[:]...)
				i64(int64(rec.digest))
				i64(int64(rec.attempt))
				for _, v := range []int64{rec.leaseExp, rec.admitAt, rec.resolveAt, rec.purgeAt, int64(rec.chargedSeq), rec.chargedAt} {
					i64(v)
				}
				for _, a := range []*Amounts{&rec.held, &rec.actual, &rec.charged} {
					for _, v := range a {
						i64(v)
					}
				}
				late := byte(0)
				if rec.late {
					late = 1
				}
				raw = append(raw, byte(rec.source), late, byte(rec.nscopes))
				for i := 0; i < rec.nscopes; i++ {
					raw = append(raw, rec.refs[i].Key[:]...)
					raw = append(raw, byte(rec.refs[i].Kind))
					i64(rec.slotMax[i])
					warn := byte(0)
					if rec.slotWarn[i] {
						warn = 1
					}
					raw = append(raw, warn)
				}
				b = (&entry{op: opSnapRecord, time: t.hwm, ref: Ref{Tenant: t.key}, raw: raw}).encode(b)
			}
		}
		if lock {
			t.mu.Unlock()
		}
	}
	return b
}

// applySnapshot restores one snapshot entry during replay.
func (m *Memory) applySnapshot(e *entry) error {
	r := &reader{b: e.raw, dims: e.dims}
	if e.op == opSnapScope && e.ref.Tenant.IsZero() {
		return m.applyGlobalScope(e, r)
	}
	t := m.tenant(e.ref.Tenant, true)
	t.mu.Lock()
	defer t.mu.Unlock()
	switch e.op {
	case opSnapTenant:
		t.hwm = max(t.hwm, e.time)
		t.seq = uint64(r.i64())
		t.pv = uint64(r.i64())
	case opSnapScope:
		k, s, err := readScope(r)
		if err != nil {
			return err
		}
		if t.scopes[k] != nil {
			return errors.New("scope restored twice")
		}
		t.scopes[k] = s
	case opSnapRecord:
		list := r.u8()
		rec := &record{heapIdx: -1}
		r.id16(rec.id[:])
		rec.state = State(r.u8())
		r.id16(rec.owner[:])
		rec.digest = uint64(r.i64())
		if !e.v1 {
			rec.attempt = uint64(r.i64())
		}
		rec.leaseExp, rec.admitAt, rec.resolveAt, rec.purgeAt = r.i64(), r.i64(), r.i64(), r.i64()
		rec.chargedSeq = uint64(r.i64())
		rec.chargedAt = r.i64()
		for _, a := range []*Amounts{&rec.held, &rec.actual, &rec.charged} {
			r.amounts(a)
		}
		rec.source, rec.late, rec.nscopes = Source(r.u8()), r.u8() == 1, int(r.u8())
		if rec.nscopes > MaxScopes {
			return fmt.Errorf("record with %d scopes", rec.nscopes)
		}
		for i := 0; i < rec.nscopes; i++ {
			r.id16(rec.refs[i].Key[:])
			rec.refs[i].Kind = Kind(r.u8())
			rec.slotMax[i] = r.i64()
			rec.slotWarn[i] = r.u8() == 1
			if rec.refs[i].Kind == KindGlobal {
				rec.global, t.hasGlobal = true, true
				rec.scopes[i] = m.glob.scopes[rec.refs[i].Key]
			} else {
				rec.scopes[i] = t.scopes[rec.refs[i].Key]
			}
			if rec.scopes[i] == nil && r.err == nil {
				return errors.New("record names a scope that was not restored")
			}
		}
		if r.err != nil {
			return r.err
		}
		if t.records[rec.id] != nil {
			return errors.New("record restored twice")
		}
		switch list {
		case 0:
			rec.heapIdx = len(t.leases)
			t.leases = append(t.leases, rec)
		case 1:
			rec.heapIdx = len(t.unres)
			t.unres = append(t.unres, rec)
		case 2:
			t.tombs = append(t.tombs, rec)
		default:
			return fmt.Errorf("record list %d", list)
		}
		t.records[rec.id] = rec
	}
	if r.err != nil {
		return r.err
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%d trailing bytes in snapshot entry", len(r.b))
	}
	return nil
}

// readScope decodes one snapshot scope entry.
func readScope(r *reader) (ScopeKey, *scopeState, error) {
	var k ScopeKey
	r.id16(k[:])
	s := &scopeState{kind: Kind(r.u8())}
	r.amounts(&s.r)
	s.n = r.i64()
	nl := int(r.u16())
	if nl > len(r.b) {
		return k, nil, errShort
	}
	for range nl {
		l := Limit{Dim: Dim(r.u8()), Mode: Mode(r.u8())}
		l.Window = msDuration(r.i64())
		l.Max = r.i64()
		s.limits = append(s.limits, l)
	}
	nc := int(r.u16())
	if nc > len(r.b) {
		return k, nil, errShort
	}
	for range nc {
		c := counter{dim: Dim(r.u8())}
		c.wms, c.idx, c.c = r.i64(), r.i64(), r.i64()
		c.since = uint64(r.i64())
		c.purged, c.adjust = r.i64(), r.i64()
		if c.wms <= 0 {
			return k, nil, fmt.Errorf("counter window %d ms", c.wms)
		}
		s.counters = append(s.counters, c)
	}
	return k, s, r.err
}

// applyGlobalScope restores one scope of the global partition.
func (m *Memory) applyGlobalScope(e *entry, r *reader) error {
	k, s, err := readScope(r)
	if err != nil {
		return err
	}
	if s.kind != KindGlobal {
		return errors.New("non-global scope in the global partition")
	}
	if len(r.b) != 0 {
		return fmt.Errorf("%d trailing bytes in snapshot entry", len(r.b))
	}
	m.glob.mu.Lock()
	defer m.glob.mu.Unlock()
	if m.glob.scopes[k] != nil {
		return errors.New("global scope restored twice")
	}
	m.glob.scopes[k] = s
	m.glob.hwm = max(m.glob.hwm, e.time)
	return nil
}

// compact rewrites the journal at start-up as open + a snapshot of the
// current state and returns the journal reopened for appending.
func (m *Memory) compact(old *journal, path string, open *entry) (*journal, error) {
	b := open.encode(nil)
	b = m.appendSnapshot(b, m.sortedTenants(), true)
	if err := replaceFile(path, b); err != nil {
		_ = old.close()
		return nil, err
	}
	if err := old.close(); err != nil {
		return nil, err
	}
	j, _, err := openJournal(path, old.lazyAfter)
	if err == nil {
		j.f = m.wrapJournalFile(j.f)
		if m.cfg.afterFunc != nil {
			j.afterFunc = m.cfg.afterFunc
		}
	}
	return j, err
}

// replaceFile atomically replaces path with data (temporary file, fsync,
// rename, directory fsync).
func replaceFile(path string, data []byte) error {
	tmp := path + ".compact"
	f, err := os.OpenFile(tmp, os.O_CREATE|os.O_TRUNC|os.O_WRONLY, 0o600)
	if err != nil {
		return err
	}
	if _, err = f.Write(data); err == nil {
		err = f.Sync()
	}
	if cerr := f.Close(); err == nil {
		err = cerr
	}
	if err == nil {
		err = os.Rename(tmp, path)
	}
	if err != nil {
		_ = os.Remove(tmp)
		return err
	}
	if d, err := os.Open(filepath.Dir(path)); err == nil {
		_ = d.Sync()
		_ = d.Close()
	}
	return nil
}

// Compact rewrites the journal as a snapshot of the current state while the
// ledger runs. It stops every tenant for the duration (one sequential write
// and fsync of the state), and Run calls it once the journal passes
// MemoryConfig.CompactBytes. A failure fails the ledger closed (every later
// call ErrUnavailable) because pending entries may be lost. Safe for
// concurrent use; a no-op without a journal.
func (m *Memory) Compact(ctx context.Context) error {
	if m.jnl == nil {
		return nil
	}
	if err := m.ready(ctx); err != nil {
		return err
	}
	m.mu.Lock() // no new tenants while every tenant is stopped
	defer m.mu.Unlock()
	ts := make([]*tenantState, 0, len(m.tenants))
	for _, t := range m.tenants {
		ts = append(ts, t)
	}
	slices.SortFunc(ts, func(a, b *tenantState) int { return bytes.Compare(a.key[:], b.key[:]) })
	for _, t := range ts {
		t.mu.Lock()
	}
	defer func() {
		for _, t := range ts {
			t.mu.Unlock()
		}
	}()
	// Every applied entry is now in the state; take the journal from any
	// in-progress fsync. The snapshot covers every entry written, synced or not.
	j := m.jnl
	j.mu.Lock()
	for j.syncing {
		j.cond.Wait()
	}
	if j.err != nil {
		err := j.err
		j.mu.Unlock()
		return fmt.Errorf("compact: %w: %w", ErrUnavailable, err)
	}
	j.syncing = true
	target := j.written
	j.mu.Unlock()

	b := (&entry{op: opRetention, time: m.clock().UnixMilli(), max: m.retention}).encode(nil)
	b = m.appendSnapshot(b, ts, false)
	err := replaceFile(j.path, b)
	var f journalFile
	if err == nil {
		var of *os.File
		if of, err = os.OpenFile(j.path, os.O_WRONLY|os.O_APPEND, 0o600); err == nil {
			f = m.wrapJournalFile(of)
		}
	}
	j.mu.Lock()
	defer j.mu.Unlock()
	j.syncing = false
	j.cond.Broadcast()
	if err != nil {
		jerr := fmt.Errorf("journal compaction: %w", err)
		j.err = jerr
		m.failed.CompareAndSwap(nil, &jerr)
		return fmt.Errorf("compact %s: %w: %w", j.path, ErrUnavailable, err)
	}
	_ = j.f.Close()
	j.f = f
	j.durable = target
	j.size = int64(len(b))
	return nil
}

// wrapJournalFile applies MemoryConfig's test hook, if any.
func (m *Memory) wrapJournalFile(f journalFile) journalFile {
	if m.cfg.wrapFile != nil {
		f = m.cfg.wrapFile(f)
	}
	return timedFile{journalFile: f, fsync: m.met.fsync}
}

// timedFile observes each fsync's duration: a call that must be durable,
// a dispatch among them, waits for one, so a slow disk shows there first.
type timedFile struct {
	journalFile
	fsync prometheus.Observer
}

func (f timedFile) Sync() error {
	t := time.Now()
	err := f.journalFile.Sync()
	f.fsync.Observe(time.Since(t).Seconds())
	return err
}

func (j *journal) sizeNow() int64 {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.size
}

func msDuration(v int64) time.Duration { return time.Duration(v) * time.Millisecond }
