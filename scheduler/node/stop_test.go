package node

import (
	"context"
	"errors"
	"net"
	"net/http"
	"testing"
	"time"

	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// TestStopServingBeforeServe: a drain that comes before a server's Serve
// goroutine has run still ends that Serve. fasthttp's Shutdown alone
// returns at once when Serve has registered no listener yet, and the late
// Serve then accepts forever (seen as a CI hang of TestAdminCLIAgainstServer,
// whose node.Run never returned). The bound below catches that hang; it
// is not a wait for anything.
func TestStopServingBeforeServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &fasthttp.Server{Handler: func(*fasthttp.RequestCtx) {}}
	require.NoError(t, stopServing(servedBy{srv.Shutdown, ln}))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		require.NoError(t, err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve after stopServing is still accepting")
	}
}

// TestStopServingAdminBeforeServe: the same for the admin listener's
// net/http server, whose Serve after Shutdown answers ErrServerClosed
// (which Run takes as a clean stop).
func TestStopServingAdminBeforeServe(t *testing.T) {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	srv := &http.Server{Handler: http.NotFoundHandler()}
	require.NoError(t, stopServing(servedBy{func() error { return srv.Shutdown(context.Background()) }, ln}))
	done := make(chan error, 1)
	go func() { done <- srv.Serve(ln) }()
	select {
	case err := <-done:
		require.True(t, errors.Is(err, http.ErrServerClosed) || errors.Is(err, net.ErrClosed), "%v", err)
	case <-time.After(10 * time.Second):
		t.Fatal("Serve after stopServing is still accepting")
	}
}
