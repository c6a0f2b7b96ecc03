package scheduler

import (
	"context"
	"errors"
	"fmt"
	"io"
	"slices"
	"time"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/abuse"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/vllm"
)

// call is one admitted request from reservation to settlement. Its ledger
// record ends in exactly one outcome: released (never dispatched), settled
// (usage known, or zero when nothing was sent) or left to lease expiry.
type call struct {
	ctx          context.Context
	cancel       context.CancelCauseFunc
	stopDeadline context.CancelFunc // nil without a client deadline

	pol      *policy
	t        *tenant
	ep       vllm.Endpoint
	req      *vllm.Request
	plan     vllm.Plan
	reqID    string
	ref      ledger.Ref
	held     ledger.Amounts
	grant    ledger.Grant
	cost     int64 // predicted fair-share cost
	size     int64 // replica room: input + allowed output
	band     int
	arrival  time.Time
	deadline time.Time // the client's overall deadline; zero when none
	handle   queue.Handle[*call]
	wf       *workflow // nil without X-Workflow-Id
	// extraScopes are the workflow and global scopes of the Reserve.
	extraScopes []ledger.Scope
	// outage: admitted on the tenant's outage allowance, without a ledger
	// record; settled later with a ledger Charge.
	outage bool

	// Delivered by the dispatch loop (exactly one of them per queued spell).
	dispatched chan *replica // size 1
	expired    chan struct{} // size 1

	// Set once dispatched.
	rep        *replica
	ticket     gpu.Ticket
	dispatchAt time.Time
	firstByte  time.Time
	lastGood   time.Time // last successful ledger Extend send time (fencing)
	settled    bool
	stream     *vllm.Stream
	sent       bool // a request may have reached the replica
	usage      vllm.Usage
	abortCause string
	actualCost int64
}

// admission is what the edge learned from the HTTP request.
type admission struct {
	ep       vllm.Endpoint
	body     []byte // owned by the call from here on
	reqID    string
	timeout  time.Duration // client's X-Request-Timeout; 0 none
	idemKey  string
	workflow string
	band     int
	bandSet  bool
	retry    bool
}

// admit runs steps 2–4 of the request path: bound, reserve, enqueue. On
// success the call is queued and holds a reservation; on error nothing is
// held.
func (s *Server) admit(ctx context.Context, t *tenant, pol *policy, a admission) (*call, error) {
	arrival := s.now()
	req, err := vllm.Parse(a.ep, a.body, vllm.CountOptions{TemplateTokensPerMessage: int(pol.cfg.Server.TemplateAllowance)})
	if err != nil {
		return nil, err
	}
	if req.Model != "" && !s.reps.knowsModel(req.Model) {
		return nil, fmt.Errorf("model %q: %w", req.Model, ErrUnknownModel)
	}
	if cl, ok := pol.clampOf(t.name, arrival); ok && len(cl.Models) > 0 && !slices.Contains(cl.Models, req.Model) {
		return nil, fmt.Errorf("model %q is not allowed while the tenant is clamped (%s): %w", req.Model, cl.Reason, ErrClamped)
	}
	if !s.reps.anyUp() {
		return nil, ErrNoReplica
	}
	if pol.cfg.Upstream.TokenCount == "tokenize" && !req.InputExact {
		req = s.tokenize(ctx, req)
	}
	in := int64(req.TotalInputTokens())
	if in > t.cfg.MaxInputTokens {
		return nil, fmt.Errorf("input of %d tokens exceeds the tenant's max_input_tokens %d: %w", in, t.cfg.MaxInputTokens, ErrContextLength)
	}
	plan, err := req.Plan(vllm.Limits{MaxModelLen: int(s.reps.maxModelLen()), TenantMaxOutput: int(t.cfg.MaxOutputTokens)})
	if err != nil {
		return nil, err
	}
	c := &call{
		pol: pol, t: t, ep: a.ep, req: req, plan: plan, reqID: a.reqID,
		arrival: arrival, band: t.cfg.Priority,
		dispatched: make(chan *replica, 1), expired: make(chan struct{}, 1),
	}
	if a.bandSet && a.band > c.band {
		c.band = a.band // a request may lower its priority, never raise it
	}
	if a.workflow != "" {
		wf, ok := s.wfs.getOrCreate(t.name, a.workflow, t.cfg.Workflow, arrival)
		if !ok {
			return nil, invalidf("X-Workflow-Id", "unknown workflow %q and the tenant has no workflow_defaults", a.workflow)
		}
		left, err := wf.admitCall(arrival, a.retry)
		if err != nil {
			return nil, err
		}
		if left > 0 && (a.timeout <= 0 || left < a.timeout) {
			a.timeout = left // the call may not outlive its envelope
		}
		c.wf = wf
	}
	if a.timeout > 0 {
		c.deadline = arrival.Add(a.timeout)
	}
	if !c.deadline.IsZero() {
		// The client's deadline bounds queueing and running alike.
		var stop context.CancelFunc
		ctx, stop = context.WithDeadlineCause(ctx, c.deadline, ErrDeadline)
		c.stopDeadline = stop
	}
	c.ctx, c.cancel = context.WithCancelCause(ctx)
	c.ref = ledger.Ref{Tenant: t.key, ID: ledger.NewRequestID()}
	if a.idemKey != "" {
		c.ref.ID = s.keyer.IdempotentID(t.key, a.idemKey)
	}
	if err := s.reserve(c, a); err != nil {
		c.cancel(err)
		return nil, err
	}
	if k := s.reps.maxCapacity(); k > 0 && c.size > k {
		s.release(c)
		return nil, fmt.Errorf("input plus output of %d tokens exceeds every replica's capacity (%d): %w", c.size, k, ErrContextLength)
	}
	s.mu.Lock()
	s.queued[c] = struct{}{}
	s.mu.Unlock()
	it, err := s.q.Enqueue(queue.Request[*call]{
		Tenant: t.name, Band: c.band, Cost: c.cost, BodyBytes: int64(len(a.body)),
		Arrival: arrival, Deadline: c.deadline, Payload: c,
	})
	if err != nil {
		s.release(c)
		s.forget(c)
		return nil, err
	}
	c.handle = it.Handle
	t.rt.queued.Add(1)
	s.observeAbuse(t.name, abuse.Event{Kind: abuse.Admitted, AtCap: int64(c.plan.Cap) >= t.cfg.MaxOutputTokens})
	s.record(audit.Record{Kind: audit.KindAdmit, Tenant: t.name, RequestID: c.reqID, Reason: "ledger " + c.ref.ID.String(),
		TokensHeld: c.held[ledger.Tokens], GPUMs: c.held[ledger.GPUMs], USDMicros: c.held[ledger.USDMicros]})
	return c, nil
}

// tokenize replaces the bytes bound with the replica's exact count; on any
// failure the bound stays (documented fallback).
func (s *Server) tokenize(ctx context.Context, req *vllm.Request) *vllm.Request {
	for _, r := range s.reps.reps {
		if o := r.obs.Load(); o == nil || !o.ok {
			continue
		}
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		counts, mml, err := s.up.Tokenize(tctx, r.url, req.Model, req)
		cancel()
		if err != nil {
			continue
		}
		if mml > 0 {
			r.maxModelLen.Store(int64(mml))
		}
		if exact, err := req.WithExactInput(counts); err == nil {
			return exact
		}
	}
	return req
}

// reserve sizes the holds and reserves them in the ledger. When a block
// budget on tokens cannot fit the full output cap but can fit a smaller one,
// the cap is lowered once to what the budget allows.
func (s *Server) reserve(c *call, a admission) error {
	for attempt := 0; ; attempt++ {
		s.sizeHolds(c)
		rr := ledger.ReserveRequest{
			Ref: c.ref, Owner: s.owner, Held: c.held,
			Scopes:        []ledger.Scope{{Kind: ledger.KindTenant, Key: c.t.key, Limits: c.t.limits}},
			LeaseTTL:      c.pol.leaseTTL,
			PolicyVersion: c.pol.version,
		}
		c.extraScopes = c.extraScopes[:0]
		if c.wf != nil {
			ws, _ := c.wf.scope(s.keyer.Key(ledger.KindWorkflow, c.t.name+"\x00"+c.wf.id))
			c.extraScopes = append(c.extraScopes, ws)
		}
		if len(c.pol.global) > 0 {
			c.extraScopes = append(c.extraScopes, ledger.Scope{Kind: ledger.KindGlobal, Key: s.keyer.GlobalKey(), Limits: c.pol.global})
		}
		rr.Scopes = append(rr.Scopes, c.extraScopes...)
		ctx, cancel := s.ledgerCtx(c.ctx)
		g, err := s.led.Reserve(ctx, rr)
		cancel()
		s.noteLedger("reserve", err)
		var d *ledger.DeniedError
		switch {
		case err == nil && g.Replayed:
			return ErrInProgress
		case err == nil:
			c.grant = g
			return nil
		case a.idemKey != "" && errors.Is(err, ledger.ErrAlreadyFinal):
			return ErrAlreadyDone
		case a.idemKey != "" && errors.Is(err, ledger.ErrConflict):
			return fmt.Errorf("Idempotency-Key reused with a different request: %w", ErrInProgress)
		case ledger.IsStoreError(err):
			if errors.Is(err, ledger.ErrAmbiguous) {
				// The hold may exist: end it by id once the store answers
				// (a replay of the same id is idempotent; unknown ids are
				// no-ops).
				s.queueOutbox(c, ledger.Amounts{}, ledger.SourceNotSent)
			}
			if s.admitOutage(c, err) {
				return nil
			}
		case attempt == 0 && errors.As(err, &d) && lowerCap(c, d):
			// Send what the budgets still allow rather than refuse.
			continue
		case errors.As(err, &d):
			s.observeAbuse(c.t.name, abuse.Event{Kind: abuse.Denied})
		}
		return err
	}
}

// lowerCap shrinks the call's output cap to fit a token budget denial, when
// at least one output token per choice still fits.
func lowerCap(c *call, d *ledger.DeniedError) bool {
	if d.Dim != ledger.Tokens && d.Dim != ledger.OutputTokens {
		return false
	}
	free := d.Limit - d.Committed - d.Reserved
	if d.Dim == ledger.Tokens {
		free -= int64(c.plan.InputTokens)
	}
	perChoice := free / int64(max(1, c.plan.Choices))
	if perChoice < 1 || perChoice >= int64(c.plan.Cap) {
		return false
	}
	c.plan.Cap = int(perChoice)
	c.plan.OutputTokens = c.plan.Cap * c.plan.Choices
	return true
}

// sizeHolds derives the ledger holds, queue cost and replica size from the
// plan.
func (s *Server) sizeHolds(c *call) {
	in, out := int64(c.plan.InputTokens), int64(c.plan.OutputTokens)
	var h ledger.Amounts
	h[ledger.Requests] = 1
	h[ledger.InputTokens] = in
	h[ledger.OutputTokens] = out
	h[ledger.Tokens] = in + out
	h[ledger.GPUMs] = s.gpu.Hold(in, out)
	h[ledger.USDMicros] = c.pol.priceMicros(c.req.Model, in, out)
	c.held = h
	c.size = in + out
	cost := c.pol.cfg.Server.Cost
	if cost.Unit == "gpu_ms" {
		c.cost = max(1, h[ledger.GPUMs])
	} else {
		c.cost = cost.WIn*in + cost.WOut*out
	}
}

// release frees a never-dispatched call's holds. A store error leaves the
// hold to lease expiry (the backstop), never to a second dispatch.
func (s *Server) release(c *call) {
	if c.outage {
		s.outage.refund(c.t.name, c.held[ledger.Tokens])
		return
	}
	ctx, cancel := s.ledgerCtx(c.ctx)
	defer cancel()
	err := s.led.Release(ctx, c.ref, s.owner)
	reason := "released"
	if cause := context.Cause(c.ctx); cause != nil {
		reason = cause.Error()
	}
	s.record(audit.Record{Kind: audit.KindRelease, Tenant: c.t.name, RequestID: c.reqID, Reason: reason, TokensHeld: c.held[ledger.Tokens]})
	s.noteLedger("release", err)
	switch {
	case err == nil, errors.Is(err, ledger.ErrAlreadyFinal), errors.Is(err, ledger.ErrNotFound):
	case errors.Is(err, ledger.ErrDispatched), ledger.IsStoreError(err):
		// An ambiguous MarkDispatched may have applied, or the store is
		// down: end the record with a zero NotSent settlement, retried by
		// the outbox until definite (LEDGER §4).
		s.queueOutbox(c, ledger.Amounts{}, ledger.SourceNotSent)
	default:
		s.log.Warn("ledger release refused; the lease will expire it", "request_id", c.reqID, "err", err)
	}
}

// forget drops a call from the drain bookkeeping.
func (s *Server) forget(c *call) {
	s.mu.Lock()
	delete(s.queued, c)
	delete(s.running, c)
	if len(s.queued) == 0 && len(s.running) == 0 {
		s.idle.Broadcast()
	}
	s.mu.Unlock()
}

// onExpire is the queue's expiry callback (queue mutex held: hand off only).
func (s *Server) onExpire(it queue.Item[*call]) {
	select {
	case it.Payload.expired <- struct{}{}:
	default:
	}
}

// await blocks until the call is dispatched to a replica with a ledger
// slot, expires, or its client leaves. On any error the call holds nothing.
func (s *Server) await(c *call) error {
	defer c.t.rt.queued.Add(-1) // counted from a successful admit
	for {
		var rep *replica
		select {
		case rep = <-c.dispatched:
		case <-c.expired:
			s.release(c)
			s.forget(c)
			return queue.ErrExpired
		case <-c.ctx.Done():
			if s.q.Cancel(c.handle) {
				s.release(c)
				s.forget(c)
				return context.Cause(c.ctx)
			}
			// Lost the race: dispatch or expiry owns the entry; one of
			// them is about to be (or was) delivered.
			select {
			case rep = <-c.dispatched:
				s.reps.release(rep, c.size)
				s.q.Release(c.handle)
				s.release(c)
				s.forget(c)
				s.signal(s.wake)
				return context.Cause(c.ctx)
			case <-c.expired:
				s.release(c)
				s.forget(c)
				return queue.ErrExpired
			}
		}
		err := s.markDispatched(c)
		var d *ledger.DeniedError
		if errors.As(err, &d) && d.Dim == ledger.Slots {
			// Another instance holds the tenant's slots: back to the head
			// of the queue, still holding the budget.
			s.reps.release(rep, c.size)
			s.q.Requeue(c.handle)
			continue
		}
		s.q.Release(c.handle)
		if err != nil {
			s.reps.release(rep, c.size)
			s.release(c)
			s.forget(c)
			s.signal(s.wake)
			return err
		}
		c.rep = rep
		c.dispatchAt = s.now()
		c.t.rt.inflight.Add(1)
		c.t.rt.inflightTokens.Add(c.size)
		ts := c.t.series(s.m)
		ts.inflight.Inc()
		ts.queueWait.Observe(c.dispatchAt.Sub(c.arrival).Seconds())
		c.lastGood = s.now()
		s.mu.Lock()
		delete(s.queued, c)
		s.running[c] = struct{}{}
		s.mu.Unlock()
		if rep.clock != nil {
			c.ticket = rep.clock.Start(c.dispatchAt)
		}
		// The slot round trip took time: re-check the deadline before the
		// first upstream byte.
		if dl := c.queueDeadline(); !dl.IsZero() && !c.dispatchAt.Before(dl) {
			s.finish(c, queue.ErrExpired)
			return queue.ErrExpired
		}
		return nil
	}
}

// queueDeadline is the effective queue deadline of the call.
func (c *call) queueDeadline() time.Time {
	d := c.arrival.Add(c.pol.maxWait)
	if w := c.t.cfg.Queue.MaxWait; w > 0 {
		d = minTime(d, c.arrival.Add(w))
	}
	if !c.deadline.IsZero() {
		d = minTime(d, c.deadline)
	}
	return d
}

func minTime(a, b time.Time) time.Time {
	if b.Before(a) {
		return b
	}
	return a
}

func (s *Server) markDispatched(c *call) error {
	if c.outage {
		return nil // no ledger record; the local concurrency cap applied
	}
	ctx, cancel := s.ledgerCtx(c.ctx)
	defer cancel()
	err := s.led.MarkDispatched(ctx, c.ref, s.owner)
	s.noteLedger("dispatch", err)
	return err
}

// execute sends the call upstream: on the chosen replica, or on another
// with room if the chosen one refused the connection before any byte was
// sent. It returns with c.stream open (200 headers received) or an error.
func (s *Server) execute(c *call) error {
	body := c.req.Rewrite(make([]byte, 0, len(c.req.Body())+96), c.plan.Cap)
	tried := map[*replica]bool{}
	for {
		tried[c.rep] = true
		st, err := s.up.Stream(c.ctx, c.rep.url, c.ep.Path(), body, c.reqID)
		if err == nil {
			c.sent = true
			c.stream = st
			c.firstByte = s.now()
			s.m.UpstreamLatency.WithLabelValues(c.rep.name).Observe(c.firstByte.Sub(c.dispatchAt).Seconds())
			return nil
		}
		var ue *vllm.UpstreamError
		retry := errors.Is(err, vllm.ErrNotSent) || (errors.As(err, &ue) && ue.Retryable())
		if !errors.Is(err, vllm.ErrNotSent) && !errors.As(err, &ue) {
			// The replica may have started it. A non-200 answer, by
			// contrast, is vLLM refusing before it queued anything.
			c.sent = true
		}
		if !retry || c.ctx.Err() != nil {
			return err
		}
		next := s.reps.choose(c.size, true, c.rep)
		if next == nil || tried[next] {
			if next != nil {
				s.reps.release(next, c.size)
			}
			return fmt.Errorf("%w: %w", ErrNoReplica, err)
		}
		s.moveClock(c, next)
		s.reps.release(c.rep, c.size)
		c.rep = next
		s.log.Warn("replica refused the request before it started; retrying on another", "request_id", c.reqID, "err", err)
	}
}

// moveClock restarts GPU-ms attribution on the replica that will run c.
func (s *Server) moveClock(c *call, next *replica) {
	now := s.now()
	if c.rep.clock != nil {
		c.rep.clock.End(now, c.ticket)
	}
	if next.clock != nil {
		c.ticket = next.clock.Start(now)
	}
}

// finish settles a dispatched call exactly once from the usage it reported,
// reconciles fair share, frees room and slots, and records metrics. err is
// the call's outcome (nil on success).
func (s *Server) finish(c *call, err error) {
	if c.settled {
		return
	}
	c.settled = true
	now := s.now()
	if c.stream != nil {
		c.usage = c.stream.Settle(c.plan.Choices, abortAllowance, c.plan.Cap, c.plan.InputTokens)
		_ = c.stream.Close()
	} else if c.sent {
		// Sent, but no stream: prefill may have run.
		c.usage = vllm.Usage{PromptTokens: c.plan.InputTokens}
	}
	cause := context.Cause(c.ctx)
	aborted := err != nil && c.sent && !c.usage.Final
	switch {
	case aborted && errors.Is(cause, ErrClientGone):
		c.abortCause = "client_disconnect"
	case aborted && (errors.Is(cause, ErrDeadline) || errors.Is(err, ErrDeadline)):
		c.abortCause = "deadline"
	case aborted && errors.Is(cause, ErrDraining):
		c.abortCause = "shutdown"
	case aborted && errors.Is(cause, ledger.ErrLeaseLost):
		c.abortCause = "lease_lost"
	}
	if c.abortCause != "" {
		s.m.UpstreamAborts.WithLabelValues(c.rep.name, c.abortCause).Inc()
	}
	var gpuNs int64
	if c.rep.clock != nil {
		gpuNs = c.rep.clock.End(now, c.ticket)
	}
	gpuMs := gpu.GPUMs(gpuNs)
	actual, src := s.actual(c, gpuMs)
	c.actualCost = s.costOf(c, actual)
	s.q.Reconcile(c.t.name, c.band, c.cost, c.actualCost)
	s.settle(c, actual, src)
	if c.usage.Final {
		c.rep.finished.Add(1) // it left the batch: room before the next scrape (roomOf)
	}
	s.reps.release(c.rep, c.size)
	c.t.rt.inflight.Add(-1)
	c.t.rt.inflightTokens.Add(-c.size)
	c.t.series(s.m).inflight.Dec()
	s.attr.Settle(c.t.name, gpuNs, max(0, gpuMs-c.held[ledger.GPUMs]))
	if c.sent {
		kind := abuse.Settled
		if c.abortCause == "client_disconnect" {
			kind = abuse.Disconnected
		}
		s.observeAbuse(c.t.name, abuse.Event{Kind: kind, Tokens: actual[ledger.Tokens], USDMicros: actual[ledger.USDMicros], GPUMs: gpuMs})
	}
	if est := s.gpu.Estimator(c.rep.name); est != nil && src == ledger.SourceFinal && gpuMs > 0 {
		est.Observe(actual[ledger.InputTokens], actual[ledger.OutputTokens], float64(gpuMs))
	}
	s.forget(c)
	s.q.Unpark(c.t.name)
	s.signal(s.wake)
}

// abortAllowance is the tokens per unfinished choice charged for what vLLM
// may have generated between the last chunk read and the abort: one stream
// interval at vLLM's default --stream-interval of 1 (VLLM.md, left to the
// implementer).
const abortAllowance = 1

// actual derives the amounts to settle from the usage vLLM reported (or the
// stream's early-end estimate, see vllm.Stream.Settle).
func (s *Server) actual(c *call, gpuMs int64) (ledger.Amounts, ledger.Source) {
	var a ledger.Amounts
	if !c.sent {
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
	a[ledger.USDMicros] = c.pol.priceMicros(c.req.Model, in, out)
	return a, src
}

func (s *Server) costOf(c *call, a ledger.Amounts) int64 {
	cost := c.pol.cfg.Server.Cost
	if cost.Unit == "gpu_ms" {
		return a[ledger.GPUMs]
	}
	return cost.WIn*a[ledger.InputTokens] + cost.WOut*a[ledger.OutputTokens]
}

// settle charges the ledger once; a store failure goes to the outbox, which
// retries with the same id (Settle is idempotent), and the lease is the
// backstop if the process dies first.
func (s *Server) settle(c *call, actual ledger.Amounts, src ledger.Source) {
	if c.outage {
		if src != ledger.SourceNotSent {
			s.oweOutage(c, actual)
		} else {
			s.outage.refund(c.t.name, c.held[ledger.Tokens])
		}
		return
	}
	ctx, cancel := s.ledgerCtx(c.ctx)
	st, err := s.led.Settle(ctx, c.ref, actual, src)
	cancel()
	rec := audit.Record{Kind: audit.KindSettle, Tenant: c.t.name, RequestID: c.reqID, Source: src.String(),
		TokensHeld: c.held[ledger.Tokens], TokensCharged: actual[ledger.Tokens], GPUMs: actual[ledger.GPUMs], USDMicros: actual[ledger.USDMicros],
		Reason: c.abortCause}
	if err == nil {
		rec.State = st.State.String()
	} else {
		rec.Code = "settle_failed"
	}
	s.record(rec)
	s.noteLedger("settle", err)
	if err != nil && ledger.IsStoreError(err) {
		s.queueOutbox(c, actual, src)
		return
	}
	if err != nil {
		s.log.Error("ledger settle refused", "request_id", c.reqID, "err", err)
	}
}

// settleRetry is one outbox entry.
type settleRetry struct {
	ref    ledger.Ref
	actual ledger.Amounts
	src    ledger.Source
	reqID  string
}

func (s *Server) queueOutbox(c *call, actual ledger.Amounts, src ledger.Source) {
	s.mu.Lock()
	s.outbox = append(s.outbox, settleRetry{ref: c.ref, actual: actual, src: src, reqID: c.reqID})
	s.mu.Unlock()
	s.signal(s.outboxC)
}

// outboxLoop retries failed settlements every second until they land.
func (s *Server) outboxLoop(ctx context.Context) {
	t := time.NewTicker(time.Second)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		case <-s.outboxC:
		}
		s.flushOutbox(ctx)
		s.chargeOutages(ctx)
	}
}

// flushOutbox retries every pending settlement once, bounded per call.
func (s *Server) flushOutbox(ctx context.Context) {
	s.mu.Lock()
	pending := s.outbox
	s.outbox = nil
	s.mu.Unlock()
	var keep []settleRetry
	for _, c := range pending {
		sctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		_, err := s.led.Settle(sctx, c.ref, c.actual, c.src)
		cancel()
		s.noteLedger("settle", err)
		if err != nil && ledger.IsStoreError(err) {
			keep = append(keep, c)
			continue
		}
		if err != nil && !errors.Is(err, ledger.ErrNotFound) && !errors.Is(err, ledger.ErrAlreadyFinal) {
			// NotFound: an ambiguous Reserve that never applied. AlreadyFinal:
			// ended meanwhile (lease expiry). Anything else needs a look.
			s.log.Error("outbox settle refused", "request_id", c.reqID, "err", err)
		}
	}
	if len(keep) > 0 {
		s.mu.Lock()
		s.outbox = append(s.outbox, keep...)
		s.mu.Unlock()
	}
}

// heartbeatLoop extends the leases of running calls every lease_ttl/3 and
// fences (aborts upstream) a call whose lease is lost or could not be
// extended in time (invariant I10).
func (s *Server) heartbeatLoop(ctx context.Context) {
	ttl := s.pol.Load().leaseTTL
	t := time.NewTicker(ttl / 3)
	defer t.Stop()
	const fenceMargin = 2 * time.Second
	for {
		select {
		case <-ctx.Done():
			return
		case <-t.C:
		}
		s.mu.Lock()
		calls := make([]*call, 0, len(s.running))
		for c := range s.running {
			if !c.outage { // no ledger record to extend
				calls = append(calls, c)
			}
		}
		s.mu.Unlock()
		for _, c := range calls {
			sent := s.now()
			ectx, cancel := context.WithTimeout(ctx, time.Second)
			_, err := s.led.Extend(ectx, c.ref, s.owner, c.pol.leaseTTL)
			cancel()
			s.noteLedger("extend", err)
			switch {
			case err == nil:
				c.lastGood = sent
			case errors.Is(err, ledger.ErrLeaseLost):
				c.cancel(ledger.ErrLeaseLost)
			case s.now().After(c.lastGood.Add(c.pol.leaseTTL - fenceMargin)):
				c.cancel(ledger.ErrLeaseLost)
			}
		}
	}
}

// drainStream reads an upstream stream to its end for a non-streaming
// client, assembling vLLM's non-stream body.
func (s *Server) drainStream(c *call) ([]byte, error) {
	asm := vllm.NewAssembler(c.ep)
	for {
		ev, err := c.stream.Next()
		if errors.Is(err, io.EOF) {
			return asm.Body()
		}
		if err != nil {
			if cause := context.Cause(c.ctx); cause != nil {
				return nil, cause
			}
			return nil, err
		}
		if ev.Err != nil {
			return nil, ev.Err
		}
		if err := asm.Add(ev); err != nil {
			return nil, err
		}
	}
}
