package ledgertest

import (
	"fmt"
	"math/rand/v2"
	"os"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// T16: a seeded random state machine over Reserve, MarkDispatched, Extend, Grow,
// Settle, Release, Advance, Reclaim, Resolve, CrashOwner and Restart, checked
// step by step against a plain-map reference model. Every sequence uses a
// fresh tenant. A failure prints its seed; LEDGERTEST_SEED=<seed> replays
// exactly that sequence, LEDGERTEST_SEQUENCES=<n> overrides the count.

func testModel(t *testing.T, f Factory) {
	b := f(t, DefaultConfig())
	n := b.ModelSequences
	if n == 0 {
		n = 10000
	}
	runModel(t, b, n, false)
}

func testModelRestart(t *testing.T, f Factory) {
	cfg := DefaultConfig()
	cfg.Durable = true
	b := f(t, cfg)
	if b.Restart == nil {
		t.Skip("backend does not support Restart")
	}
	n := b.ModelSequences / 50
	if n < 200 {
		n = 200
	}
	runModel(t, b, n, true)
}

func runModel(t *testing.T, b *Backend, n int, restarts bool) {
	first, last := uint64(1), uint64(n)
	if s := os.Getenv("LEDGERTEST_SEQUENCES"); s != "" {
		v, err := strconv.Atoi(s)
		if err != nil || v <= 0 {
			t.Fatalf("LEDGERTEST_SEQUENCES=%q: want a positive integer", s)
		}
		last = uint64(v)
	}
	if s := os.Getenv("LEDGERTEST_SEED"); s != "" {
		v, err := strconv.ParseUint(s, 10, 64)
		if err != nil {
			t.Fatalf("LEDGERTEST_SEED=%q: want an unsigned integer", s)
		}
		first, last = v, v
	}
	steps := 0
	for seed := first; seed <= last; seed++ {
		steps += runSequence(t, b, seed, restarts)
		if t.Failed() {
			t.Fatalf("sequence failed; replay with LEDGERTEST_SEED=%d", seed)
		}
	}
	t.Logf("%d sequences, %d steps", last-first+1, steps)
}

type mCounter struct{ idx, c int64 }

type mScope struct {
	ref     ledger.ScopeRef
	limits  []ledger.Limit
	slotMax int64 // -1: none
	r       ledger.Amounts
	n       int64
	c       map[ledger.Limit]*mCounter // keyed by {Dim, Window}
}

type mRec struct {
	state                        ledger.State
	owner                        ledger.Owner
	digest                       uint64
	leaseExp, admitAt, resolveAt int64
	held, actual, charged        ledger.Amounts
	late                         bool
	scopes                       []int
	req                          ledger.ReserveRequest
	attempt                      uint64
}

type model struct {
	now    int64
	tenant ledger.ScopeKey
	scopes []*mScope
	recs   map[ledger.RequestID]*mRec
	pv     uint64
	cfg    Config
}

func winKey(d ledger.Dim, w time.Duration) ledger.Limit { return ledger.Limit{Dim: d, Window: w} }

func (s *mScope) cur(d ledger.Dim, w time.Duration, now int64) int64 {
	c := s.c[winKey(d, w)]
	if c == nil || c.idx != floorDiv(now, w.Milliseconds()) {
		return 0
	}
	return c.c
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if a%b != 0 && (a < 0) != (b < 0) {
		q--
	}
	return q
}

func (m *model) scopeIdx(key ledger.ScopeKey) int {
	for i, s := range m.scopes {
		if s.ref.Key == key {
			return i
		}
	}
	return -1
}

func (m *model) charge(rec *mRec, a ledger.Amounts) {
	for _, i := range rec.scopes {
		s := m.scopes[i]
		for _, l := range s.limits {
			if l.Dim == ledger.Slots {
				continue
			}
			wms := l.Window.Milliseconds()
			cur := floorDiv(m.now, wms)
			if floorDiv(rec.admitAt, wms) != cur {
				continue
			}
			k := winKey(l.Dim, l.Window)
			c := s.c[k]
			if c == nil {
				c = &mCounter{idx: cur}
				s.c[k] = c
			}
			if c.idx < cur {
				*c = mCounter{idx: cur}
			}
			c.c += a[l.Dim]
		}
	}
	rec.charged = a
}

func (m *model) release(rec *mRec) {
	for _, i := range rec.scopes {
		for d := range ledger.NumDims {
			if !d.Windowed() {
				continue
			}
			m.scopes[i].r[d] -= rec.held[d]
		}
	}
}

func (m *model) freeSlot(rec *mRec, delta int64) {
	for _, i := range rec.scopes {
		if m.scopes[i].slotMax >= 0 {
			m.scopes[i].n += delta
		}
	}
}

func isOpen(s ledger.State) bool {
	return s == ledger.Reserved || s == ledger.Dispatched || s == ledger.Unresolved
}

func (m *model) headroom(req *ledger.ReserveRequest, g *ledger.Grant) {
	for _, sc := range req.Scopes {
		s := m.scopes[m.scopeIdx(sc.Key)]
		for _, l := range sc.Limits {
			var used int64
			var resets time.Time
			if l.Dim == ledger.Slots {
				used = s.n
			} else {
				used = s.cur(l.Dim, l.Window, m.now) + s.r[l.Dim]
				resets = ledger.WindowResetsAt(floorDiv(m.now, l.Window.Milliseconds()), l.Window)
			}
			if l.Mode == ledger.Warn {
				if used > l.Max {
					g.Warnings = append(g.Warnings, ledger.Warning{Scope: sc.Kind, Dim: l.Dim, Window: l.Window, Limit: l.Max, Used: used, ResetsAt: resets})
				}
				continue
			}
			rem := max(l.Max-used, 0)
			room := &g.Headroom[l.Dim]
			if !room.Tracked || rem < room.Remaining || (rem == room.Remaining && resets.After(room.ResetsAt)) {
				*room = ledger.Room{Tracked: true, Limit: l.Max, Remaining: rem, Window: l.Window, ResetsAt: resets}
			}
		}
	}
}

func (m *model) reserve(req ledger.ReserveRequest) (ledger.Grant, error) {
	ttl := req.LeaseTTL
	if ttl == 0 {
		ttl = m.cfg.LeaseTTL
	}
	if rec := m.recs[req.Ref.ID]; rec != nil {
		if !isOpen(rec.state) {
			return ledger.Grant{}, &ledger.FinalError{State: rec.state}
		}
		if rec.digest != req.Digest() {
			return ledger.Grant{}, ledger.ErrConflict
		}
		same := req.Attempt != 0 && rec.attempt == req.Attempt
		g := ledger.Grant{Ref: req.Ref, Owner: rec.owner, State: rec.state, LeaseExpiry: time.UnixMilli(rec.leaseExp), Replayed: !same}
		m.headroom(&req, &g)
		return g, nil
	}
	var denied, slotDenied *ledger.DeniedError
	for _, sc := range req.Scopes {
		s := m.scopes[m.scopeIdx(sc.Key)]
		for _, l := range sc.Limits {
			if l.Mode != ledger.Block {
				continue
			}
			if l.Dim == ledger.Slots {
				if req.Dispatch && s.n+1 > l.Max && slotDenied == nil {
					slotDenied = &ledger.DeniedError{Scope: sc.Kind, Dim: ledger.Slots, Limit: l.Max, Reserved: s.n, Requested: 1}
				}
				continue
			}
			c, r, h := s.cur(l.Dim, l.Window, m.now), s.r[l.Dim], req.Held[l.Dim]
			if c+r+h <= l.Max {
				continue
			}
			resets := ledger.WindowResetsAt(floorDiv(m.now, l.Window.Milliseconds()), l.Window)
			if denied == nil || resets.After(denied.ResetsAt) {
				denied = &ledger.DeniedError{Scope: sc.Kind, Dim: l.Dim, Window: l.Window, Limit: l.Max, Committed: c,
					Reserved: r, Requested: h, ResetsAt: resets, RetryAfter: resets.Sub(time.UnixMilli(m.now))}
			}
		}
	}
	if denied != nil {
		return ledger.Grant{}, denied
	}
	if slotDenied != nil {
		return ledger.Grant{}, slotDenied
	}
	m.pv = req.PolicyVersion
	rec := &mRec{state: ledger.Reserved, owner: req.Owner, digest: req.Digest(), leaseExp: m.now + ttl.Milliseconds(),
		admitAt: m.now, resolveAt: 1<<63 - 1, held: req.Held, req: req, attempt: req.Attempt}
	for _, sc := range req.Scopes {
		i := m.scopeIdx(sc.Key)
		rec.scopes = append(rec.scopes, i)
		s := m.scopes[i]
		for _, l := range sc.Limits {
			if l.Dim == ledger.Slots {
				continue
			}
			wms := l.Window.Milliseconds()
			if end := (floorDiv(m.now, wms) + 1) * wms; end < rec.resolveAt {
				rec.resolveAt = end
			}
		}
		for d := range ledger.NumDims {
			if !d.Windowed() {
				continue
			}
			s.r[d] += req.Held[d]
		}
	}
	if req.Dispatch {
		rec.state = ledger.Dispatched
		m.freeSlot(rec, +1)
	}
	m.recs[req.Ref.ID] = rec
	g := ledger.Grant{Ref: req.Ref, Owner: rec.owner, State: rec.state, LeaseExpiry: time.UnixMilli(rec.leaseExp)}
	m.headroom(&req, &g)
	return g, nil
}

func (m *model) mark(id ledger.RequestID, owner ledger.Owner) error {
	rec := m.recs[id]
	if rec == nil {
		return ledger.ErrNotFound
	}
	switch rec.state {
	case ledger.Reserved:
	case ledger.Dispatched:
		if rec.owner != owner {
			return ledger.ErrLeaseLost
		}
		return nil
	case ledger.Expired, ledger.Unresolved:
		return ledger.ErrLeaseLost
	default:
		return ledger.ErrAlreadyFinal
	}
	if rec.owner != owner {
		return ledger.ErrLeaseLost
	}
	for _, i := range rec.scopes {
		s := m.scopes[i]
		for _, l := range s.limits {
			if l.Dim == ledger.Slots && l.Mode == ledger.Block && s.n+1 > l.Max {
				return &ledger.DeniedError{Scope: s.ref.Kind, Dim: ledger.Slots, Limit: l.Max, Reserved: s.n, Requested: 1}
			}
		}
	}
	rec.state = ledger.Dispatched
	m.freeSlot(rec, +1)
	return nil
}

func (m *model) extend(id ledger.RequestID, owner ledger.Owner, ttl time.Duration) (int64, error) {
	rec := m.recs[id]
	if rec == nil {
		return 0, ledger.ErrNotFound
	}
	switch rec.state {
	case ledger.Reserved, ledger.Dispatched:
		if rec.owner != owner {
			return 0, ledger.ErrLeaseLost
		}
	case ledger.Expired, ledger.Unresolved:
		return 0, ledger.ErrLeaseLost
	default:
		return 0, ledger.ErrAlreadyFinal
	}
	rec.leaseExp = m.now + ttl.Milliseconds()
	return rec.leaseExp, nil
}

func overrunOf(a, h ledger.Amounts) ledger.Amounts {
	var o ledger.Amounts
	for d := range ledger.NumDims {
		if !d.Windowed() {
			continue
		}
		o[d] = max(a[d]-h[d], 0)
	}
	return o
}

func (m *model) settle(id ledger.RequestID, a ledger.Amounts) (ledger.Settlement, error) {
	rec := m.recs[id]
	if rec == nil {
		return ledger.Settlement{}, ledger.ErrNotFound
	}
	switch rec.state {
	case ledger.Settled, ledger.SettledLate:
		if rec.actual != a {
			return ledger.Settlement{}, ledger.ErrConflict
		}
		return ledger.Settlement{State: rec.state, Charged: rec.charged, Overrun: overrunOf(rec.charged, rec.held), Late: rec.late, Replayed: true}, nil
	case ledger.Charged:
		return ledger.Settlement{}, ledger.ErrAlreadyFinal
	case ledger.Released, ledger.Expired:
		m.charge(rec, a)
		rec.state, rec.actual, rec.late = ledger.SettledLate, a, true
		return ledger.Settlement{State: ledger.SettledLate, Charged: a, Overrun: overrunOf(a, rec.held), Late: true}, nil
	}
	prev := rec.state
	m.release(rec)
	if prev == ledger.Dispatched {
		m.freeSlot(rec, -1)
	}
	m.charge(rec, a)
	rec.state, rec.actual, rec.late = ledger.Settled, a, prev == ledger.Unresolved
	return ledger.Settlement{State: ledger.Settled, Charged: a, Overrun: overrunOf(a, rec.held), Late: rec.late}, nil
}

func (m *model) releaseOp(id ledger.RequestID, owner ledger.Owner) error {
	rec := m.recs[id]
	if rec == nil {
		m.recs[id] = &mRec{state: ledger.Released, owner: owner, admitAt: m.now}
		return nil
	}
	switch rec.state {
	case ledger.Released, ledger.Expired, ledger.SettledLate:
		return nil
	case ledger.Reserved:
	default:
		return ledger.ErrDispatched
	}
	if rec.owner != owner {
		return ledger.ErrLeaseLost
	}
	m.release(rec)
	rec.state = ledger.Released
	return nil
}

func (m *model) resolve(id ledger.RequestID) (ledger.Settlement, error) {
	rec := m.recs[id]
	if rec == nil {
		return ledger.Settlement{}, ledger.ErrNotFound
	}
	switch rec.state {
	case ledger.Unresolved:
	case ledger.Charged:
		return ledger.Settlement{State: ledger.Charged, Charged: rec.charged, Late: true, Replayed: true}, nil
	case ledger.Reserved, ledger.Dispatched:
		return ledger.Settlement{}, ledger.ErrConflict
	default:
		return ledger.Settlement{}, ledger.ErrAlreadyFinal
	}
	m.chargeHeld(rec)
	return ledger.Settlement{State: ledger.Charged, Charged: rec.charged, Late: true}, nil
}

func (m *model) chargeHeld(rec *mRec) {
	m.release(rec)
	m.charge(rec, rec.held)
	rec.state, rec.actual, rec.late = ledger.Charged, rec.held, true
}

func (m *model) reclaim() ledger.ReclaimStats {
	var st ledger.ReclaimStats
	for _, rec := range m.recs {
		if (rec.state == ledger.Reserved || rec.state == ledger.Dispatched) && rec.leaseExp <= m.now {
			if rec.state == ledger.Reserved {
				m.release(rec)
				rec.state = ledger.Expired
				st.Expired++
				continue
			}
			m.freeSlot(rec, -1)
			rec.state = ledger.Unresolved
			st.Unresolved++
		}
	}
	for _, rec := range m.recs {
		if rec.state == ledger.Unresolved && rec.resolveAt <= m.now {
			m.chargeHeld(rec)
			st.Charged++
		}
	}
	return st
}

func (m *model) restart() {
	for _, rec := range m.recs {
		switch rec.state {
		case ledger.Reserved:
			m.release(rec)
			rec.state = ledger.Expired
		case ledger.Dispatched:
			m.freeSlot(rec, -1)
			rec.state = ledger.Unresolved
		}
	}
}

func randLimits(rng *rand.Rand, kind ledger.Kind) []ledger.Limit {
	mode := func() ledger.Mode {
		if rng.IntN(5) == 0 {
			return ledger.Warn
		}
		return ledger.Block
	}
	switch kind {
	case ledger.KindTenant:
		return []ledger.Limit{
			{Dim: ledger.Tokens, Window: 10 * time.Second, Max: 100 + rng.Int64N(300)},
			{Dim: ledger.Requests, Window: time.Minute, Max: 3 + rng.Int64N(8)},
			{Dim: ledger.GPUMs, Window: time.Minute, Max: 100 + rng.Int64N(200), Mode: mode()},
			{Dim: ledger.GPUJoules, Window: 10 * time.Second, Max: 400 + rng.Int64N(800), Mode: mode()},
			{Dim: ledger.Slots, Max: 1 + rng.Int64N(3)},
		}
	case ledger.KindAPIKey:
		return []ledger.Limit{
			{Dim: ledger.Tokens, Window: time.Minute, Max: 150 + rng.Int64N(450), Mode: mode()},
			{Dim: ledger.Slots, Max: 1 + rng.Int64N(2), Mode: mode()},
		}
	default:
		return []ledger.Limit{
			{Dim: ledger.GPUMs, Window: 10 * time.Second, Max: 50 + rng.Int64N(250)},
			{Dim: ledger.OutputTokens, Window: 30 * time.Second, Max: 100 + rng.Int64N(200), Mode: mode()},
		}
	}
}

// runSequence runs one seeded sequence; it returns the number of steps.
func runSequence(t *testing.T, b *Backend, seed uint64, restarts bool) int {
	rng := rand.New(rand.NewPCG(seed, seed^0x9e3779b97f4a7c15))
	cfg := DefaultConfig()
	tenant := newKey(1)
	m := &model{now: b.Now().UnixMilli(), tenant: tenant, recs: map[ledger.RequestID]*mRec{}, cfg: cfg, pv: 0}
	kinds := []ledger.Kind{ledger.KindTenant, ledger.KindAPIKey, ledger.KindAPIKey, ledger.KindWorkflow, ledger.KindWorkflow}
	for i, k := range kinds {
		key := tenant
		if i > 0 {
			key = newKey(byte(k))
		}
		s := &mScope{ref: ledger.ScopeRef{Kind: k, Key: key}, limits: randLimits(rng, k), slotMax: -1, c: map[ledger.Limit]*mCounter{}}
		for _, l := range s.limits {
			if l.Dim == ledger.Slots {
				s.slotMax = l.Max
			}
		}
		m.scopes = append(m.scopes, s)
	}
	owners := []ledger.Owner{{byte(seed), 1}, {byte(seed), 2}}
	ids := make([]ledger.RequestID, 6)
	for i := range ids {
		ids[i] = ledger.NewRequestID()
	}
	pickOwner := func(id ledger.RequestID) ledger.Owner {
		if rec := m.recs[id]; rec != nil && rng.IntN(5) != 0 {
			return rec.owner
		}
		return owners[rng.IntN(2)]
	}
	randAmounts := func() ledger.Amounts {
		in, out := rng.Int64N(60), rng.Int64N(60)
		a := tokens(in, out)
		a[ledger.GPUMs] = rng.Int64N(100)
		a[ledger.USDMicros] = rng.Int64N(3)
		a[ledger.GPUJoules] = rng.Int64N(300)
		return a
	}
	newReq := func(id ledger.RequestID) ledger.ReserveRequest {
		if rec := m.recs[id]; rec != nil && rec.req.Scopes != nil && rng.IntN(2) == 0 {
			r := rec.req
			r.Owner = owners[rng.IntN(2)]
			r.Dispatch = rng.IntN(2) == 0
			if rng.IntN(2) == 0 { // another attempt; else the same one retried
				r.Attempt = uint64(rng.IntN(3))
			}
			return r
		}
		req := ledger.ReserveRequest{Ref: ledger.Ref{Tenant: tenant, ID: id}, Owner: owners[rng.IntN(2)], Held: randAmounts(),
			Dispatch: rng.IntN(3) == 0, PolicyVersion: m.pv, Attempt: uint64(rng.IntN(3))}
		if rng.IntN(40) == 0 && m.pv > 0 {
			req.PolicyVersion = m.pv - 1
		} else if rng.IntN(20) == 0 {
			req.PolicyVersion = m.pv + 1
		}
		switch rng.IntN(3) {
		case 1:
			req.LeaseTTL = time.Duration(1+rng.IntN(20)) * time.Second
		case 2:
			req.LeaseTTL = cfg.MaxLeaseTTL
		}
		idx := []int{0}
		if rng.IntN(3) != 0 {
			idx = append(idx, 1+rng.IntN(2))
		}
		if rng.IntN(3) != 0 {
			idx = append(idx, 3+rng.IntN(2))
		}
		rng.Shuffle(len(idx), func(i, j int) { idx[i], idx[j] = idx[j], idx[i] })
		for _, i := range idx {
			s := m.scopes[i]
			req.Scopes = append(req.Scopes, ledger.Scope{Kind: s.ref.Kind, Key: s.ref.Key, Limits: s.limits})
		}
		return req
	}
	actualFor := func(id ledger.RequestID) ledger.Amounts {
		if rec := m.recs[id]; rec != nil {
			switch rng.IntN(4) {
			case 0:
				return rec.actual
			case 1:
				return rec.held
			}
		}
		return randAmounts()
	}
	ctx := t.Context()
	n := 5 + rng.IntN(36)
	for step := range n {
		id := ids[rng.IntN(len(ids))]
		var op func() string
		eq := true
		var got, want func() string
		r := rng.IntN(100)
		if restarts && rng.IntN(12) == 0 {
			r = 100 // Restart
		}
		switch {
		case r < 30:
			req := newReq(id)
			op = func() string {
				return fmt.Sprintf("Reserve(%s dispatch=%v held=%v scopes=%d pv=%d)", id, req.Dispatch, req.Held, len(req.Scopes), req.PolicyVersion)
			}
			g, err := b.Ledger.Reserve(ctx, req)
			wg, werr := m.reserve(req)
			eq = errEq(err, werr) && (err != nil || grantEq(g, wg))
			got, want = func() string { return grantString(g, err) }, func() string { return grantString(wg, werr) }
		case r < 42:
			owner := pickOwner(id)
			op = func() string { return fmt.Sprintf("MarkDispatched(%s)", id) }
			err, werr := b.Ledger.MarkDispatched(ctx, ledger.Ref{Tenant: tenant, ID: id}, owner), m.mark(id, owner)
			eq = errEq(err, werr)
			got, want = func() string { return describe(err) }, func() string { return describe(werr) }
		case r < 46:
			// Grow: mostly from the record's hold, sometimes from a stale
			// or other one; by a random step, sometimes none (a retry) or
			// a shrink (ErrInvalid).
			owner := pickOwner(id)
			from := randAmounts()
			if rec := m.recs[id]; rec != nil && rng.IntN(5) != 0 {
				from = rec.held
			}
			to := from
			switch rng.IntN(6) {
			case 0:
			case 1:
				if to[ledger.OutputTokens] > 0 {
					to[ledger.OutputTokens]--
					to[ledger.Tokens]--
				}
			default:
				x := rng.Int64N(80)
				to[ledger.OutputTokens] += x
				to[ledger.Tokens] += x
				to[ledger.GPUMs] += rng.Int64N(40)
			}
			op = func() string { return fmt.Sprintf("Grow(%s, %v → %v)", id, from, to) }
			err := b.Ledger.Grow(ctx, ledger.Ref{Tenant: tenant, ID: id}, owner, from, to)
			werr := m.grow(id, owner, from, to)
			eq = errEq(err, werr)
			got, want = func() string { return describe(err) }, func() string { return describe(werr) }
		case r < 50:
			owner := pickOwner(id)
			ttl := time.Duration(1+rng.IntN(30)) * time.Second
			op = func() string { return fmt.Sprintf("Extend(%s, %s)", id, ttl) }
			exp, err := b.Ledger.Extend(ctx, ledger.Ref{Tenant: tenant, ID: id}, owner, ttl)
			wexp, werr := m.extend(id, owner, ttl)
			eq = errEq(err, werr) && ms(exp) == wexp
			got, want = func() string { return fmt.Sprint(ms(exp), describe(err)) }, func() string { return fmt.Sprint(wexp, describe(werr)) }
		case r < 66:
			a := actualFor(id)
			src := ledger.Source(1 + rng.IntN(5))
			op = func() string { return fmt.Sprintf("Settle(%s, %v)", id, a) }
			s, err := b.Ledger.Settle(ctx, ledger.Ref{Tenant: tenant, ID: id}, a, src)
			ws, werr := m.settle(id, a)
			eq = errEq(err, werr) && s == ws
			got, want = func() string { return fmt.Sprintf("%+v %s", s, describe(err)) }, func() string { return fmt.Sprintf("%+v %s", ws, describe(werr)) }
		case r < 74:
			owner := pickOwner(id)
			op = func() string { return fmt.Sprintf("Release(%s)", id) }
			err, werr := b.Ledger.Release(ctx, ledger.Ref{Tenant: tenant, ID: id}, owner), m.releaseOp(id, owner)
			eq = errEq(err, werr)
			got, want = func() string { return describe(err) }, func() string { return describe(werr) }
		case r < 86:
			d := []time.Duration{0, 100 * time.Millisecond, time.Second, 3 * time.Second, 7 * time.Second, 25 * time.Second, 70 * time.Second}[rng.IntN(7)]
			op = func() string { return fmt.Sprintf("Advance(%s)", d) }
			b.Advance(d)
			m.now += d.Milliseconds()
		case r < 94:
			op = func() string { return "Reclaim" }
			st, err := b.Ledger.Reclaim(ctx, tenant, 1000)
			st.Purged = 0
			wst := m.reclaim()
			eq = err == nil && st == wst
			got, want = func() string { return fmt.Sprintf("%+v %s", st, describe(err)) }, func() string { return fmt.Sprintf("%+v nil", wst) }
		case r < 97:
			op = func() string { return fmt.Sprintf("Resolve(%s)", id) }
			s, err := b.Ledger.Resolve(ctx, ledger.Ref{Tenant: tenant, ID: id})
			ws, werr := m.resolve(id)
			eq = errEq(err, werr) && s == ws
			got, want = func() string { return fmt.Sprintf("%+v %s", s, describe(err)) }, func() string { return fmt.Sprintf("%+v %s", ws, describe(werr)) }
		case r < 100:
			// CrashOwner: the owner stops calling; its leases run out. The
			// ledger sees nothing, so there is nothing to compare.
			op = func() string { return "CrashOwner" }
		default:
			op = func() string { return "Restart" }
			l, err := b.Restart()
			if err != nil {
				t.Fatalf("seed %d step %d: restart: %v", seed, step, err)
			}
			b.Ledger = l
			m.restart()
		}
		if !eq {
			t.Fatalf("seed %d step %d: %s\n got: %s\nwant: %s", seed, step, op(), got(), want())
		}
		if msg := m.compare(t, b); msg != "" {
			t.Fatalf("seed %d step %d: after %s: %s", seed, step, op(), msg)
		}
		if b.Audit != nil {
			if err := b.Audit(tenant); err != nil {
				t.Fatalf("seed %d step %d: after %s: %v", seed, step, op(), err)
			}
		}
	}
	return n
}

func errEq(a, b error) bool {
	if (a == nil) != (b == nil) {
		return false
	}
	if a == nil {
		return true
	}
	da, oka := isDenied(a)
	db, okb := isDenied(b)
	if oka || okb {
		return oka && okb && da.Scope == db.Scope && da.Dim == db.Dim && da.Window == db.Window && da.Limit == db.Limit &&
			da.Committed == db.Committed && da.Reserved == db.Reserved && da.Requested == db.Requested &&
			ms(da.ResetsAt) == ms(db.ResetsAt) && da.RetryAfter == db.RetryAfter
	}
	return describe(a) == describe(b)
}

func grantEq(a, b ledger.Grant) bool {
	if a.Owner != b.Owner || a.State != b.State || ms(a.LeaseExpiry) != ms(b.LeaseExpiry) || a.Replayed != b.Replayed ||
		len(a.Warnings) != len(b.Warnings) {
		return false
	}
	for d := range a.Headroom {
		x, y := a.Headroom[d], b.Headroom[d]
		if x.Tracked != y.Tracked || x.Limit != y.Limit || x.Remaining != y.Remaining || x.Window != y.Window || ms(x.ResetsAt) != ms(y.ResetsAt) {
			return false
		}
	}
	for i := range a.Warnings {
		x, y := a.Warnings[i], b.Warnings[i]
		if x.Scope != y.Scope || x.Dim != y.Dim || x.Window != y.Window || x.Limit != y.Limit || x.Used != y.Used || ms(x.ResetsAt) != ms(y.ResetsAt) {
			return false
		}
	}
	return true
}

func grantString(g ledger.Grant, err error) string {
	if err != nil {
		return describe(err)
	}
	for d := range g.Headroom {
		g.Headroom[d].ResetsAt = time.UnixMilli(ms(g.Headroom[d].ResetsAt))
	}
	for i := range g.Warnings {
		g.Warnings[i].ResetsAt = time.UnixMilli(ms(g.Warnings[i].ResetsAt))
	}
	return fmt.Sprintf("owner=%s state=%s lease=%d replayed=%v headroom=%+v warnings=%+v", g.Owner, g.State,
		ms(g.LeaseExpiry), g.Replayed, g.Headroom, g.Warnings)
}

// compare checks every scope's counters against the model (I1–I5 as seen
// through Snapshot).
func (m *model) compare(t *testing.T, b *Backend) string {
	unres := 0
	for _, rec := range m.recs {
		if rec.state == ledger.Unresolved {
			unres++
		}
	}
	for _, s := range m.scopes {
		u, err := b.Ledger.Snapshot(t.Context(), m.tenant, s.ref.Key)
		if err != nil {
			return fmt.Sprintf("snapshot: %v", err)
		}
		r := u.Reserved
		r[ledger.Slots] = 0
		if r != s.r || u.SlotsInUse != s.n {
			return fmt.Sprintf("%s scope: r=%v n=%d, model r=%v n=%d", s.ref.Kind, r, u.SlotsInUse, s.r, s.n)
		}
		if u.Now.UnixMilli() != m.now {
			return fmt.Sprintf("ledger time %d, model %d", u.Now.UnixMilli(), m.now)
		}
		for _, l := range s.limits {
			if l.Dim == ledger.Slots {
				if l.Mode == ledger.Block && s.n > l.Max {
					return fmt.Sprintf("I1: %s scope n=%d > %d", s.ref.Kind, s.n, l.Max)
				}
				continue
			}
			if got, want := committed(u, l.Dim, l.Window), s.cur(l.Dim, l.Window, m.now); got != want {
				return fmt.Sprintf("%s scope c[%s/%s]=%d, model %d", s.ref.Kind, l.Dim, ledger.FormatWindow(l.Window), got, want)
			}
		}
		if s.ref.Kind == ledger.KindTenant && u.Unresolved != unres {
			return fmt.Sprintf("unresolved=%d, model %d", u.Unresolved, unres)
		}
	}
	return ""
}
