package vllm

import (
	"bufio"
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http/httputil"
	"net/url"
	"os"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"time"
)

// h1 is the HTTP/1.1 client of generation requests (see doc.go, "The
// upstream connection"). One request owns one connection from the write to
// the end of its body, on the caller's goroutine: net/http's transport
// hands every request to a per-connection write goroutine and every
// response to a read goroutine, and on a loopback replica those hand-offs
// were the largest part of Sluice's CPU per request. Cancelling
// the request's context closes its connection: the abort signal vLLM
// understands (VLLM.md §1.4).
type h1 struct {
	cfg    Config
	dialer net.Dialer
	roots  *x509.CertPool // nil: the system's (tests set their own)
	mu     sync.Mutex
	hosts  map[string]*h1Host // by base URL
	// creds are the replicas' credentials (Client.SetCredentials).
	creds atomic.Pointer[credentials]
}

func newH1(cfg Config) *h1 {
	return &h1{cfg: cfg, dialer: net.Dialer{Timeout: cfg.DialTimeout, KeepAlive: 30 * time.Second}, hosts: map[string]*h1Host{}}
}

// h1Host is one replica's pool of idle keep-alive connections.
type h1Host struct {
	c      *h1
	base   string // the base URL, as the caller passes it
	addr   string // host:port
	host   string // the Host header
	prefix string // the base URL's path, without a trailing slash
	tls    *tls.Config

	mu       sync.Mutex
	idle     []*h1Conn // oldest first; reused newest first
	sweeping bool
}

// h1Conn is one upstream connection.
type h1Conn struct {
	h      *h1Host
	nc     net.Conn
	br     *bufio.Reader // reads rd
	rd     connReader
	idleAt time.Time
	reused bool
}

// connReader is the connection as its bufio.Reader reads it. Once an abort
// marks it (h1Body.abort), a read that would wait takes, without waiting,
// what the replica had already sent, and the first read that finds nothing
// closes the connection (vLLM's abort signal). Closing at once would drop
// those bytes in the kernel's buffer: the tokens in them ran on the GPU and
// their usage chunks are the charge's evidence; on a loaded node the read
// goroutine can lag the replica by several chunks.
type connReader struct {
	nc       net.Conn
	aborting atomic.Bool
	drained  int // bytes taken after the abort
}

// maxAbortDrain bounds what a read takes after an abort: a replica that
// keeps sending is not followed forever.
const maxAbortDrain = 256 << 10

func (r *connReader) Read(p []byte) (int, error) {
	n, err := r.nc.Read(p)
	if err == nil || !r.aborting.Load() || n > 0 {
		return n, err
	}
	if r.drained < maxAbortDrain {
		if m := recvNow(r.nc, p[:min(len(p), maxAbortDrain-r.drained)]); m > 0 {
			r.drained += m
			return m, nil
		}
	}
	_ = r.nc.Close()
	return 0, err
}

// recvNow reads what the kernel holds for a plain TCP connection, without
// waiting and without touching Go's poller state (Control only lends the
// descriptor; Read through RawConn would reset the poller's readiness).
// It returns 0 for anything else.
func recvNow(nc net.Conn, p []byte) int {
	tc, ok := nc.(*net.TCPConn)
	if !ok || len(p) == 0 {
		return 0
	}
	rc, err := tc.SyscallConn()
	if err != nil {
		return 0
	}
	n := 0
	_ = rc.Control(func(fd uintptr) {
		m, _, err := syscall.Recvfrom(int(fd), p, syscall.MSG_DONTWAIT)
		if err == nil && m > 0 {
			n = m
		}
	})
	return n
}

func (c *h1) host(baseURL string) (*h1Host, error) {
	c.mu.Lock()
	defer c.mu.Unlock()
	if h := c.hosts[baseURL]; h != nil {
		return h, nil
	}
	u, err := url.Parse(baseURL)
	if err != nil {
		return nil, err
	}
	h := &h1Host{c: c, base: baseURL, host: u.Host, prefix: strings.TrimSuffix(u.Path, "/")}
	port := u.Port()
	switch u.Scheme {
	case "http":
		if port == "" {
			port = "80"
		}
	case "https":
		if port == "" {
			port = "443"
		}
		h.tls = &tls.Config{ServerName: u.Hostname(), NextProtos: []string{"http/1.1"}, RootCAs: c.roots}
	default:
		return nil, fmt.Errorf("unsupported scheme %q", u.Scheme)
	}
	if u.Hostname() == "" {
		return nil, errors.New("no host")
	}
	h.addr = net.JoinHostPort(u.Hostname(), port)
	c.hosts[baseURL] = h
	return h, nil
}

// get returns an idle connection (newest first), or dials one when there
// is none or fresh is set.
func (h *h1Host) get(ctx context.Context, fresh bool) (*h1Conn, error) {
	if !fresh {
		var stale []*h1Conn
		var cn *h1Conn
		now := time.Now()
		h.mu.Lock()
		if n := len(h.idle); n > 0 {
			cn = h.idle[n-1]
			h.idle[n-1] = nil
			h.idle = h.idle[:n-1]
			if now.Sub(cn.idleAt) >= h.c.cfg.IdleConnTimeout {
				// The newest is too old: so are all the others.
				stale = append(h.idle, cn) //nolint:gocritic // takes over h.idle's array, reset next
				h.idle = nil
				cn = nil
			}
		}
		h.mu.Unlock()
		for _, s := range stale {
			_ = s.nc.Close()
		}
		if cn != nil {
			cn.reused = true
			return cn, nil
		}
	}
	var nc net.Conn
	var err error
	if h.tls != nil {
		d := tls.Dialer{NetDialer: &h.c.dialer, Config: h.tls}
		nc, err = d.DialContext(ctx, "tcp", h.addr)
	} else {
		nc, err = h.c.dialer.DialContext(ctx, "tcp", h.addr)
	}
	if err != nil {
		return nil, err
	}
	cn := &h1Conn{h: h, nc: nc}
	cn.rd.nc = nc
	cn.br = bufio.NewReaderSize(&cn.rd, 8<<10)
	return cn, nil
}

// put keeps a connection whose response ended cleanly for reuse.
func (h *h1Host) put(cn *h1Conn) {
	cn.idleAt = time.Now()
	h.mu.Lock()
	if len(h.idle) >= h.c.cfg.MaxIdleConnsPerHost {
		h.mu.Unlock()
		_ = cn.nc.Close()
		return
	}
	h.idle = append(h.idle, cn)
	arm := !h.sweeping
	h.sweeping = true
	h.mu.Unlock()
	if arm {
		time.AfterFunc(h.c.cfg.IdleConnTimeout, h.sweep)
	}
}

// sweep closes connections idle for IdleConnTimeout, so that Sluice closes
// them before the replica does (uvicorn: 5s), and re-arms while any remain.
func (h *h1Host) sweep() {
	now := time.Now()
	timeout := h.c.cfg.IdleConnTimeout
	h.mu.Lock()
	i := 0
	for i < len(h.idle) && now.Sub(h.idle[i].idleAt) >= timeout {
		i++
	}
	old := append([]*h1Conn(nil), h.idle[:i]...)
	n := copy(h.idle, h.idle[i:])
	clear(h.idle[n:])
	h.idle = h.idle[:n]
	var next time.Duration
	if n > 0 {
		next = max(timeout-now.Sub(h.idle[0].idleAt), time.Millisecond)
	} else {
		h.sweeping = false
	}
	h.mu.Unlock()
	for _, cn := range old {
		_ = cn.nc.Close()
	}
	if next > 0 {
		time.AfterFunc(next, h.sweep)
	}
}

func (c *h1) closeIdle() {
	c.mu.Lock()
	hosts := make([]*h1Host, 0, len(c.hosts))
	for _, h := range c.hosts {
		hosts = append(hosts, h)
	}
	c.mu.Unlock()
	for _, h := range hosts {
		h.mu.Lock()
		idle := h.idle
		h.idle = nil
		h.mu.Unlock()
		for _, cn := range idle {
			_ = cn.nc.Close()
		}
	}
}

// h1Resp is a response's head and body.
type h1Resp struct {
	status      int
	contentType string
	body        *h1Body
}

// errHeaderTimeout is the ResponseHeaderTimeout's error.
var errHeaderTimeout = errors.New("timeout awaiting response headers")

// reqBufs recycles request heads.
var reqBufs = sync.Pool{New: func() any { b := make([]byte, 0, 1024); return &b }}

// post sends one generation request and returns its response once the head
// arrived. gotConn reports whether any byte may have reached the replica
// (else nothing was sent). headerTimeout > 0 bounds the wait for the head. A request that
// failed on a kept-alive connection the server had closed while idle is
// sent once more on a fresh connection (see stale). stream says which
// answer the body asks for (its Accept: an SSE stream or one JSON body).
func (c *h1) post(ctx context.Context, h *h1Host, path string, body []byte, requestID string, headerTimeout time.Duration, stream bool) (*h1Resp, bool, error) {
	bp := reqBufs.Get().(*[]byte)
	defer reqBufs.Put(bp)
	head := append((*bp)[:0], "POST "...) //nolint:gocritic // builds in the pooled buffer, stored back below
	head = append(head, h.prefix...)
	head = append(head, path...)
	head = append(head, " HTTP/1.1\r\nHost: "...)
	head = append(head, h.host...)
	if stream {
		head = append(head, "\r\nUser-Agent: sluice\r\nContent-Type: application/json\r\nAccept: text/event-stream\r\n"...)
	} else {
		head = append(head, "\r\nUser-Agent: sluice\r\nContent-Type: application/json\r\nAccept: application/json\r\n"...)
	}
	if requestID != "" {
		head = append(head, "X-Request-Id: "...)
		head = append(head, requestID...)
		head = append(head, "\r\n"...)
	}
	if tp := traceparentOf(ctx); tp != "" {
		head = append(head, "Traceparent: "...)
		head = append(head, tp...)
		head = append(head, "\r\n"...)
	}
	if auth := c.creds.Load().byBase(h.base); auth != "" {
		head = append(head, "Authorization: "...)
		head = append(head, auth...)
		head = append(head, "\r\n"...)
	}
	head = append(head, "Content-Length: "...)
	head = strconv.AppendInt(head, int64(len(body)), 10)
	head = append(head, "\r\n\r\n"...)
	small := len(head)+len(body) <= 64<<10
	if small {
		head = append(head, body...)
	}
	*bp = head
	fresh := false
	for {
		if err := ctx.Err(); err != nil {
			return nil, false, err // as net/http: nothing sent once cancelled
		}
		cn, err := h.get(ctx, fresh)
		if err != nil {
			return nil, false, err
		}
		b := &h1Body{cn: cn, ctx: ctx}
		b.stop = context.AfterFunc(ctx, b.abort)
		var wrote time.Time
		var n int64
		if small {
			var k int
			k, err = cn.nc.Write(head)
			n = int64(k)
		} else {
			bufs := net.Buffers{head, body}
			n, err = bufs.WriteTo(cn.nc)
		}
		if err != nil && n == 0 {
			// Not a byte left: the replica cannot have seen it.
			b.close(false)
			if !fresh && cn.reused && ctx.Err() == nil {
				fresh = true
				continue
			}
			return nil, false, b.ctxErr(err, 0)
		}
		if err == nil {
			wrote = time.Now()
			if headerTimeout > 0 {
				_ = cn.nc.SetReadDeadline(wrote.Add(headerTimeout))
			}
			_, err = cn.br.Peek(1)
			var resp *h1Resp
			if err == nil {
				resp, err = cn.readHead(b)
				if err == nil && headerTimeout > 0 {
					err = cn.nc.SetReadDeadline(time.Time{})
				}
				if err == nil {
					return resp, true, nil
				}
				b.close(false)
				return nil, true, b.ctxErr(err, headerTimeout)
			}
		}
		b.close(false)
		if !fresh && cn.reused && ctx.Err() == nil && stale(err, wrote) {
			fresh = true
			continue
		}
		return nil, true, b.ctxErr(err, headerTimeout)
	}
}

// stale reports a failure on a reused connection, before any response
// byte, that is the server's close of an idle connection rather than of a
// request it had started: an EOF or reset right after the write (or in
// it). vLLM answers a streamed request's headers right after validation,
// and a server closing an idle connection does so before reading anything.
func stale(err error, wrote time.Time) bool {
	if !errors.Is(err, io.EOF) && !errors.Is(err, io.ErrUnexpectedEOF) && !errors.Is(err, syscall.ECONNRESET) && !errors.Is(err, syscall.EPIPE) {
		return false
	}
	return wrote.IsZero() || time.Since(wrote) < staleWindow
}

// readHead parses the status line and the headers that matter here, and
// frames the body (RFC 9112 §6.3).
func (cn *h1Conn) readHead(b *h1Body) (*h1Resp, error) {
	for {
		line, err := cn.line()
		if err != nil {
			return nil, err
		}
		if len(line) < 12 || !bytes.HasPrefix(line, []byte("HTTP/1.")) || line[8] != ' ' {
			return nil, fmt.Errorf("malformed status line %q", truncate(line))
		}
		status, err := strconv.Atoi(string(line[9:12]))
		if err != nil || status < 100 {
			return nil, fmt.Errorf("malformed status line %q", truncate(line))
		}
		keep := line[7] == '1'
		r := &b.resp
		*r = h1Resp{status: status, body: b}
		length, chunked, conn := int64(-1), false, ""
		for {
			l, err := cn.line()
			if err != nil {
				return nil, err
			}
			if len(l) == 0 {
				break
			}
			k, v, ok := bytes.Cut(l, []byte(":"))
			if !ok {
				return nil, fmt.Errorf("malformed header line %q", truncate(l))
			}
			v = bytes.TrimSpace(v)
			switch {
			case bytes.EqualFold(k, []byte("Content-Type")):
				r.contentType = contentType(v)
			case bytes.EqualFold(k, []byte("Content-Length")):
				n, err := strconv.ParseInt(string(v), 10, 64)
				if err != nil || n < 0 || (length >= 0 && n != length) {
					return nil, fmt.Errorf("bad Content-Length %q", truncate(v))
				}
				length = n
			case bytes.EqualFold(k, []byte("Transfer-Encoding")):
				chunked = bytes.EqualFold(v, []byte("chunked"))
				if !chunked {
					return nil, fmt.Errorf("unsupported Transfer-Encoding %q", truncate(v))
				}
			case bytes.EqualFold(k, []byte("Connection")):
				conn = strings.ToLower(string(v))
			}
		}
		if status < 200 {
			continue // 100 Continue and other interim answers
		}
		switch conn {
		case "close":
			keep = false
		case "keep-alive":
			keep = true
		}
		b.keep = keep
		switch {
		case status == 204 || status == 304:
			b.r, b.eof = eofReader{}, true
		case chunked:
			b.r, b.chunked = httputil.NewChunkedReader(cn.br), true
		case length >= 0:
			b.lr = lengthReader{r: cn.br, n: length}
			b.r = &b.lr
			b.eof = length == 0
		default:
			b.r, b.keep = cn.br, false // until the server closes
		}
		return r, nil
	}
}

// contentType returns the Content-Type value v, the replica's usual ones
// without an allocation.
func contentType(v []byte) string {
	for _, t := range [...]string{"application/json", "text/event-stream; charset=utf-8", "text/event-stream"} {
		if string(v) == t {
			return t
		}
	}
	return string(v)
}

// line reads one header line without its CRLF; a line over the read
// buffer is an error.
func (cn *h1Conn) line() ([]byte, error) {
	l, err := cn.br.ReadSlice('\n')
	if err != nil {
		if errors.Is(err, bufio.ErrBufferFull) {
			return nil, errors.New("response header line too long")
		}
		if errors.Is(err, io.EOF) && len(l) > 0 {
			err = io.ErrUnexpectedEOF
		}
		return nil, err
	}
	l = bytes.TrimSuffix(l[:len(l)-1], []byte("\r"))
	return l, nil
}

func truncate(b []byte) []byte {
	if len(b) > 64 {
		return b[:64]
	}
	return b
}

// h1Body is a response body on its connection. Reading it to its end
// makes the connection reusable; Close returns it to the pool then, and
// closes it otherwise. abort (the context's cancellation, or Stream's
// drain timeout) closes the connection at once.
type h1Body struct {
	cn      *h1Conn
	ctx     context.Context
	stop    func() bool
	resp    h1Resp       // the response this body belongs to (readHead)
	lr      lengthReader // r for a Content-Length body
	r       io.Reader
	chunked bool
	keep    bool
	eof     bool
	err     error

	mu      sync.Mutex
	closed  bool
	aborted bool
}

func (b *h1Body) Read(p []byte) (int, error) {
	if b.err != nil {
		return 0, b.err
	}
	n, err := b.r.Read(p)
	if errors.Is(err, io.EOF) && b.chunked {
		err = b.trailers()
	}
	switch {
	case errors.Is(err, io.EOF):
		b.eof = true
	case err != nil:
		err = b.ctxErr(err, 0)
	}
	b.err = err
	return n, err
}

// trailers reads the chunked body's trailer section to its empty line.
func (b *h1Body) trailers() error {
	for {
		l, err := b.cn.line()
		if err != nil {
			if errors.Is(err, io.EOF) {
				err = io.ErrUnexpectedEOF
			}
			return err
		}
		if len(l) == 0 {
			return io.EOF
		}
	}
}

// ctxErr reports a failure caused by the context (which closed the
// connection) as the context's error, as net/http does.
func (b *h1Body) ctxErr(err error, headerTimeout time.Duration) error {
	if b.ctx.Err() != nil {
		return context.Cause(b.ctx) // as net/http: the cancellation's cause
	}
	if headerTimeout > 0 && errors.Is(err, os.ErrDeadlineExceeded) {
		return fmt.Errorf("%w after %s", errHeaderTimeout, headerTimeout)
	}
	return err
}

// abort ends the response unless the body was closed already. A plain TCP
// connection is marked (connReader) and its read deadline moved to the
// past, which wakes a waiting read: the reader takes what already arrived,
// then closes the connection. abortGrace later it is closed whatever the
// reader does (one that is writing to a slow client reads nothing). A TLS
// connection's bytes need its reader to decrypt them: it closes at once.
func (b *h1Body) abort() {
	b.mu.Lock()
	defer b.mu.Unlock()
	if b.closed || b.aborted {
		return
	}
	b.aborted = true
	nc := b.cn.nc
	if _, ok := nc.(*net.TCPConn); !ok {
		_ = nc.Close()
		return
	}
	b.cn.rd.aborting.Store(true)
	_ = nc.SetReadDeadline(aLongTimeAgo)
	time.AfterFunc(abortGrace, func() { _ = nc.Close() })
}

// ending reports that the response is being aborted, or will be (its
// context is done): reads of it no longer wait for the replica.
func (b *h1Body) ending() bool {
	if b.ctx.Err() != nil {
		return true
	}
	b.mu.Lock()
	defer b.mu.Unlock()
	return b.aborted
}

// abortGrace bounds how long an aborted connection stays open for its
// reader to take what already arrived.
const abortGrace = 5 * time.Millisecond

// aLongTimeAgo is a read deadline that has passed.
var aLongTimeAgo = time.Unix(1, 0)

// close ends the body's hold on its connection: back to the pool when
// reuse is set and the response was read to its end, else closed.
func (b *h1Body) close(reuse bool) {
	b.stop()
	b.mu.Lock()
	if b.closed {
		b.mu.Unlock()
		return
	}
	b.closed = true
	reuse = reuse && !b.aborted && b.eof && b.keep && b.cn.br.Buffered() == 0
	b.mu.Unlock()
	if reuse {
		b.cn.h.put(b.cn)
		return
	}
	_ = b.cn.nc.Close()
}

// Close implements io.Closer.
func (b *h1Body) Close() error {
	b.close(true)
	return nil
}

// readAll reads the body to its end, up to limit+1 bytes (the caller
// tells over-limit apart), into one buffer sized from Content-Length when
// the response has one: io.ReadAll's doubling from 512 bytes was the
// largest allocation of a non-streamed request.
func (b *h1Body) readAll(limit int) ([]byte, error) {
	if lr, ok := b.r.(*lengthReader); ok && lr.n <= int64(limit) {
		buf := make([]byte, lr.n)
		_, err := io.ReadFull(b, buf)
		if err == nil {
			_, err = b.Read(nil) // reach EOF: the connection is reusable
		}
		if errors.Is(err, io.EOF) {
			err = nil
		}
		return buf, err
	}
	return io.ReadAll(io.LimitReader(b, int64(limit)+1))
}

// lengthReader reads a Content-Length body; an early EOF is an error.
type lengthReader struct {
	r io.Reader
	n int64
}

func (l *lengthReader) Read(p []byte) (int, error) {
	if l.n <= 0 {
		return 0, io.EOF
	}
	if int64(len(p)) > l.n {
		p = p[:l.n]
	}
	n, err := l.r.Read(p)
	l.n -= int64(n)
	if errors.Is(err, io.EOF) {
		if l.n > 0 {
			return n, io.ErrUnexpectedEOF
		}
		err = nil
	}
	if err == nil && l.n == 0 {
		err = io.EOF
	}
	return n, err
}

type eofReader struct{}

func (eofReader) Read([]byte) (int, error) { return 0, io.EOF }
