package redisledger

import (
	"context"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// Snapshot reads one scope's counters in the current windows (read-only).
func (l *Ledger) Snapshot(ctx context.Context, tenant, scope ledger.ScopeKey) (ledger.Usage, error) {
	if tenant.IsZero() || scope.IsZero() {
		return ledger.Usage{}, fmt.Errorf("zero tenant or scope: %w", ledger.ErrInvalid)
	}
	base := l.tenantBase(tenant)
	r, err := l.run(ctx, l.s.snapshot, true, []string{base + "m", base + "U", base + "s:" + scope.String()})
	if err != nil {
		return ledger.Usage{}, err
	}
	if r.status() != "OK" || len(r) < 5 {
		return ledger.Usage{}, l.corrupt("snapshot reply")
	}
	now, ok1 := r.int(1)
	pv, ok2 := r.int(2)
	nU, ok3 := r.int(3)
	flat, ok4 := r[4].([]any)
	if !ok1 || !ok2 || !ok3 || !ok4 || len(flat)%2 != 0 {
		return ledger.Usage{}, l.corrupt("snapshot reply")
	}
	u, err := l.usageOf(now, pv, flat)
	if err == nil && scope == tenant {
		u.Unresolved = int(nU)
	}
	return u, err
}

// Orphans returns how many Settles found no record (never reserved, or its
// tombstone aged out) since this Ledger was created.
func (l *Ledger) Orphans() int64 { return l.orphans.Load() }

func (l *Ledger) usageOf(now, pv int64, flat []any) (ledger.Usage, error) {
	u := ledger.Usage{Now: time.UnixMilli(now).UTC(), PolicyVersion: uint64(pv)}
	fields := make(map[string]int64, len(flat)/2)
	var lim string
	for i := 0; i < len(flat); i += 2 {
		k, _ := flat[i].(string)
		v, _ := flat[i+1].(string)
		if k == "lim" {
			lim = v
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > ledger.MaxCounter {
			return ledger.Usage{}, l.corrupt("scope field " + k)
		}
		fields[k] = n
	}
	for d := range ledger.NumDims {
		u.Reserved[d] = fields["r:"+strconv.Itoa(int(d))]
	}
	u.SlotsInUse = fields["n"]
	if lim == "" {
		return u, nil
	}
	sc, ok := parseSpec(lim)
	if !ok || len(sc) != 1 {
		return ledger.Usage{}, l.corrupt("scope limits")
	}
	u.Scope = sc[0].kind
	for _, lm := range sc[0].limits {
		lu := ledger.LimitUsage{Limit: lm}
		if lm.Dim == ledger.Slots || lm.Window == 0 {
			lu.Reserved = u.SlotsInUse
		} else {
			dw := strconv.Itoa(int(lm.Dim)) + ":" + strconv.FormatInt(int64(lm.Window/time.Second), 10)
			idx := ledger.WindowIndex(u.Now, lm.Window)
			if fields["w:"+dw] == idx {
				lu.Committed = fields["c:"+dw]
			}
			lu.Reserved = u.Reserved[lm.Dim]
			lu.ResetsAt = ledger.WindowResetsAt(idx, lm.Window)
		}
		lu.Remaining = max(lm.Max-lu.Committed-lu.Reserved, 0)
		u.Limits = append(u.Limits, lu)
	}
	return u, nil
}

// List returns up to max (≤ 0: ledger.DefaultListMax) open records of tenant
// in state, ordered like the ZSET that indexes them: RESERVED and DISPATCHED
// by lease expiry (L), UNRESOLVED by chargeable-at (U), ties by id. It never
// writes: ZRANGE pages of the index, each followed by one read-only script
// (FCALL_RO, or EVALSHA_RO without functions) that decodes the page's records (packed, or the older hash
// layout) and returns the fields List reports.
//
// # Design rationale
//
// One script could read the index and the records atomically, but only by
// building key names inside Lua, which the key rules forbid (every key in
// KEYS). The price of reading the index first is that the answer is not one
// atomic cut: a record that changes state between the ZRANGE and the read of
// its record is judged by the state read last (and skipped if it no longer
// matches), and an id whose record is gone (purged or damaged) is skipped.
// Reclaim, not List, reports corruption.
func (l *Ledger) List(ctx context.Context, tenant ledger.ScopeKey, state ledger.State, limit int) ([]ledger.ReservationInfo, error) {
	if tenant.IsZero() {
		return nil, fmt.Errorf("zero tenant: %w", ledger.ErrInvalid)
	}
	if !state.Open() {
		return nil, fmt.Errorf("list state %s: only reserved, dispatched or unresolved: %w", state, ledger.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ledger.ErrUnavailable, err)
	}
	if limit <= 0 {
		limit = ledger.DefaultListMax
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	defer cancel()
	base := l.tenantBase(tenant)
	index := base + "L"
	if state == ledger.Unresolved {
		index = base + "U"
	}
	const page = 256
	want := strconv.Itoa(int(state))
	var out []ledger.ReservationInfo
	for start := int64(0); len(out) < limit; start += page {
		ids, err := l.c.ZRange(ctx, index, start, start+page-1).Result()
		if err != nil {
			return nil, l.storeErr(err)
		}
		if len(ids) == 0 {
			break
		}
		keys := make([]string, len(ids))
		for i, id := range ids {
			keys[i] = base + "q:" + id
		}
		recs, err := l.run(ctx, l.s.records, true, keys)
		if err != nil {
			return nil, err
		}
		for i, x := range recs {
			v, _ := x.([]any)
			if len(v) < 5 || i >= len(ids) {
				continue
			}
			r := reply(v)
			if r.str(0) != want {
				continue
			}
			ref, ok := refOf(tenant, ids[i])
			owner, ok2 := parseOwner(r.str(1))
			le, ok3 := r.int(2)
			held, ok4 := parseAmountsCSV(r.str(3))
			at, ok5 := r.int(4)
			if !ok || !ok2 || !ok3 || !ok4 || !ok5 {
				return nil, l.corrupt("record of list entry " + ids[i])
			}
			held[ledger.Slots] = 0
			out = append(out, ledger.ReservationInfo{Ref: ref, State: state, Held: held,
				LeaseExpiry: time.UnixMilli(le).UTC(), AdmittedAt: time.UnixMilli(at).UTC(), Owner: owner})
			if len(out) == limit {
				break
			}
		}
		if len(ids) < page {
			break
		}
	}
	return out, nil
}
