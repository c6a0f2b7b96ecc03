package lifecycle

import (
	"context"
	"errors"
	"io"
	"os"
	"time"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/vllm"
)

// A streamed answer's delivery, inside Finish: the events passed from the
// replica to the sink's writer, coalesced per upstream read, each write
// bounded by server.stream_write_timeout.

// end releases the call's context resources; the call must be settled or
// released already.
func (c *call) end() {
	c.cancel(nil)
	if c.stopDeadline != nil {
		c.stopDeadline()
	}
}

// pump passes a chat or completions stream to a streaming client, then
// settles (Finish, for a streamed answer).
// Events already in the stream's read buffer are written together, in one
// write (the sink's: one HTTP chunk, flushed) made just before the stream
// reads the replica again (Stream.BeforeRead), so no event waits on the
// replica; under load, when several events arrive in one read, that is one
// client write per upstream read instead of one per event. A failed write
// is a client disconnect. Each write must complete within
// server.stream_write_timeout (conn's write deadline, when conn is set): a
// client that stops reading fills its socket buffers, the write blocks,
// and the deadline ends the call as apierr.ErrClientStalled, so that it does not
// hold its slot and replica room for as long as it does not read. It
// returns the outcome it counted.
func (e *Engine) pump(c *call, w io.Writer, conn WriteDeadliner) Outcome {
	var buf []byte // shaped events not yet written
	first := true
	shaper := vllm.NewShaper(c.req)
	cw := newClientWriter(c, w, conn)
	defer cw.done()
	write := cw.write
	flush := func() {
		if len(buf) == 0 || cw.err != nil {
			return
		}
		write(buf)
		buf = buf[:0]
	}
	c.stream.BeforeRead(flush)
	defer c.stream.BeforeRead(nil)

	for {
		ev, err := c.next()
		if err != nil {
			flush() // what was read goes out before the end or the error event
		}
		if cw.err != nil {
			c.cancel(apierr.ErrClientGone)
			e.finish(c, apierr.ErrClientGone)
			e.m.count(c.t.Name, outcomeCancelled, nil)
			return outcomeCancelled
		}
		if errors.Is(err, io.EOF) {
			if ref := c.stream.Refused(); ref != nil {
				// vLLM refused it after the headers: an error, uncharged.
				e.finish(c, ref)
				e.m.count(c.t.Name, outcomeUpstreamError, nil)
				return outcomeUpstreamError
			}
			e.finish(c, nil)
			seriesOf(c.t, e.m).requestsOK.Inc()
			return outcomeOK
		}
		if err != nil {
			cause := context.Cause(c.ctx)
			if cause == nil {
				cause = err
			}
			e.finish(c, cause)
			if !errors.Is(cause, apierr.ErrClientGone) {
				write(apierr.StreamEvent(c.ep.Anthropic(), cause))
			}
			o, _ := outcomeFor(apierr.MidStream(cause))
			e.m.count(c.t.Name, o, nil)
			return o
		}
		if c.wf != nil {
			c.wf.countToolCalls(toolCallsFor(c.ep, ev.Data))
		}
		var ok bool
		buf, ok = shaper.Shape(buf, ev)
		if e.growHold(c, &ev) {
			// Stopped at a budget (grow.go): what was generated, then the
			// chunk that ends it.
			buf = appendStopped(buf, c)
			flush()
			e.finish(c, errBudgetEnded)
			seriesOf(c.t, e.m).requestsOK.Inc()
			return outcomeOK
		}
		if !ok {
			continue
		}
		if first && !ev.Done {
			first = false
			seriesOf(c.t, e.m).ttft.Observe(e.now().Sub(c.arrival).Seconds())
		}
		if len(buf) >= maxCoalesce {
			flush()
		}
	}
}

// WriteDeadliner is the part of the client's connection (a net.Conn) a
// streamed answer's writes use: each write's deadline.
type WriteDeadliner interface{ SetWriteDeadline(time.Time) error }

// clientWriter writes a streamed answer to the client. Each write must
// complete within server.stream_write_timeout (conn's write deadline, when
// conn is set); a failed write cancels the call, as a disconnect or, past
// the deadline, a stalled client (which closes its upstream), and ends
// the writing (err).
type clientWriter struct {
	c       *call
	w       io.Writer
	conn    WriteDeadliner
	timeout time.Duration
	err     error // the first failed write's
}

func newClientWriter(c *call, w io.Writer, conn WriteDeadliner) *clientWriter {
	cw := &clientWriter{c: c, w: w, conn: conn, timeout: c.pol.Cfg.Server.StreamWriteTimeout}
	if cw.timeout <= 0 {
		cw.conn = nil
	}
	return cw
}

func (cw *clientWriter) write(b []byte) {
	if cw.err != nil {
		return
	}
	if cw.conn != nil {
		_ = cw.conn.SetWriteDeadline(time.Now().Add(cw.timeout))
	}
	if _, err := cw.w.Write(b); err != nil {
		cw.err = err
		cause := apierr.ErrClientGone
		if errors.Is(err, os.ErrDeadlineExceeded) {
			cause = apierr.ErrClientStalled
		}
		cw.c.cancel(cause) // closes upstream: the read after this returns
	}
}

// done clears the write deadline: the connection may serve the next
// request, with no deadline of this one's.
func (cw *clientWriter) done() {
	if cw.conn != nil && cw.err == nil {
		_ = cw.conn.SetWriteDeadline(time.Time{})
	}
}

// maxCoalesce bounds the events pump holds for one write.
const maxCoalesce = 32 << 10
