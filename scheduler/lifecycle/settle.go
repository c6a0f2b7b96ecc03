package lifecycle

import (
	"context"
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/abuse"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/settle"
)

// The end of a dispatched call: settlement exactly once, from what the
// replica reported, and the release of its room and slots.

// finish settles a dispatched call exactly once from the usage it reported,
// reconciles fair share, frees room and slots, and records metrics. err is
// the call's outcome (nil on success).
func (e *Engine) finish(c *call, err error) {
	if c.phase != phaseDispatched && c.phase != phaseStreaming {
		if !c.phase.terminal() {
			e.illegal(c, transitionError{c.phase, phaseSettled})
		}
		return
	}
	now := e.now()
	if c.tr != nil {
		defer e.traceFinished(c, err, now)
	}
	if c.stream != nil {
		c.usage = e.settleUsage(c)
		_ = c.stream.Close()
	} else if c.sent && !c.usage.Known {
		// Sent, but no stream nor answer usage: prefill may have run.
		c.usage = sentUsage(c)
	}
	if c.resp != nil {
		_ = c.resp.Body.Close() // read whole, or cut: vLLM aborts it
	}
	if c.usage.Final {
		// Completions while polls time out excuse a slow /metrics
		// (Observe).
		c.rep.Finished.Add(1)
	}
	cause := context.Cause(c.ctx)
	aborted := err != nil && c.sent && !c.usage.Final
	switch {
	case aborted && errors.Is(cause, apierr.ErrClientStalled):
		c.abortCause = "client_stalled"
	case aborted && errors.Is(cause, apierr.ErrClientGone):
		c.abortCause = "client_disconnect"
	case aborted && (errors.Is(cause, apierr.ErrDeadline) || errors.Is(err, apierr.ErrDeadline)):
		c.abortCause = "deadline"
	case aborted && errors.Is(cause, apierr.ErrDraining):
		c.abortCause = "shutdown"
	case aborted && errors.Is(cause, ledger.ErrLeaseLost):
		c.abortCause = "lease_lost"
	}
	if c.abortCause != "" {
		e.m.UpstreamAborts.WithLabelValues(c.rep.Name, c.abortCause).Inc()
	}
	var use gpu.Use
	if c.rep.Clock != nil {
		use = c.rep.Clock.End(now, c.ticket)
	}
	gpuMs := gpu.GPUMs(use.GPUNs)
	actual, src := e.actual(c, gpuMs)
	actual = e.boundStopped(c, actual) // grow.go
	if src != ledger.SourceNotSent {
		actual[ledger.GPUJoules] = gpu.MilliJoules(use.EnergyUJ)
	}
	e.observeOutput(c, actual[ledger.OutputTokens], src) // predict.go
	c.actualCost = e.costOf(c, actual)
	e.q.Reconcile(c.t.Name, c.band, c.cost, c.actualCost)
	e.settle(c, actual, src)
	e.reps.Leave(c.rep, c.size, c.seq, c.sent && !c.usage.Final, now)
	c.t.RT.Inflight.Add(-1)
	c.keyInflight(-1)
	c.t.RT.InflightTokens.Add(-c.size)
	e.movePool(c, gate.SpotNone)
	seriesOf(c.t, e.m).inflight.Dec()
	e.attr.Overrun(c.t.Name, max(0, gpuMs-c.held[ledger.GPUMs]))
	if c.sent {
		kind := abuse.Settled
		if c.abortCause == "client_disconnect" {
			kind = abuse.Disconnected
		}
		e.observeAbuse(c.t.Name, abuse.Event{Kind: kind, Tokens: actual[ledger.Tokens], USDMicros: actual[ledger.USDMicros], GPUMs: gpuMs})
	}
	if est := e.gpu.Estimator(c.rep.Name); est != nil && src == ledger.SourceFinal && gpuMs > 0 {
		est.Observe(actual[ledger.InputTokens], actual[ledger.OutputTokens], float64(gpuMs))
	}
	e.forget(c)
	e.q.Unpark(c.t.Name)
	for _, n := range e.pools.UnparkFull(c.place.Pool) {
		e.q.Unpark(n)
	}
	// Freed room matters only to queued work; an empty queue's next
	// arrival signals the loop itself (Queue.Ready). A wake per completion
	// readied the loop's goroutine, often on an idle thread: a futex round.
	if depth, _ := e.q.Len(); depth > 0 {
		e.Wake()
	}
}

// actual derives the amounts to settle from the usage vLLM reported (or the
// stream's early-end estimate, see vllm.Stream.Settle).
func (e *Engine) actual(c *call, gpuMs int64) (ledger.Amounts, ledger.Source) {
	var a ledger.Amounts
	if !c.ran() {
		return a, ledger.SourceNotSent
	}
	src := ledger.SourceFinal
	if !c.usage.Final {
		src = ledger.SourcePartial
	}
	in, out := int64(c.usage.PromptTokens), int64(c.usage.CompletionTokens)
	a[ledger.Requests] = 1
	a[ledger.InputTokens] = in
	a[ledger.OutputTokens] = out
	a[ledger.Tokens] = in + out
	a[ledger.GPUMs] = gpuMs
	a[ledger.USDMicros] = c.pol.PriceCached(c.req.Model, in, int64(c.usage.CachedTokens), out)
	return a, src
}

func (e *Engine) costOf(c *call, a ledger.Amounts) int64 {
	cost := c.pol.Cfg.Server.Cost
	if cost.Unit == "gpu_ms" {
		return a[ledger.GPUMs]
	}
	return cost.WIn*a[ledger.InputTokens] + cost.WOut*a[ledger.OutputTokens]
}

// settle charges the ledger once; a store failure goes to the pending-writes
// log (scheduler/settle), which retries with the same id (Settle is
// idempotent). With a Redis ledger the Settle is written ahead to the log's
// file, where there is one, so a
// process killed before the store answers settles it exactly when it
// starts again; otherwise the lease is the backstop.
func (e *Engine) settle(c *call, actual ledger.Amounts, src ledger.Source) {
	e.countUsage(c, actual)
	if c.outage {
		if src != ledger.SourceNotSent {
			e.oweOutage(c, actual, src)
			e.to(c, phaseUnresolved) // the owed charge ends it
		} else {
			e.outageNotRun(c)
			e.to(c, phaseSettled)
		}
		return
	}
	e.settler.Untrack(&c.lease)
	ended := phaseSettled
	defer func() { e.to(c, ended) }()
	e.settler.WriteAhead(c.ref, actual, src, c.reqID)
	op := c.ledgerOp()
	st, err := e.led.Settle(op, c.ref, actual, src)
	op.cancel()
	rec := audit.Record{Kind: audit.KindSettle, Tenant: c.t.Name, RequestID: c.reqID, Source: src.String(),
		TokensHeld: c.held[ledger.Tokens], TokensCharged: actual[ledger.Tokens], GPUMs: actual[ledger.GPUMs], USDMicros: actual[ledger.USDMicros],
		Reason: c.abortCause}
	if err == nil {
		rec.State = st.State.String()
	} else {
		rec.Code = "settle_failed"
	}
	e.record(rec)
	e.noteLedger("settle", err)
	if err != nil && ledger.IsStoreError(err) {
		e.queueSettle(c, actual, src)
		ended = phaseUnresolved
		return
	}
	e.settler.Landed(c.ref.ID)
	if err != nil {
		e.log.Error("ledger settle refused", "request_id", c.reqID, "err", err)
	}
}

// The call's side of the settlement room (scheduler/settle): the room
// takes ledger values, the lifecycle knows the call they come from.

// queueRelease hands the ending of c's never-dispatched hold to the
// pending-writes log.
func (e *Engine) queueRelease(c *call) {
	e.settler.Untrack(&c.lease)
	e.settler.QueueRelease(c.ref, c.reqID)
}

// queueReplay hands the ending of an ambiguous keyed Reserve to the log.
func (e *Engine) queueReplay(c *call, rr ledger.ReserveRequest) {
	e.settler.Untrack(&c.lease)
	e.settler.QueueReplay(c.ref, rr, c.reqID)
}

// queueSettle hands the settlement of c to the log.
func (e *Engine) queueSettle(c *call, actual ledger.Amounts, src ledger.Source) {
	e.settler.Untrack(&c.lease)
	e.settler.QueueSettle(c.ref, actual, src, c.reqID)
}

// outageScopes are the scopes an outage charge of c lands in: those of its
// Reserve.
func outageScopes(c *call) []ledger.Scope {
	scopes := []ledger.Scope{{Kind: ledger.KindTenant, Key: c.t.ScopeKey, Limits: c.t.Limits}}
	return append(scopes, c.extraScopes...)
}

// admitOutage lets c run on its tenant's allowance while the ledger is
// unreachable (settle/outage.go); it reports false when the tenant has
// none left.
func (e *Engine) admitOutage(c *call, cause error) bool {
	held := c.held
	held[ledger.Slots] = 0
	ch := &settle.OwedCharge{Tenant: c.t.Name, ReqID: c.reqID, Running: true, Source: ledger.SourceHeld,
		Ambiguous: errors.Is(cause, ledger.ErrAmbiguous),
		Req:       ledger.ChargeRequest{Ref: c.ref, Scopes: outageScopes(c), Amounts: held, At: c.arrival}}
	al := c.t.Cfg.OutageAllowance
	used, ok := e.settler.AdmitOutage(al, c.held[ledger.Tokens], ch)
	if !ok {
		return false
	}
	c.outage = true
	e.m.OutageAdmissions.WithLabelValues(c.t.Name).Inc()
	e.log.Warn("ledger unreachable: admitting under the tenant's outage allowance", "tenant", c.t.Name,
		"used_requests", used.Requests, "allowance_requests", al.Requests, "err", cause)
	e.record(audit.Record{Kind: "outage_admit", Tenant: c.t.Name, RequestID: c.reqID, TokensHeld: c.held[ledger.Tokens],
		Reason: fmt.Sprintf("ledger unreachable; allowance %d/%d requests", used.Requests, al.Requests)})
	return true
}

// oweOutage records an outage-admitted call's usage for the later Charge.
func (e *Engine) oweOutage(c *call, actual ledger.Amounts, src ledger.Source) {
	actual[ledger.Slots] = 0
	e.settler.OweOutage(&settle.OwedCharge{Tenant: c.t.Name, ReqID: c.reqID, Source: src,
		Req: ledger.ChargeRequest{Ref: c.ref, Scopes: outageScopes(c), Amounts: actual, At: c.arrival}})
}

// outageNotRun ends an outage-admitted call that never ran.
func (e *Engine) outageNotRun(c *call) {
	e.settler.OutageNotRun(c.t.Name, c.held[ledger.Tokens], c.ref, c.reqID)
}
