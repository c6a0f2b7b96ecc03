package ledger

import (
	"context"
	"fmt"
	"time"
)

// Growing a hold (LEDGER.md §12). A request whose hold was sized on a
// prediction of its output, not its worst case, asks for more as it
// generates: Grow raises an open record's hold from one amount to a larger
// one, atomically against every block-mode limit of every scope the record
// holds in (tenant, api_key, workflow, global), exactly as a Reserve of the
// difference would be admitted. It is a compare-and-set on the hold, so a
// retried Grow (a lost reply) is answered as applied, never applied twice.

// ValidateGrow checks a Grow's amounts: both valid, and to ≥ from in every
// dimension (a hold never shrinks while its request runs).
func ValidateGrow(from, to *Amounts) error {
	if err := from.Validate(); err != nil {
		return err
	}
	if err := to.Validate(); err != nil {
		return err
	}
	for d := range NumDims {
		if d.Windowed() && to[d] < from[d] {
			return fmt.Errorf("grow %s from %d to %d: a hold only grows: %w", d, from[d], to[d], ErrInvalid)
		}
	}
	return nil
}

// sameHold compares two holds on the windowed dimensions.
func sameHold(a, b *Amounts) bool {
	for d := range NumDims {
		if d.Windowed() && a[d] != b[d] {
			return false
		}
	}
	return true
}

// Grow implements [Ledger.Grow] on the embedded ledger.
func (m *Memory) Grow(ctx context.Context, ref Ref, owner Owner, from, to Amounts) error {
	if err := m.ready(ctx); err != nil {
		return err
	}
	if err := ValidateGrow(&from, &to); err != nil {
		return err
	}
	from[Slots], to[Slots] = 0, 0
	t := m.lockTenant(ref)
	g := m.lockGlobal(t, ref.ID)
	e := entry{op: opGrow, ref: ref, owner: owner, actual: from, grow: to, time: m.nowLocked(t, g)}
	seq, err := m.growLocked(t, &e)
	m.unlockGlobal(g, e.time)
	t.mu.Unlock()
	if err != nil {
		return err
	}
	return m.finish(seq)
}

// growLocked applies a Grow: e.actual is the hold it grows from, e.grow
// the hold it grows to.
func (m *Memory) growLocked(t *tenantState, e *entry) (uint64, error) {
	rec := t.records[e.ref.ID]
	if rec == nil {
		return 0, fmt.Errorf("grow %s: %w", e.ref.ID, ErrNotFound)
	}
	if err := checkRecord(rec); err != nil {
		return 0, m.corrupt(t, e.ref, err)
	}
	switch rec.state {
	case Reserved, Dispatched:
		if rec.owner != e.owner {
			return 0, fmt.Errorf("grow %s: another owner: %w", e.ref.ID, ErrLeaseLost)
		}
	case Expired, Unresolved:
		return 0, fmt.Errorf("grow %s: state %s: %w", e.ref.ID, rec.state, ErrLeaseLost)
	default:
		return 0, fmt.Errorf("grow %s: state %s: %w", e.ref.ID, rec.state, ErrAlreadyFinal)
	}
	if sameHold(&rec.held, &e.grow) {
		return 0, nil // applied before: the caller's retry
	}
	if !sameHold(&rec.held, &e.actual) {
		return 0, fmt.Errorf("grow %s: the hold is not the one it grows from: %w", e.ref.ID, ErrConflict)
	}
	var add Amounts
	for d := range NumDims {
		if d.Windowed() {
			add[d] = e.grow[d] - rec.held[d]
		}
	}
	now := e.time
	var denied *DeniedError
	for i := 0; i < rec.nscopes; i++ {
		s := rec.scopes[i]
		for _, l := range s.limits {
			if l.Mode != Block || l.Dim == Slots || add[l.Dim] == 0 {
				continue
			}
			wms := l.Window.Milliseconds()
			c, r := s.committed(l.Dim, wms, now), s.r[l.Dim]
			if c+r+add[l.Dim] <= l.Max {
				continue
			}
			resets := WindowResetsAt(floorDiv(now, wms), l.Window)
			if denied == nil || resets.After(denied.ResetsAt) {
				denied = &DeniedError{Scope: rec.refs[i].Kind, Dim: l.Dim, Window: l.Window, Limit: l.Max, Committed: c,
					Reserved: r, Requested: add[l.Dim], ResetsAt: resets, RetryAfter: resets.Sub(time.UnixMilli(now))}
			}
		}
		for d := range NumDims {
			if d.Windowed() && s.r[d]+add[d] > MaxCounter {
				return 0, m.corrupt(t, e.ref, fmt.Errorf("reserved %s would pass 2^53-1", d))
			}
		}
	}
	if denied != nil {
		return 0, denied
	}
	seq := m.journal(e)
	t.seq++
	t.hwm = now
	for i := 0; i < rec.nscopes; i++ {
		s := rec.scopes[i]
		for d := range NumDims {
			if d.Windowed() {
				s.r[d] += add[d]
			}
		}
	}
	for d := range NumDims {
		if d.Windowed() {
			rec.held[d] = e.grow[d]
		}
	}
	m.purge(t, now, inlinePurge)
	return seq, nil
}
