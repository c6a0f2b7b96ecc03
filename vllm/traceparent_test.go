package vllm

import (
	"context"
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// A traceparent in the context reaches the replica on both upstream paths
// (the hand-written HTTP/1.1 client and net/http), and none is sent without
// one.
func TestTraceparentSentUpstream(t *testing.T) {
	t.Parallel()
	const tp = "00-4bf92f3577b34da6a3ce929d0e0e4736-00f067aa0ba902b7-01"
	got := make(chan []string, 4)
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		got <- r.Header.Values("Traceparent")
		w.Header().Set("Content-Type", "application/json")
		_, _ = w.Write([]byte(`{"choices":[],"usage":{"prompt_tokens":1,"completion_tokens":0,"total_tokens":1}}`))
	}))
	defer srv.Close()
	c := NewClient(Config{})

	for _, tc := range []struct {
		name string
		ctx  context.Context
		want []string
	}{
		{"with", WithTraceparent(t.Context(), tp), []string{tp}},
		{"without", t.Context(), nil},
		{"invalid value dropped", WithTraceparent(t.Context(), "00-x\r\nX-Evil: 1"), nil},
	} {
		s, err := c.Stream(tc.ctx, srv.URL, "/v1/chat/completions", []byte(`{"stream":false}`), "req-1")
		require.NoError(t, err, tc.name)
		_ = s.Close()
		assert.Equal(t, tc.want, <-got, "Stream %s", tc.name)

		resp, err := c.Post(tc.ctx, srv.URL, "/v1/embeddings", []byte(`{}`), "req-2")
		require.NoError(t, err, tc.name)
		_ = resp.Body.Close()
		assert.Equal(t, tc.want, <-got, "Post %s", tc.name)
	}
}
