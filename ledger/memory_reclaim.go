package ledger

import (
	"container/heap"
	"context"
	"errors"
	"fmt"
)

// Reclaim implements [Ledger.Reclaim]: at most max transitions (max ≤ 0
// means 1024) of due leases (RESERVED → EXPIRED, DISPATCHED → UNRESOLVED),
// UNRESOLVED records whose first admission window has closed (→ CHARGED),
// and tombstones past TombstoneRetention. It never acts early.
func (m *Memory) Reclaim(ctx context.Context, tenant ScopeKey, limit int) (ReclaimStats, error) {
	if err := m.ready(ctx); err != nil {
		return ReclaimStats{}, err
	}
	if limit <= 0 {
		limit = 1024
	}
	t := m.tenant(tenant, false)
	if t == nil {
		return ReclaimStats{}, nil
	}
	t.mu.Lock()
	var gl *globalState
	if t.hasGlobal {
		gl = &m.glob
		gl.mu.Lock()
	}
	e := entry{op: opReclaim, ref: Ref{Tenant: tenant}, max: int64(limit), time: m.nowLocked(t, gl)}
	var evs []UsageEvent
	st, seq, err := m.reclaimLocked(t, &e, &evs)
	m.unlockGlobal(gl, e.time)
	t.mu.Unlock()
	if err != nil {
		return ReclaimStats{}, err
	}
	if err := m.finish(seq); err != nil {
		return ReclaimStats{}, err
	}
	if m.cfg.OnUsage != nil {
		for i := range evs {
			m.cfg.OnUsage(evs[i])
		}
	}
	return st, nil
}

func (m *Memory) reclaimLocked(t *tenantState, e *entry, evs *[]UsageEvent) (ReclaimStats, uint64, error) {
	now, limit := e.time, int(e.max)
	if (len(t.leases) == 0 || t.leases[0].leaseExp > now) && (len(t.unres) == 0 || t.unres[0].resolveAt > now) &&
		(t.thead >= len(t.tombs) || t.tombs[t.thead].purgeAt > now) {
		return ReclaimStats{}, 0, nil // nothing due: O(1)
	}
	// Validate everything this call would touch before the first write (I7).
	due := 0
	for _, rec := range t.leases {
		if rec.leaseExp <= now {
			due++
			if err := m.reclaimCheck(t, rec); err != nil {
				return ReclaimStats{}, 0, m.corrupt(t, Ref{Tenant: t.key, ID: rec.id}, err)
			}
		}
	}
	for _, rec := range t.unres {
		if rec.resolveAt <= now {
			due++
			if err := m.reclaimCheck(t, rec); err != nil {
				return ReclaimStats{}, 0, m.corrupt(t, Ref{Tenant: t.key, ID: rec.id}, err)
			}
		}
	}
	if t.thead < len(t.tombs) && t.tombs[t.thead].purgeAt <= now {
		due++
	}
	if due == 0 {
		return ReclaimStats{}, 0, nil
	}
	seq := m.journal(e)
	t.seq++
	t.hwm = now
	var st ReclaimStats
	retention := m.retention
	for len(t.leases) > 0 && t.leases[0].leaseExp <= now {
		if st.Expired+st.Unresolved >= limit {
			st.More = true
			break
		}
		rec := heap.Pop(&t.leases).(*record)
		if rec.state == Reserved {
			t.releaseHold(rec)
			rec.state = Expired
			t.entomb(rec, now, retention)
			st.Expired++
			continue
		}
		t.freeSlot(rec)
		rec.state = Unresolved
		heap.Push(&t.unres, rec)
		st.Unresolved++
	}
	for len(t.unres) > 0 && t.unres[0].resolveAt <= now {
		if st.Expired+st.Unresolved+st.Charged >= limit {
			st.More = true
			break
		}
		var ev UsageEvent
		m.chargeHeld(t, t.unres[0], now, &ev)
		if !m.replaying {
			*evs = append(*evs, ev)
		}
		st.Charged++
	}
	if left := limit - st.Expired - st.Unresolved - st.Charged; left > 0 {
		st.Purged = m.purge(t, now, left)
	}
	if t.thead < len(t.tombs) && t.tombs[t.thead].purgeAt <= now {
		st.More = true
	}
	return st, seq, nil
}

func (m *Memory) reclaimCheck(t *tenantState, rec *record) error {
	if t.records[rec.id] != rec {
		return errors.New("lease entry without record")
	}
	if err := checkRecord(rec); err != nil {
		return err
	}
	switch rec.state {
	case Reserved:
		return checkRelease(rec, false)
	case Dispatched:
		return checkRelease(rec, true)
	case Unresolved:
		return m.chargeHeldCheck(t, rec)
	}
	return fmt.Errorf("record in state %s on a heap", rec.state)
}
