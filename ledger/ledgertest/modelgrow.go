package ledgertest

import (
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// grow is the model's Grow (ledger.Ledger.Grow): a compare-and-set of an
// open record's hold, admitted like a Reserve of the difference against
// every block limit of the record's scopes.
func (m *model) grow(id ledger.RequestID, owner ledger.Owner, from, to ledger.Amounts) error {
	if err := ledger.ValidateGrow(&from, &to); err != nil {
		return ledger.ErrInvalid
	}
	rec := m.recs[id]
	if rec == nil {
		return ledger.ErrNotFound
	}
	switch rec.state {
	case ledger.Reserved, ledger.Dispatched:
		if rec.owner != owner {
			return ledger.ErrLeaseLost
		}
	case ledger.Expired, ledger.Unresolved:
		return ledger.ErrLeaseLost
	default:
		return ledger.ErrAlreadyFinal
	}
	same := func(a, b ledger.Amounts) bool {
		for d := range ledger.NumDims {
			if d.Windowed() && a[d] != b[d] {
				return false
			}
		}
		return true
	}
	if same(rec.held, to) {
		return nil
	}
	if !same(rec.held, from) {
		return ledger.ErrConflict
	}
	var add ledger.Amounts
	for d := range ledger.NumDims {
		if d.Windowed() {
			add[d] = to[d] - from[d]
		}
	}
	var denied *ledger.DeniedError
	for _, i := range rec.scopes {
		s := m.scopes[i]
		for _, l := range s.limits {
			if l.Mode != ledger.Block || l.Dim == ledger.Slots || add[l.Dim] == 0 {
				continue
			}
			c, r := s.cur(l.Dim, l.Window, m.now), s.r[l.Dim]
			if c+r+add[l.Dim] <= l.Max {
				continue
			}
			resets := ledger.WindowResetsAt(floorDiv(m.now, l.Window.Milliseconds()), l.Window)
			if denied == nil || resets.After(denied.ResetsAt) {
				denied = &ledger.DeniedError{Scope: s.ref.Kind, Dim: l.Dim, Window: l.Window, Limit: l.Max, Committed: c,
					Reserved: r, Requested: add[l.Dim], ResetsAt: resets, RetryAfter: resets.Sub(time.UnixMilli(m.now))}
			}
		}
	}
	if denied != nil {
		return denied
	}
	for _, i := range rec.scopes {
		for d := range ledger.NumDims {
			if d.Windowed() {
				m.scopes[i].r[d] += add[d]
			}
		}
	}
	for d := range ledger.NumDims {
		if d.Windowed() {
			rec.held[d] = to[d]
		}
	}
	return nil
}
