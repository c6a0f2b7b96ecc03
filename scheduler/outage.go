package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/audit"
)

// The outage allowance (issue 10): by default a ledger outage stops
// admission (503 ledger_unavailable). A tenant with an outage_allowance may
// go on while the ledger cannot answer, up to that many requests and tokens
// per outage and per clock hour (so a flapping ledger cannot multiply it).
// Such requests are counted here, audited as they are admitted, and charged
// into the ledger once it answers again, into the window in which they ran,
// exactly once (ledger Charge is idempotent by id). They take no ledger
// slot; the tenant's local concurrency cap still applies.

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
	req    ledger.ChargeRequest
	tenant string
	reqID  string
}

// outages tracks allowances and the charges owed to the ledger.
type outages struct {
	mu       sync.Mutex // guards everything below
	inOutage bool
	outage   map[string]outageUse // this outage, by tenant
	hour     map[string]outageUse // this clock hour, by tenant
	hourIdx  int64
	pending  []outageCharge
}

// admit takes one request of tokens from the tenant's allowance, if both the
// per-outage and the per-hour allowance have room.
func (o *outages) admit(t *tenant, tokens int64, now time.Time) (outageUse, bool) {
	al := t.cfg.OutageAllowance
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
	cur, hr := o.outage[t.name], o.hour[t.name]
	fits := func(u outageUse) bool {
		return u.requests+1 <= al.Requests && (al.Tokens <= 0 || u.tokens+tokens <= al.Tokens)
	}
	if !fits(cur) || !fits(hr) {
		return cur, false
	}
	cur.requests, cur.tokens = cur.requests+1, cur.tokens+tokens
	hr.requests, hr.tokens = hr.requests+1, hr.tokens+tokens
	o.outage[t.name], o.hour[t.name] = cur, hr
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

func (o *outages) owe(ch outageCharge) {
	o.mu.Lock()
	o.pending = append(o.pending, ch)
	o.mu.Unlock()
}

// admitOutage lets c run on its tenant's allowance while the ledger is
// unreachable; it reports false when the tenant has none left.
func (s *Server) admitOutage(c *call, cause error) bool {
	used, ok := s.outage.admit(c.t, c.held[ledger.Tokens], s.now())
	if !ok {
		return false
	}
	al := c.t.cfg.OutageAllowance
	c.outage = true
	c.ref.ID = ledger.NewRequestID() // its own id: an ambiguous Reserve is ended separately
	s.m.OutageAdmissions.WithLabelValues(c.t.name).Inc()
	s.log.Warn("ledger unreachable: admitting under the tenant's outage allowance", "tenant", c.t.name,
		"used_requests", used.requests, "allowance_requests", al.Requests, "err", cause)
	s.record(audit.Record{Kind: "outage_admit", Tenant: c.t.name, RequestID: c.reqID, TokensHeld: c.held[ledger.Tokens],
		Reason: fmt.Sprintf("ledger unreachable; allowance %d/%d requests", used.requests, al.Requests)})
	return true
}

// oweOutage records an outage-admitted call's usage for a later Charge.
func (s *Server) oweOutage(c *call, actual ledger.Amounts) {
	scopes := []ledger.Scope{{Kind: ledger.KindTenant, Key: c.t.key, Limits: c.t.limits}}
	scopes = append(scopes, c.extraScopes...)
	s.outage.owe(outageCharge{tenant: c.t.name, reqID: c.reqID,
		req: ledger.ChargeRequest{Ref: c.ref, Scopes: scopes, Amounts: actual, At: c.arrival}})
}

// chargeOutages settles owed outage usage once the ledger answers; it runs
// with the outbox.
func (s *Server) chargeOutages(ctx context.Context) {
	ch, ok := s.led.(Charger)
	s.outage.mu.Lock()
	pending := s.outage.pending
	s.outage.pending = nil
	s.outage.mu.Unlock()
	if len(pending) == 0 {
		return
	}
	var keep []outageCharge
	for _, p := range pending {
		if !ok {
			s.log.Error("this ledger cannot charge outage usage; it is lost", "tenant", p.tenant, "request_id", p.reqID)
			continue
		}
		cctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := ch.Charge(cctx, p.req)
		cancel()
		s.noteLedger("charge", err)
		switch {
		case err == nil || errors.Is(err, ledger.ErrAlreadyFinal):
			s.record(audit.Record{Kind: "outage_charge", Tenant: p.tenant, RequestID: p.reqID,
				TokensCharged: p.req.Amounts[ledger.Tokens], GPUMs: p.req.Amounts[ledger.GPUMs], USDMicros: p.req.Amounts[ledger.USDMicros]})
		case ledger.IsStoreError(err):
			keep = append(keep, p)
		default:
			s.log.Error("ledger refused an outage charge", "tenant", p.tenant, "request_id", p.reqID, "err", err)
		}
	}
	if len(keep) > 0 {
		s.outage.mu.Lock()
		s.outage.pending = append(keep, s.outage.pending...)
		s.outage.mu.Unlock()
	}
}
