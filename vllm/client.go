package vllm

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strings"
	"sync/atomic"
	"syscall"
	"time"
)

const (
	defaultMaxEventBytes = 1 << 20
	defaultMaxErrorBody  = 64 << 10
)

// Config configures a [Client]. The zero value is usable.
type Config struct {
	// DialTimeout bounds connecting to a replica. Optional; default 2s.
	DialTimeout time.Duration
	// ResponseHeaderTimeout bounds the wait for response headers after the
	// request was written (vLLM sends them right after validation, before
	// prefill). Optional; default 60s; negative disables.
	ResponseHeaderTimeout time.Duration
	// MaxIdleConnsPerHost bounds idle keep-alive connections per replica.
	// Optional; default 256.
	MaxIdleConnsPerHost int
	// MaxConnsPerHost bounds all connections per replica (one per running
	// stream). Optional; default 0: unlimited (the scheduler bounds in-flight
	// requests per replica itself).
	MaxConnsPerHost int
	// IdleConnTimeout closes idle connections. Optional; default 4s: below
	// uvicorn's timeout_keep_alive of 5s, which vLLM keeps, so that Sluice
	// never reuses a connection the replica is closing.
	IdleConnTimeout time.Duration
	// MaxEventBytes bounds one SSE event. Optional; default 1 MiB.
	MaxEventBytes int
	// MaxErrorBodyBytes bounds the error body kept from a non-200 response.
	// Optional; default 64 KiB.
	MaxErrorBodyBytes int
	// MaxResponseBytes bounds /tokenize, /v1/models, /metrics and /health
	// bodies. Optional; default 8 MiB.
	MaxResponseBytes int
}

// Validate reports negative sizes.
func (c Config) Validate() error {
	var errs []error
	for _, f := range []struct {
		name string
		v    int
	}{
		{"max_idle_conns_per_host", c.MaxIdleConnsPerHost},
		{"max_conns_per_host", c.MaxConnsPerHost},
		{"max_event_bytes", c.MaxEventBytes},
		{"max_error_body_bytes", c.MaxErrorBodyBytes},
		{"max_response_bytes", c.MaxResponseBytes},
	} {
		if f.v < 0 {
			errs = append(errs, fmt.Errorf("upstream.%s must be >= 0", f.name))
		}
	}
	if c.DialTimeout < 0 {
		errs = append(errs, errors.New("upstream.dial_timeout must be >= 0"))
	}
	if c.IdleConnTimeout < 0 {
		errs = append(errs, errors.New("upstream.idle_conn_timeout must be >= 0"))
	}
	return errors.Join(errs...)
}

func (c Config) withDefaults() Config {
	if c.DialTimeout == 0 {
		c.DialTimeout = 2 * time.Second
	}
	if c.ResponseHeaderTimeout == 0 {
		c.ResponseHeaderTimeout = 60 * time.Second
	} else if c.ResponseHeaderTimeout < 0 {
		c.ResponseHeaderTimeout = 0
	}
	if c.MaxIdleConnsPerHost == 0 {
		c.MaxIdleConnsPerHost = 256
	}
	if c.IdleConnTimeout == 0 {
		c.IdleConnTimeout = 4 * time.Second
	}
	if c.MaxEventBytes == 0 {
		c.MaxEventBytes = defaultMaxEventBytes
	}
	if c.MaxErrorBodyBytes == 0 {
		c.MaxErrorBodyBytes = defaultMaxErrorBody
	}
	if c.MaxResponseBytes == 0 {
		c.MaxResponseBytes = 8 << 20
	}
	return c
}

// Client talks to vLLM replicas over HTTP/1.1 (net/http). It is safe for
// concurrent use.
//
// # Design rationale
//
// net/http, not fasthttp: cancelling a request's context must close its
// upstream connection, because a closed connection is the only abort signal
// vLLM understands (VLLM.md §1.4). HTTP/2 is disabled so that a cancel
// closes a connection rather than resetting one stream of a shared one.
type Client struct {
	cfg Config
	hc  *http.Client
	tr  *http.Transport
	// whole serves non-streamed generation requests: vLLM answers them
	// only once generation ends, so no response-header timeout applies.
	whole   *http.Client
	wholeTr *http.Transport
}

// NewClient builds a Client. Call Validate on cfg first; invalid values fall
// back to defaults.
func NewClient(cfg Config) *Client {
	cfg = cfg.withDefaults()
	d := &net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}
	tr := &http.Transport{
		Proxy:                 nil,
		DialContext:           d.DialContext,
		ForceAttemptHTTP2:     false,
		TLSNextProto:          map[string]func(string, *tls.Conn) http.RoundTripper{},
		MaxIdleConns:          0,
		MaxIdleConnsPerHost:   max(cfg.MaxIdleConnsPerHost, 1),
		MaxConnsPerHost:       max(cfg.MaxConnsPerHost, 0),
		IdleConnTimeout:       cfg.IdleConnTimeout,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
		DisableCompression:    true,
		ExpectContinueTimeout: 0,
	}
	wtr := tr.Clone()
	wtr.ResponseHeaderTimeout = 0
	return &Client{cfg: cfg, tr: tr, hc: &http.Client{Transport: tr}, wholeTr: wtr, whole: &http.Client{Transport: wtr}}
}

// CloseIdleConnections closes idle keep-alive connections.
func (c *Client) CloseIdleConnections() {
	c.tr.CloseIdleConnections()
	c.wholeTr.CloseIdleConnections()
}

// maxWholeBytes bounds a non-streamed generation response: prompt_logprobs
// of a long prompt can run to megabytes.
const maxWholeBytes = 64 << 20

// streamed reports whether a generation body asks for a streamed response
// (its top-level "stream" is true).
func streamed(body []byte) bool {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return false
	}
	on := false
	_ = eachMember(body, i, func(m member) bool {
		if m.keyIs(body, "stream") {
			on = string(body[m.valStart:m.valEnd]) == "true"
		}
		return true
	})
	return on
}

// Stream POSTs body (already rewritten by [Request.Rewrite]) to
// baseURL+path and returns the response stream once 200 headers arrived.
// requestID, when not empty, is sent as X-Request-Id (vLLM uses it as its
// request id). ctx governs the whole stream: cancelling it closes the
// connection, which makes vLLM abort the request.
//
// Errors: a non-200 response is an *UpstreamError (body read and closed); a
// failure before a connection was obtained wraps ErrNotSent (retry on another
// replica is safe); any other failure happened after the request may have
// been sent and must not be retried silently.
func (c *Client) Stream(ctx context.Context, baseURL, path string, body []byte, requestID string) (*Stream, error) {
	replica := baseURL
	ctx, cancel := context.WithCancel(ctx)
	// The trace goes into the context before the request is built: no
	// req.WithContext copy per request.
	var tr connTrace
	gotConn := &tr.got
	trace := &httptrace.ClientTrace{
		GotConn: func(i httptrace.GotConnInfo) {
			tr.got.Store(true)
			tr.reused.Store(i.Reused)
		},
		WroteRequest:         func(httptrace.WroteRequestInfo) { tr.wrote.Store(time.Now().UnixNano()) },
		GotFirstResponseByte: func() { tr.firstByte.Store(true) },
	}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost,
		strings.TrimSuffix(baseURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		cancel()
		return nil, fmt.Errorf("upstream %s: build request: %w: %w", replica, ErrNotSent, err)
	}
	req.Header = http.Header{
		"Content-Type": {"application/json"},
		"Accept":       {"text/event-stream"},
	}
	if requestID != "" {
		req.Header["X-Request-Id"] = []string{requestID}
	}
	whole := !streamed(body)
	hc := c.hc
	if whole {
		hc = c.whole
	}
	resp, err := c.do(hc, req, &tr)
	if err != nil {
		cancel()
		if !gotConn.Load() {
			return nil, fmt.Errorf("upstream %s: %w: %w", replica, ErrNotSent, err)
		}
		return nil, fmt.Errorf("upstream %s: %w", replica, err)
	}
	if resp.StatusCode != http.StatusOK {
		err := c.errorFrom(resp, replica)
		cancel()
		return nil, err
	}
	if whole && strings.HasPrefix(resp.Header.Get("Content-Type"), "application/json") {
		defer cancel()
		defer resp.Body.Close()
		limit := max(c.cfg.MaxResponseBytes, c.cfg.MaxEventBytes, maxWholeBytes)
		b, err := io.ReadAll(io.LimitReader(resp.Body, int64(limit)+1))
		if err != nil {
			return nil, fmt.Errorf("upstream %s: read response: %w", replica, err)
		}
		if len(b) > limit {
			return nil, fmt.Errorf("upstream %s: response over %d bytes: %w", replica, limit, ErrEventTooLarge)
		}
		return newWholeStream(b, replica), nil
	}
	s := NewStream(resp.Body, replica, c.cfg.MaxEventBytes)
	s.cancel = cancel
	return s, nil
}

// connTrace is what the client learns of one attempt's connection.
type connTrace struct {
	got, reused, firstByte atomic.Bool
	wrote                  atomic.Int64 // unix nanoseconds the request was written
}

// staleWindow bounds how soon after the request was written an EOF on a
// reused connection counts as the server's idle close rather than a failure
// of a request it had started: vLLM answers a streamed request's headers
// right after validation, and a server closing an idle connection does so
// before reading anything.
const staleWindow = 250 * time.Millisecond

// do sends req. A request that failed on a reused keep-alive connection
// that the server had closed while idle (uvicorn closes idle connections
// after timeout_keep_alive, 5s by default) never reached the server, so it
// is sent once more on a fresh connection; net/http retries that itself
// only for idempotent requests, and a generation POST is not. The signs:
// net/http's own "server closed idle connection", or an EOF/reset on a
// reused connection before any response byte, right after the write.
func (c *Client) do(hc *http.Client, req *http.Request, tr *connTrace) (*http.Response, error) {
	resp, err := hc.Do(req)
	if err == nil || req.GetBody == nil || req.Context().Err() != nil || !stale(err, tr) {
		return resp, err
	}
	body, gerr := req.GetBody()
	if gerr != nil {
		return nil, err
	}
	retry := req.Clone(req.Context())
	retry.Body = body
	tr.got.Store(false)
	tr.reused.Store(false)
	tr.wrote.Store(0)
	return hc.Do(retry)
}

// stale reports an attempt that failed on a connection the server had
// closed before reading the request.
func stale(err error, tr *connTrace) bool {
	if closedIdle(err) {
		return true
	}
	if !tr.reused.Load() || tr.firstByte.Load() {
		return false
	}
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		return false
	}
	w := tr.wrote.Load()
	return w == 0 || time.Since(time.Unix(0, w)) < staleWindow
}

// closedIdle reports net/http's error for a request written to a pooled
// connection that the server had closed before reading it
// (errServerClosedIdle, unexported).
func closedIdle(err error) bool {
	return strings.Contains(err.Error(), "server closed idle connection")
}

// errorFrom reads a non-200 response into an *UpstreamError and closes it.
func (c *Client) errorFrom(resp *http.Response, replica string) error {
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, int64(c.cfg.MaxErrorBodyBytes)))
	e := &UpstreamError{Replica: replica, Status: resp.StatusCode, Body: b}
	parseErrorBody(b, e)
	return e
}

// getJSON performs a request and decodes a 200 JSON answer into out.
func (c *Client) doJSON(ctx context.Context, method, url string, in, out any) error {
	var rd io.Reader
	if in != nil {
		b, err := json.Marshal(in)
		if err != nil {
			return fmt.Errorf("encode: %w", err)
		}
		rd = bytes.NewReader(b)
	}
	req, err := http.NewRequestWithContext(ctx, method, url, rd)
	if err != nil {
		return err
	}
	if in != nil {
		req.Header.Set("Content-Type", "application/json")
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return err
	}
	if resp.StatusCode != http.StatusOK {
		return c.errorFrom(resp, url)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(c.cfg.MaxResponseBytes)+1))
	if err != nil {
		return err
	}
	if len(b) > c.cfg.MaxResponseBytes {
		return fmt.Errorf("response over %d bytes", c.cfg.MaxResponseBytes)
	}
	if err := json.Unmarshal(b, out); err != nil {
		return fmt.Errorf("decode response: %w", err)
	}
	return nil
}

// get fetches url and returns the status and (capped) body.
func (c *Client) get(ctx context.Context, url string) (int, []byte, error) {
	req, err := http.NewRequestWithContext(ctx, http.MethodGet, url, nil)
	if err != nil {
		return 0, nil, err
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		return 0, nil, err
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(c.cfg.MaxResponseBytes)+1))
	if err != nil {
		return resp.StatusCode, nil, err
	}
	if len(b) > c.cfg.MaxResponseBytes {
		return resp.StatusCode, nil, fmt.Errorf("response over %d bytes", c.cfg.MaxResponseBytes)
	}
	return resp.StatusCode, b, nil
}
