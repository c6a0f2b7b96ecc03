package vllm

import (
	"net/http"
	"net/http/httptest"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestPollerSetTargets: a target kept keeps its state, a new one starts
// unpolled and is polled in the next round, a dropped one is gone.
func TestPollerSetTargets(t *testing.T) {
	t.Parallel()
	srv := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.URL.Path == "/metrics" {
			_, _ = w.Write([]byte("vllm:num_requests_running 2\n"))
		}
	}))
	defer srv.Close()
	p, err := NewPoller(PollerConfig{Replicas: []Target{{Name: "a", URL: srv.URL}}}, nil, nil)
	require.NoError(t, err)
	p.PollOnce(t.Context())
	a, _ := p.Get("a")
	require.True(t, a.Up)

	require.NoError(t, p.SetTargets([]Target{{Name: "a", URL: srv.URL}, {Name: "b", URL: srv.URL + "/"}}))
	a2, _ := p.Get("a")
	assert.Same(t, a, a2, "a kept target keeps its state")
	b, ok := p.Get("b")
	require.True(t, ok)
	assert.False(t, b.Up, "a new target is not up before a poll")
	p.PollOnce(t.Context())
	b, _ = p.Get("b")
	assert.True(t, b.Up)

	require.NoError(t, p.SetTargets([]Target{{Name: "b", URL: srv.URL + "/"}}))
	_, ok = p.Get("a")
	assert.False(t, ok)
	assert.Len(t, p.Snapshot(), 1)
	assert.Error(t, p.SetTargets([]Target{{Name: "x", URL: "ftp://x"}}))
}
