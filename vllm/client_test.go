package vllm

import (
	"context"
	"errors"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// sseHandler writes events one by one, flushing after each.
func sseHandler(t *testing.T, gotBody *[]byte, gotID *string, events ...string) http.HandlerFunc {
	return func(w http.ResponseWriter, r *http.Request) {
		b, err := io.ReadAll(r.Body)
		assert.NoError(t, err)
		if gotBody != nil {
			*gotBody = b
		}
		if gotID != nil {
			*gotID = r.Header.Get("X-Request-Id")
		}
		w.Header().Set("Content-Type", "text/event-stream")
		w.WriteHeader(http.StatusOK)
		for _, e := range events {
			_, _ = io.WriteString(w, e)
			w.(http.Flusher).Flush()
		}
	}
}

func TestClientStream(t *testing.T) {
	t.Parallel()
	var body []byte
	var id string
	srv := httptest.NewServer(sseHandler(t, &body, &id,
		`data: {"choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`+"\n\n",
		`data: {"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"total_tokens":4}}`+"\n\n",
		"data: [DONE]\n\n"))
	defer srv.Close()

	c := NewClient(Config{})
	s, err := c.Stream(t.Context(), srv.URL, "/v1/chat/completions", []byte(`{"x":1}`), "req-1")
	require.NoError(t, err)
	defer s.Close()
	var n int
	for {
		_, err := s.Next()
		if errors.Is(err, io.EOF) {
			break
		}
		require.NoError(t, err)
		n++
	}
	assert.Equal(t, 3, n)
	assert.Equal(t, `{"x":1}`, string(body))
	assert.Equal(t, "req-1", id)
	assert.Equal(t, Usage{PromptTokens: 3, CompletionTokens: 1, Final: true, Known: true, Choices: 1}, s.Usage())
}

// TestClientAcceptMatchesTheBody: the upstream request asks for what its
// body asks for: an SSE stream for "stream": true, one JSON body otherwise.
func TestClientAcceptMatchesTheBody(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	var accepts []string
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		mu.Lock()
		accepts = append(accepts, r.Header.Get("Accept"))
		mu.Unlock()
		if r.Header.Get("Accept") == "text/event-stream" {
			w.Header().Set("Content-Type", "text/event-stream")
			_, _ = io.WriteString(w, "data: [DONE]\n\n")
			return
		}
		w.Header().Set("Content-Type", "application/json")
		_, _ = io.WriteString(w, `{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":1,"total_tokens":2}}`)
	}))
	defer srv.Close()
	c := NewClient(Config{})
	for _, body := range []string{`{"stream":true}`, `{"stream":false}`, `{"x":1}`} {
		s, err := c.Stream(t.Context(), srv.URL, "/v1/completions", []byte(body), "")
		require.NoError(t, err, body)
		for {
			if _, err := s.Next(); err != nil {
				break
			}
		}
		s.Close()
	}
	assert.Equal(t, []string{"text/event-stream", "application/json", "application/json"}, accepts)
}

func TestClientUpstreamErrors(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name      string
		status    int
		body      string
		want      UpstreamError
		retryable bool
		ctxLen    bool
	}{
		{
			name:   "nested 400 context length",
			status: 400,
			body:   `{"error":{"message":"This model's maximum context length is 4096 tokens","type":"BadRequestError","param":"input_tokens","code":400}}`,
			want:   UpstreamError{Status: 400, Type: "BadRequestError", Param: "input_tokens", Code: "400"},
			ctxLen: true,
		},
		{
			name:   "flat 404",
			status: 404,
			body:   `{"object":"error","message":"The model does not exist.","type":"NotFoundError","param":null,"code":404}`,
			want:   UpstreamError{Status: 404, Type: "NotFoundError", Code: "404"},
		},
		{
			name:      "503 admission control is retryable",
			status:    503,
			body:      `{"error":{"message":"queue full","type":"ServiceUnavailableError","param":null,"code":503}}`,
			want:      UpstreamError{Status: 503, Type: "ServiceUnavailableError", Code: "503"},
			retryable: true,
		},
		{
			name:   "non-json 500",
			status: 500,
			body:   `Internal Server Error`,
			want:   UpstreamError{Status: 500},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, _ *http.Request) {
				w.WriteHeader(tt.status)
				_, _ = io.WriteString(w, tt.body)
			}))
			defer srv.Close()
			_, err := NewClient(Config{}).Stream(t.Context(), srv.URL, "/v1/completions", []byte(`{}`), "")
			var ue *UpstreamError
			require.ErrorAs(t, err, &ue)
			want := tt.want
			want.Replica = srv.URL
			want.Body = []byte(tt.body)
			assert.Equal(t, want, *ue)
			assert.Equal(t, tt.retryable, ue.Retryable())
			assert.Equal(t, tt.ctxLen, ue.ContextLength())
			require.NotErrorIs(t, err, ErrNotSent)
			assert.NotContains(t, ue.Error(), "maximum context", "messages are never part of the error string")
		})
	}
}

func TestClientNotSentOnRefusedConnection(t *testing.T) {
	t.Parallel()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())
	_, err = NewClient(Config{}).Stream(t.Context(), "http://"+addr, "/v1/completions", []byte(`{}`), "")
	require.ErrorIs(t, err, ErrNotSent)
}

func TestClientSentFailureIsNotErrNotSent(t *testing.T) {
	t.Parallel()
	// The server reads the request and then drops the connection without
	// answering: the request was sent, so it must not look retryable.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		conn, err := ln.Accept()
		if err != nil {
			return
		}
		buf := make([]byte, 4096)
		_, _ = conn.Read(buf)
		_ = conn.Close()
	}()
	_, err = NewClient(Config{}).Stream(t.Context(), "http://"+ln.Addr().String(), "/v1/completions", []byte(`{}`), "")
	wg.Wait()
	require.Error(t, err)
	assert.NotErrorIs(t, err, ErrNotSent)
}

// TestCancelClosesUpstreamConnection checks vLLM's abort signal: cancelling
// the stream's context closes the HTTP/1.1 connection, which the server sees.
func TestCancelClosesUpstreamConnection(t *testing.T) {
	t.Parallel()
	sawClose := make(chan struct{})
	wrote := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		w.Header().Set("Content-Type", "text/event-stream")
		_, _ = io.WriteString(w, `data: {"choices":[{"index":0,"delta":{"content":"a"}}],"usage":{"prompt_tokens":7,"completion_tokens":1}}`+"\n\n")
		_, _ = io.WriteString(w, `data: {"choices":[{"index":1,"delta":{"content":"b"}}],"usage":{"prompt_tokens":7,"completion_tokens":4}}`+"\n\n")
		w.(http.Flusher).Flush()
		close(wrote)
		<-r.Context().Done() // net/http notices the peer's close without a write
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			close(sawClose)
		}
	}
	srv.Start()
	defer srv.Close()

	ctx, cancel := context.WithCancel(t.Context())
	s, err := NewClient(Config{}).Stream(ctx, srv.URL, "/v1/chat/completions", []byte(`{}`), "")
	require.NoError(t, err)
	<-wrote
	for range 2 {
		_, err = s.Next()
		require.NoError(t, err)
	}
	cancel()
	select {
	case <-sawClose:
	case <-time.After(10 * time.Second):
		t.Fatal("server never saw the upstream connection close")
	}
	_, err = s.Next()
	require.ErrorIs(t, err, context.Canceled)
	require.NotErrorIs(t, err, ErrStreamCut)
	assert.Equal(t, Usage{PromptTokens: 7, CompletionTokens: 5, Known: true, Choices: 2}, s.Usage(),
		"last cumulative usage: prompt + Σ per-choice completion")
	require.NoError(t, s.Close())
}

func TestClientReusesConnectionAfterDone(t *testing.T) {
	t.Parallel()
	var conns atomic.Int32
	srv := httptest.NewUnstartedServer(sseHandler(t, nil, nil, "data: [DONE]\n\n"))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateNew {
			conns.Add(1)
		}
	}
	srv.Start()
	defer srv.Close()
	c := NewClient(Config{})
	for range 3 {
		s, err := c.Stream(t.Context(), srv.URL, "/v1/completions", []byte(`{}`), "")
		require.NoError(t, err)
		_, err = s.Next()
		require.NoError(t, err)
		_, err = s.Next()
		require.ErrorIs(t, err, io.EOF)
		require.NoError(t, s.Close())
	}
	assert.Equal(t, int32(1), conns.Load(), "streams read to [DONE] reuse one connection")
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	err := Config{MaxIdleConnsPerHost: -1, DialTimeout: -time.Second}.Validate()
	require.Error(t, err)
	assert.Contains(t, err.Error(), "upstream.max_idle_conns_per_host must be >= 0")
	assert.Contains(t, err.Error(), "upstream.dial_timeout must be >= 0")
	require.NoError(t, Config{}.Validate())
}

func TestCloseAfterDoneDoesNotHangOnOpenBody(t *testing.T) {
	t.Parallel()
	sawClose := make(chan struct{})
	srv := httptest.NewUnstartedServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		_, _ = io.WriteString(w, "data: [DONE]\n\n")
		w.(http.Flusher).Flush()
		<-r.Context().Done() // never ends the response
	}))
	srv.Config.ConnState = func(_ net.Conn, st http.ConnState) {
		if st == http.StateClosed {
			close(sawClose)
		}
	}
	srv.Start()
	defer srv.Close()
	s, err := NewClient(Config{}).Stream(t.Context(), srv.URL, "/v1/completions", []byte(`{}`), "")
	require.NoError(t, err)
	ev, err := s.Next()
	require.NoError(t, err)
	require.True(t, ev.Done)
	require.NoError(t, s.Close())
	select {
	case <-sawClose:
	case <-time.After(10 * time.Second):
		t.Fatal("connection left open after Close")
	}
}
