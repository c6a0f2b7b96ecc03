package redisledger

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"strconv"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// Reserve admits req all-or-nothing on every block-mode limit of its scopes,
// or returns a [*ledger.DeniedError]; it is idempotent by req.Ref.ID.
func (l *Ledger) Reserve(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error) {
	if err := req.Validate(l.cfg.MaxLeaseTTL); err != nil {
		return ledger.Grant{}, err
	}
	if req.PolicyVersion > uint64(ledger.MaxCounter) {
		return ledger.Grant{}, fmt.Errorf("policy version %d too large: %w", req.PolicyVersion, ledger.ErrPolicy)
	}
	ttl := req.LeaseTTL
	if ttl == 0 {
		ttl = l.cfg.LeaseTTL
	}
	l.register(ctx, req.Ref.Tenant)
	rec := l.recordName(req.Ref)
	digest := strconv.FormatUint(req.Digest(), 16)
	// A global scope kept inline is one more scope of the tenant record
	// (global.go). Otherwise, step 1: the global hold, in its own partition.
	var gh *globalHold
	treq := req // the tenant partition's part of the request
	if gi := globalIndex(req.Scopes); gi >= 0 && !l.inlineGlobal(req.Scopes) {
		treq.Scopes = append(append(make([]ledger.Scope, 0, len(req.Scopes)-1), req.Scopes[:gi]...), req.Scopes[gi+1:]...)
		// Step 0: check the tenant side without writing, so a request the
		// tenant would refuse (or a replay) never takes a global hold.
		if g, err := l.reserveTenant(ctx, &treq, rec, digest, ttl, nil, modeCheck); !errors.Is(err, errChecked) {
			return g, err
		}
		var err error
		if gh, err = l.reserveGlobal(ctx, &req, gi, ttl, digest); err != nil {
			if !errors.Is(err, ledger.ErrDenied) {
				l.ambiguousHold(req.Ref.ID, gh, err)
				return ledger.Grant{}, err
			}
			// The id decides first (as in Memory): a replay, a conflict or
			// a final record answers even when the global budget is full.
			g, terr := l.reserveTenant(ctx, &treq, rec, digest, ttl, nil, modeReplayOnly)
			if !errors.Is(terr, errNoRecord) {
				return g, terr
			}
			// A denial that only in-flight holds cause may be one of the
			// short-lived holds of requests their tenant step refuses (see
			// global.go); that consult took a round trip, so try once more.
			var d *ledger.DeniedError
			if !errors.As(err, &d) || d.Committed+d.Requested > d.Limit {
				return ledger.Grant{}, err
			}
			if gh, err = l.reserveGlobal(ctx, &req, gi, ttl, digest); err != nil {
				l.ambiguousHold(req.Ref.ID, gh, err)
				return ledger.Grant{}, err
			}
		}
	}
	// Step 2: the tenant holds. Any definite failure drops the global hold.
	g, err := l.reserveTenant(ctx, &treq, rec, digest, ttl, gh, modeReserve)
	if gh != nil && l.settleHold(ctx, gh, &g, err) && (!req.Dispatch || err != nil) {
		l.rememberHold(req.Ref.ID, gh)
	}
	return g, err
}

// knownHold is a global hold this process reserved (or may have: an
// ambiguous global step) for a request, and its owner.
type knownHold struct {
	ref   ledger.Ref
	owner ledger.Owner
}

func (l *Ledger) rememberHold(id ledger.RequestID, gh *globalHold) {
	l.mu.Lock()
	if len(l.holds) < maxSpecCache {
		l.holds[id] = knownHold{ref: gh.ref, owner: gh.owner}
	}
	l.mu.Unlock()
}

// ambiguousHold remembers the hold of a global step that failed err, if
// the hold may exist (an ambiguous store error): the request's end
// releases it (endHold). A hold that never applied is released as an
// unknown id, whose tombstone refuses a late arrival of the step.
func (l *Ledger) ambiguousHold(id ledger.RequestID, gh *globalHold, err error) {
	if gh != nil && errors.Is(err, ledger.ErrAmbiguous) {
		l.rememberHold(id, gh)
	}
}

// endHold forgets the global hold remembered for request id and releases it
// unless the request's record carries it (g, as the record's operation
// answered): a hold of a Reserve whose global or tenant step was ambiguous
// may belong to no record, and would otherwise wait for its lease and,
// dispatched, be charged then.
//
// A release that fails keeps the hold remembered and returns the error, so
// that the caller's retry of the request's end (the outbox's) releases it;
// the hold's lease is the backstop.
func (l *Ledger) endHold(ctx context.Context, id ledger.RequestID, g string) error {
	l.mu.Lock()
	h, ok := l.holds[id]
	delete(l.holds, id)
	l.mu.Unlock()
	if !ok || encodeHold(h.ref) == g {
		return nil
	}
	// Released: a dispatched one is settled at zero, and an unknown id
	// leaves a tombstone that refuses the step if it arrives late.
	if err := l.globalRelease(ctx, h.ref, h.owner); err != nil {
		l.m.storeErrors.WithLabelValues("global_release").Inc()
		l.mu.Lock()
		l.holds[id] = h
		l.mu.Unlock()
		return fmt.Errorf("global hold: %w", err)
	}
	return nil
}

// holdOf returns the global hold of record id reserved here and not yet
// dispatched, if it is known.
func (l *Ledger) holdOf(id ledger.RequestID) (ledger.Ref, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.holds[id]
	return h.ref, ok
}

// settleHold decides the fate of the global hold gh after the tenant step
// answered g, err: kept (true; on success its headroom merged into g) or
// dropped.
func (l *Ledger) settleHold(ctx context.Context, gh *globalHold, g *ledger.Grant, err error) bool {
	switch {
	case err == nil && (!g.Replayed || gh.stored == gh.enc):
		mergeHeadroom(g, &gh.grant)
		return true
	case err == nil || !errors.Is(err, ledger.ErrAmbiguous):
		// A replay carries its own (earlier) global hold, and a refusal
		// wrote nothing: ours must go.
		l.dropGlobal(ctx, gh)
		return false
	}
	// An ambiguous outcome keeps it: the tenant record may carry it. The
	// request's end drops it if not (endHold); its lease is the backstop.
	return true
}

// Modes of the reserve script (ARGV 14).
const (
	modeReserve    = "0"
	modeReplayOnly = "1" // answer from an existing record, else errNoRecord; no writes
	modeCheck      = "2" // answer like a reserve but errChecked instead of admitting; no writes
)

var (
	errNoRecord = errors.New("redis ledger: no record")
	errChecked  = errors.New("redis ledger: would admit")
)

// reserveTenant runs the reserve script on one partition in mode; gh, when
// not nil, is the global hold the record will carry.
func (l *Ledger) reserveTenant(ctx context.Context, req *ledger.ReserveRequest, rec recName, digest string, ttl time.Duration, gh *globalHold, mode string) (ledger.Grant, error) {
	op := getOp()
	call := l.reserveOp(op, req, rec, digest, ttl, gh, mode)
	r, err := l.runOp(ctx, l.s.reserve, op)
	if err != nil {
		return ledger.Grant{}, err
	}
	return l.reserveReply(req, call, gh, r)
}

// reserveCall is what a reserve call's reply is decoded against.
type reserveCall struct {
	sk     *specKeys
	cached string
}

// reserveOp appends one reserve script call's keys and arguments to op.
func (l *Ledger) reserveOp(op *bop, req *ledger.ReserveRequest, rec recName, digest string, ttl time.Duration, gh *globalHold, mode string) reserveCall {
	pk := l.partKeys(req.Ref.Tenant)
	sk := pk.specFor(req.Scopes, l.inlineGlobal(req.Scopes))
	op.fixedKeys(pk, rec)
	op.keys = append(op.keys, sk.scopes...)
	dispatch := "0"
	if req.Dispatch {
		dispatch = "1"
	}
	hold := ""
	if gh != nil {
		hold = gh.enc
	}
	cached := l.common(op, req.Ref.Tenant, rec.id)
	op.str(strconv.FormatUint(req.PolicyVersion, 10))
	op.str(l.ownerText(req.Owner))
	op.str(digest)
	op.int(ttl.Milliseconds())
	op.str(dispatch)
	op.str(amountsCSV(&req.Held))
	op.str(sk.spec)
	op.str(hold)
	op.str(mode)
	op.str(strconv.FormatUint(req.Attempt, 10))
	return reserveCall{sk: sk, cached: cached}
}

// reserveReply decodes the reply r of the reserve call op.
func (l *Ledger) reserveReply(req *ledger.ReserveRequest, op reserveCall, gh *globalHold, r reply) (ledger.Grant, error) {
	sk, cached := op.sk, op.cached
	l.noteEpoch(req.Ref.Tenant, cached, r)
	switch r.status() {
	case "OK":
		g, err := l.grantFrom(*req, r)
		if err == nil {
			l.cacheSpec(req.Ref.ID, sk)
		}
		return g, err
	case "REPLAY":
		owner, ok1 := parseOwner(r.str(2))
		le, ok2 := r.int(3)
		st, ok3 := r.int(4)
		if !ok1 || !ok2 || !ok3 {
			return ledger.Grant{}, l.corrupt("replay reply")
		}
		if gh != nil {
			gh.stored = r.str(6)
		}
		l.cacheSpec(req.Ref.ID, sk)
		// The same attempt is the caller's own retry after a lost reply
		// (go-redis retries EVALSHA on a broken connection): a success.
		same := r.str(7) == "1"
		g := ledger.Grant{Ref: req.Ref, Owner: owner, State: ledger.State(st),
			LeaseExpiry: time.UnixMilli(le).UTC(), Replayed: !same}
		decodeRoom(&g, req.Scopes, r, 8)
		return g, nil
	case "FINAL":
		st, _ := r.int(2)
		return ledger.Grant{}, &ledger.FinalError{State: ledger.State(st)}
	case "DENIED":
		return ledger.Grant{}, l.denied(r, kindsOf(req.Scopes))
	case "NOREC":
		return ledger.Grant{}, errNoRecord
	case "CHECKED":
		return ledger.Grant{}, errChecked
	}
	if err := l.statusErr(r); err != nil {
		return ledger.Grant{}, err
	}
	return ledger.Grant{}, l.corrupt("unknown reserve reply " + r.status())
}

func kindsOf(scopes []ledger.Scope) []ledger.Kind {
	k := make([]ledger.Kind, len(scopes))
	for i := range scopes {
		k[i] = scopes[i].Kind
	}
	return k
}

func parseOwner(s string) (ledger.Owner, bool) {
	var o ledger.Owner
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(o) {
		return o, false
	}
	copy(o[:], b)
	return o, true
}

// grantFrom decodes an OK reserve reply.
func (l *Ledger) grantFrom(req ledger.ReserveRequest, r reply) (ledger.Grant, error) {
	le, ok := r.int(2)
	if !ok {
		return ledger.Grant{}, l.corrupt("reserve reply")
	}
	g := ledger.Grant{Ref: req.Ref, Owner: req.Owner, State: ledger.Reserved, LeaseExpiry: time.UnixMilli(le).UTC()}
	if req.Dispatch {
		g.State = ledger.Dispatched
	}
	decodeRoom(&g, req.Scopes, r, 4)
	return g, nil
}

// decodeRoom decodes append_room's layout starting at r[i]: the number of
// tracked dimensions, then (dimension, max, remaining, W, resetsAt) for each.
func decodeRoom(g *ledger.Grant, scopes []ledger.Scope, r reply, i int) {
	k, _ := r.int(i)
	i++
	for range k {
		d, _ := r.int(i)
		mx, _ := r.int(i + 1)
		rem, _ := r.int(i + 2)
		w, _ := r.int(i + 3)
		rs, _ := r.int(i + 4)
		if d >= 0 && d < int64(ledger.NumDims) {
			room := ledger.Room{Tracked: true, Limit: mx, Remaining: rem, Window: time.Duration(w) * time.Second}
			if w > 0 {
				room.ResetsAt = time.UnixMilli(rs).UTC()
			}
			g.Headroom[d] = room
		}
		i += 5
	}
	nw, _ := r.int(i)
	i++
	for range nw {
		si, _ := r.int(i)
		d, _ := r.int(i + 1)
		w, _ := r.int(i + 2)
		mx, _ := r.int(i + 3)
		used, _ := r.int(i + 4)
		rs, _ := r.int(i + 5)
		i += 6
		wr := ledger.Warning{Dim: ledger.Dim(d), Window: time.Duration(w) * time.Second, Limit: mx, Used: used}
		if si >= 1 && int(si) <= len(scopes) {
			wr.Scope = scopes[si-1].Kind
		}
		if w > 0 {
			wr.ResetsAt = time.UnixMilli(rs).UTC()
		}
		g.Warnings = append(g.Warnings, wr)
	}
}

// denied decodes a DENIED reply: scope index, dim, W, max, committed,
// reserved, requested, resets at, now.
func (l *Ledger) denied(r reply, kinds []ledger.Kind) error {
	var v [9]int64
	for i := range v {
		x, ok := r.int(2 + i)
		if !ok {
			return l.corrupt("denied reply")
		}
		v[i] = x
	}
	e := &ledger.DeniedError{Dim: ledger.Dim(v[1]), Window: time.Duration(v[2]) * time.Second,
		Limit: v[3], Committed: v[4], Reserved: v[5], Requested: v[6]}
	if si := int(v[0]); si >= 1 && si <= len(kinds) {
		e.Scope = kinds[si-1]
	}
	if v[2] > 0 {
		e.ResetsAt = time.UnixMilli(v[7]).UTC()
		e.RetryAfter = time.Duration(v[7]-v[8]) * time.Millisecond
	}
	return e
}
