package ledger

import "errors"

// CorruptForTest damages stored state for T11: 1 makes the scope's reserved
// tokens negative, 2 puts the record in an unknown state, 3 removes the
// record while its lease entry stays.
func (m *Memory) CorruptForTest(kind int, ref Ref, scope ScopeKey) error {
	t := m.tenant(ref.Tenant, false)
	if t == nil {
		return errors.New("unknown tenant")
	}
	t.mu.Lock()
	defer t.mu.Unlock()
	switch kind {
	case 1:
		s := t.scopes[scope]
		if s == nil {
			return errors.New("unknown scope")
		}
		s.r[Tokens] = -5
	case 2:
		rec := t.records[ref.ID]
		if rec == nil {
			return errors.New("unknown record")
		}
		rec.state = 99
	case 3:
		if t.records[ref.ID] == nil {
			return errors.New("unknown record")
		}
		delete(t.records, ref.ID)
	default:
		return errors.New("unknown corruption")
	}
	return nil
}

// BreakJournalForTest closes the journal's file underneath the ledger, so the
// next write fails.
func (m *Memory) BreakJournalForTest() { _ = m.jnl.f.Close() }
