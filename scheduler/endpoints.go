package scheduler

import (
	"bufio"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/vllm"
)

// The rest of vLLM's OpenAI surface: /v1/embeddings, /v1/responses,
// /tokenize, /detokenize, /v1/score, /v1/rerank, /pooling and /classify.
// Each goes through the same admit → await → execute → finish lifecycle as
// chat; the endpoint (vllm.Endpoint) says how input is counted
// (vllm.parseOther), whether there is output (HasOutput) and whether only
// the request counts (RequestOnly). Usage is settled from the answer's
// usage object, or for a streamed response from response.completed.

// poster is what the new endpoints need from the upstream client
// (vllm.Client): a plain POST whose answer is read whole or as SSE.
type poster interface {
	Post(ctx context.Context, baseURL, path string, body []byte, requestID string) (*http.Response, error)
	ReadBody(resp *http.Response) ([]byte, error)
}

var _ poster = (*vllm.Client)(nil)

// textCounter counts output text with a replica's tokenizer (vllm.Client):
// a stream of events cut before its usage is charged the count of the
// text it carried.
type textCounter interface {
	CountText(ctx context.Context, baseURL, model, text string) (int, error)
}

var _ textCounter = (*vllm.Client)(nil)

// countSeen is the token count of the output a cut /v1/responses or
// /v1/messages stream showed, by the replica's own tokenizer; -1 when the
// stream ended by itself or no count could be had (Settle then bounds it
// by bytes). The call's context is done by now (its client may have
// left), so the count runs on a detached one of its own, bounded.
func (s *Server) countSeen(c *call, rs *vllm.ResponsesStream) int {
	tc, ok := s.up.(textCounter)
	text, whole := rs.SeenText()
	if rs.Ended() || !ok || !whole || c.rep == nil {
		return -1
	}
	if text == "" {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), 2*time.Second)
	defer cancel()
	n, err := tc.CountText(ctx, c.rep.url, c.req.Model, text)
	if err != nil {
		s.log.Warn("counting a cut stream's output failed; charging its bytes bound", "request_id", c.reqID, "err", err)
		return -1
	}
	return n
}

// isOther reports an endpoint served by other (not chat/completions).
func isOther(ep vllm.Endpoint) bool {
	return ep != vllm.EndpointChat && ep != vllm.EndpointCompletions
}

// other serves one request of the non-chat endpoints end to end.
func (e *Edge) other(rc *fasthttp.RequestCtx, ep vllm.Endpoint, reqID string) {
	if !rc.IsPost() {
		e.methodNotAllowed(rc)
		return
	}
	s := e.s
	cr, ok := e.accept(rc, ep, reqID)
	if !ok {
		return
	}
	t, pol, a, cctx, gone, stopWatch := cr.t, cr.pol, cr.a, cr.ctx, cr.gone, cr.stopWatch
	streaming := false
	defer func() {
		if !streaming {
			stopWatch()
			gone(nil)
		}
	}()
	c, err := s.admit(cctx, t, pol, a)
	var replay *cachedResponse
	if errors.As(err, &replay) {
		e.replayed(rc, t.name, replay)
		return
	}
	if err != nil {
		e.reject(rc, t.name, err)
		return
	}
	defer func() {
		if !streaming {
			c.end()
		}
	}()
	if err := s.await(c); err != nil {
		e.outcome(rc, c, err)
		return
	}
	resp, err := s.post(c) //nolint:bodyclose // closed by pumpResponses (stream) or ReadBody (unary)
	if err != nil {
		s.finish(c, err)
		e.outcome(rc, c, err)
		return
	}
	e.successHeaders(rc, c)
	if (ep == vllm.EndpointResponses || ep == vllm.EndpointMessages) && c.req.Stream {
		streaming = true
		rc.Response.ImmediateHeaderFlush = true
		rc.SetContentType("text/event-stream")
		rc.Response.Header.Set("Cache-Control", "no-cache")
		rc.SetBodyStreamWriter(func(w *bufio.Writer) {
			defer gone(nil)
			defer stopWatch()
			defer c.end()
			e.pumpResponses(c, resp, w)
		})
		return
	}
	body, err := s.readUnary(c, resp)
	if err == nil {
		s.rememberResponse(c, body) // before the settlement, as start does
	}
	s.finish(c, err)
	if err != nil {
		e.outcome(rc, c, err)
		return
	}
	ts := t.series(s.m)
	ts.ttft.Observe(s.now().Sub(c.arrival).Seconds())
	ts.requestsOK.Inc()
	rc.SetContentType("application/json")
	rc.SetBody(body)
}

// post sends the call upstream like execute: on the chosen replica, or on
// another of its pool when the chosen one refused before anything was sent.
func (s *Server) post(c *call) (*http.Response, error) {
	p, ok := s.up.(poster)
	if !ok {
		return nil, fmt.Errorf("the upstream client cannot serve %s: %w", c.ep.Path(), ErrUpstreamFailed)
	}
	body := make([]byte, 0, len(c.req.Body())+32)
	built, bodyPrio := false, false
	tried := map[*replica]bool{}
	for {
		if !built || bodyPrio != c.rep.prioritySched {
			body = c.req.UpstreamBody(body[:0], c.plan.Cap, c.rewriteOptions())
			built, bodyPrio = true, c.rep.prioritySched
		}
		tried[c.rep] = true
		resp, err := p.Post(c.ctx, c.rep.url, c.ep.Path(), body, c.reqID)
		if err == nil {
			c.sent = true
			c.firstByte = s.now()
			s.upLatency(c.rep).Observe(c.firstByte.Sub(c.dispatchAt).Seconds())
			return resp, nil
		}
		var ue *vllm.UpstreamError
		retry := errors.Is(err, vllm.ErrNotSent) || (errors.As(err, &ue) && ue.Retryable())
		if !errors.Is(err, vllm.ErrNotSent) && !errors.As(err, &ue) {
			c.sent = true // the replica may have started it
		}
		if cause := context.Cause(c.ctx); cause != nil {
			return nil, cause // the client left or its deadline passed (execute)
		}
		if !retry {
			return nil, err
		}
		next, seq := s.reps.take(c.route, c.size, c.rep)
		if next == nil || tried[next] {
			if next != nil {
				s.reps.release(next, c.size)
			}
			return nil, fmt.Errorf("%w: %w", ErrNoReplica, err)
		}
		s.moveClock(c, next)
		s.reps.release(c.rep, c.size)
		c.rep, c.seq = next, seq
	}
}

// readUnary reads a whole answer and takes its usage for settlement.
func (s *Server) readUnary(c *call, resp *http.Response) ([]byte, error) {
	b, err := s.up.(poster).ReadBody(resp)
	if err != nil {
		if cause := context.Cause(c.ctx); cause != nil {
			return nil, cause
		}
		return nil, fmt.Errorf("%w: %w", ErrUpstreamFailed, err)
	}
	u, ok := vllm.BodyUsage(b)
	switch {
	case c.ep.RequestOnly():
		c.usage = vllm.Usage{Known: true, Final: true}
	case ok:
		if !c.ep.HasOutput() {
			u.CompletionTokens = 0
		}
		c.usage = u
	default:
		// No usage: charge the admitted input bound (and the cap).
		c.usage = vllm.Usage{PromptTokens: c.plan.InputTokens, CompletionTokens: c.plan.OutputTokens, Known: true}
	}
	return b, nil
}

// pumpResponses passes a streamed /v1/responses answer through event by
// event, then settles from response.completed (or, cut short, from the
// deltas seen). A client that leaves cancels the call's context, which
// closes the upstream connection: vLLM aborts the request.
func (e *Edge) pumpResponses(c *call, resp *http.Response, w *bufio.Writer) {
	s := e.s
	rs := vllm.NewResponsesStream(resp.Body, 0)
	defer resp.Body.Close()
	first := true
	var end error
	for {
		raw, err := rs.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		if err != nil {
			end = context.Cause(c.ctx)
			if end == nil {
				end = fmt.Errorf("%w: %w", ErrUpstreamFailed, err)
			}
			if !errors.Is(end, ErrClientGone) && c.ep.Anthropic() {
				_, _ = w.Write(anthropicSSEError(statusFor(end)))
				_ = w.Flush()
			} else if !errors.Is(end, ErrClientGone) {
				_, _ = w.Write(sseError(statusFor(end)))
				_ = w.Flush()
			}
			break
		}
		if first {
			first = false
			c.t.series(s.m).ttft.Observe(s.now().Sub(c.arrival).Seconds())
		}
		if _, err := w.Write(raw); err == nil {
			if err = w.Flush(); err == nil {
				continue
			}
		}
		c.cancel(ErrClientGone)
		end = ErrClientGone
		break
	}
	_ = resp.Body.Close()
	c.usage = rs.Settle(c.plan.InputTokens, max(1, c.pol.cfg.Upstream.StreamInterval), c.plan.OutputTokens, s.countSeen(c, rs))
	s.finish(c, end)
	if end == nil {
		c.t.series(s.m).requestsOK.Inc()
		return
	}
	o, _ := outcomeFor(&streamError{cause: end})
	s.m.count(c.t.name, o, nil)
}
