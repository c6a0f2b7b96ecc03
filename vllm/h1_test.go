package vllm

import (
	"context"
	"crypto/x509"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
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
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
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
	assert.NotErrorIs(t, err, ErrNotSent)
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
	assert.False(t, errors.Is(err, io.EOF))
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
