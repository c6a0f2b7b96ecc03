package lifecycle

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"time"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/vllm"
)

// The rest of vLLM's OpenAI surface: /v1/embeddings, /v1/responses,
// /tokenize, /detokenize, /v1/score, /v1/rerank, /pooling, /classify and
// Anthropic's /v1/messages. Each is one call of the same lifecycle as chat
// (Start and Finish, ticket.go): the endpoint (vllm.Endpoint) says how
// input is counted (vllm.parseOther), whether there is output (HasOutput)
// and whether only the request counts (RequestOnly). The answer is read
// whole (readOther) or, for a streamed /v1/responses or /v1/messages, as
// its SSE events (pumpEvents); usage is settled from the answer's usage
// object, or for a stream from response.completed or message_delta.

// countSeen is the token count of the output a cut /v1/responses or
// /v1/messages stream showed, by the replica's own tokenizer; -1 when the
// stream ended by itself or no count could be had (Settle then bounds it
// by bytes). The call's context is done by now (its client may have
// left), so the count runs on a detached one of its own, bounded.
func (e *Engine) countSeen(c *call, rs *vllm.ResponsesStream) int {
	text, whole := rs.SeenText()
	if rs.Ended() || !whole || c.rep == nil {
		return -1
	}
	if text == "" {
		return 0
	}
	ctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), 2*time.Second)
	defer cancel()
	n, err := e.up.CountText(ctx, c.rep.URL, c.req.Model, text)
	if err != nil {
		e.log.Warn("counting a cut stream's output failed; charging its bytes bound", "request_id", c.reqID, "err", err)
		return -1
	}
	return n
}

// isOther reports an endpoint other than chat and completions.
func isOther(ep vllm.Endpoint) bool {
	return ep != vllm.EndpointChat && ep != vllm.EndpointCompletions
}

// readOther reads a whole answer and takes its usage for settlement.
func (e *Engine) readOther(c *call) ([]byte, error) {
	b, err := e.up.ReadBody(c.resp)
	if err != nil {
		if cause := context.Cause(c.ctx); cause != nil {
			return nil, cause
		}
		return nil, fmt.Errorf("%w: %w", apierr.ErrUpstreamFailed, err)
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

// pumpEvents passes a streamed /v1/responses or /v1/messages answer through
// event by event (each one write: clientWriter), then settles from
// response.completed or message_delta (or, cut short, from the deltas
// seen). A client that leaves cancels the call's context, which closes
// the upstream connection: vLLM aborts the request. It returns the
// outcome it counted.
func (e *Engine) pumpEvents(c *call, w io.Writer, conn WriteDeadliner) Outcome {
	rs := vllm.NewResponsesStream(c.resp.Body, 0)
	cw := newClientWriter(c, w, conn)
	defer cw.done()
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
				end = fmt.Errorf("%w: %w", apierr.ErrUpstreamFailed, err)
			}
			if !errors.Is(end, apierr.ErrClientGone) && !errors.Is(end, apierr.ErrClientStalled) {
				cw.write(apierr.StreamEvent(c.ep.Anthropic(), end))
			}
			break
		}
		if first {
			first = false
			seriesOf(c.t, e.m).ttft.Observe(e.now().Sub(c.arrival).Seconds())
		}
		if c.wf != nil {
			c.wf.countToolCalls(toolCallsFor(c.ep, raw))
		}
		if cw.write(raw); cw.err != nil {
			end = context.Cause(c.ctx) // the disconnect or stall write cancelled it with
			break
		}
	}
	_ = c.resp.Body.Close()
	c.usage = rs.Settle(c.plan.InputTokens, max(1, c.pol.Cfg.Upstream.StreamInterval), c.plan.OutputTokens, e.countSeen(c, rs))
	e.finish(c, end)
	if end == nil {
		seriesOf(c.t, e.m).requestsOK.Inc()
		return outcomeOK
	}
	o, _ := outcomeFor(apierr.MidStream(end))
	e.m.count(c.t.Name, o, nil)
	return o
}

// toolCallsFor counts the tool calls an answer, or one event of a
// streamed answer, started: chat's and completions' tool_calls entries;
// /v1/responses' function_call output items (in a stream, as each item is
// added: response.completed repeats them); Anthropic's tool_use content
// blocks (in a stream, at content_block_start).
func toolCallsFor(ep vllm.Endpoint, b []byte) int64 {
	switch ep {
	case vllm.EndpointResponses:
		if isEvent(b) && !bytes.Contains(b, []byte(`"type":"response.output_item.added"`)) {
			return 0 // output_item.done and response.completed repeat the items
		}
		return int64(bytes.Count(b, []byte(`"type":"function_call"`)))
	case vllm.EndpointMessages:
		return int64(bytes.Count(b, []byte(`"type":"tool_use"`)))
	default:
		return toolCallsIn(b)
	}
}

// isEvent reports an SSE event (event: or data: lines), not a JSON body.
func isEvent(b []byte) bool {
	return bytes.HasPrefix(b, []byte("event:")) || bytes.HasPrefix(b, []byte("data:"))
}
