package lifecycle

import (
	"context"
	"errors"
	"time"

	"github.com/sluicehq/sluice/internal/plainjson"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// The ports of the client edge (scheduler/edge), the one room that speaks
// HTTP to clients. The edge authenticates a request (Authenticate), reads
// the headers that shape admission into an Admission, and hands the call to
// its one owner: Start, then Ticket.Finish into a Sink the edge implements.
// What crosses is values (Caller, Admission, Meta, APIError, bodies); no
// HTTP type enters this package and no *call leaves it.

// Caller is an authenticated client: its tenant, the key it used and the
// policy it was authenticated under (its calls run under the same one).
type Caller struct {
	t   *policy.Tenant
	key *policy.Key
	pol *policy.Snapshot
}

// Tenant is the caller's tenant name.
func (c Caller) Tenant() string { return c.t.Name }

// Authenticate maps an Authorization header ("Bearer <key>") to its caller
// under the policy in force, run-time keys included (keysync.go).
func (e *Engine) Authenticate(authz []byte) (Caller, error) {
	pol := e.pol.Load()
	t, key, err := e.authenticate(pol, authz)
	if err != nil {
		return Caller{}, err
	}
	return Caller{t: t, key: key, pol: pol}, nil
}

// Draining reports a server that refuses new calls (apierr.ErrDraining).
func (e *Engine) Draining() bool { return e.draining.Load() }

// Traced reports whether calls are traced: only then does Start read an
// Admission's trace context.
func (e *Engine) Traced() bool { return e.tracer != nil }

// Admission is what the edge learned from a client's request: who sent it,
// to which endpoint, its body and the headers that shape admission.
type Admission struct {
	Caller    Caller // Authenticate's
	Endpoint  vllm.Endpoint
	Body      []byte // owned by the call from here on
	RequestID string
	// Timeout is the client's X-Request-Timeout (or X-Stainless-Timeout);
	// 0 none.
	Timeout        time.Duration
	IdempotencyKey string
	Workflow       string // X-Workflow-Id; "" none
	// Band is the client's X-Priority, when BandSet: it may lower its
	// tenant's priority, never raise it.
	Band    int
	BandSet bool
	// Retry: the client says this is a retry (X-Stainless-Retry-Count
	// above 0), counted against a workflow's max_retries.
	Retry bool
	// Cancel ends the context Start is given, when the call may own it
	// (the edge's client context, used by nothing else): without a client
	// deadline the call then runs on it instead of deriving a second
	// cancel context (a cancelCtx, a children map, a registration).
	Cancel context.CancelCauseFunc
	// Traceparent and Tracestate are the client's W3C trace context, read
	// only when Traced.
	Traceparent, Tracestate string
}

// admission is the Admission as admit takes it.
func (a *Admission) admission() admission {
	return admission{
		ep: a.Endpoint, key: a.Caller.key, body: a.Body, reqID: a.RequestID, timeout: a.Timeout,
		idemKey: a.IdempotencyKey, workflow: a.Workflow, band: a.Band, bandSet: a.BandSet, retry: a.Retry,
		cancel: a.Cancel, traceparent: a.Traceparent, tracestate: a.Tracestate,
	}
}

// Reject classifies a refusal the edge answers outside Finish (before
// admission, or Start's): logged when a failure of Sluice's, audited and
// counted. tenant is "" before authentication.
func (e *Engine) Reject(tenant, reqID string, err error) *apierr.Error {
	ae := e.classify(tenant, err)
	e.countRefusal(tenant, reqID, err, ae)
	return ae
}

// Replayed is the answer to an Idempotency-Key retry of a completed
// request when err (Start's) is one: the original body, counted as ok.
func (e *Engine) Replayed(c Caller, err error) ([]byte, bool) {
	var replay *cachedResponse
	if !errors.As(err, &replay) {
		return nil, false
	}
	e.m.count(c.t.Name, outcomeOK, nil)
	return replay.body, true
}

// Models is the body of GET /v1/models for the caller: the union of the
// replicas' models it may use (routing.go), in vLLM's shape.
func (e *Engine) Models(c Caller) []byte {
	b, _ := plainjson.Marshal(struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", e.modelList(c.t)})
	return b
}

// Meta is what a call's client is told beside its answer (ARCHITECTURE
// §3.3): budget headroom, a budget warning, a lowered output cap, a
// generation stopped at a budget, and where the time went.
type Meta struct {
	// Sent: the call reached a replica. A refusal before dispatch has
	// none of the rest.
	Sent bool
	// Tokens and Requests are the token and request budgets' headroom
	// after the call's grant.
	Tokens, Requests Headroom
	// Warning: a warn-mode budget is past its limit, or a block-mode one
	// past its warning ratio.
	Warning bool
	// OutputCap is the cap sent upstream; CapReason why it is below what
	// the client asked for (outputCapReason), "" when it is not.
	OutputCap int
	CapReason string
	// Stopped is why Sluice stopped the generation at a budget, "reason;
	// scope=…; dimension=…; window=…" (grow.go); nil when it did not.
	Stopped []byte
	// Queue is the time from arrival to dispatch (0 when not
	// dispatched); Upstream from dispatch to the replica's first byte,
	// when Answered.
	Queue, Upstream time.Duration
	Answered        bool
}

// Headroom is a budget's room after a grant; Tracked false when no budget
// of the dimension applies.
type Headroom struct {
	Tracked          bool
	Limit, Remaining int64
	ResetsIn         time.Duration
}

// meta is c's Meta as of now.
func (e *Engine) meta(c *call) Meta {
	now := e.now()
	m := Meta{Sent: true, Warning: warn(c), OutputCap: c.plan.Cap, CapReason: outputCapReason(c)}
	m.Tokens = headroom(c.grant.Headroom[ledger.Tokens], now)
	m.Requests = headroom(c.grant.Headroom[ledger.Requests], now)
	if c.growth != nil && c.growth.stop != nil {
		m.Stopped = c.growth.stop.header()
	}
	if !c.arrival.IsZero() && !c.dispatchAt.IsZero() {
		m.Queue = c.dispatchAt.Sub(c.arrival)
	}
	if !c.firstByte.IsZero() {
		m.Answered = true
		if !c.dispatchAt.IsZero() {
			m.Upstream = c.firstByte.Sub(c.dispatchAt)
		}
	}
	return m
}

func headroom(r ledger.Room, now time.Time) Headroom {
	if !r.Tracked {
		return Headroom{}
	}
	return Headroom{Tracked: true, Limit: r.Limit, Remaining: r.Remaining, ResetsIn: r.ResetsAt.Sub(now)}
}

// warn reports whether a warn-mode budget is past its limit or a block-mode
// budget past its warning ratio after this grant.
func warn(c *call) bool {
	if len(c.grant.Warnings) > 0 {
		return true
	}
	for d, ratio := range c.t.Warn {
		room := c.grant.Headroom[d]
		if room.Tracked && room.Limit > 0 && float64(room.Limit-room.Remaining) >= ratio*float64(room.Limit) {
			return true
		}
	}
	return false
}
