// Package edge is the client edge: the fasthttp server of the client API,
// and the only code under scheduler/ that speaks HTTP to clients (with the
// wiring in scheduler/node). It authenticates a request, reads the headers
// that shape admission, watches the client's connection, and hands the
// call to its one owner in package scheduler: Start, then Ticket.Finish into
// a sink of this package that writes the answer (whole, refused or
// streamed). It sees the scheduler only through those exported ports and
// values; it never sees a call.
package edge

import (
	"bytes"
	"context"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	mrand "math/rand/v2"
	"net"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/connwatch"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/sluicehq/sluice/vllm"
)

// Scheduler is what the edge needs of the admission pipeline
// (*scheduler.Server, which carries the call lifecycle's ports): the
// call's owner (Start; Replayed and Reject for a call that never started),
// authentication, the model list and workflows it answers itself, whether
// it drains or traces, readiness for the probes it serves, and the
// policy's body limit.
type Scheduler interface {
	Authenticate(authz []byte) (lifecycle.Caller, error)
	Start(ctx context.Context, a lifecycle.Admission) (*lifecycle.Ticket, error)
	Replayed(c lifecycle.Caller, err error) ([]byte, bool)
	Reject(tenant, reqID string, err error) *apierr.Error
	Models(c lifecycle.Caller) []byte
	CreateWorkflow(ctx context.Context, c lifecycle.Caller, body []byte) ([]byte, error)
	Workflow(ctx context.Context, c lifecycle.Caller, id string) ([]byte, error)
	Draining() bool
	Traced() bool
	Ready() (bool, string)
	ReadyDetail() string
	Policy() *config.File
}

// Edge is the fasthttp adapter of the client-facing API. It is the only
// code that sees *fasthttp.RequestCtx; everything below it gets a
// context.Context that the edge cancels when the client leaves.
type Edge struct {
	s     Scheduler
	watch *connwatch.Watcher
	base  context.Context
}

// New returns the client API handler. base is the parent of every request
// context (the server's lifetime); watch may be nil (then only a failed
// write notices a disconnect).
func New(base context.Context, s Scheduler, watch *connwatch.Watcher) *Edge {
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
		writeError(rc, apierr.For(fmt.Errorf("body over %d bytes: %w", e.s.Policy().Server.MaxBodyBytes, apierr.ErrTooLarge)))
		rc.SetConnectionClose()
		return
	}
	writeError(rc, apierr.For(apierr.Invalidf("", "malformed HTTP request")))
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
			e.serve(rc, ep, reqID) // the rest of vLLM's surface
			return
		}
		writeError(rc, apierr.For(fmt.Errorf("no route %s: %w", path, apierr.ErrNotFound)))
	}
}

func (e *Edge) methodNotAllowed(rc *fasthttp.RequestCtx) {
	writeError(rc, apierr.For(apierr.Invalidf("", "method %s not allowed on %s", rc.Method(), rc.Path())))
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

// parseAdmission reads the request headers that shape admission into a.
func parseAdmission(rc *fasthttp.RequestCtx, a *lifecycle.Admission, traced bool) error {
	a.Body = bytes.Clone(rc.PostBody())
	h := &rc.Request.Header
	for _, name := range []string{"X-Request-Timeout", "X-Stainless-Timeout"} {
		v := h.Peek(name)
		if len(v) == 0 {
			continue
		}
		sec, err := strconv.ParseFloat(string(v), 64)
		if err != nil || sec <= 0 || sec > 86400 || sec != sec {
			return apierr.Invalidf(name, "%s must be a positive number of seconds (got %q)", name, v)
		}
		a.Timeout = time.Duration(sec * float64(time.Second))
		break
	}
	if v := h.Peek("X-Priority"); len(v) > 0 {
		p, err := strconv.Atoi(string(v))
		if err != nil || p < 0 || p > 15 {
			return apierr.Invalidf("X-Priority", "X-Priority must be an integer band 0..15 (got %q)", v)
		}
		a.Band, a.BandSet = p, true
	}
	if v := h.Peek("Idempotency-Key"); len(v) > 0 {
		if len(v) > 256 {
			return apierr.Invalidf("Idempotency-Key", "Idempotency-Key is longer than 256 bytes")
		}
		a.IdempotencyKey = string(v)
	}
	if v := h.Peek("X-Workflow-Id"); len(v) > 0 {
		if len(v) > 256 || !printable(v) {
			return apierr.Invalidf("X-Workflow-Id", "X-Workflow-Id must be 1..256 printable characters")
		}
		a.Workflow = string(v)
	}
	if v := h.Peek("X-Stainless-Retry-Count"); len(v) > 0 && string(v) != "0" {
		a.Retry = true
	}
	if traced {
		a.Traceparent, a.Tracestate = string(h.Peek("Traceparent")), string(h.Peek("Tracestate"))
	}
	return nil
}

// clientReq is an authenticated, parsed request and its client context.
type clientReq struct {
	a         lifecycle.Admission
	ctx       context.Context         // cancelled when the peer closes its connection
	gone      context.CancelCauseFunc // ends ctx
	stopWatch func()                  // stops watching the connection
}

// accept runs the first steps every endpoint shares: refuse while draining,
// authenticate, parse the admission headers, and watch the client's
// connection. On false the refusal has been written.
func (e *Edge) accept(rc *fasthttp.RequestCtx, ep vllm.Endpoint, reqID string) (clientReq, bool) {
	s := e.s
	if s.Draining() {
		e.reject(rc, "", apierr.ErrDraining)
		return clientReq{}, false
	}
	authz := rc.Request.Header.Peek("Authorization")
	if len(authz) == 0 && ep.Anthropic() {
		// Anthropic's clients send the key as x-api-key.
		if k := rc.Request.Header.Peek("X-Api-Key"); len(k) > 0 {
			authz = append([]byte("Bearer "), k...)
		}
	}
	caller, err := s.Authenticate(authz)
	if err != nil {
		e.reject(rc, "", err)
		return clientReq{}, false
	}
	cr := clientReq{a: lifecycle.Admission{Caller: caller, Endpoint: ep, RequestID: reqID}, stopWatch: func() {}}
	if err := parseAdmission(rc, &cr.a, s.Traced()); err != nil {
		e.reject(rc, caller.Tenant(), err)
		return clientReq{}, false
	}
	cr.ctx, cr.gone = context.WithCancelCause(e.base)
	cr.a.Cancel = cr.gone // the call's own context unless it has a deadline
	if e.watch != nil {
		gone := cr.gone // captured alone, so that cr stays on the stack
		if stop, err := e.watch.Watch(rc.Conn(), func() { gone(apierr.ErrClientGone) }); err == nil {
			cr.stopWatch = stop
		}
	}
	return cr, true
}

// serve answers one request of vLLM's API end to end: the edge's part of
// the call (authenticate, read the admission headers, watch the client's
// connection, write the answer) around the call's owner, Start and
// Finish.
func (e *Edge) serve(rc *fasthttp.RequestCtx, ep vllm.Endpoint, reqID string) {
	if !rc.IsPost() {
		e.methodNotAllowed(rc)
		return
	}
	cr, ok := e.accept(rc, ep, reqID)
	if !ok {
		return
	}
	tk, err := e.s.Start(cr.ctx, cr.a)
	if tk == nil || !tk.Streaming() {
		if tk != nil {
			tk.Finish(&wholeSink{rc: rc})
		} else if body, ok := e.s.Replayed(cr.a.Caller, err); ok {
			// A retry of a completed Idempotency-Key: its original answer.
			rc.Response.Header.Set("Idempotent-Replayed", "true")
			rc.SetContentType("application/json")
			rc.SetBody(body)
		} else {
			e.reject(rc, cr.a.Caller.Tenant(), err)
		}
		cr.stopWatch()
		cr.gone(nil)
		return
	}
	successHeaders(&rc.Response.Header, tk.Meta())
	// Send the 200 headers at once. vLLM sends them right after validation,
	// a prefill before its first chunk; here that chunk is in hand already
	// (the lifecycle's Engine.first reads it before the call counts as
	// started: until then the request may be taken back), so the headers
	// go out with it.
	rc.Response.ImmediateHeaderFlush = true
	rc.SetContentType("text/event-stream")
	rc.Response.Header.Set("Cache-Control", "no-cache")
	rc.SetBodyStream(&sseBody{tk: tk, conn: rc.Conn(), stopWatch: cr.stopWatch, gone: cr.gone}, -1)
}

// wholeSink answers a non-streamed call, or a call that failed before its
// answer opened, on the request's response.
type wholeSink struct {
	rc *fasthttp.RequestCtx
}

func (w *wholeSink) Whole(m lifecycle.Meta, body []byte) {
	successHeaders(&w.rc.Response.Header, m)
	w.rc.SetContentType("application/json")
	w.rc.SetBody(body)
}

func (w *wholeSink) Refuse(_ error, ae *apierr.Error, m lifecycle.Meta) {
	if ae == nil { // the client left: no one to answer
		w.rc.SetConnectionClose()
		return
	}
	if m.Sent {
		successHeaders(&w.rc.Response.Header, m) // Server-Timing and budget headers still apply
	}
	writeError(w.rc, ae)
}

func (w *wholeSink) Stream() (io.Writer, lifecycle.WriteDeadliner) { return io.Discard, nil } // never streamed

// finisher is the part of a Ticket a streamed body runs.
type finisher interface {
	Finish(lifecycle.Sink) lifecycle.Outcome
}

// sseBody is a streamed response's body. fasthttp calls WriteTo on the
// connection's own goroutine, and each Write is one HTTP chunk, flushed
// (SetBodyStreamWriter instead runs a writer on a goroutine of its own and
// passes every chunk through a pipe, a goroutine hand-off per event).
// WriteTo runs the call's Finish into the connection; Close, which
// fasthttp always calls, runs it with no sink when the body was never
// written (the client left before the headers went out), then stops
// watching the client.
type sseBody struct {
	tk        finisher
	conn      lifecycle.WriteDeadliner // the client's connection; nil: no write deadline
	stopWatch func()                   // stops watching the client's connection
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
	conn lifecycle.WriteDeadliner
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

func (o *sseSink) Stream() (io.Writer, lifecycle.WriteDeadliner) { return o, o.conn }

// Whole and Refuse do not happen to a streamed answer, whose 200 headers
// went out before Finish.
func (o *sseSink) Whole(lifecycle.Meta, []byte) {}

func (o *sseSink) Refuse(error, *apierr.Error, lifecycle.Meta) {}

// models answers GET /v1/models with the union of the replicas' models
// that the tenant may use.
func (e *Edge) models(rc *fasthttp.RequestCtx) {
	caller, err := e.s.Authenticate(rc.Request.Header.Peek("Authorization"))
	if err != nil {
		e.reject(rc, "", err)
		return
	}
	rc.SetContentType("application/json")
	rc.SetBody(e.s.Models(caller))
}

// workflowAPI serves POST /v1/workflows (create an envelope) and GET
// /v1/workflows/{id} (limits, used, remaining), with the tenant's own key.
func (e *Edge) workflowAPI(rc *fasthttp.RequestCtx, id string) {
	caller, err := e.s.Authenticate(rc.Request.Header.Peek("Authorization"))
	if err != nil {
		e.reject(rc, "", err)
		return
	}
	var body []byte
	status := 200
	switch {
	case id == "" && rc.IsPost():
		body, err = e.s.CreateWorkflow(e.base, caller, rc.PostBody())
		status = 201
	case id != "" && rc.IsGet():
		body, err = e.s.Workflow(e.base, caller, id)
	default:
		e.methodNotAllowed(rc)
		return
	}
	if err != nil {
		e.reject(rc, caller.Tenant(), err)
		return
	}
	rc.SetStatusCode(status)
	rc.SetContentType("application/json")
	rc.SetBody(body)
}
