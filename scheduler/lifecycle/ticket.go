package lifecycle

import (
	"context"
	"errors"
	"io"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// One owner per call. Start runs a call from admission to its upstream's
// first byte; Finish delivers its answer (streamed or whole) to a sink,
// settles it, records its outcome (metrics, audit, the workflow's tool
// calls) and ends it. Every endpoint goes through the pair, and Finish is
// the one place an admitted call ends: it runs whether or not its answer is
// ever written (a nil sink: the client left before the headers went out).

// Ticket is an admitted call between Start and Finish.
type Ticket struct {
	e   *Engine
	c   *call
	err error // the call ended before its answer opened; Finish answers it
	// finished: Finish ran (a second one is an illegal move).
	finished bool
}

// Sink is where Finish delivers a call's answer: the client's response,
// written by the client edge. Finish calls exactly one of its methods,
// once.
type Sink interface {
	// Whole writes a non-streamed answer: m's headers and body.
	Whole(m Meta, body []byte)
	// Refuse writes the answer of a call that ended in err before any
	// byte of its answer was written: ae in the pinned error shape, with
	// m's headers when m.Sent. ae is nil when the client left: there is
	// no one to answer.
	Refuse(err error, ae *apierr.Error, m Meta)
	// Stream returns the writer of a streamed answer, whose headers went
	// out already (each Write one chunk, flushed), and the connection
	// whose write deadline bounds each write (nil: none).
	Stream() (io.Writer, WriteDeadliner)
}

// Start admits a call and runs it to its upstream's first byte: bound,
// reserve, queue, dispatch, send (with the retry on another replica). A nil
// Ticket means nothing was admitted: err is the refusal (Reject), or a
// completed request to replay (Replayed). Otherwise err is nil and the
// caller must call Finish exactly once, also when the call failed before
// its answer opened (Finish answers that failure). ctx is the client's:
// cancelled with apierr.ErrClientGone when it leaves.
func (e *Engine) Start(ctx context.Context, a Admission) (*Ticket, error) {
	return e.begin(ctx, a.Caller.t, a.Caller.pol, a.admission())
}

// begin is Start for a tenant and policy already known.
func (e *Engine) begin(ctx context.Context, t *policy.Tenant, pol *policy.Snapshot, a admission) (*Ticket, error) {
	c, err := e.admit(ctx, t, pol, a)
	if err != nil {
		return nil, err
	}
	tk := &Ticket{e: e, c: c}
	for {
		if err := e.await(c); err != nil {
			tk.err = err
			return tk, nil
		}
		err := e.execute(c) // Finish ends a call that failed here
		if errors.Is(err, errTakenBack) {
			err = e.takeBack(c)
			if err == nil {
				continue
			}
		}
		tk.err = err
		return tk, nil
	}
}

// Streaming reports a call whose answer opened as a stream for the client:
// the caller sends the stream's headers (Meta's among them), then Finish
// writes its events.
func (tk *Ticket) Streaming() bool { return tk.err == nil && tk.c.req.Stream }

// Meta is what the client is told beside the answer, as of now: a
// streamed answer's headers.
func (tk *Ticket) Meta() Meta { return tk.e.meta(tk.c) }

// Finish delivers the call's answer to out, settles the call, records its
// outcome and ends it; out nil means the answer will never be written (the
// client left before the headers went out). It returns the outcome as
// counted in sluice_requests_total.
func (tk *Ticket) Finish(out Sink) Outcome {
	e, c := tk.e, tk.c
	if tk.finished {
		e.illegal(c, errFinishedTwice)
		return outcomeCancelled
	}
	tk.finished = true
	defer c.end()
	switch {
	case out == nil:
		c.cancel(apierr.ErrClientGone)
		end := error(apierr.ErrClientGone)
		if tk.err != nil {
			end = tk.err // it failed before the client left
		}
		e.end(c, end)
		e.m.count(c.t.Name, outcomeCancelled, nil)
		return outcomeCancelled
	case tk.err != nil:
		e.end(c, tk.err)
		return e.refused(c, out, tk.err)
	case c.req.Stream:
		w, conn := out.Stream()
		if c.stream != nil {
			return e.pump(c, w, conn)
		}
		return e.pumpEvents(c, w, conn)
	}
	body, err := e.readWhole(c)
	if err == nil {
		// Before the settlement: a retry that finds the record charged
		// must find the response too.
		e.rememberResponse(c, body)
	}
	e.finish(c, err)
	if err != nil {
		return e.refused(c, out, err)
	}
	if c.wf != nil {
		c.wf.countToolCalls(toolCallsFor(c.ep, body))
	}
	ts := seriesOf(c.t, e.m)
	ts.ttft.Observe(e.now().Sub(c.arrival).Seconds())
	ts.requestsOK.Inc()
	out.Whole(e.meta(c), body)
	return outcomeOK
}

// errFinishedTwice is a second Finish of one ticket.
var errFinishedTwice = errors.New("call lifecycle: Finish called twice")

// readWhole reads a non-streamed answer whole: chat and completions
// assembled from their stream (drainStream), the other endpoints' body as
// vLLM sent it (readOther).
func (e *Engine) readWhole(c *call) ([]byte, error) {
	if c.stream != nil {
		return e.drainStream(c)
	}
	return e.readOther(c)
}

// refused has out answer a call that ended in err, and counts and audits
// the outcome.
func (e *Engine) refused(c *call, out Sink, err error) Outcome {
	if errors.Is(err, apierr.ErrClientGone) || errors.Is(context.Cause(c.ctx), apierr.ErrClientGone) {
		out.Refuse(err, nil, Meta{})
		e.m.count(c.t.Name, outcomeCancelled, nil)
		return outcomeCancelled
	}
	var ue *vllm.UpstreamError
	if errors.As(err, &ue) && ue.Status == 404 && !ue.InStream && c.rep != nil {
		// vLLM no longer serves the model (an adapter unloaded): read its
		// models again.
		c.rep.ModelsAt.Store(0)
	}
	ae := e.classify(c.t.Name, err)
	var m Meta
	if c.rep != nil && c.sent {
		m = e.meta(c) // Server-Timing and budget headers still apply
	}
	out.Refuse(err, ae, m)
	return e.countRefusal(c.t.Name, c.reqID, err, ae)
}

// classify is err's refusal (statusFor), logged when it is a failure of
// Sluice's or the replica's (a 5xx other than 503 and 504).
func (e *Engine) classify(tenant string, err error) *apierr.Error {
	ae := apierr.For(err)
	if ae.Status >= 500 && ae.Status != 503 && ae.Status != 504 {
		e.log.Warn("request failed", "tenant", tenant, "status", ae.Status, "code", ae.Code, "err", err)
	}
	return ae
}

// countRefusal audits and counts a refusal answered as ae: every endpoint's,
// whether before admission (Reject) or after (Finish).
func (e *Engine) countRefusal(tenant, reqID string, err error, ae *apierr.Error) Outcome {
	if ae.Status != 499 && ae.Raw == nil {
		e.record(audit.Record{Kind: audit.KindDeny, Tenant: tenant, RequestID: reqID, Code: ae.Code, Reason: ae.Message})
	}
	if tenant == "" {
		tenant = "_unauthenticated"
	}
	o, _ := outcomeFor(err)
	if ae.Raw != nil {
		// vLLM's refusal passed through: not Sluice's rejection.
		o = outcomeUpstreamError
	}
	e.m.count(tenant, o, ae)
	return o
}
