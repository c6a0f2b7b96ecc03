package redisledger

import (
	"context"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// MarkDispatched takes the request's slots (RESERVED → DISPATCHED). A full
// slot limit returns a [*ledger.DeniedError] on Slots and leaves the record
// RESERVED. Repeating it for a DISPATCHED record of the same owner succeeds.
func (l *Ledger) MarkDispatched(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	// A global hold reserved here is dispatched first (two steps,
	// global.go): a process that dies between the steps leaves a dispatched
	// hold on a record still RESERVED, which Reclaim frees when the record
	// expires. The other order left a dispatched record, charged its hold
	// once UNRESOLVED, whose global hold expired uncharged.
	h, first := l.holdOf(ref.ID)
	if first {
		if err := l.globalDispatch(ctx, h, owner); err != nil {
			return fmt.Errorf("global hold: %w", err)
		}
	}
	r, spec, err := l.runRecord(ctx, l.s.dispatch, ref, l.ownerText(owner))
	if err != nil {
		return err
	}
	switch r.status() {
	case "OK":
		if first && r.str(4) == encodeHold(h) {
			return l.endHold(ctx, ref.ID, r.str(4)) // (the record names it: only forgotten)
		}
		return l.followGlobal(ctx, r.str(4), func(g ledger.Ref) error { return l.globalDispatch(ctx, g, owner) })
	case "DENIED":
		sc, _ := parseSpec(spec)
		kinds := make([]ledger.Kind, len(sc))
		for i := range sc {
			kinds[i] = sc[i].kind
		}
		return l.denied(r, kinds)
	}
	if err := l.statusErr(r); err != nil {
		return err
	}
	return l.corrupt("unknown dispatch reply " + r.status())
}

// Extend sets the lease of a RESERVED or DISPATCHED record of owner to
// now + ttl (never shortening it) and returns the new expiry, or
// ErrLeaseLost when the lease ran out, the record is UNRESOLVED or terminal,
// another owner holds it, or the tenant's epoch changed (store loss).
func (l *Ledger) Extend(ctx context.Context, ref ledger.Ref, owner ledger.Owner, ttl time.Duration) (time.Time, error) {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return time.Time{}, fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	if ttl <= 0 || ttl > l.cfg.MaxLeaseTTL {
		return time.Time{}, fmt.Errorf("lease ttl %s outside (0, %s]: %w", ttl, l.cfg.MaxLeaseTTL, ledger.ErrInvalid)
	}
	r, err := l.extend(ctx, ref, owner, ttl)
	if err != nil {
		return time.Time{}, err
	}
	if r.status() == "OK" {
		le, ok := r.int(2)
		if !ok {
			return time.Time{}, l.corrupt("extend reply")
		}
		err := l.followGlobal(ctx, r.str(3), func(g ledger.Ref) error {
			_, err := l.extend(ctx, g, owner, ttl)
			return err
		})
		if err != nil {
			return time.Time{}, err
		}
		return time.UnixMilli(le).UTC(), nil
	}
	if err := l.statusErr(r); err != nil {
		return time.Time{}, err
	}
	return time.Time{}, l.corrupt("unknown extend reply " + r.status())
}

// extend runs the extend script and returns its reply (errors: store only).
func (l *Ledger) extend(ctx context.Context, ref ledger.Ref, owner ledger.Owner, ttl time.Duration) (reply, error) {
	rec := l.recordName(ref)
	op := getOp()
	op.fixedKeys(l.partKeys(ref.Tenant), rec)
	cached := l.common(op, ref.Tenant, rec.id)
	op.str(l.ownerText(owner))
	op.int(ttl.Milliseconds())
	r, err := l.runOp(ctx, l.s.extend, op)
	if err != nil {
		return nil, err
	}
	l.noteEpoch(ref.Tenant, cached, r)
	return r, nil
}

// Settle charges actual once (the first Settle wins; the same actual again is
// Replayed, another is ErrConflict) and frees the record's holds and slot.
func (l *Ledger) Settle(ctx context.Context, ref ledger.Ref, actual ledger.Amounts, src ledger.Source) (ledger.Settlement, error) {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return ledger.Settlement{}, fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	if err := actual.Validate(); err != nil {
		return ledger.Settlement{}, err
	}
	if !src.Valid() {
		return ledger.Settlement{}, fmt.Errorf("source %d: %w", src, ledger.ErrInvalid)
	}
	csv := amountsCSV(&actual)
	r, spec, err := l.runRecord(ctx, l.s.settle, ref, csv, src.String())
	if err != nil {
		return ledger.Settlement{}, err
	}
	// The record's global hold, if it has one, settles with the same actual.
	globalStep := func(g ledger.Ref) error { return l.globalSettle(ctx, g, actual, src) }
	switch r.status() {
	case "OK":
		// {'OK', epoch, st, prev, held, at, now}
		st, ok1 := r.int(2)
		prev, ok2 := r.int(3)
		held, ok3 := parseAmountsCSV(r.str(4))
		at, _ := r.int(5)
		now, _ := r.int(6)
		if !ok1 || !ok2 || !ok3 {
			return ledger.Settlement{}, l.corrupt("settle reply")
		}
		l.forgetSpec(ref.ID)
		s := settlementOf(ledger.State(st), ledger.State(prev), held, actual, false)
		l.emit(ref, specWithHold(spec, r.str(7)), held, actual, s.Charged, s.State, s.Late, src, at, now)
		if err := l.followGlobal(ctx, r.str(7), globalStep); err != nil {
			return ledger.Settlement{}, err
		}
		if err := l.endHold(ctx, ref.ID, r.str(7)); err != nil {
			return ledger.Settlement{}, err
		}
		return s, nil
	case "REPLAY":
		// {'REPLAY', epoch, st, prev, held, src}
		st, _ := r.int(2)
		prev, _ := r.int(3)
		held, ok := parseAmountsCSV(r.str(4))
		if !ok {
			return ledger.Settlement{}, l.corrupt("settle replay reply")
		}
		if err := l.followGlobal(ctx, r.str(6), globalStep); err != nil {
			return ledger.Settlement{}, err
		}
		if err := l.endHold(ctx, ref.ID, r.str(6)); err != nil {
			return ledger.Settlement{}, err
		}
		return settlementOf(ledger.State(st), ledger.State(prev), held, actual, true), nil
	case "FINAL":
		l.forgetSpec(ref.ID)
		if err := l.endHold(ctx, ref.ID, ""); err != nil {
			return ledger.Settlement{}, err
		}
		// The actual still goes to the usage log.
		l.emit(ref, spec, ledger.Amounts{}, actual, ledger.Amounts{}, ledger.Charged, true, src, 0, 0)
		return ledger.Settlement{}, ledger.ErrAlreadyFinal
	case "NOTFOUND":
		l.forgetSpec(ref.ID)
		if err := l.endHold(ctx, ref.ID, ""); err != nil {
			return ledger.Settlement{}, err
		}
		l.orphans.Add(1)
		l.m.orphans.Inc()
	}
	if err := l.statusErr(r); err != nil {
		return ledger.Settlement{}, err
	}
	return ledger.Settlement{}, l.corrupt("unknown settle reply " + r.status())
}

func settlementOf(st, prev ledger.State, held, actual ledger.Amounts, replayed bool) ledger.Settlement {
	s := ledger.Settlement{State: st, Charged: actual, Replayed: replayed}
	s.Late = prev == ledger.Unresolved || prev == ledger.Released || prev == ledger.Expired
	if st == ledger.Settled || st == ledger.SettledLate {
		for d := range actual {
			if x := actual[d] - held[d]; x > 0 && ledger.Dim(d) != ledger.Slots {
				s.Overrun[d] = x
			}
		}
	}
	return s
}

// emit sends a usage event to Config.OnUsage.
func (l *Ledger) emit(ref ledger.Ref, spec string, held, actual, charged ledger.Amounts, st ledger.State, late bool, src ledger.Source, at, now int64) {
	if l.cfg.OnUsage == nil {
		return
	}
	ev := ledger.UsageEvent{Ref: ref, Held: held, Actual: actual, Charged: charged, Source: src, State: st, Late: late}
	if sc, ok := parseSpec(spec); ok {
		for i := range sc {
			if i < ledger.MaxScopes {
				ev.Scopes[i] = ledger.ScopeRef{Kind: sc[i].kind, Key: sc[i].key}
				ev.NScopes++
			}
		}
	}
	if at > 0 {
		ev.AdmittedAt = time.UnixMilli(at).UTC()
	}
	if now > 0 {
		ev.At = time.UnixMilli(now).UTC()
	}
	l.cfg.OnUsage(ev)
}

// Release frees a RESERVED record's holds (RELEASED). After dispatch it is
// ErrDispatched; on an unknown id it writes a RELEASED tombstone so that a
// late Reserve gets ErrAlreadyFinal; releasing a RELEASED record succeeds.
func (l *Ledger) Release(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	r, _, err := l.runRecord(ctx, l.s.release, ref, l.ownerText(owner))
	if err != nil {
		return err
	}
	if r.status() == "OK" {
		l.forgetSpec(ref.ID)
		if err := l.endHold(ctx, ref.ID, r.str(3)); err != nil {
			return err
		}
		return l.followGlobal(ctx, r.str(3), func(g ledger.Ref) error { return l.globalRelease(ctx, g, owner) })
	}
	if err := l.statusErr(r); err != nil {
		return err
	}
	return l.corrupt("unknown release reply " + r.status())
}

// Resolve (admin) charges an UNRESOLVED record at its held amount (CHARGED).
// Resolving a CHARGED record again is Replayed.
func (l *Ledger) Resolve(ctx context.Context, ref ledger.Ref) (ledger.Settlement, error) {
	return l.resolve(ctx, ref, true)
}

func (l *Ledger) resolve(ctx context.Context, ref ledger.Ref, admin bool) (ledger.Settlement, error) {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return ledger.Settlement{}, fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	force := "0"
	if admin {
		force = "1"
	}
	r, spec, err := l.runRecord(ctx, l.s.resolve, ref, force)
	if err != nil {
		return ledger.Settlement{}, err
	}
	switch r.status() {
	case "OK":
		held, ok := parseAmountsCSV(r.str(2))
		if !ok {
			return ledger.Settlement{}, l.corrupt("resolve reply")
		}
		at, _ := r.int(3)
		now, _ := r.int(4)
		l.forgetSpec(ref.ID)
		s := ledger.Settlement{State: ledger.Charged, Charged: held, Late: true}
		l.emit(ref, specWithHold(spec, r.str(5)), held, held, held, ledger.Charged, true, ledger.SourceResolved, at, now)
		if err := l.followGlobal(ctx, r.str(5), func(g ledger.Ref) error {
			return l.globalSettle(ctx, g, held, ledger.SourceResolved)
		}); err != nil {
			return ledger.Settlement{}, err
		}
		return s, nil
	case "REPLAY":
		held, _ := parseAmountsCSV(r.str(2))
		if err := l.followGlobal(ctx, r.str(3), func(g ledger.Ref) error {
			return l.globalSettle(ctx, g, held, ledger.SourceResolved)
		}); err != nil {
			return ledger.Settlement{}, err
		}
		return ledger.Settlement{State: ledger.Charged, Charged: held, Late: true, Replayed: true}, nil
	case "NOTDUE":
		st, _ := r.int(2)
		return ledger.Settlement{}, fmt.Errorf("resolve a %s record: %w", ledger.State(st), errNotDue)
	}
	if err := l.statusErr(r); err != nil {
		return ledger.Settlement{}, err
	}
	return ledger.Settlement{}, l.corrupt("unknown resolve reply " + r.status())
}

// errNotDue is returned by resolve for a record that is not UNRESOLVED (or,
// for Reclaim, whose admission window is still open).
var errNotDue = fmt.Errorf("record is not unresolved: %w", ledger.ErrConflict)

func refOf(tenant ledger.ScopeKey, x any) (ledger.Ref, bool) {
	s, ok := x.(string)
	if !ok {
		return ledger.Ref{}, false
	}
	k, err := ledger.ParseScopeKey(s) // same encoding as ids
	if err != nil {
		return ledger.Ref{}, false
	}
	return ledger.Ref{Tenant: tenant, ID: ledger.RequestID(k)}, true
}
