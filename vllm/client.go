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
	"strings"
	"sync/atomic"
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

// Client talks to vLLM replicas over HTTP/1.1. It is safe for concurrent
// use.
//
// # Design rationale
//
// Generation requests go over Sluice's own HTTP/1.1 client (h1.go): one
// connection per request, written and read on the caller's goroutine, and
// cancelling a request's context closes its upstream connection, because a
// closed connection is the only abort signal vLLM understands (VLLM.md
// §1.4). The other calls (/tokenize, /v1/models, /metrics, /health) use
// net/http. Neither speaks HTTP/2, so a cancel closes a connection rather
// than resetting one stream of a shared one.
type Client struct {
	cfg Config
	hc  *http.Client
	tr  *http.Transport
	// h1 carries the generation requests (h1.go).
	h1 *h1
	// creds are the replicas' credentials (secret.go).
	creds atomic.Pointer[credentials]
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
		IdleConnTimeout:       cfg.IdleConnTimeout,
		ResponseHeaderTimeout: cfg.ResponseHeaderTimeout,
		DisableCompression:    true,
		ExpectContinueTimeout: 0,
	}
	c := &Client{cfg: cfg, tr: tr, h1: newH1(cfg)}
	c.hc = &http.Client{Transport: authTransport{base: tr, creds: &c.creds}}
	return c
}

// CloseIdleConnections closes idle keep-alive connections.
func (c *Client) CloseIdleConnections() {
	c.tr.CloseIdleConnections()
	c.h1.closeIdle()
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
	h, err := c.h1.host(baseURL)
	if err == nil && !validHeaderValue(requestID) {
		err = errors.New("request id is not a valid header value")
	}
	if err != nil {
		return nil, fmt.Errorf("upstream %s: build request: %w: %w", replica, ErrNotSent, err)
	}
	// vLLM answers a non-streamed generation only once it is done, so no
	// response-header timeout applies to it.
	whole := !streamed(body)
	timeout := c.cfg.ResponseHeaderTimeout
	if whole {
		timeout = 0
	}
	resp, gotConn, err := c.h1.post(ctx, h, path, body, requestID, timeout, !whole)
	if err != nil {
		if !gotConn {
			return nil, fmt.Errorf("upstream %s: %w: %w", replica, ErrNotSent, err)
		}
		return nil, fmt.Errorf("upstream %s: %w", replica, err)
	}
	if resp.status != http.StatusOK {
		return nil, c.errorFrom(resp.status, resp.body, replica)
	}
	if whole && strings.HasPrefix(resp.contentType, "application/json") {
		defer resp.body.close(true)
		limit := max(c.cfg.MaxResponseBytes, c.cfg.MaxEventBytes, maxWholeBytes)
		b, err := resp.body.readAll(limit)
		if err != nil {
			return nil, fmt.Errorf("upstream %s: read response: %w", replica, err)
		}
		if len(b) > limit {
			return nil, fmt.Errorf("upstream %s: response over %d bytes: %w", replica, limit, ErrEventTooLarge)
		}
		return newWholeStream(b, replica), nil
	}
	s := NewStream(resp.body, replica, c.cfg.MaxEventBytes)
	s.cancel = resp.body.abort
	s.ending = resp.body.ending
	return s, nil
}

// validHeaderValue reports a value without control characters.
func validHeaderValue(v string) bool {
	for i := 0; i < len(v); i++ {
		if c := v[i]; c < ' ' || c == 0x7f {
			return false
		}
	}
	return true
}

// staleWindow bounds how soon after the request was written an EOF on a
// reused connection counts as the server's idle close rather than a failure
// of a request it had started (see stale).
const staleWindow = 250 * time.Millisecond

// errorFrom reads a non-200 response into an *UpstreamError and closes it.
func (c *Client) errorFrom(status int, body io.ReadCloser, replica string) error {
	defer body.Close()
	b, _ := io.ReadAll(io.LimitReader(body, int64(c.cfg.MaxErrorBodyBytes)))
	e := &UpstreamError{Replica: replica, Status: status, Body: b}
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
		return c.errorFrom(resp.StatusCode, resp.Body, url)
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
