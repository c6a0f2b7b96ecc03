package redisledger

import (
	"context"
	"fmt"

	"github.com/sluicehq/sluice/ledger"
)

// Grow raises an open record's hold from from to to (ledger.Ledger.Grow)
// with the grow script, admitted like a Reserve of the difference against
// every scope the record's spec names, in one script call. A record with a
// global hold of its own (a Cluster, global.go) grows that hold after its
// own step: a global denial then leaves the tenant record holding the
// step, which its Settle frees (held more, never less, until it ends).
func (l *Ledger) Grow(ctx context.Context, ref ledger.Ref, owner ledger.Owner, from, to ledger.Amounts) error {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	if err := ledger.ValidateGrow(&from, &to); err != nil {
		return err
	}
	from[ledger.Slots], to[ledger.Slots] = 0, 0
	fs, ts := amountsCSV(&from), amountsCSV(&to)
	r, spec, err := l.runRecord(ctx, l.s.grow, ref, l.ownerText(owner), fs, ts)
	if err != nil {
		return err
	}
	switch r.status() {
	case "OK":
		return l.followGlobal(ctx, r.str(3), func(g ledger.Ref) error {
			gr, gspec, err := l.runRecord(ctx, l.s.grow, g, l.ownerText(owner), fs, ts)
			if err != nil {
				return err
			}
			switch gr.status() {
			case "OK":
				return nil
			case "DENIED":
				return l.denied(gr, specKinds(gspec))
			}
			return l.globalStatus(gr)
		})
	case "DENIED":
		return l.denied(r, specKinds(spec))
	}
	if err := l.statusErr(r); err != nil {
		return err
	}
	return l.corrupt("unknown grow reply " + r.status())
}

// specKinds lists the kinds of a record spec's scopes, in order.
func specKinds(spec string) []ledger.Kind {
	sc, _ := parseSpec(spec)
	kinds := make([]ledger.Kind, len(sc))
	for i := range sc {
		kinds[i] = sc[i].kind
	}
	return kinds
}
