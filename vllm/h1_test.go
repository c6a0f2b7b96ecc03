package vllm

import (
	"context"
	"crypto/x509"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"runtime"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"golang.org/x/sys/unix"
)

// Non-streamed answers (Content-Length bodies) read to their end leave the
// connection reusable, and a base URL's path prefixes the request path.
func TestH1WholeResponsesReuseOneConnection(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	var paths []string
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		paths = append(paths, r.URL.Path)
		assert.Equal(t, "application/json", r.Header.Get("Content-Type"))
		b, _ := io.ReadAll(r.Body)
		assert.Equal(t, `{"prompt":"a"}`, string(b))
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":2,"total_tokens":3}}`)
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := NewClient(Config{})
	for range 3 {
		s, err := c.Stream(t.Context(), srv.URL+"/base/", "/v1/completions", []byte(`{"prompt":"a"}`), "r1")
		require.NoError(t, err)
		ev, err := s.Next()
		require.NoError(t, err)
		assert.True(t, ev.Whole)
		assert.Equal(t, Usage{PromptTokens: 1, CompletionTokens: 2, Final: true, Known: true}, s.Usage())
		require.NoError(t, s.Close())
	}
	assert.Equal(t, int32(1), conns.Load())
	assert.Equal(t, []string{"/base/v1/completions", "/base/v1/completions", "/base/v1/completions"}, paths)
}

// A streamed request whose head does not come within
// ResponseHeaderTimeout fails as sent (not ErrNotSent), and its connection
// is closed.
func TestH1StreamHeaderTimeout(t *testing.T) {
	t.Parallel()
	release := make(chan struct{})
	closed := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		_, _ = io.ReadAll(r.Body) // then net/http watches for the peer's close
		select {
		case <-release:
		case <-r.Context().Done():
		}
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			close(closed)
		}
	}
	srv.Start()
	defer srv.Close()
	defer close(release)
	_, err := NewClient(Config{ResponseHeaderTimeout: 50 * time.Millisecond}).Stream(t.Context(), srv.URL, "/v1/completions",
		[]byte(`{"stream":true}`), "")
	require.ErrorIs(t, err, errHeaderTimeout)
	require.NotErrorIs(t, err, ErrNotSent)
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the timed-out connection was left open")
	}
}

// Idle connections are closed after IdleConnTimeout, before the replica's
// own keep-alive timeout would close them under a request.
func TestH1IdleConnectionsClosedAfterTimeout(t *testing.T) {
	t.Parallel()
	closed := make(chan struct{})
	srv := httptest.NewUnstartedServer(sseHandler(t, nil, nil, "data: [DONE]\n\n"))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			close(closed)
		}
	}
	srv.Start()
	defer srv.Close()
	c := NewClient(Config{IdleConnTimeout: 50 * time.Millisecond})
	s, err := c.Stream(t.Context(), srv.URL, "/v1/completions", []byte(`{"stream":true}`), "")
	require.NoError(t, err)
	_, _ = s.Next()
	_, err = s.Next()
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, s.Close())
	select {
	case <-closed:
	case <-time.After(10 * time.Second):
		t.Fatal("the idle connection was never closed")
	}
}

// A stream closed before its end (the client left) closes its connection:
// vLLM's abort signal; the next request dials a new one.
func TestH1CloseBeforeEndClosesConnection(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	closed := make(chan struct{}, 4)
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"text":"a"}]}`+"\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		switch st {
		case http.StateNew:
			conns.Add(1)
		case http.StateClosed:
			closed <- struct{}{}
		}
	}
	srv.Start()
	defer srv.Close()
	c := NewClient(Config{})
	for i := range 2 {
		s, err := c.Stream(context.Background(), srv.URL, "/v1/completions", []byte(`{"stream":true}`), "")
		require.NoError(t, err)
		_, err = s.Next()
		require.NoError(t, err)
		require.NoError(t, s.Close())
		select {
		case <-closed:
		case <-time.After(10 * time.Second):
			t.Fatalf("stream %d: connection left open", i)
		}
	}
	assert.Equal(t, int32(2), conns.Load())
}

// A request id with a control character never reaches the wire.
func TestH1RefusesBadRequestID(t *testing.T) {
	t.Parallel()
	_, err := NewClient(Config{}).Stream(t.Context(), "http://127.0.0.1:1", "/v1/completions", []byte(`{}`), "a\r\nX-Evil: 1")
	require.ErrorIs(t, err, ErrNotSent)
	assert.NotErrorIs(t, err, io.EOF)
}

// An https replica is spoken to over TLS (HTTP/1.1), with its connection
// reused like a plain one.
func TestH1TLSReplica(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(sseHandler(t, nil, nil, "data: [DONE]\n\n"))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.StartTLS()
	defer srv.Close()
	c := NewClient(Config{})
	c.h1.roots = x509.NewCertPool()
	c.h1.roots.AddCert(srv.Certificate())
	for range 2 {
		s, err := c.Stream(t.Context(), srv.URL, "/v1/completions", []byte(`{"stream":true}`), "")
		require.NoError(t, err)
		ev, err := s.Next()
		require.NoError(t, err)
		assert.True(t, ev.Done)
		require.NoError(t, s.Close())
	}
	assert.Equal(t, int32(1), conns.Load())
}

// A request whose context ended before it was written is ErrNotSent and
// never reaches the replica, on a fresh or a kept-alive connection: a call
// cancelled as it is dispatched is not charged as if it ran.
func TestH1CancelledBeforeSendIsNotSent(t *testing.T) {
	t.Parallel()
	var served atomic.Int32
	done := sseHandler(t, nil, nil, "data: [DONE]\n\n")
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		served.Add(1)
		done(w, r)
	}))
	defer srv.Close()
	c := NewClient(Config{})
	ctx, cancel := context.WithCancel(t.Context())
	cancel()
	_, err := c.Stream(ctx, srv.URL, "/v1/completions", []byte(`{"stream":true}`), "")
	require.ErrorIs(t, err, ErrNotSent)
	require.ErrorIs(t, err, context.Canceled)
	// Now with a kept-alive connection in the pool.
	s, err := c.Stream(t.Context(), srv.URL, "/v1/completions", []byte(`{"stream":true}`), "")
	require.NoError(t, err)
	_, _ = s.Next()
	_, err = s.Next()
	require.ErrorIs(t, err, io.EOF)
	require.NoError(t, s.Close())
	_, err = c.Stream(ctx, srv.URL, "/v1/completions", []byte(`{"stream":true}`), "")
	require.ErrorIs(t, err, ErrNotSent)
	assert.Equal(t, int32(1), served.Load(), "only the live request reached the replica")
}

// An abort takes what the replica had already sent before it closes the
// connection: the events sitting in the kernel's buffer when the request is
// cancelled are counted by SettleFor (their tokens ran on the GPU), and the
// replica still sees the close. Without connReader's drain the charge is
// the last event read plus the allowance (1 + 1 here).
func TestH1AbortTakesWhatArrived(t *testing.T) {
	t.Parallel()
	readOne, sent, ended := make(chan struct{}), make(chan struct{}), make(chan struct{})
	type connKey struct{}
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(ended)
		w.Header().Set("Content-Type", "text/event-stream")
		chunk := func(i int) {
			_, _ = fmt.Fprintf(w, "data: {\"choices\":[{\"index\":0,\"text\":\"a\"}],\"usage\":{\"prompt_tokens\":5,\"completion_tokens\":%d}}\n\n", i)
			w.(http.Flusher).Flush()
		}
		chunk(1)
		<-readOne
		for i := 2; i <= 10; i++ {
			chunk(i)
		}
		// Barrier: every byte acknowledged, i.e. in the client's kernel buffer.
		waitAcked(t, r.Context().Value(connKey{}).(net.Conn))
		close(sent)
		<-r.Context().Done() // the client's close
	}))
	srv.Config.ConnContext = func(ctx context.Context, c net.Conn) context.Context {
		return context.WithValue(ctx, connKey{}, c)
	}
	srv.Start()
	defer srv.Close()

	ctx, cancel := context.WithCancel(context.Background())
	s, err := NewClient(Config{}).Stream(ctx, srv.URL, "/v1/completions", []byte(`{"stream":true}`), "")
	require.NoError(t, err)
	_, err = s.Next()
	require.NoError(t, err)
	close(readOne)
	<-sent
	cancel()
	s.cancel() // the context's abort, run now rather than on its own goroutine (idempotent)
	u := s.SettleFor(Shape{N: 1, Inputs: []int{5}, Allowance: 1, Cap: 100})
	assert.Equal(t, 5, u.PromptTokens)
	assert.Equal(t, 10+1, u.CompletionTokens, "the nine unread chunks count, plus the allowance")
	assert.False(t, u.Final)
	require.NoError(t, s.Close())
	<-ended
}

// An abort whose reader never reads again still closes the connection
// (abortGrace), so vLLM stops generating.
func TestH1AbortClosesWithoutAReader(t *testing.T) {
	t.Parallel()
	ended := make(chan struct{})
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		defer close(ended)
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"text":"a"}]}`+"\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done()
	}))
	defer srv.Close()
	ctx, cancel := context.WithCancel(context.Background())
	s, err := NewClient(Config{}).Stream(ctx, srv.URL, "/v1/completions", []byte(`{"stream":true}`), "")
	require.NoError(t, err)
	cancel()
	<-ended          // the replica saw the close with nobody reading
	for err == nil { // the event read with the head, if it came with it
		_, err = s.Next()
	}
	require.ErrorIs(t, err, context.Canceled)
	require.NoError(t, s.Close())
}

// waitAcked returns once c has no byte its peer has not acknowledged
// (SIOCOUTQ): on loopback, once they are in the peer's receive buffer.
func waitAcked(t *testing.T, c net.Conn) {
	rc, err := c.(*net.TCPConn).SyscallConn()
	require.NoError(t, err)
	for {
		var n int
		require.NoError(t, rc.Control(func(fd uintptr) { n, err = unix.IoctlGetInt(int(fd), unix.SIOCOUTQ) }))
		require.NoError(t, err)
		if n == 0 {
			return
		}
		runtime.Gosched()
	}
}
