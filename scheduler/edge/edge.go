package scheduler

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/connwatch"
	"github.com/sluicehq/sluice/vllm"
)

// Edge is the fasthttp adapter of the client-facing API. It is the only
// code that sees *fasthttp.RequestCtx; everything below it gets a
// context.Context that the edge cancels when the client leaves.
type Edge struct {
	s     *Server
	watch *connwatch.Watcher
	base  context.Context
}

// NewEdge returns the client API handler. base is the parent of every
// request context (the server's lifetime); watch may be nil (then only a
// failed write notices a disconnect).
func NewEdge(base context.Context, s *Server, watch *connwatch.Watcher) *Edge {
	return &Edge{s: s, watch: watch, base: base}
}

// HTTPServer returns a fasthttp.Server for the edge with the configured
// body limit.
func (e *Edge) HTTPServer() *fasthttp.Server {
	return &fasthttp.Server{
		Handler:                      e.Handle,
		Name:                         "sluice",
		MaxRequestBodySize:           int(e.s.Policy().Server.MaxBodyBytes),
		ErrorHandler:                 e.fasthttpError,
		IdleTimeout:                  2 * time.Minute,
		ReadTimeout:                  2 * time.Minute,
		NoDefaultContentType:         true,
		CloseOnShutdown:              true,
		StreamRequestBody:            false,
		DisablePreParseMultipartForm: true,
		ConnState:                    e.connState,
	}
}

// connState ends a closed connection's watch (connwatch.NewPerConn keeps one
// registration per connection, not one per request).
func (e *Edge) connState(c net.Conn, st fasthttp.ConnState) {
	if e.watch != nil && (st == fasthttp.StateClosed || st == fasthttp.StateHijacked) {
		e.watch.Closed(c)
	}
}

// fasthttpError answers errors fasthttp hits before the handler runs.
func (e *Edge) fasthttpError(rc *fasthttp.RequestCtx, err error) {
	rc.Response.Header.Set("X-Request-Id", requestID(rc))
	if errors.Is(err, fasthttp.ErrBodyTooLarge) {
		e.writeError(rc, "", fmt.Errorf("body over %d bytes: %w", e.s.Policy().Server.MaxBodyBytes, ErrTooLarge))
		rc.SetConnectionClose()
		return
	}
	e.writeError(rc, "", invalidf("", "malformed HTTP request"))
	rc.SetConnectionClose()
}

// Handle routes client API requests.
func (e *Edge) Handle(rc *fasthttp.RequestCtx) {
	p := rc.Path() // compared without a copy; path is for the rarer routes
	reqID := requestID(rc)
	rc.Response.Header.Set("X-Request-Id", reqID)
	switch {
	case string(p) == "/healthz":
		rc.SetContentType("text/plain")
		rc.SetBodyString("ok\n")
	case string(p) == "/readyz":
		ok, why := e.s.Ready()
		rc.SetContentType("text/plain")
		if !ok {
			rc.SetStatusCode(503)
		} else if d := e.s.ReadyDetail(); d != "" {
			why += "\n" + d
		}
		rc.SetBodyString(why + "\n")
	case string(p) == "/health":
		// vLLM's own path, for load balancers that probe it: 200 with an
		// empty body (vllm/entrypoints/serve/instrumentator/health.py)
		// while /readyz passes, else 503 with /readyz's reason.
		if !rc.IsGet() && !rc.IsHead() {
			e.methodNotAllowed(rc)
			return
		}
		if ok, why := e.s.Ready(); !ok {
			rc.SetStatusCode(503)
			rc.SetContentType("text/plain")
			rc.SetBodyString(why + "\n")
		}
	case string(p) == "/v1/chat/completions":
		e.serve(rc, vllm.EndpointChat, reqID)
	case string(p) == "/v1/completions":
		e.serve(rc, vllm.EndpointCompletions, reqID)
	case string(p) == "/v1/workflows" || bytes.HasPrefix(p, []byte("/v1/workflows/")):
		e.workflowAPI(rc, strings.TrimPrefix(strings.TrimPrefix(string(p), "/v1/workflows"), "/"))
	case string(p) == "/v1/models":
		if !rc.IsGet() {
			e.methodNotAllowed(rc)
			return
		}
		e.models(rc)
	default:
		path := string(p)
		if ep, ok := vllm.EndpointForPath(path); ok {
			e.serve(rc, ep, reqID) // the rest of vLLM's surface (endpoints.go)
			return
		}
		e.writeError(rc, "", fmt.Errorf("no route %s: %w", path, ErrNotFound))
	}
}

func (e *Edge) methodNotAllowed(rc *fasthttp.RequestCtx) {
	e.writeError(rc, "", invalidf("", "method %s not allowed on %s", rc.Method(), rc.Path()))
	rc.SetStatusCode(405)
}

// requestID is the client's X-Request-Id when sane, else a new random one.
func requestID(rc *fasthttp.RequestCtx) string {
	if id := rc.Request.Header.Peek("X-Request-Id"); len(id) > 0 && len(id) <= 128 && printable(id) {
		return string(id)
	}
	// 96 random bits from the runtime's ChaCha8 generator (seeded by the
	// OS, per thread): unique and unguessable as a correlation id needs,
	// without crypto/rand's per-call cost on every request.
	var r [12]byte
	binary.LittleEndian.PutUint64(r[:8], mrand.Uint64())
	binary.LittleEndian.PutUint32(r[8:], mrand.Uint32())
	var b [7 + 24]byte
	copy(b[:], "sluice-")
	hex.Encode(b[7:], r[:])
	return string(b[:])
}

func printable(b []byte) bool {
	for _, c := range b {
		if c <= ' ' || c >= 0x7f || c == '"' || c == '\\' {
			return false
		}
	}
	return true
}

// parseAdmission reads the request headers that shape admission.
func parseAdmission(rc *fasthttp.RequestCtx, ep vllm.Endpoint, reqID string, traced bool) (admission, error) {
	a := admission{ep: ep, reqID: reqID, body: bytes.Clone(rc.PostBody())}
	h := &rc.Request.Header
	for _, name := range []string{"X-Request-Timeout", "X-Stainless-Timeout"} {
		v := h.Peek(name)
		if len(v) == 0 {
			continue
		}
		sec, err := strconv.ParseFloat(string(v), 64)
		if err != nil || sec <= 0 || sec > 86400 || sec != sec {
			return a, invalidf(name, "%s must be a positive number of seconds (got %q)", name, v)
		}
		a.timeout = time.Duration(sec * float64(time.Second))
		break
	}
	if v := h.Peek("X-Priority"); len(v) > 0 {
		p, err := strconv.Atoi(string(v))
		if err != nil || p < 0 || p > 15 {
			return a, invalidf("X-Priority", "X-Priority must be an integer band 0..15 (got %q)", v)
		}
		a.band, a.bandSet = p, true
	}
	if v := h.Peek("Idempotency-Key"); len(v) > 0 {
		if len(v) > 256 {
			return a, invalidf("Idempotency-Key", "Idempotency-Key is longer than 256 bytes")
		}
		a.idemKey = string(v)
	}
	if v := h.Peek("X-Workflow-Id"); len(v) > 0 {
		if len(v) > 256 || !printable(v) {
			return a, invalidf("X-Workflow-Id", "X-Workflow-Id must be 1..256 printable characters")
		}
		a.workflow = string(v)
	}
	if v := h.Peek("X-Stainless-Retry-Count"); len(v) > 0 && string(v) != "0" {
		a.retry = true
	}
	if traced {
		a.traceparent, a.tracestate = string(h.Peek("Traceparent")), string(h.Peek("Tracestate"))
	}
	return a, nil
}

// clientReq is an authenticated, parsed request and its client context.
type clientReq struct {
	t         *tenant
	pol       *policy
	a         admission
	ctx       context.Context         // cancelled when the peer closes its connection
	gone      context.CancelCauseFunc // ends ctx
	stopWatch func()                  // stops watching the connection
}

// accept runs the first steps every endpoint shares: refuse while draining,
// authenticate, parse the admission headers, and watch the client's
// connection. On false the refusal has been written.
func (e *Edge) accept(rc *fasthttp.RequestCtx, ep vllm.Endpoint, reqID string) (clientReq, bool) {
	s := e.s
	if s.draining.Load() {
		e.reject(rc, "", ErrDraining)
		return clientReq{}, false
	}
	pol := s.pol.Load()
	authz := rc.Request.Header.Peek("Authorization")
	if len(authz) == 0 && ep.Anthropic() {
		// Anthropic's clients send the key as x-api-key.
		if k := rc.Request.Header.Peek("X-Api-Key"); len(k) > 0 {
			authz = append([]byte("Bearer "), k...)
		}
	}
	t, key, err := s.authenticate(pol, authz)
	if err != nil {
		e.reject(rc, "", err)
		return clientReq{}, false
	}
	a, err := parseAdmission(rc, ep, reqID, e.s.tracer != nil)
	if err != nil {
		e.reject(rc, t.name, err)
		return clientReq{}, false
	}
	a.key = key
	cr := clientReq{t: t, pol: pol, a: a, stopWatch: func() {}}
	cr.ctx, cr.gone = context.WithCancelCause(e.base)
	cr.a.cancel = cr.gone // the call's own context unless it has a deadline
	if e.watch != nil {
		gone := cr.gone // captured alone, so that cr stays on the stack
		if stop, err := e.watch.Watch(rc.Conn(), func() { gone(ErrClientGone) }); err == nil {
			cr.stopWatch = stop
		}
	}
	return cr, true
}

// replayed answers a retry of a completed Idempotency-Key with its
// original response.
func (e *Edge) replayed(rc *fasthttp.RequestCtx, tenant string, r *cachedResponse) {
	rc.Response.Header.Set("Idempotent-Replayed", "true")
	rc.SetContentType("application/json")
	rc.SetBody(r.body)
	e.s.m.count(tenant, outcomeOK, nil)
}

// serve answers one request of vLLM's API end to end: the edge's part of
// the call (authenticate, read the admission headers, watch the client's
// connection, write the answer) around the call's owner, Start and
// Finish (ticket.go).
func (e *Edge) serve(rc *fasthttp.RequestCtx, ep vllm.Endpoint, reqID string) {
	if !rc.IsPost() {
		e.methodNotAllowed(rc)
		return
	}
	cr, ok := e.accept(rc, ep, reqID)
	if !ok {
		return
	}
	tk, err := e.s.Start(cr.ctx, cr.t, cr.pol, cr.a)
	if tk == nil || !tk.Streaming() {
		if tk != nil {
			tk.Finish(&wholeSink{e: e, rc: rc})
		} else if replay := asReplay(err); replay != nil {
			e.replayed(rc, cr.t.name, replay)
		} else {
			e.reject(rc, cr.t.name, err)
		}
		cr.stopWatch()
		cr.gone(nil)
		return
	}
	e.successHeaders(rc, tk.c)
	// Send the 200 headers at once, as vLLM does right after validation:
	// the first chunk may be a long prefill away.
	rc.Response.ImmediateHeaderFlush = true
	rc.SetContentType("text/event-stream")
	rc.Response.Header.Set("Cache-Control", "no-cache")
	rc.SetBodyStream(&sseBody{tk: tk, conn: rc.Conn(), stopWatch: cr.stopWatch, gone: cr.gone}, -1)
}

// asReplay is the completed response an Idempotency-Key retry is answered
// with, or nil (out of line: an errors.As target escapes).
func asReplay(err error) *cachedResponse {
	var replay *cachedResponse
	if errors.As(err, &replay) {
		return replay
	}
	return nil
}

// wholeSink answers a non-streamed call, or a call that failed before its
// answer opened, on the request's response.
type wholeSink struct {
	e  *Edge
	rc *fasthttp.RequestCtx
}

func (w *wholeSink) whole(c *call, body []byte) {
	w.e.successHeaders(w.rc, c)
	w.rc.SetContentType("application/json")
	w.rc.SetBody(body)
}

func (w *wholeSink) refuse(c *call, err error) *apiError { return w.e.refuse(w.rc, c, err) }

func (w *wholeSink) stream() (io.Writer, writeDeadliner) { return io.Discard, nil } // never streamed

// sseBody is a streamed response's body. fasthttp calls WriteTo on the
// connection's own goroutine, and each Write is one HTTP chunk, flushed
// (SetBodyStreamWriter instead runs a writer on a goroutine of its own and
// passes every chunk through a pipe, a goroutine hand-off per event).
// WriteTo runs the call's Finish into the connection; Close, which
// fasthttp always calls, runs it with no sink when the body was never
// written (the client left before the headers went out), then stops
// watching the client.
type sseBody struct {
	tk        *Ticket
	conn      writeDeadliner // the client's connection; nil: no write deadline
	stopWatch func()         // stops watching the client's connection
	gone      context.CancelCauseFunc

	mu     sync.Mutex
	pumped bool // WriteTo ran Finish
	closed bool
}

func (b *sseBody) SupportsBodyWriteTo() bool { return true }

func (b *sseBody) WriteTo(w io.Writer) (int64, error) {
	b.mu.Lock()
	if b.pumped || b.closed {
		b.mu.Unlock()
		return 0, errors.New("sse body: written twice")
	}
	b.pumped = true
	b.mu.Unlock()
	out := sseSink{w: w, conn: b.conn}
	b.tk.Finish(&out)
	return out.n, out.err
}

// Read is never called: fasthttp writes a body whose SupportsBodyWriteTo
// is true through WriteTo, and SetBodyStream takes an io.Reader.
func (b *sseBody) Read([]byte) (int, error) {
	return 0, errors.New("sse body: fasthttp reads it through WriteTo")
}

func (b *sseBody) Close() error {
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return nil
	}
	b.closed = true
	pumped := b.pumped
	b.mu.Unlock()
	if !pumped {
		b.tk.Finish(nil)
	}
	if b.stopWatch != nil {
		b.stopWatch()
	}
	if b.gone != nil {
		b.gone(nil)
	}
	return nil
}

// sseSink is a streamed answer's sink: the chunked body writer fasthttp
// gives WriteTo, and what was written to it.
type sseSink struct {
	w    io.Writer
	conn writeDeadliner
	n    int64
	err  error
}

func (o *sseSink) Write(b []byte) (int, error) {
	n, err := o.w.Write(b)
	o.n += int64(n)
	if err != nil && o.err == nil {
		o.err = err
	}
	return n, err
}

func (o *sseSink) stream() (io.Writer, writeDeadliner) { return o, o.conn }

// whole and refuse do not happen to a streamed answer, whose 200 headers
// went out before Finish.
func (o *sseSink) whole(*call, []byte) {}

func (o *sseSink) refuse(*call, error) *apiError { return nil }

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
// write (one HTTP chunk, flushed: sseBody) made just before the stream
// reads the replica again (Stream.BeforeRead), so no event waits on the
// replica; under load, when several events arrive in one read, that is one
// client write per upstream read instead of one per event. A failed write
// is a client disconnect. Each write must complete within
// server.stream_write_timeout (conn's write deadline, when conn is set): a
// client that stops reading fills its socket buffers, the write blocks,
// and the deadline ends the call as ErrClientStalled, so that it does not
// hold its slot and replica room for as long as it does not read. It
// returns the outcome it counted.
func (s *Server) pump(c *call, w io.Writer, conn writeDeadliner) outcome {
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
		ev, err := c.stream.Next()
		if err != nil {
			flush() // what was read goes out before the end or the error event
		}
		if cw.err != nil {
			c.cancel(ErrClientGone)
			s.finish(c, ErrClientGone)
			s.m.count(c.t.name, outcomeCancelled, nil)
			return outcomeCancelled
		}
		if errors.Is(err, io.EOF) {
			if ref := c.stream.Refused(); ref != nil {
				// vLLM refused it after the headers: an error, uncharged.
				s.finish(c, ref)
				s.m.count(c.t.name, outcomeUpstreamError, nil)
				return outcomeUpstreamError
			}
			s.finish(c, nil)
			c.t.series(s.m).requestsOK.Inc()
			return outcomeOK
		}
		if err != nil {
			cause := context.Cause(c.ctx)
			if cause == nil {
				cause = err
			}
			s.finish(c, cause)
			if !errors.Is(cause, ErrClientGone) {
				write(streamErrorEvent(c, cause))
			}
			o, _ := outcomeFor(&streamError{cause: cause})
			s.m.count(c.t.name, o, nil)
			return o
		}
		if c.wf != nil {
			c.wf.countToolCalls(toolCallsFor(c.ep, ev.Data))
		}
		var ok bool
		buf, ok = shaper.Shape(buf, ev)
		if s.growHold(c, &ev) {
			// Stopped at a budget (grow.go): what was generated, then the
			// chunk that ends it.
			buf = appendStopped(buf, c)
			flush()
			s.finish(c, errBudgetEnded)
			c.t.series(s.m).requestsOK.Inc()
			return outcomeOK
		}
		if !ok {
			continue
		}
		if first && !ev.Done {
			first = false
			c.t.series(s.m).ttft.Observe(s.now().Sub(c.arrival).Seconds())
		}
		if len(buf) >= maxCoalesce {
			flush()
		}
	}
}

// writeDeadliner is the part of the client's net.Conn pump uses.
type writeDeadliner interface{ SetWriteDeadline(time.Time) error }

// clientWriter writes a streamed answer to the client. Each write must
// complete within server.stream_write_timeout (conn's write deadline, when
// conn is set); a failed write cancels the call, as a disconnect or, past
// the deadline, a stalled client (which closes its upstream), and ends
// the writing (err).
type clientWriter struct {
	c       *call
	w       io.Writer
	conn    writeDeadliner
	timeout time.Duration
	err     error // the first failed write's
}

func newClientWriter(c *call, w io.Writer, conn writeDeadliner) *clientWriter {
	cw := &clientWriter{c: c, w: w, conn: conn, timeout: c.pol.cfg.Server.StreamWriteTimeout}
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
		cause := ErrClientGone
		if errors.Is(err, os.ErrDeadlineExceeded) {
			cause = ErrClientStalled
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

// successHeaders sets the budget and timing headers of ARCHITECTURE §3.3.
func (e *Edge) successHeaders(rc *fasthttp.RequestCtx, c *call) {
	h := &rc.Response.Header
	now := e.s.now()
	var num [24]byte
	for _, d := range rateLimitHeaders {
		room := c.grant.Headroom[d.dim]
		if !room.Tracked {
			continue
		}
		h.SetBytesV(d.limit, strconv.AppendInt(num[:0], room.Limit, 10))
		h.SetBytesV(d.remaining, strconv.AppendInt(num[:0], room.Remaining, 10))
		h.Set(d.reset, room.ResetsAt.Sub(now).Round(time.Millisecond).String())
	}
	if warn(c) {
		h.Set("X-Budget-Warning", "soft_threshold")
	}
	outputCapHeader(h, c)
	// "queue;dur=%.3f[, upstream;dur=%.3f]" of whole microseconds, without
	// fmt nor float formatting.
	var st [64]byte
	b := append(st[:0], "queue;dur="...)
	b = appendMillis(b, usBetween(c.arrival, c.dispatchAt))
	if !c.firstByte.IsZero() {
		b = append(b, ", upstream;dur="...)
		b = appendMillis(b, usBetween(c.dispatchAt, c.firstByte))
	}
	h.SetBytesV("Server-Timing", b)
}

// appendMillis appends us microseconds as milliseconds with three decimals:
// the text %.3f prints for float64(us)/1000.
func appendMillis(b []byte, us int64) []byte {
	if us < 0 {
		b, us = append(b, '-'), -us
	}
	b = strconv.AppendInt(b, us/1000, 10)
	frac := us % 1000
	return append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
}

// rateLimitHeaders are the budget headers of ARCHITECTURE §3.3, names
// built once.
var rateLimitHeaders = []struct {
	dim                     ledger.Dim
	limit, remaining, reset string
}{
	{ledger.Tokens, "x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"},
	{ledger.Requests, "x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"},
}

func usBetween(a, b time.Time) int64 {
	if a.IsZero() || b.IsZero() {
		return 0
	}
	return b.Sub(a).Microseconds()
}

// warn reports whether a warn-mode budget is past its limit or a block-mode
// budget past its warning ratio after this grant.
func warn(c *call) bool {
	if len(c.grant.Warnings) > 0 {
		return true
	}
	for d, ratio := range c.t.warn {
		room := c.grant.Headroom[d]
		if room.Tracked && room.Limit > 0 && float64(room.Limit-room.Remaining) >= ratio*float64(room.Limit) {
			return true
		}
	}
	return false
}

// models answers GET /v1/models with the union of the replicas' models
// that the tenant may use (routing.go).
func (e *Edge) models(rc *fasthttp.RequestCtx) {
	t, _, err := e.s.authenticate(e.s.pol.Load(), rc.Request.Header.Peek("Authorization"))
	if err != nil {
		e.reject(rc, "", err)
		return
	}
	b, _ := marshal(struct {
		Object string      `json:"object"`
		Data   []modelCard `json:"data"`
	}{"list", e.s.modelList(t)})
	rc.SetContentType("application/json")
	rc.SetBody(b)
}

// workflowAPI serves POST /v1/workflows (create an envelope with explicit
// limits, capped by the tenant's workflow_defaults) and GET
// /v1/workflows/{id} (limits, used, remaining), with the tenant's own key.
func (e *Edge) workflowAPI(rc *fasthttp.RequestCtx, id string) {
	s := e.s
	pol := s.pol.Load()
	t, _, err := s.authenticate(pol, rc.Request.Header.Peek("Authorization"))
	if err != nil {
		e.reject(rc, "", err)
		return
	}
	switch {
	case id == "" && rc.IsPost():
		var in struct {
			MaxCalls        int64  `json:"max_calls"`
			MaxInputTokens  int64  `json:"max_input_tokens"`
			MaxOutputTokens int64  `json:"max_output_tokens"`
			MaxDuration     string `json:"max_duration"`
			MaxUSDMicros    int64  `json:"max_usd_micros"`
			MaxRetries      int64  `json:"max_retries"`
			MaxToolCalls    int64  `json:"max_tool_calls"`
		}
		dec := json.NewDecoder(bytes.NewReader(rc.PostBody()))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&in); err != nil {
			e.reject(rc, t.name, invalidf("", "workflow body: %v", err))
			return
		}
		lim := config.WorkflowLimit{MaxCalls: in.MaxCalls, MaxInputTokens: in.MaxInputTokens, MaxOutputTokens: in.MaxOutputTokens,
			MaxUSDMicros: in.MaxUSDMicros, MaxRetries: in.MaxRetries, MaxToolCalls: in.MaxToolCalls}
		if in.MaxDuration != "" {
			d, err := time.ParseDuration(in.MaxDuration)
			if err != nil || d <= 0 {
				e.reject(rc, t.name, invalidf("max_duration", "max_duration must be a positive duration such as 10m"))
				return
			}
			lim.MaxDuration = d
		}
		for name, v := range map[string]int64{"max_calls": lim.MaxCalls, "max_input_tokens": lim.MaxInputTokens,
			"max_output_tokens": lim.MaxOutputTokens, "max_usd_micros": lim.MaxUSDMicros, "max_retries": lim.MaxRetries,
			"max_tool_calls": lim.MaxToolCalls} {
			if v < 0 {
				e.reject(rc, t.name, invalidf(name, "%s must be >= 0", name))
				return
			}
		}
		if in.MaxOutputTokens == 0 && t.cfg.Workflow.MaxOutputTokens == 0 {
			e.reject(rc, t.name, invalidf("max_output_tokens", "max_output_tokens must be > 0"))
			return
		}
		wf := s.wfs.create(t.name, capWorkflowLimits(lim, t.cfg.Workflow), s.now())
		rc.SetStatusCode(201)
		e.writeWorkflow(rc, t, wf)
	case id != "" && rc.IsGet():
		wf := s.wfs.get(t.name, id)
		if wf == nil {
			e.reject(rc, t.name, fmt.Errorf("workflow %q: %w", id, ErrNotFound))
			return
		}
		e.writeWorkflow(rc, t, wf)
	default:
		e.methodNotAllowed(rc)
	}
}

// writeWorkflow renders an envelope with its ledger usage.
func (e *Edge) writeWorkflow(rc *fasthttp.RequestCtx, t *tenant, wf *workflow) {
	s := e.s
	ctx, cancel := context.WithTimeout(e.base, 2*time.Second)
	defer cancel()
	u, err := s.led.Snapshot(ctx, t.key, s.keyer.Key(ledger.KindWorkflow, t.name+"\x00"+wf.id))
	if err != nil {
		e.reject(rc, t.name, err)
		return
	}
	used := map[string]int64{
		"calls": u.Reserved[ledger.Requests], "input_tokens": u.Reserved[ledger.InputTokens],
		"output_tokens": u.Reserved[ledger.OutputTokens], "usd_micros": u.Reserved[ledger.USDMicros],
	}
	for _, l := range u.Limits {
		switch l.Limit.Dim {
		case ledger.Requests:
			used["calls"] += l.Committed
		case ledger.InputTokens:
			used["input_tokens"] += l.Committed
		case ledger.OutputTokens:
			used["output_tokens"] += l.Committed
		case ledger.USDMicros:
			used["usd_micros"] += l.Committed
		}
	}
	wf.mu.Lock()
	used["retries"], used["tool_calls"] = wf.retries, wf.toolCalls
	wf.mu.Unlock()
	lim := wf.limits
	limits := map[string]any{"max_calls": lim.MaxCalls, "max_input_tokens": lim.MaxInputTokens, "max_output_tokens": lim.MaxOutputTokens,
		"max_usd_micros": lim.MaxUSDMicros, "max_retries": lim.MaxRetries, "max_tool_calls": lim.MaxToolCalls,
		"max_duration": lim.MaxDuration.String()}
	remaining := map[string]any{}
	for k, l := range map[string]int64{"calls": lim.MaxCalls, "input_tokens": lim.MaxInputTokens, "output_tokens": lim.MaxOutputTokens,
		"usd_micros": lim.MaxUSDMicros, "retries": lim.MaxRetries, "tool_calls": lim.MaxToolCalls} {
		if l > 0 {
			remaining[k] = max(0, l-used[k])
		}
	}
	if lim.MaxDuration > 0 {
		remaining["duration"] = max(0, lim.MaxDuration-s.now().Sub(wf.created)).Round(time.Millisecond).String()
	}
	b, _ := marshal(map[string]any{"id": wf.id, "object": "workflow", "created": wf.created.Unix(),
		"limits": limits, "used": used, "remaining": remaining})
	rc.SetContentType("application/json")
	rc.SetBody(b)
}
