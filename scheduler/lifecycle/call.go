package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"slices"
	"time"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/abuse"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/scheduler/settle"
	"github.com/sluicehq/sluice/vllm"
)

// call is one admitted request from reservation to settlement. Its ledger
// record ends in exactly one outcome: released (never dispatched), settled
// (usage known, or zero when nothing was sent) or left to lease expiry.
type call struct {
	ctx          context.Context
	cancel       context.CancelCauseFunc
	phase        phase              // see lifecycle.go; owned by the request goroutine
	stopDeadline context.CancelFunc // nil without a client deadline
	detached     context.Context    // WithoutCancel(ctx), made by the first ledgerOp
	ops          [3]opCtx           // the first ledgerOps' contexts (reserve, mark dispatched, settle)
	nops         uint8              // ops handed out

	pol      *policy.Snapshot
	t        *policy.Tenant
	key      *policy.Key // the key that authenticated the request
	ep       vllm.Endpoint
	req      *vllm.Request
	route    fleet.Route               // model (pool) and prefix for the replica choice
	place    gate.Place[fleet.PoolKey] // its pool (fixed at admission) and where it counts in the pool's load (Engine.pools)
	plan     vllm.Plan
	reqID    string
	idemKey  string // the client's Idempotency-Key; "" none
	ref      ledger.Ref
	held     ledger.Amounts
	grant    ledger.Grant
	cost     int64 // predicted fair-share cost (expected use, expected.go)
	size     int64 // replica room: input + expected output (expected.go)
	band     int
	arrival  time.Time
	deadline time.Time // the client's overall deadline; zero when none
	handle   queue.Handle[*call]
	// qplace is its place among its tenant's queued entries, kept when it
	// is taken back (takeback.go); bodyBytes is what the queue's byte
	// bound counts of it.
	qplace    uint64
	bodyBytes int64
	wf        *workflow // nil without X-Workflow-Id
	// extraScopes are the api_key, workflow and global scopes of the Reserve.
	extraScopes []ledger.Scope
	scopes      [ledger.MaxScopes]ledger.Scope // backs the Reserve's scopes (the ledger copies them)
	lease       settle.Lease                   // the call's lease, kept by the settlement room
	// counted: the input is exact, or the replica's /tokenize was asked
	// for it already (countAndPlan).
	counted bool
	// idemDigest is the requestDigest of the request under idemKey (0 none).
	idemDigest uint64
	// capReason is why Sluice lowered the output cap to fit a budget
	// (budget, workflow); "" when it did not.
	capReason string
	// outage: admitted on the tenant's outage allowance, without a ledger
	// record; settled later with a ledger Charge.
	outage bool
	tr     *callTrace // nil unless tracing is on (trace.go)

	// dispatched delivers the queue's verdict on a queued call, once per
	// stay in the queue: the replica it was dispatched to, or nil when it
	// expired there (one channel, not two: one allocation fewer per call).
	dispatched chan *fleet.Replica // size 1
	// exitReason and exitRetry are the queue's account of an expiry,
	// written by onExpire before it delivers nil on dispatched.
	exitReason queue.Reason
	exitRetry  time.Duration

	// Set once dispatched.
	rep        *fleet.Replica
	seq        int64 // its number among the requests given room on rep (fleet.Set.Take)
	ticket     gpu.Ticket
	dispatchAt time.Time
	firstByte  time.Time
	stream     *vllm.Stream   // chat and completions: the answer, opened by execute
	resp       *http.Response // the other endpoints: the answer, opened by execute
	upInterval int            // > 0: a non-streamed request sent upstream as a stream of this interval
	peeked     peeked         // a stream's first event, read by execute (Engine.first)
	sent       bool           // a request may have reached the replica
	usage      vllm.Usage
	abortCause string
	actualCost int64
	// growth is the state of a hold sized on a prediction (grow.go); nil
	// for a worst-case hold.
	growth *growth
}

// admission is what the edge learned from the HTTP request (Admission, as
// admit takes it).
type admission struct {
	ep       vllm.Endpoint
	key      *policy.Key // nil only in tests that bypass the edge
	body     []byte      // owned by the call from here on
	reqID    string
	timeout  time.Duration // client's X-Request-Timeout; 0 none
	idemKey  string
	workflow string
	band     int
	bandSet  bool
	retry    bool
	// cancel ends the context admit is given, when the call may own it
	// (the edge's client context, used by nothing else): without a client
	// deadline the call then runs on it instead of deriving a second
	// cancel context (a cancelCtx, a children map, a registration).
	cancel context.CancelCauseFunc
	// traceparent and tracestate are the client's W3C trace context,
	// read only when tracing is on.
	traceparent, tracestate string
}

// admit runs steps 2–4 of the request path: bound, reserve, enqueue. On
// success the call is queued and holds a reservation; on error nothing is
// held.
func (e *Engine) admit(ctx context.Context, t *policy.Tenant, pol *policy.Snapshot, a admission) (*call, error) {
	arrival := e.now()
	req, err := vllm.Parse(a.ep, a.body, vllm.CountOptions{TemplateTokensPerMessage: int(pol.Cfg.Server.TemplateAllowance),
		MediaTokensPerPart: int(pol.Cfg.Server.MediaAllowance)})
	if err != nil {
		return nil, err
	}
	if req.N > maxChoices {
		return nil, apierr.Invalidf("n", "n must be at most %d (got %d)", maxChoices, req.N)
	}
	if err := e.checkModel(t, req.Model); err != nil {
		return nil, err
	}
	if cl, ok := pol.ClampOf(t.Name, arrival); ok && len(cl.Models) > 0 && !slices.Contains(cl.Models, req.Model) {
		return nil, fmt.Errorf("model %q is not allowed while the tenant is clamped (%s): %w", req.Model, cl.Reason, apierr.ErrClamped)
	}
	if !e.reps.AnyUpFor(req.Model) {
		return nil, apierr.ErrNoReplica
	}
	req, plan, counted, err := e.countAndPlan(ctx, t, pol, req)
	if err != nil {
		return nil, err
	}
	c := &call{
		pol: pol, t: t, key: a.key, ep: a.ep, req: req, route: e.routeOf(pol, t, req), plan: plan, reqID: a.reqID, counted: counted,
		arrival: arrival, band: t.Cfg.Priority,
		dispatched: make(chan *fleet.Replica, 1),
	}
	if a.bandSet && a.band > c.band {
		c.band = a.band // a request may lower its priority, never raise it
	}
	if a.workflow != "" {
		wf, ok := e.wfs.getOrCreate(t.Name, a.workflow, t.Cfg.Workflow, arrival)
		if !ok {
			return nil, apierr.Invalidf("X-Workflow-Id", "unknown workflow %q and the tenant has no workflow_defaults", a.workflow)
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
		// A context's deadline is on the runtime's clock, the deadline on
		// the server's: hand over what is left, not the instant.
		ctx, stop = context.WithTimeoutCause(ctx, c.deadline.Sub(e.now()), apierr.ErrDeadline)
		c.stopDeadline = stop
	}
	if c.stopDeadline == nil && a.cancel != nil {
		c.ctx, c.cancel = ctx, a.cancel
	} else {
		c.ctx, c.cancel = context.WithCancelCause(ctx)
	}
	c.ref = ledger.Ref{Tenant: t.ScopeKey, ID: ledger.NewRequestID()}
	c.idemKey = a.idemKey
	if a.idemKey != "" {
		c.idemDigest = requestDigest(a.ep, a.body)
	}
	if e.tracer != nil {
		e.startTrace(c, a)
	}
	if err := e.reserve(c, a); err != nil {
		if c.tr != nil {
			e.traceRefused(c, err)
		}
		c.cancel(err)
		return nil, err
	}
	if c.tr != nil {
		c.tr.queuedAt = e.now()
	}
	e.mu.Lock()
	e.queued[c] = struct{}{}
	e.mu.Unlock()
	c.place.Pool = e.reps.PoolKeyOf(req.Model)
	// Counted queued in its pool before the queue holds it: from Enqueue on,
	// the dispatch loop may move it to held.
	e.movePool(c, gate.SpotQueued)
	c.bodyBytes = int64(len(a.body))
	qr := c.queueRequest()
	qr.Deferred = !e.loopOnly // dispatchInline below, then Wake
	it, err := e.q.Enqueue(qr)
	if err != nil {
		e.movePool(c, gate.SpotNone)
		c.traceErr(err)
		e.release(c)
		e.forget(c)
		return nil, err
	}
	c.handle, c.qplace = it.Handle, it.Place
	e.to(c, phaseQueued)
	t.RT.Queued.Add(1)
	e.countKey(c, "admitted")
	e.dispatchInline()
	if !e.loopOnly {
		e.q.Wake(c.handle) // still queued: the loop and the expiry timer learn of it now
	}
	e.observeAbuse(t.Name, abuse.Event{Kind: abuse.Admitted, AtCap: e.atCap(c)})
	if e.trail != nil { // the reason's text costs two allocations: only with a trail
		e.record(audit.Record{Kind: audit.KindAdmit, Tenant: t.Name, RequestID: c.reqID, Reason: "ledger " + c.ref.ID.String(),
			TokensHeld: c.held[ledger.Tokens], GPUMs: c.held[ledger.GPUMs], USDMicros: c.held[ledger.USDMicros]})
	}
	return c, nil
}

// dispatchInline runs the dispatch loop's pass (dispatch.go) on the
// admitting goroutine: with room free, the call just queued is usually
// dispatched here, so await finds it delivered instead of parking until
// the loop's goroutine wakes, runs and wakes it back (two goroutine
// hand-offs, often futex rounds on idle threads: about 100 µs of light-load
// latency, docs/benchmarks/cpu-per-request.md). The queue's mutex
// serialises the passes and NextView hands each entry out once, so the
// queue's order and the loop's predicate decide exactly as in the loop.
func (e *Engine) dispatchInline() {
	if !e.loopOnly {
		e.dispatchPass()
	}
}

// tokenize replaces the bytes bound with the replica's exact count; on any
// failure the bound stays (documented fallback).
func (e *Engine) tokenize(ctx context.Context, req *vllm.Request) *vllm.Request {
	for _, r := range e.reps.Pool(req.Model) {
		if o := r.Obs.Load(); o == nil || !o.OK {
			continue
		}
		tctx, cancel := context.WithTimeout(ctx, 2*time.Second)
		counts, mml, err := e.up.Tokenize(tctx, r.URL, req.Model, req)
		cancel()
		if err != nil {
			continue
		}
		if mml > 0 {
			r.MaxModelLen.Store(int64(mml))
		}
		if exact, err := req.WithTokenizedInput(counts, vllm.DefaultTemplateTokensPerRequest); err == nil {
			return exact
		}
	}
	return req
}

// reserve sizes the holds and reserves them in the ledger. When a block
// budget on tokens cannot fit the full output cap but can fit a smaller one,
// the cap is lowered once to what the budget allows. On success the call's
// lease is tracked until its record ends.
func (e *Engine) reserve(c *call, a admission) error {
	gen := 0
	for lowered := false; ; {
		if a.idemKey != "" {
			c.ref.ID = e.idemID(c.t.ScopeKey, a.idemKey, gen)
		}
		if err := e.sizeHolds(c); err != nil {
			return err
		}
		if k := e.reps.MaxCapacity(c.req.Model); k > 0 && c.size > k {
			// Before any budget: a request no replica can run is invalid.
			return fmt.Errorf("input plus expected output of %d tokens exceeds every replica's capacity (%d): %w", c.size, k, apierr.ErrContextLength)
		}
		rr := ledger.ReserveRequest{
			Ref: c.ref, Owner: e.owner, Held: c.held,
			Scopes:   append(c.scopes[:0], ledger.Scope{Kind: ledger.KindTenant, Key: c.t.ScopeKey, Limits: c.t.Limits}),
			LeaseTTL: c.pol.LeaseTTL,
			// A label for audit lines only: the ledger never orders policy
			// versions (limits travel with each Reserve).
			PolicyVersion: c.pol.Version,
			// A keyed retry is the same payload when the client's request
			// is, whatever the holds (idempotency.go).
			RequestDigest: c.idemDigest,
			// A fresh nonce per attempt tells the store client's own retry
			// of this Reserve (lost reply: Replayed false) from another
			// attempt holding the id (Replayed true).
			Attempt: rand.Uint64() | 1,
		}
		c.extraScopes = c.extraScopes[:0]
		if ks, ok := c.keyScope(); ok {
			c.extraScopes = append(c.extraScopes, ks)
		}
		if c.wf != nil {
			ws, _ := c.wf.scope(e.keyer.Key(ledger.KindWorkflow, c.t.Name+"\x00"+c.wf.id))
			c.extraScopes = append(c.extraScopes, ws)
		}
		if len(c.pol.Global) > 0 {
			c.extraScopes = append(c.extraScopes, ledger.Scope{Kind: ledger.KindGlobal, Key: e.keyer.GlobalKey(), Limits: c.pol.Global})
		}
		rr.Scopes = append(rr.Scopes, c.extraScopes...)
		op := c.ledgerOp()
		sent := e.now()
		g, err := e.led.Reserve(op, rr)
		op.cancel()
		e.noteLedger("reserve", err)
		switch {
		case err == nil && (!g.Replayed || a.idemKey == ""):
			// Replayed false with our nonce is this very Reserve, retried
			// by the store client after its reply was lost; a random id
			// is never another attempt's.
			c.grant = g
			e.to(c, phaseReserved)
			e.settler.Track(&c.lease, c.ref, c.cancel, sent, c.pol.LeaseTTL)
			return nil
		case err == nil:
			return idemStateErr(g.State)
		case a.idemKey != "" && endedUnrun(err):
			// The attempt holding this generation never ran: this one may.
			if gen++; gen >= maxIdemGenerations {
				return idemExhaustedErr()
			}
			continue
		case a.idemKey != "" && errors.Is(err, ledger.ErrAlreadyFinal):
			return e.completed(c.ctx, c.ref.ID, c.idemDigest)
		case a.idemKey != "" && errors.Is(err, ledger.ErrConflict):
			return errIdemConflict
		case ledger.IsStoreError(err):
			// A keyed request is never admitted without the ledger: only
			// the ledger knows whether an earlier attempt of the key ran
			// (on this instance or another), so running it blind could
			// execute the key twice. It gets 503 and may be retried.
			if a.idemKey == "" && e.admitOutage(c, err) {
				// The outage charge ends the id, whether or not an
				// ambiguous Reserve applied (settle/outage.go).
				e.to(c, phaseReserved)
				return nil
			}
			switch {
			case errors.Is(err, ledger.ErrAmbiguous) && a.idemKey != "":
				// The hold may exist, or be another attempt's: replay
				// this attempt once the store answers (settle/outbox.go).
				e.queueReplay(c, rr)
			case errors.Is(err, ledger.ErrAmbiguous):
				// The hold may exist: end it by id once the store answers.
				e.queueRelease(c)
			}
		default:
			if d := deniedOf(err); d != nil {
				if d.Dim == ledger.Tokens && !c.counted && exactMayFit(c, d, c.pol.Cfg.Server.MinOutputTokens) {
					// A token budget refused a hold sized on the bytes
					// bound: count exactly before refusing or lowering.
					if again, err := e.recount(c); err != nil || again {
						if err != nil {
							return err
						}
						continue
					}
				}
				if !lowered && lowerCap(c, d, c.pol.Cfg.Server.MinOutputTokens) {
					// Send what the budgets still allow rather than refuse.
					lowered = true
					continue
				}
				e.observeAbuse(c.t.Name, abuse.Event{Kind: abuse.Denied})
				e.countKey(c, "denied")
				return refusal(c, d, c.pol.Cfg.Server.MinOutputTokens)
			}
		}
		return err
	}
}

// deniedOf and endedUnrun unwrap reserve's errors out of line: an
// errors.As target escapes, and reserve's success path should not pay for
// it.
func deniedOf(err error) *ledger.DeniedError {
	if err == nil {
		return nil
	}
	var d *ledger.DeniedError
	if errors.As(err, &d) {
		return d
	}
	return nil
}

// endedUnrun reports a FinalError of an id that ended without running.
func endedUnrun(err error) bool {
	var fe *ledger.FinalError
	return errors.As(err, &fe) && (fe.State == ledger.Released || fe.State == ledger.Expired)
}

// lowerCap lowers the call's output cap to fit a token budget denial where
// Sluice may (its own injected cap for any budget; any cap for a workflow
// envelope's remaining output), never below floor per choice. A cap the
// client chose is never lowered to fit a tenant, key or global budget: the
// request is refused with what would fit (see [refusal]).
func lowerCap(c *call, d *ledger.DeniedError, floor int64) bool {
	fits := fitsOutput(c, d)
	// Never below the floor, nor below the client's min_tokens (vLLM
	// refuses max_tokens < min_tokens with a 400 naming a cap the client
	// never sent): refuse instead.
	if fits < 0 || fits >= int64(c.plan.Cap) || fits < max(1, floor, c.minTokens()) {
		return false
	}
	reason := "budget"
	if d.Scope == ledger.KindWorkflow {
		reason = "workflow"
	} else if c.req.MaxTokens > 0 {
		return false
	}
	c.plan.Cap = int(fits)
	c.plan.OutputTokens = c.plan.Cap * c.plan.Choices
	c.capReason = reason
	return true
}

// maxChoices bounds n, as the OpenAI API does ("n": 1..128), so a
// client-controlled multiplier cannot take a hold out of the ledger's range.
const maxChoices = 128

// sizeHolds derives the ledger holds (the worst case, or a prediction the
// hold grows from: predict.go), queue cost and replica size (the expected
// use, expected.go) from the plan. Every product is overflow-checked: a
// hold outside the ledger's range is the client's 400, naming the
// parameter that made it so, never a ledger_error.
func (e *Engine) sizeHolds(c *call) error {
	in := int64(c.plan.InputTokens)
	out, ok := mulAmount(int64(c.plan.Cap), int64(c.plan.Choices))
	if !ok || in > ledger.MaxAmount-out {
		param := "max_tokens"
		if c.req.N > 1 {
			param = "n"
		}
		return apierr.Invalidf(param, "the output cap times the number of choices (%d × %d) plus the input is more than a request may hold", c.plan.Cap, c.plan.Choices)
	}
	h, err := e.holdFor(c, in, e.holdOutput(c))
	if err != nil {
		return err
	}
	c.held = h
	return e.sizeExpected(c, in) // expected.go
}

// holdFor is the hold of a call's input and out output tokens: tokens,
// GPU time, price and energy.
func (e *Engine) holdFor(c *call, in, out int64) (ledger.Amounts, error) {
	var h ledger.Amounts
	h[ledger.Requests] = 1
	h[ledger.InputTokens] = in
	h[ledger.OutputTokens] = out
	h[ledger.Tokens] = in + out
	h[ledger.GPUMs] = e.reps.GPUHold(e.gpu, c.req.Model, in, out)
	usd, ok := c.pol.PriceMicrosChecked(c.req.Model, in, out)
	if !ok || h[ledger.GPUMs] < 0 || h[ledger.GPUMs] > ledger.MaxAmount {
		return h, apierr.Invalidf("max_tokens", "the request's priced or GPU-time hold is more than a request may hold; lower max_tokens")
	}
	h[ledger.USDMicros] = usd
	if h[ledger.GPUJoules] = e.gpu.HoldEnergy(h[ledger.GPUMs]); h[ledger.GPUJoules] > ledger.MaxAmount {
		return h, apierr.Invalidf("max_tokens", "the request's GPU energy hold is more than a request may hold; lower max_tokens")
	}
	return h, nil
}

// mulAmount multiplies two non-negative amounts, reporting false when the
// product is outside 0..ledger.MaxAmount.
func mulAmount(a, b int64) (int64, bool) {
	if a < 0 || b < 0 {
		return 0, false
	}
	if a == 0 || b == 0 {
		return 0, true
	}
	if a > ledger.MaxAmount/b {
		return 0, false
	}
	return a * b, true
}

// release frees a never-dispatched call's holds. A store error hands the
// ending to the outbox (Release by id until definite), never to a second
// dispatch.
func (e *Engine) release(c *call) {
	if c.phase != phaseReserved && c.phase != phaseQueued {
		e.illegal(c, transitionError{c.phase, phaseReleased})
		return
	}
	if c.tr != nil {
		defer e.traceReleased(c, e.now())
	}
	if c.outage {
		e.outageNotRun(c)
		e.to(c, phaseReleased)
		return
	}
	e.settler.Untrack(&c.lease)
	ended := phaseReleased
	defer func() { e.to(c, ended) }()
	op := c.ledgerOp()
	defer op.cancel()
	err := e.led.Release(op, c.ref, e.owner)
	reason := "released"
	if cause := context.Cause(c.ctx); cause != nil {
		reason = cause.Error()
	}
	e.record(audit.Record{Kind: audit.KindRelease, Tenant: c.t.Name, RequestID: c.reqID, Reason: reason, TokensHeld: c.held[ledger.Tokens]})
	e.noteLedger("release", err)
	switch {
	case err == nil, errors.Is(err, ledger.ErrAlreadyFinal), errors.Is(err, ledger.ErrNotFound):
	case errors.Is(err, ledger.ErrDispatched):
		// An ambiguous MarkDispatched applied: end the record with a zero
		// NotSent settlement (LEDGER §4).
		e.queueSettle(c, ledger.Amounts{}, ledger.SourceNotSent)
		ended = phaseUnresolved
	case ledger.IsStoreError(err):
		e.queueRelease(c)
		ended = phaseUnresolved
	default:
		e.log.Warn("ledger release refused; the lease will expire it", "request_id", c.reqID, "err", err)
		ended = phaseUnresolved
	}
}

// end ends a call that failed before its answer opened, by how far it
// got: one that never left the queue gives its holds back (release), one
// dispatched settles as not sent (finish), and so does one taken back
// (settleTakenBack).
func (e *Engine) end(c *call, err error) {
	if c.phase == phaseReserved || c.phase == phaseQueued {
		e.release(c)
		e.forget(c)
		return
	}
	if c.phase == phaseTakenBack {
		e.settleTakenBack(c)
		e.forget(c)
		return
	}
	e.finish(c, err)
}

// forget drops a call from the drain bookkeeping.
func (e *Engine) forget(c *call) {
	e.mu.Lock()
	delete(e.queued, c)
	delete(e.running, c)
	if len(e.queued) == 0 && len(e.running) == 0 {
		e.idle.Broadcast()
	}
	e.mu.Unlock()
}

// onExpire is the queue's expiry callback (queue mutex held: hand off only).
func (e *Engine) onExpire(it queue.Item[*call]) {
	it.Payload.exitReason, it.Payload.exitRetry = it.Reason, it.RetryAfter
	select {
	case it.Payload.dispatched <- nil:
	default:
	}
}

// await blocks until the call is dispatched to a replica with a ledger
// slot, expires, or its client leaves. On an error it has left the queue
// and holds no replica room; what it holds in the ledger (and, dispatched
// as its deadline passed, its dispatch) Ticket.Finish gives back, the one
// place a call ends.
func (e *Engine) await(c *call) (err error) {
	defer c.t.RT.Queued.Add(-1) // counted from a successful admit
	defer func() {
		if err != nil {
			e.movePool(c, gate.SpotNone) // never ran: no longer queued nor holding room
		}
	}()
	for {
		var rep *fleet.Replica
		select {
		case rep = <-c.dispatched:
			// Dispatched inline (or just now): the context's Done channel,
			// made on first use, is not needed. A cancellation that raced
			// the dispatch is seen below, before anything is sent.
		default:
			select {
			case rep = <-c.dispatched:
			case <-c.ctx.Done():
				if e.q.Cancel(c.handle) {
					return context.Cause(c.ctx)
				}
				// Lost the race: dispatch or expiry owns the entry; one of
				// them is about to be (or was) delivered.
				if rep = <-c.dispatched; rep != nil {
					e.reps.Release(rep, c.size)
					e.q.Release(c.handle)
					e.Wake()
					return context.Cause(c.ctx)
				}
			}
		}
		if rep == nil { // expired or shed in the queue
			return c.queueExit(e.now())
		}
		if c.tr != nil {
			c.tr.handedAt = e.now()
		}
		err := e.markDispatched(c)
		if d := deniedOf(err); d != nil && d.Dim == ledger.Slots {
			// Another instance holds the tenant's slots: back to the head
			// of the queue, still holding the budget.
			e.reps.Release(rep, c.size)
			e.movePool(c, gate.SpotQueued)
			e.q.Requeue(c.handle)
			continue
		}
		e.q.Release(c.handle)
		if errors.Is(err, ledger.ErrAlreadyFinal) {
			// The record ended under us (lease expired or released):
			// nothing was sent, so it is a lost lease, never a 500.
			err = fmt.Errorf("%w: %w", ledger.ErrLeaseLost, err)
		}
		if err != nil {
			e.reps.Release(rep, c.size)
			c.traceErr(err)
			e.Wake()
			return err
		}
		c.rep = rep
		again := !c.dispatchAt.IsZero() // taken back and sent again
		c.dispatchAt = e.now()
		e.to(c, phaseDispatched)
		c.t.RT.Inflight.Add(1)
		c.keyInflight(1)
		c.t.RT.InflightTokens.Add(c.size)
		ts := seriesOf(c.t, e.m)
		ts.inflight.Inc()
		if !again {
			// One sample per request: a request taken back counted its
			// wait when it was first sent.
			ts.queueWait.Observe(c.dispatchAt.Sub(c.arrival).Seconds())
		}
		e.mu.Lock()
		delete(e.queued, c)
		e.running[c] = struct{}{}
		e.mu.Unlock()
		if rep.Clock != nil {
			c.ticket = rep.Clock.Start(c.dispatchAt, c.t.Name)
		}
		// The slot round trip took time: re-check the deadline before the
		// first upstream byte.
		if dl := c.queueDeadline(); !dl.IsZero() && !c.dispatchAt.Before(dl) {
			e.m.ExpiredDispatch.Inc()
			return c.queueExit(c.dispatchAt)
		}
		if cause := context.Cause(c.ctx); cause != nil {
			// The client left (or its deadline passed) as the dispatch
			// arrived: nothing was sent, so nothing is charged.
			return cause
		}
		return nil
	}
}

// queueDeadline is the effective queue deadline of the call.
func (c *call) queueDeadline() time.Time {
	d := c.arrival.Add(c.pol.MaxWait)
	if w := c.t.Cfg.Queue.MaxWait; w > 0 {
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

func (e *Engine) markDispatched(c *call) error {
	if c.outage || c.phase == phaseTakenBack {
		// No ledger record (the local concurrency cap applied), or one
		// DISPATCHED already (taken back, takeback.go).
		return nil
	}
	op := c.ledgerOp()
	defer op.cancel()
	err := e.led.MarkDispatched(op, c.ref, e.owner)
	e.noteLedger("dispatch", err)
	return err
}

// queueRequest is what the queue holds of c.
func (c *call) queueRequest() queue.Request[*call] {
	return queue.Request[*call]{Tenant: c.t.Name, Band: c.band, Cost: c.cost, BodyBytes: c.bodyBytes,
		Arrival: c.arrival, Deadline: c.deadline, Payload: c}
}
