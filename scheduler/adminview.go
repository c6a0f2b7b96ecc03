package scheduler

import (
	"context"
	"encoding/hex"
	"errors"
	"strings"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/scheduler/views"
)

// The admin API (package scheduler/adminapi) reads and changes the server
// through these methods and values only: it never holds a *fleet.Replica, a
// *policy or a ledger, so what it shows is a copy taken under the server's
// own rules, and the server's internals can change without the HTTP side.

// ErrNotSupported marks an operation the configured backend cannot do.
var ErrNotSupported = errors.New("not supported")

// AdminInputField returns the field path and message of a bad admin
// request (an error that matches [ErrAdminInput]).
func AdminInputField(err error) (param, msg string, ok bool) {
	var ai *adminInputError
	if !errors.As(err, &ai) {
		return "", "", false
	}
	return ai.Param, ai.Msg, true
}

// AdminInputError is a bad admin request naming its field.
func AdminInputError(param, format string, a ...any) error { return inputErr(param, format, a...) }

func oneLine(err error) string { return strings.ReplaceAll(err.Error(), "\n", "; ") }

// Now is the server's clock.
func (s *Server) Now() time.Time { return s.now() }

// PolicyVersion is the version of the policy in force.
func (s *Server) PolicyVersion() uint64 { return s.pol.Load().Version }

// StatusToken is admin.status_token in force ("sha256:<hex>", "" none).
func (s *Server) StatusToken() string { return s.pol.Load().File.Admin.StatusToken }

// HasTenant reports whether name is a configured tenant.
func (s *Server) HasTenant(name string) bool { return s.pol.Load().Tenants[name] != nil }

// Replicas copies the replicas' state for the views (package
// scheduler/views builds GET /admin/replicas and the status page's rows).
func (s *Server) Replicas() []views.ReplicaIn {
	snap, now := s.gpu.Snapshot(), s.now()
	out := []views.ReplicaIn{}
	for _, r := range s.reps.List() {
		v, ok := snap.Replica(r.Name)
		bound, cut := r.Bound()
		out = append(out, views.ReplicaIn{Name: r.Name, URL: r.URL, InflightTokens: r.Load.Load(), Inflight: r.Count.Load(),
			AbortsHeld: r.Distrusted(now), Peers: r.Peers.Load(), SeqShare: r.Share.Load(), SeqBound: bound, SeqCut: cut, MaxNumSeqs: r.MaxSeqs,
			LearnedBatch: r.Learned(), BatchLimit: r.BatchLimit(), Seqs: r.Seqs(true), GPU: v, Known: ok, Obs: r.Obs.Load(), LastScrapeError: r.LastScrapeError(now)})
	}
	return out
}

// DrainReplica drains the replica (reason != "": it finishes what it
// runs and gets nothing new) or undrains it (reason == "").
func (s *Server) DrainReplica(name, reason string) error {
	if err := s.gpu.Drain(name, reason); err != nil {
		return err
	}
	s.log.Info("replica drain changed by admin", "replica", name, "drained", reason != "", "reason", reason)
	s.Wake()
	return nil
}

// Tenants copies the tenants' state, without the ledger's use (GET
// /admin/tenants; with LedgerUse, GET /admin/tenants/{name}/usage).
func (s *Server) Tenants() []views.TenantIn {
	pol, now := s.pol.Load(), s.now()
	out := []views.TenantIn{}
	for _, t := range pol.Order {
		out = append(out, s.tenantIn(pol, t, now))
	}
	return out
}

// tenantIn copies t's state, less the ledger's use.
func (s *Server) tenantIn(pol *policy.Snapshot, t *policy.Tenant, now time.Time) views.TenantIn {
	in := views.TenantIn{Name: t.Name, Weight: t.Cfg.Weight, Priority: t.Cfg.Priority, Concurrency: t.Cfg.Concurrency,
		Inflight: t.RT.Inflight.Load(), InflightTokens: t.RT.InflightTokens.Load(), Keys: len(t.Keys),
		MaxDepth: t.Cfg.Queue.MaxDepth, MaxWait: t.Cfg.Queue.MaxWait, Limits: t.Limits}
	if qs, ok := s.Queue().Stats(t.Name); ok {
		in.Queued, in.Charged = qs.Depth, qs.Charged
	}
	if c, ok := pol.ClampOf(t.Name, now); ok {
		in.Clamp = &c
	}
	return in
}

// LedgerUse reads the ledger's use of each named tenant's scope (of the
// global scope for GlobalTenant), once per name; an unknown name is left
// out.
func (s *Server) LedgerUse(ctx context.Context, tenants []string) map[string]views.LedgerUse {
	pol := s.pol.Load()
	out := map[string]views.LedgerUse{}
	for _, name := range tenants {
		if _, done := out[name]; done {
			continue
		}
		key := s.keyer.GlobalKey()
		if name != GlobalTenant {
			t := pol.Tenants[name]
			if t == nil {
				continue
			}
			key = t.ScopeKey
		}
		var u views.LedgerUse
		u.Usage, u.Err = s.led.Snapshot(ctx, key, key)
		out[name] = u
	}
	return out
}

// Resolution is an operator's ending of a reservation the server could
// not settle: Charge is "held" (at its held amount), "actual" (at
// Amounts) or "zero" (Amounts is zero). The admin API has checked the
// charge and the amounts; the ID is kept as the operator wrote it, for the
// log and the audit trail.
type Resolution struct {
	Tenant  string
	ID      string // the ledger request id, 32 hex digits
	Charge  string
	Amounts ledger.Amounts
	Reason  string
}

// ResolveReservation ends an UNRESOLVED (or dispatched, abandoned) hold
// as r says, logs it and records it in the audit trail.
func (s *Server) ResolveReservation(ctx context.Context, r Resolution) (ledger.Settlement, error) {
	t := s.pol.Load().Tenants[r.Tenant]
	id, err := hex.DecodeString(r.ID)
	switch {
	case t == nil:
		return ledger.Settlement{}, inputErr("tenant", "unknown tenant %q", r.Tenant)
	case err != nil || len(id) != len(ledger.RequestID{}):
		return ledger.Settlement{}, inputErr("id", "must be a 32-hex-digit ledger request id")
	}
	ref := ledger.Ref{Tenant: t.ScopeKey, ID: ledger.RequestID(id)}
	var st ledger.Settlement
	if r.Charge == "held" {
		st, err = s.led.Resolve(ctx, ref)
	} else {
		st, err = s.led.Settle(ctx, ref, r.Amounts, ledger.SourceResolved)
	}
	if err != nil {
		return ledger.Settlement{}, err
	}
	s.log.Warn("reservation resolved by admin", "tenant", r.Tenant, "id", r.ID, "charge", r.Charge, "reason", r.Reason)
	s.record(audit.Record{Kind: audit.KindResolve, Tenant: r.Tenant, RequestID: r.ID, Source: "operator", State: st.State.String(),
		Reason: r.Charge + ": " + r.Reason, TokensCharged: st.Charged[ledger.Tokens], GPUMs: st.Charged[ledger.GPUMs], USDMicros: st.Charged[ledger.USDMicros]})
	return st, nil
}

// ReservationLister is the optional ledger capability behind
// [Server.Reservations].
type ReservationLister interface {
	List(ctx context.Context, tenant ledger.ScopeKey, state ledger.State, limit int) ([]ledger.ReservationInfo, error)
}

// ListsReservations reports whether the ledger can list reservations.
func (s *Server) ListsReservations() bool {
	_, ok := s.led.(ReservationLister)
	return ok
}

// Reservations copies up to 1000 reservations per tenant in state (of the
// one tenant, if named); [ErrNotSupported] when the ledger cannot list.
func (s *Server) Reservations(ctx context.Context, tenant string, state ledger.State) ([]views.ReservationsIn, error) {
	lister, ok := s.led.(ReservationLister)
	if !ok {
		return nil, ErrNotSupported
	}
	var out []views.ReservationsIn
	for _, t := range s.pol.Load().Order {
		if tenant != "" && tenant != t.Name {
			continue
		}
		lctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		list, err := lister.List(lctx, t.ScopeKey, state, 1000)
		cancel()
		if err != nil {
			return nil, err
		}
		out = append(out, views.ReservationsIn{Tenant: t.Name, List: list})
	}
	return out, nil
}
