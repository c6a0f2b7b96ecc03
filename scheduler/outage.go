package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/policy"
)

// The outage allowance: by default a ledger outage stops
// admission (503 ledger_unavailable). A tenant with an outage_allowance may
// go on while the ledger cannot answer, up to that many requests and tokens
// per outage and per clock hour (so a flapping ledger cannot multiply it).
// Such requests are counted here, audited as they are admitted, and charged
// into the ledger once it answers again, into the window in which they ran,
// exactly once (ledger Charge is idempotent by id). They take no ledger
// slot; the tenant's local concurrency cap still applies.
//
// A request with an Idempotency-Key is never outage-admitted: only the ledger knows whether an earlier attempt of the key ran,
// on this instance or another, and the seeded fault simulator (test/chaos)
// showed that a key whose first attempt ran before the outage executes
// again when its retry is admitted blind. It gets 503 ledger_unavailable
// and may retry. An outage-admitted call keeps its ledger id: when the
// failed Reserve was ambiguous and did apply, the id names a reservation,
// and the charge settles that reservation instead (Charge answers
// ErrConflict), so the usage lands once either way.
//
// Owed charges are persisted in the pending-writes log (outbox.go) from
// admission on, so a restart still bills them exactly once: a call that
// was still running when the process died is charged at its hold, the
// honest charge without usage evidence.

// Charger is the ledger capability that settles outage usage afterwards.
type Charger interface {
	Charge(ctx context.Context, req ledger.ChargeRequest) (ledger.Settlement, error)
}

// outageUse is what a tenant used of its allowance.
type outageUse struct {
	requests, tokens int64
}

// outageCharge is one outage-admitted request waiting to be charged.
type outageCharge struct {
	Req    ledger.ChargeRequest `json:"req"`
	Tenant string               `json:"tenant"`
	ReqID  string               `json:"request_id"`
	Source ledger.Source        `json:"source"` // of the Settle fallback
	// Running: admitted, usage not known yet. Charged at its hold if the
	// process restarts before it settles.
	Running bool `json:"running"`
	// Ambiguous: the failed Reserve may have applied under this id.
	Ambiguous bool `json:"ambiguous,omitempty"`
}

// outages tracks allowances and the charges owed to the ledger.
type outages struct {
	mu       sync.Mutex // guards everything below
	inOutage bool
	outage   map[string]outageUse // this outage, by tenant
	hour     map[string]outageUse // this clock hour, by tenant
	hourIdx  int64
	owed     map[ledger.RequestID]*outageCharge
	log      *outbox // the pending-writes log, where owed is persisted
}

// count is how many charges are owed.
func (o *outages) count() int {
	o.mu.Lock()
	defer o.mu.Unlock()
	return len(o.owed)
}

// restore takes the owed charges the pending-writes log returned at start
// and persists later changes there.
func (o *outages) restore(owed map[ledger.RequestID]*outageCharge, log *outbox) {
	o.mu.Lock()
	defer o.mu.Unlock()
	o.owed, o.log = owed, log
}

// admit takes one request of tokens from the tenant's allowance, if both the
// per-outage and the per-hour allowance have room.
func (o *outages) admit(t *policy.Tenant, tokens int64, now time.Time) (outageUse, bool) {
	al := t.Cfg.OutageAllowance
	if al.Requests <= 0 {
		return outageUse{}, false
	}
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.outage == nil {
		o.outage, o.hour = map[string]outageUse{}, map[string]outageUse{}
	}
	if idx := now.Unix() / 3600; idx != o.hourIdx {
		o.hourIdx, o.hour = idx, map[string]outageUse{}
	}
	o.inOutage = true
	cur, hr := o.outage[t.Name], o.hour[t.Name]
	fits := func(u outageUse) bool {
		return u.requests+1 <= al.Requests && (al.Tokens <= 0 || u.tokens+tokens <= al.Tokens)
	}
	if !fits(cur) || !fits(hr) {
		return cur, false
	}
	cur.requests, cur.tokens = cur.requests+1, cur.tokens+tokens
	hr.requests, hr.tokens = hr.requests+1, hr.tokens+tokens
	o.outage[t.Name], o.hour[t.Name] = cur, hr
	return cur, true
}

// refund returns an outage-admitted request that never ran.
func (o *outages) refund(tenant string, tokens int64) {
	o.mu.Lock()
	defer o.mu.Unlock()
	for _, m := range []map[string]outageUse{o.outage, o.hour} {
		if u, ok := m[tenant]; ok {
			u.requests, u.tokens = max(0, u.requests-1), max(0, u.tokens-tokens)
			m[tenant] = u
		}
	}
}

// recovered ends the outage: the next one starts with a full allowance.
func (o *outages) recovered() bool {
	o.mu.Lock()
	defer o.mu.Unlock()
	was := o.inOutage
	o.inOutage = false
	clear(o.outage)
	return was
}

// put records (or updates) an owed charge and persists it.
func (o *outages) put(ch *outageCharge) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	if o.owed == nil {
		o.owed = map[ledger.RequestID]*outageCharge{}
	}
	o.owed[ch.Req.Ref.ID] = ch
	if o.log == nil {
		return nil
	}
	return o.log.putCharge(ch)
}

// drop removes an owed charge and persists that it is no longer owed.
func (o *outages) drop(id ledger.RequestID) error {
	o.mu.Lock()
	defer o.mu.Unlock()
	ch, ok := o.owed[id]
	if !ok {
		return nil
	}
	delete(o.owed, id)
	if o.log == nil {
		return nil
	}
	return o.log.dropCharge(ch.Req.Ref, ch.ReqID)
}

// chargeable returns the owed charges whose usage is known.
func (o *outages) chargeable() []outageCharge {
	o.mu.Lock()
	defer o.mu.Unlock()
	var out []outageCharge
	for _, ch := range o.owed {
		if !ch.Running {
			out = append(out, *ch)
		}
	}
	return out
}

// admitOutage lets c run on its tenant's allowance while the ledger is
// unreachable; it reports false when the tenant has none left.
func (s *Server) admitOutage(c *call, cause error) bool {
	used, ok := s.outage.admit(c.t, c.held[ledger.Tokens], s.now())
	if !ok {
		return false
	}
	al := c.t.Cfg.OutageAllowance
	scopes := []ledger.Scope{{Kind: ledger.KindTenant, Key: c.t.ScopeKey, Limits: c.t.Limits}}
	scopes = append(scopes, c.extraScopes...)
	held := c.held
	held[ledger.Slots] = 0
	ch := &outageCharge{Tenant: c.t.Name, ReqID: c.reqID, Running: true, Source: ledger.SourceHeld,
		Ambiguous: errors.Is(cause, ledger.ErrAmbiguous),
		Req:       ledger.ChargeRequest{Ref: c.ref, Scopes: scopes, Amounts: held, At: c.arrival}}
	if err := s.outage.put(ch); err != nil {
		// Unpersisted, a restart would lose the charge: refuse instead.
		s.outage.refund(c.t.Name, c.held[ledger.Tokens])
		_ = s.outage.drop(c.ref.ID)
		s.log.Error("outage admission refused: owed charges cannot be persisted", "tenant", c.t.Name, "err", err)
		return false
	}
	c.outage = true
	s.m.OutageAdmissions.WithLabelValues(c.t.Name).Inc()
	s.log.Warn("ledger unreachable: admitting under the tenant's outage allowance", "tenant", c.t.Name,
		"used_requests", used.requests, "allowance_requests", al.Requests, "err", cause)
	s.record(audit.Record{Kind: "outage_admit", Tenant: c.t.Name, RequestID: c.reqID, TokensHeld: c.held[ledger.Tokens],
		Reason: fmt.Sprintf("ledger unreachable; allowance %d/%d requests", used.requests, al.Requests)})
	return true
}

// oweOutage records an outage-admitted call's usage for the later Charge.
func (s *Server) oweOutage(c *call, actual ledger.Amounts, src ledger.Source) {
	scopes := []ledger.Scope{{Kind: ledger.KindTenant, Key: c.t.ScopeKey, Limits: c.t.Limits}}
	scopes = append(scopes, c.extraScopes...)
	actual[ledger.Slots] = 0
	ch := &outageCharge{Tenant: c.t.Name, ReqID: c.reqID, Source: src,
		Req: ledger.ChargeRequest{Ref: c.ref, Scopes: scopes, Amounts: actual, At: c.arrival}}
	s.outage.mu.Lock()
	if prev := s.outage.owed[c.ref.ID]; prev != nil {
		ch.Ambiguous = prev.Ambiguous
	}
	s.outage.mu.Unlock()
	if err := s.outage.put(ch); err != nil {
		s.log.Error("owed outage charge not persisted; a restart before it is charged bills the hold", "request_id", c.reqID, "err", err)
	}
	s.outbox.kickNow()
}

// outageNotRun ends an outage-admitted call that never ran: the allowance
// is refunded and nothing is owed (an ambiguous Reserve that may have
// applied is released by id).
func (s *Server) outageNotRun(c *call) {
	s.outage.refund(c.t.Name, c.held[ledger.Tokens])
	s.outage.mu.Lock()
	ch := s.outage.owed[c.ref.ID]
	s.outage.mu.Unlock()
	if ch != nil && ch.Ambiguous {
		s.outbox.add(outboxEntry{op: opRelease, ref: c.ref, owner: s.owner, reqID: c.reqID})
	}
	if err := s.outage.drop(c.ref.ID); err != nil {
		s.log.Error("outage charges not persisted", "err", err)
	}
}

// chargeOutages settles owed outage usage once the ledger answers; it runs
// with the outbox.
func (s *Server) chargeOutages(ctx context.Context) {
	pending := s.outage.chargeable()
	if len(pending) == 0 {
		return
	}
	ch, ok := s.led.(Charger)
	for _, p := range pending {
		if !ok {
			s.log.Error("this ledger cannot charge outage usage; it is lost", "tenant", p.Tenant, "request_id", p.ReqID)
			_ = s.outage.drop(p.Req.Ref.ID)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := ch.Charge(cctx, p.Req)
		if errors.Is(err, ledger.ErrConflict) {
			// The id names a reservation (an ambiguous Reserve applied):
			// settle that record with the usage instead.
			src := p.Source
			if !src.Valid() {
				src = ledger.SourceHeld
			}
			_, err = s.led.Settle(cctx, p.Req.Ref, p.Req.Amounts, src)
		}
		cancel()
		s.noteLedger("charge", err)
		switch {
		case err == nil || errors.Is(err, ledger.ErrAlreadyFinal):
			s.record(audit.Record{Kind: "outage_charge", Tenant: p.Tenant, RequestID: p.ReqID,
				TokensCharged: p.Req.Amounts[ledger.Tokens], GPUMs: p.Req.Amounts[ledger.GPUMs], USDMicros: p.Req.Amounts[ledger.USDMicros]})
		case ledger.IsStoreError(err):
			continue
		default:
			s.log.Error("ledger refused an outage charge", "tenant", p.Tenant, "request_id", p.ReqID, "err", err)
		}
		if err := s.outage.drop(p.Req.Ref.ID); err != nil {
			s.log.Error("outage charges not persisted", "err", err)
		}
	}
}
