package lifecycle

import (
	"context"
	"errors"
	"fmt"
	"io"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/vllm"
)

// A dispatched call on the wire: the one send-and-retry loop of every
// endpoint, and the non-streamed answer read from the stream.

// execute sends the call upstream: on the chosen replica, or on another
// with room if the chosen one refused the connection before any byte was
// sent. It returns with the answer open (c.stream for chat and
// completions, its first event read; c.resp for the other endpoints, 200
// headers received), errTakenBack when the replica kept it waiting and it
// was taken back (takeback.go), or another error.
func (e *Engine) execute(c *call) error {
	c.upInterval = upstreamInterval(c)
	body := make([]byte, 0, len(c.req.Body())+128)
	built, bodyPrio := false, false
	tried := map[*fleet.Replica]bool{}
	for {
		if !built || bodyPrio != c.rep.PrioritySched {
			// A retry on a replica that schedules by priority differently
			// needs its own body.
			body = upstreamBody(c, body[:0])
			built, bodyPrio = true, c.rep.PrioritySched
		}
		tried[c.rep] = true
		err := e.open(c, body)
		if err == nil {
			e.to(c, phaseStreaming)
			c.sent = true
			return nil
		}
		if errors.Is(err, errTakenBack) {
			return err // begin queues it again (takeback.go)
		}
		var ue *vllm.UpstreamError
		retry := errors.Is(err, vllm.ErrNotSent) || (errors.As(err, &ue) && ue.Retryable())
		if !errors.Is(err, vllm.ErrNotSent) && (ue == nil || upstreamRan(c, ue)) {
			// The replica may have started it. A non-200 answer, by
			// contrast, is vLLM refusing before it queued anything,
			// except a 5xx to a non-streamed request (upstreamRan).
			c.sent = true
		}
		if cause := context.Cause(c.ctx); cause != nil {
			// The client left or its deadline passed (a non-streamed
			// answer is read whole inside Stream): that, not the read's
			// context error, is the outcome (504, or a disconnect).
			return cause
		}
		if !retry {
			return err
		}
		next, seq := e.reps.Take(c.route, c.size, c.rep)
		if next == nil || tried[next] {
			if next != nil {
				e.reps.Release(next, c.size)
			}
			return fmt.Errorf("%w: %w", apierr.ErrNoReplica, err)
		}
		e.moveClock(c, next)
		e.reps.Release(c.rep, c.size)
		c.rep, c.seq = next, seq
		e.log.Warn("replica refused the request before it started; retrying on another", "request_id", c.reqID, "err", err)
	}
}

// upstreamBody is the body the call is sent upstream with: chat and
// completions rewritten with their cap and stream options, the other
// endpoints with their cap (those with output) and Sluice's options.
func upstreamBody(c *call, dst []byte) []byte {
	if isOther(c.ep) {
		return c.req.UpstreamBody(dst, c.plan.Cap, c.rewriteOptions())
	}
	return c.req.RewriteWith(dst, c.plan.UpstreamCap(), c.rewriteOptions())
}

// open sends body to c's replica once and keeps the answer it opened: a
// stream once its first event arrived (first).
func (e *Engine) open(c *call, body []byte) error {
	if isOther(c.ep) {
		resp, err := e.up.Post(c.ctx, c.rep.URL, c.ep.Path(), body, c.reqID) //nolint:bodyclose // closed by finish
		if err == nil {
			e.firstByte(c)
			c.resp = resp
		}
		return err
	}
	ctx, takeBack := c.ctx, context.CancelCauseFunc(nil)
	if takeBackOn(c.pol) && (c.req.Stream || c.upInterval > 0) {
		// Its own context, so that taking it back aborts this attempt
		// alone; the call's ending still cancels it. A request sent
		// non-streamed is answered only once it ran: nothing to take back.
		ctx, takeBack = context.WithCancelCause(c.ctx)
	}
	st, err := e.up.Stream(ctx, c.rep.URL, c.ep.Path(), body, c.reqID)
	if err != nil {
		if takeBack != nil {
			takeBack(nil)
		}
		return err
	}
	e.firstByte(c)
	if err := e.first(ctx, c, st, takeBack); err != nil {
		return err
	}
	c.stream = st
	return nil
}

// firstByte notes that c's replica answered (its headers).
func (e *Engine) firstByte(c *call) {
	c.firstByte = e.now()
	e.upLatency(c.rep).Observe(c.firstByte.Sub(c.dispatchAt).Seconds())
}

// moveClock restarts GPU-ms attribution on the replica that will run c.
func (e *Engine) moveClock(c *call, next *fleet.Replica) {
	now := e.now()
	if c.rep.Clock != nil {
		c.rep.Clock.End(now, c.ticket)
	}
	if next.Clock != nil {
		c.ticket = next.Clock.Start(now, c.t.Name)
	}
}

// drainStream reads an upstream stream to its end for a non-streaming
// client, assembling vLLM's non-stream body.
func (e *Engine) drainStream(c *call) ([]byte, error) {
	var asm *vllm.Assembler
	var whole []byte
	for {
		ev, err := c.next()
		if errors.Is(err, io.EOF) {
			if whole != nil {
				return whole, nil
			}
			if asm == nil {
				asm = vllm.NewAssembler(c.ep)
			}
			return asm.Body()
		}
		if err != nil {
			if cause := context.Cause(c.ctx); cause != nil {
				return nil, cause
			}
			return nil, err
		}
		if ev.Err != nil {
			if c.upInterval > 0 {
				// Sent as a stream for the evidence only: the client gets
				// vLLM's error as vLLM answers a non-streamed request,
				// its status and body.
				e := *ev.Err
				e.InStream = false
				return nil, &e
			}
			return nil, ev.Err
		}
		if ev.Whole {
			// vLLM's non-streamed body, the client's as is: the stream
			// owns the buffer, so no Assembler and no copy.
			whole = ev.Raw
			continue
		}
		if asm == nil {
			asm = vllm.NewAssembler(c.ep)
		}
		if err := asm.Add(ev); err != nil {
			return nil, err
		}
		if e.growHold(c, &ev) {
			return stoppedBody(c, asm) // stopped at a budget (grow.go)
		}
	}
}
