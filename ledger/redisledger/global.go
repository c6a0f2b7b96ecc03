package redisledger

import (
	"context"
	"encoding/base64"
	"fmt"
	"strconv"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// Global (fleet-wide) budgets. A KindGlobal scope G lives in its own
// partition "<prefix>:{G}:…", laid out exactly like a tenant's (m, L, U,
// q:<id>, s:G), because its counters cannot share a Cluster slot with every
// tenant. How a request reaches them depends on where the partitions live.
//
// # One server: the global scope inline
//
// On a standalone or Sentinel server (with batching, the default) every key
// is on one server, so a Reserve with a global scope is one ordinary
// reserve operation of the tenant partition whose spec also names G: the
// record holds on s:G in the global partition as on its other scope hashes,
// and every later operation (dispatch, extend, settle, release, expire,
// resolve) moves that hold with the others, in the same script, exactly
// once — as Memory does under both partitions' locks. There is no second
// record, no hold to drop and no false-denial window, and a global pair
// costs one operation per call instead of two records' worth (BENCHMARKS.md
// §0.7).
//
//   - The spec marks the scope: its limits are B and W instead of b and w
//     (appendSpec), and its key is the global partition's s:G; the global
//     partition's meta key follows the scope keys (specFor,
//     scopeKeysFromSpec). Versions without inline global scopes refuse such
//     a spec as malformed (nothing written), so during a rolling upgrade they never
//     act on such a record; the new processes settle and reclaim it.
//   - Time: the operation runs at the later of the tenant's and the global
//     partition's ledger time and raises both hwms (lua/prelude.lua,
//     ledger_now and touch), so one global hash is charged on one clock by
//     every tenant and its windows never go back (Memory: max(tenant time,
//     global hwm)). A Reserve also honours a fence on the global partition.
//   - Store loss is detected by the tenants' epochs, which a loss of the
//     one server changes with the global partition's.
//   - A global scope without limits has nothing to mark and keeps the
//     two-step protocol below; so does a Ledger with MaxBatch 1, which keeps
//     that protocol exercised on one server (TestConformanceUnbatched,
//     TestGlobalOrphanHoldIsReclaimed, the stepwise cases of
//     TestLostReplyIsNotADuplicate). Either settles an inline record: the
//     stored spec names its keys.
//
// # Cluster: a global hold in two steps
//
// On a Cluster (and with MaxBatch 1) a Reserve with a global scope is two
// writing scripts after a read-only check:
//
//  0. the tenant partition's reserve script in check mode: it answers as a
//     reserve would (replay, conflict, final, policy, denial) but writes
//     nothing and says CHECKED where it would admit. Anything but CHECKED
//     is the answer, so a request the tenant side refuses, and every
//     replay, never takes a global hold.
//  1. reserve in the global partition, under a fresh random id gid per
//     attempt ("global hold"), with the request's owner, held amounts, lease
//     and Dispatch flag and the global scope's limits. A denial here is a
//     *ledger.DeniedError with Scope KindGlobal and nothing is written —
//     unless the tenant partition already has a record with this id: the
//     reserve script then runs in replay-only mode, so a replay, conflict
//     or final record answers first, as in Memory.
//  2. reserve in the tenant partition as before; the tenant record stores
//     "G.gid" in its field g. If this step refuses (denial, conflict, final,
//     policy, corrupt, recovering, or a store error that is certainly not
//     applied), or answers a replay whose record carries another attempt's
//     hold, the global hold is dropped at once (settled at zero, not sent).
//     An ambiguous store error keeps it, because the tenant record may
//     carry it, and so does an ambiguous step 1. The process remembers such
//     a hold, and the request's end (Release, Settle, the outage Charge)
//     releases it unless the record names it: a dispatched hold no record
//     names would otherwise be charged at its amount when its lease ran
//     out. A release that fails fails that end, whose retry (the outbox's)
//     releases it.
//
// Every later operation on the tenant record gets g back from its script and
// then acts on the global hold by id, idempotently, inside the same Go
// method: MarkDispatched → dispatch, Extend → extend, Settle → settle with
// the same actual (a replayed tenant Settle re-runs it, so the outbox retry
// of a Settle whose global step failed completes it), Release → release (or
// settle at zero, not sent, for a hold already dispatched), Resolve and the
// automatic charge → settle at the hold (SourceResolved), Reclaim's EXPIRED
// → settle at zero, not sent (an EXPIRED record never went out). The process
// that reserved a record remembers its hold and dispatches the hold before
// the record: dying between the two steps then leaves a dispatched hold on a
// RESERVED record, freed when the record expires, where the other order
// left a DISPATCHED record (charged its hold once UNRESOLVED) whose RESERVED
// hold expired uncharged. A full slot limit refusing the record's step
// leaves the hold dispatched until the record is dispatched, released or
// expired. A failed global step fails the call (the
// caller retries by id) except in Reclaim, where the global hold's own lease
// is the backstop. Global partitions run the same state machine, so a hold
// nobody resolves — a crash between the two steps, or an ambiguous tenant
// step whose tenant record was never written — is reclaimed like any other:
// RESERVED → EXPIRED when its lease runs out (Run reclaims every global
// partition this process has reserved in), DISPATCHED → UNRESOLVED →
// CHARGED at the hold once its admission window closes — unless its request
// has ended: a hold's record names its request (backMark), and Reclaim ends
// the hold of a request that settled, was released or expired, or carries
// another hold, as that request ended (followRequest), so a crash between a
// request's end and its hold's does not charge the global scope the whole
// hold. A request whose record is missing (its step may still land) keeps
// the backstop. Every resolution of
// the global hold is the global record's own exactly-once transition, so
// the global c rises at most once per request.
//
// # False denials (two steps)
//
// Between step 1 and the release of a hold whose tenant step refused (one
// round trip), or until the lease of an orphaned hold runs out (LeaseTTL,
// only after a crash or an ambiguous store error), the global budget counts
// a hold that will never be used, and a concurrent Reserve may be denied on
// the global budget although it would fit. Step 0 narrows the first case to
// requests whose tenant budget ran out between the check and step 2, and a
// global denial that only in-flight holds cause (c + h ≤ max) is retried
// once after the replay-only consult (one round trip later, when such holds
// are usually gone). When no
// tenant, api_key or workflow budget denies and the store answers, there is
// no window and false global denials are zero; ledgertest's global tests
// assert that and, for a T2-style round where tenant and api_key budgets
// also deny, report the count (Memory and the inline scope: always 0).
//
// Global limits carry no policy version (tenants' versions differ); each
// Reserve overwrites the scope's stored limits with its own. A global scope
// may not have a slots limit (ledger.ErrPolicy). Charge (outage usage)
// charges the global partition under the request's id in a second step on
// every server.

// globalHold is one attempt's hold in a global partition.
type globalHold struct {
	ref    ledger.Ref   // Tenant: the global key G; ID: gid
	enc    string       // "G.gid", stored in the tenant record's field g
	owner  ledger.Owner // the Reserve's owner
	grant  ledger.Grant // the global step's grant (headroom and warnings)
	stored string       // g of the tenant record a replay found
}

func globalIndex(scopes []ledger.Scope) int {
	for i := range scopes {
		if scopes[i].Kind == ledger.KindGlobal {
			return i
		}
	}
	return -1
}

// encodeHold returns "G.gid" (one allocation).
func encodeHold(ref ledger.Ref) string {
	var b [2*encLen + 1]byte
	base64.RawURLEncoding.Encode(b[:encLen], ref.Tenant[:])
	b[encLen] = '.'
	base64.RawURLEncoding.Encode(b[encLen+1:], ref.ID[:])
	return string(b[:])
}

// parseHold parses a record's field g ("" means no global hold).
func parseHold(s string) (ledger.Ref, bool) {
	gk, id, ok := strings.Cut(s, ".")
	if !ok {
		return ledger.Ref{}, false
	}
	k, ok1 := decodeKey(gk)
	i, ok2 := decodeKey(id)
	if !ok1 || !ok2 {
		return ledger.Ref{}, false
	}
	return ledger.Ref{Tenant: k, ID: i}, true
}

// specWithHold appends the global scope of a record's hold g to its spec,
// so usage events name every scope of the request (as Memory's do).
func specWithHold(spec, g string) string {
	if g == "" {
		return spec
	}
	ref, ok := parseHold(g)
	if !ok {
		return spec
	}
	return spec + ";" + string(kindDigit(ledger.KindGlobal)) + ref.Tenant.String() + "/"
}

// reserveGlobal is step 1: a fresh hold in the global partition of
// req.Scopes[gi].
func (l *Ledger) reserveGlobal(ctx context.Context, req *ledger.ReserveRequest, gi int, ttl time.Duration, digest string) (*globalHold, error) {
	gk := req.Scopes[gi].Key
	ref := ledger.Ref{Tenant: gk, ID: ledger.NewRequestID()}
	l.globals.LoadOrStore(gk, struct{}{})
	l.register(ctx, gk)
	greq := ledger.ReserveRequest{Ref: ref, Owner: req.Owner, Scopes: req.Scopes[gi : gi+1], Held: req.Held,
		Dispatch: req.Dispatch}
	back := &globalHold{enc: backRef(req.Ref)} // the hold record's g names its request
	g, err := l.reserveTenant(ctx, &greq, l.recordName(ref), digest, ttl, back, modeReserve)
	gh := &globalHold{ref: ref, enc: encodeHold(ref), owner: req.Owner, grant: g}
	if err != nil {
		return gh, err // (the hold, which an ambiguous error may have left)
	}
	return gh, nil
}

// inlineGlobal reports whether a Reserve of scopes keeps its global scope in
// the tenant record (see the top of this file): on one server with batching,
// for a global scope that has limits (they carry the inline mark).
func (l *Ledger) inlineGlobal(scopes []ledger.Scope) bool {
	if l.b == nil || l.b.cc != nil {
		return false
	}
	gi := globalIndex(scopes)
	return gi >= 0 && len(scopes[gi].Limits) > 0
}

// dropGlobal releases a hold that no tenant record carries. Failures are
// left to the hold's lease (the false-denial window of the package docs).
func (l *Ledger) dropGlobal(ctx context.Context, gh *globalHold) {
	// Settle at zero (not sent) frees a RESERVED or DISPATCHED (Dispatch)
	// hold alike, charging nothing.
	if err := l.globalSettle(ctx, gh.ref, ledger.Amounts{}, ledger.SourceNotSent); err != nil {
		l.m.storeErrors.WithLabelValues("global_release").Inc()
	}
}

// followGlobal runs fn on the global hold named by a tenant record's field g
// (nothing when g is empty).
func (l *Ledger) followGlobal(_ context.Context, g string, fn func(ledger.Ref) error) error {
	if g == "" || strings.HasPrefix(g, backMark) { // (a hold's own record: its request)
		return nil
	}
	ref, ok := parseHold(g)
	if !ok {
		return l.corrupt("record's global hold")
	}
	if err := fn(ref); err != nil {
		return fmt.Errorf("global hold: %w", err)
	}
	return nil
}

func (l *Ledger) globalDispatch(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error {
	r, _, err := l.runRecord(ctx, l.s.dispatch, ref, l.ownerText(owner))
	if err != nil {
		return err
	}
	if r.status() == "OK" {
		return nil
	}
	return l.globalStatus(r)
}

func (l *Ledger) globalSettle(ctx context.Context, ref ledger.Ref, actual ledger.Amounts, src ledger.Source) error {
	r, _, err := l.runRecord(ctx, l.s.settle, ref, amountsCSV(&actual), src.String())
	if err != nil {
		return err
	}
	return l.globalSettleReply(ref, r)
}

// globalSettleReply decodes the reply of a global hold's settle.
func (l *Ledger) globalSettleReply(ref ledger.Ref, r reply) error {
	switch r.status() {
	case "OK", "REPLAY", "FINAL", "NOTFOUND":
		// FINAL: the hold was already charged at its amount by its own
		// Reclaim; NOTFOUND: its tombstone aged out. Either way it resolved once.
		l.forgetSpec(ref.ID)
		return nil
	}
	return l.globalStatus(r)
}

// globalRelease releases a hold whose RESERVED record was released; a hold
// that MarkDispatched dispatched before its record's step was refused (a
// full slot limit) is settled at zero, not sent.
func (l *Ledger) globalRelease(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error {
	r, _, err := l.runRecord(ctx, l.s.release, ref, l.ownerText(owner))
	if err != nil {
		return err
	}
	switch r.status() {
	case "OK":
		l.forgetSpec(ref.ID)
		return nil
	case "DISPATCHED":
		return l.globalSettle(ctx, ref, ledger.Amounts{}, ledger.SourceNotSent)
	}
	return l.globalStatus(r)
}

func (l *Ledger) globalStatus(r reply) error {
	if err := l.statusErr(r); err != nil {
		return err
	}
	return l.corrupt("unknown global reply " + r.status())
}

// mergeHeadroom folds the global step's headroom and warnings into g: per
// dimension the smaller remaining room (ties: the later reset).
func mergeHeadroom(g, global *ledger.Grant) {
	for d := range g.Headroom {
		gr, tr := global.Headroom[d], g.Headroom[d]
		if !gr.Tracked {
			continue
		}
		if !tr.Tracked || gr.Remaining < tr.Remaining || (gr.Remaining == tr.Remaining && gr.ResetsAt.After(tr.ResetsAt)) {
			g.Headroom[d] = gr
		}
	}
	g.Warnings = append(g.Warnings, global.Warnings...)
}

// Charge commits usage admitted while the ledger was unreachable (see
// [ledger.Ledger.Charge]) with the charge script: never denied, idempotent
// by id, a SETTLED tombstone (source outage) admitted at At. With a global
// scope the tenant partition is charged first, then the global partition
// under the same id; both steps are idempotent, so a failure between them is
// completed by the caller's retry with the same id (never charged twice).
func (l *Ledger) Charge(ctx context.Context, req ledger.ChargeRequest) (ledger.Settlement, error) {
	if err := req.Validate(); err != nil {
		return ledger.Settlement{}, err
	}
	a := req.Amounts
	a[ledger.Slots] = 0
	digest := strconv.FormatUint(req.Digest(), 16)
	at := req.At.UnixMilli()
	// Tenant partition first: a refusal there (conflict, policy) leaves the
	// global budget untouched; the global step follows every applied or
	// replayed tenant charge, so a retry after a failed global step completes
	// it, and the global record's id makes it count once.
	scopes := req.Scopes
	gi := globalIndex(scopes)
	if gi >= 0 {
		scopes = append(append(make([]ledger.Scope, 0, len(scopes)-1), scopes[:gi]...), scopes[gi+1:]...)
	}
	st, err := l.charge(ctx, req.Ref, scopes, &a, at, digest)
	if err != nil {
		return ledger.Settlement{}, err
	}
	// The charge ends the id: a hold of its ambiguous Reserve has no record.
	if err := l.endHold(ctx, req.Ref.ID, ""); err != nil {
		return ledger.Settlement{}, err
	}
	if !st.Replayed {
		l.emit(req.Ref, buildSpec(req.Scopes), ledger.Amounts{}, a, a, ledger.Settled, false, ledger.SourceOutage,
			st.at, st.now)
	}
	if gi >= 0 {
		l.globals.LoadOrStore(req.Scopes[gi].Key, struct{}{})
		gref := ledger.Ref{Tenant: req.Scopes[gi].Key, ID: req.Ref.ID}
		gst, err := l.charge(ctx, gref, req.Scopes[gi:gi+1], &a, at, digest)
		if err != nil {
			return ledger.Settlement{}, fmt.Errorf("global charge: %w", err)
		}
		st.OverLimit = st.OverLimit || gst.OverLimit
	}
	if st.Replayed {
		st.OverLimit = false
	}
	return st.Settlement, nil
}

type chargeResult struct {
	ledger.Settlement
	at, now int64
}

func (l *Ledger) charge(ctx context.Context, ref ledger.Ref, scopes []ledger.Scope, a *ledger.Amounts, at int64, digest string) (chargeResult, error) {
	rec := l.recordName(ref)
	pk := l.partKeys(ref.Tenant)
	op := getOp()
	op.fixedKeys(pk, rec)
	for i := range scopes {
		op.keys = append(op.keys, pk.base+"s:"+scopes[i].Key.String())
	}
	cached := l.common(op, ref.Tenant, rec.id)
	op.str(amountsCSV(a))
	op.str(buildSpec(scopes))
	op.int(at)
	op.str(digest)
	r, err := l.runOp(ctx, l.s.charge, op)
	if err != nil {
		return chargeResult{}, err
	}
	l.noteEpoch(ref.Tenant, cached, r)
	switch r.status() {
	case "OK":
		now, ok1 := r.int(2)
		at, ok2 := r.int(3)
		over, ok3 := r.int(4)
		if !ok1 || !ok2 || !ok3 {
			return chargeResult{}, l.corrupt("charge reply")
		}
		return chargeResult{Settlement: ledger.Settlement{State: ledger.Settled, Charged: *a, OverLimit: over == 1}, at: at, now: now}, nil
	case "REPLAY":
		prev, ok := parseAmountsCSV(r.str(2))
		if !ok {
			return chargeResult{}, l.corrupt("charge replay reply")
		}
		return chargeResult{Settlement: ledger.Settlement{State: ledger.Settled, Charged: prev, Replayed: true}}, nil
	}
	if err := l.statusErr(r); err != nil {
		return chargeResult{}, err
	}
	return chargeResult{}, l.corrupt("unknown charge reply " + r.status())
}

// A global hold's record names its request in its field g, as backMark
// followed by the request's "T.id" (a hold's g is never a hold of its own).
// A process killed between the end of a request and the end of its hold
// (Settle, Release, Reclaim's EXPIRED follow) leaves the hold to its lease,
// and a DISPATCHED hold would then be charged at its amount once
// UNRESOLVED, though its request settled for less or never went out.
// Reclaim, finding such a hold due, reads the request's record and ends the
// hold as the request ended (followRequest). A hold written by a version
// that does not set the mark has an empty g and keeps the lease's backstop.
const backMark = "^"

func backRef(req ledger.Ref) string { return backMark + encodeHold(req) }

// followRequest ends the global hold hold, whose record's g is g, the way
// its request ended, and reports whether it did: settled with the
// request's actual when the request settled; at zero, not sent, when the
// request was released or expired, or when its record carries another
// attempt's hold or none (this one can never be its). A request still open,
// charged at its hold (the hold's own charge matches), or not found (its
// step may still land) leaves the hold as it is.
func (l *Ledger) followRequest(ctx context.Context, hold ledger.Ref, g string) bool {
	enc, ok := strings.CutPrefix(g, backMark)
	if !ok {
		return false
	}
	req, ok := parseHold(enc)
	if !ok {
		return false
	}
	rec, ok := l.peekRecord(ctx, req)
	if !ok {
		return false
	}
	st, _ := rec.int(0)
	var actual ledger.Amounts
	src := ledger.SourceNotSent
	switch {
	case rec.str(7) != encodeHold(hold):
	case ledger.State(st) == ledger.Settled || ledger.State(st) == ledger.SettledLate:
		a, ok := parseAmountsCSV(rec.str(5))
		if !ok {
			return false
		}
		actual, src = a, ledger.SourceFinal
		for s := ledger.SourceFinal; s.Valid(); s++ {
			if s.String() == rec.str(6) {
				src = s
			}
		}
	case ledger.State(st) == ledger.Released || ledger.State(st) == ledger.Expired:
	default:
		return false
	}
	if l.globalSettle(ctx, hold, actual, src) != nil {
		return false
	}
	l.m.reclaimed.WithLabelValues("followed").Inc()
	return true
}

// peekRecord reads ref's record with the records reader: {state, owner,
// lease expiry, held, admitted at, actual, source, g}; false when there is
// none, it does not decode, or the store failed.
func (l *Ledger) peekRecord(ctx context.Context, ref ledger.Ref) (reply, bool) {
	r, err := l.run(ctx, l.s.records, true, []string{l.recordName(ref).key})
	if err != nil {
		return nil, false
	}
	v, _ := r[0].([]any)
	return reply(v), len(v) >= 8
}
