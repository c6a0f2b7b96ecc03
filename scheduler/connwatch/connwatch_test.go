//go:build linux

package connwatch

import (
	"bufio"
	"context"
	"io"
	"net"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"github.com/valyala/fasthttp"
)

// startWatcher runs a Watcher for the test's lifetime.
func startWatcher(t *testing.T) *Watcher {
	t.Helper()
	w, err := New()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, w.Close())
	})
	return w
}

// pair returns a connected (server side, client side) TCP pair on loopback.
func pair(t *testing.T) (srv, cli net.Conn) {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	cli, err = net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	srv, err = ln.Accept()
	require.NoError(t, err)
	t.Cleanup(func() { srv.Close(); cli.Close() })
	return srv, cli
}

// fired waits for a close notification; the bound is a hang guard, not a
// timing assertion (latency is a benchmark).
func fired(ch <-chan struct{}) bool {
	select {
	case <-ch:
		return true
	case <-time.After(5 * time.Second):
		return false
	}
}

// Not parallel: its subtests share one watcher and each checks that it is
// left watching nothing.
func TestPeerCloseFires(t *testing.T) {
	w := startWatcher(t)
	tests := []struct {
		name  string
		close func(c net.Conn)
	}{
		{"close", func(c net.Conn) { c.Close() }},
		{"half-close", func(c net.Conn) { c.(*net.TCPConn).CloseWrite() }},
		{"reset", func(c net.Conn) { c.(*net.TCPConn).SetLinger(0); c.Close() }},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			srv, cli := pair(t)
			ch := make(chan struct{}, 2)
			stop, err := w.Watch(srv, func() { ch <- struct{}{} })
			require.NoError(t, err)
			defer stop()
			tc.close(cli)
			require.True(t, fired(ch), "no close event")
			assert.Equal(t, 0, w.Watching())
		})
	}
}

func TestDataIsNotADisconnect(t *testing.T) {
	t.Parallel()
	w := startWatcher(t)
	srv, cli := pair(t)
	ch := make(chan struct{}, 1)
	stop, err := w.Watch(srv, func() { ch <- struct{}{} })
	require.NoError(t, err)
	defer stop()
	// A pipelined next request arrives: must not count as a close.
	_, err = cli.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
	require.NoError(t, err)
	buf := make([]byte, 64)
	n, err := srv.Read(buf) // the bytes are still readable by the server
	require.NoError(t, err)
	assert.Positive(t, n)
	// Now watch a second, closed connection as a barrier: once its event has
	// been delivered, the earlier data event (if any) would have been too.
	srv2, cli2 := pair(t)
	ch2 := make(chan struct{}, 1)
	stop2, err := w.Watch(srv2, func() { ch2 <- struct{}{} })
	require.NoError(t, err)
	defer stop2()
	cli2.Close()
	require.True(t, fired(ch2))
	select {
	case <-ch:
		t.Fatal("data was reported as a disconnect")
	default:
	}
	assert.Equal(t, 1, w.Watching())
}

func TestStopBeforeCloseNeverFires(t *testing.T) {
	t.Parallel()
	w := startWatcher(t)
	srv, cli := pair(t)
	ch := make(chan struct{}, 1)
	stop, err := w.Watch(srv, func() { ch <- struct{}{} })
	require.NoError(t, err)
	stop()
	stop() // idempotent
	cli.Close()
	// Barrier as above.
	srv2, cli2 := pair(t)
	ch2 := make(chan struct{}, 1)
	stop2, err := w.Watch(srv2, func() { ch2 <- struct{}{} })
	require.NoError(t, err)
	defer stop2()
	cli2.Close()
	require.True(t, fired(ch2))
	assert.Empty(t, ch)
}

func TestManyRegistrations(t *testing.T) {
	t.Parallel()
	w := startWatcher(t)
	var wg sync.WaitGroup
	for range 8 {
		srv, _ := pair(t) // one in-flight request per connection, as in HTTP/1.1
		wg.Add(1)
		go func() {
			defer wg.Done()
			for range 1250 {
				stop, err := w.Watch(srv, func() {})
				if err != nil {
					t.Error(err)
					return
				}
				stop()
			}
		}()
	}
	wg.Wait()
	assert.Equal(t, 0, w.Watching())
}

func TestUnsupportedConn(t *testing.T) {
	t.Parallel()
	w := startWatcher(t)
	a, b := net.Pipe()
	defer a.Close()
	defer b.Close()
	_, err := w.Watch(a, func() {})
	assert.ErrorIs(t, err, ErrUnsupported)
}

// TestFasthttpClientDisconnect is the reason the package exists: a fasthttp
// handler learns that its client hung up while the handler is still busy.
func TestFasthttpClientDisconnect(t *testing.T) {
	t.Parallel()
	w := startWatcher(t)
	cancelled := make(chan struct{})
	entered := make(chan struct{})
	srv := &fasthttp.Server{Handler: func(rc *fasthttp.RequestCtx) {
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		stop, err := w.Watch(rc.Conn(), cancel)
		if err != nil {
			t.Error(err)
			return
		}
		defer stop()
		close(entered)
		<-ctx.Done() // the handler would be waiting on the queue or upstream
		close(cancelled)
	}}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown below
	defer srv.Shutdown()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	_, err = c.Write([]byte("POST /v1/chat/completions HTTP/1.1\r\nHost: x\r\nContent-Length: 2\r\n\r\n{}"))
	require.NoError(t, err)
	<-entered
	c.Close()
	require.True(t, fired(cancelled), "handler never saw the disconnect")
}

func BenchmarkWatchStop(b *testing.B) {
	w, err := New()
	require.NoError(b, err)
	defer w.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	cli, _ := net.Dial("tcp", ln.Addr().String())
	defer cli.Close()
	srv, _ := ln.Accept()
	defer srv.Close()
	b.ReportAllocs()
	for b.Loop() {
		stop, err := w.Watch(srv, func() {})
		if err != nil {
			b.Fatal(err)
		}
		stop()
	}
}

// TestStopAfterCloseDoesNotTouchReusedFd: a registration stopped after its
// connection was closed (a streaming writer outliving fasthttp's close)
// must not unregister the new connection that got the same fd number.
func TestStopAfterCloseDoesNotTouchReusedFd(t *testing.T) {
	w := startWatcher(t)
	srv1, _ := pair(t)
	stop1, err := w.Watch(srv1, func() {})
	require.NoError(t, err)
	old := fdOf(t, srv1)

	// The next accepted connection gets the lowest free number: srv1's,
	// once it is closed between Dial and Accept.
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	defer ln.Close()
	cli2, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	defer cli2.Close()
	require.NoError(t, srv1.Close())
	srv2, err := ln.Accept()
	require.NoError(t, err)
	defer srv2.Close()
	require.Equal(t, old, fdOf(t, srv2), "the kernel reused the fd number")

	ch := make(chan struct{}, 1)
	stop2, err := w.Watch(srv2, func() { ch <- struct{}{} })
	require.NoError(t, err)
	defer stop2()
	stop1() // late stop of the old registration
	require.NoError(t, cli2.Close())
	assert.True(t, fired(ch), "the new connection's watch must survive the old one's stop")
}

func fdOf(t *testing.T, c net.Conn) int {
	t.Helper()
	raw, err := c.(syscall.Conn).SyscallConn()
	require.NoError(t, err)
	var fd int
	require.NoError(t, raw.Control(func(f uintptr) { fd = int(f) }))
	return fd
}

// startPerConn runs a per-connection Watcher for the test's lifetime.
func startPerConn(t *testing.T) *Watcher {
	t.Helper()
	w, err := NewPerConn()
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- w.Run(ctx) }()
	t.Cleanup(func() {
		cancel()
		require.NoError(t, <-done)
		require.NoError(t, w.Close())
	})
	return w
}

// Requests on one kept-alive connection share one registration: stop
// leaves it in place, a later request's peer close fires only that
// request's callback, and Closed removes it.
func TestPerConnOneRegistrationPerConnection(t *testing.T) {
	t.Parallel()
	w := startPerConn(t)
	srv, cli := pair(t)
	var old int
	for range 1000 {
		stop, err := w.Watch(srv, func() { old++ })
		require.NoError(t, err)
		stop()
		stop() // idempotent
	}
	require.Equal(t, 1, w.Watching())
	ch := make(chan struct{}, 2)
	stop, err := w.Watch(srv, func() { ch <- struct{}{} })
	require.NoError(t, err)
	defer stop()
	require.NoError(t, cli.Close())
	require.True(t, fired(ch), "no close event")
	assert.Equal(t, 0, old, "a finished request's callback never fires")
	assert.Equal(t, 1, w.Watching(), "registered until the server closes the connection")
	w.Closed(srv)
	w.Closed(srv) // idempotent
	assert.Equal(t, 0, w.Watching())
	assert.Empty(t, ch, "fired exactly once")
}

// A peer that closed between two requests is reported to the next one at
// once; the one before it is not told.
func TestPerConnCloseBetweenRequests(t *testing.T) {
	t.Parallel()
	w := startPerConn(t)
	srv, cli := pair(t)
	first := make(chan struct{}, 1)
	stop, err := w.Watch(srv, func() { first <- struct{}{} })
	require.NoError(t, err)
	stop()
	require.NoError(t, cli.Close())
	// Barrier: a second connection's close is delivered after the first's.
	srv2, cli2 := pair(t)
	ch2 := make(chan struct{}, 1)
	stop2, err := w.Watch(srv2, func() { ch2 <- struct{}{} })
	require.NoError(t, err)
	defer stop2()
	require.NoError(t, cli2.Close())
	require.True(t, fired(ch2))
	fires := 0
	stop, err = w.Watch(srv, func() { fires++ })
	require.NoError(t, err)
	stop()
	assert.Equal(t, 1, fires, "the next request learns at once that its client left")
	assert.Empty(t, first)
	w.Closed(srv)
	w.Closed(srv2)
	assert.Equal(t, 0, w.Watching())
}

// Closed with a request still watching tells it (nothing can reach its
// client any more), and releases the watcher's duplicate descriptor: the
// peer sees the server's close.
func TestPerConnClosedTellsInFlightAndReleasesSocket(t *testing.T) {
	t.Parallel()
	w := startPerConn(t)
	srv, cli := pair(t)
	fires := 0
	stop, err := w.Watch(srv, func() { fires++ })
	require.NoError(t, err)
	defer stop()
	require.NoError(t, srv.Close())
	w.Closed(srv)
	assert.Equal(t, 1, fires)
	assert.Equal(t, 0, w.Watching())
	require.NoError(t, cli.SetReadDeadline(time.Now().Add(5*time.Second)))
	_, err = cli.Read(make([]byte, 1))
	assert.ErrorIs(t, err, io.EOF, "the duplicate no longer holds the socket open")
}

// The edge's set-up: fasthttp reports closed connections through ConnState;
// two requests on one keep-alive connection use one registration, which is
// gone once the client hangs up.
func TestPerConnFasthttpConnState(t *testing.T) {
	t.Parallel()
	w := startPerConn(t)
	var mu sync.Mutex
	seen := []int{}
	srv := &fasthttp.Server{
		Handler: func(rc *fasthttp.RequestCtx) {
			stop, err := w.Watch(rc.Conn(), func() {})
			if err != nil {
				t.Error(err)
				return
			}
			defer stop()
			mu.Lock()
			seen = append(seen, w.Watching())
			mu.Unlock()
		},
		ConnState: func(c net.Conn, st fasthttp.ConnState) {
			if st == fasthttp.StateClosed {
				w.Closed(c)
			}
		},
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	go srv.Serve(ln) //nolint:errcheck // ends with Shutdown below
	defer srv.Shutdown()
	c, err := net.Dial("tcp", ln.Addr().String())
	require.NoError(t, err)
	for range 2 {
		_, err = c.Write([]byte("GET / HTTP/1.1\r\nHost: x\r\n\r\n"))
		require.NoError(t, err)
		var resp fasthttp.Response
		require.NoError(t, resp.Read(bufio.NewReader(c)))
	}
	mu.Lock()
	assert.Equal(t, []int{1, 1}, seen)
	mu.Unlock()
	require.NoError(t, c.Close())
	eventually(t, func() bool { return w.Watching() == 0 })
}

// eventually polls cond (another goroutine's state) with a bound.
func eventually(t *testing.T, cond func() bool) {
	t.Helper()
	for deadline := time.Now().Add(5 * time.Second); time.Now().Before(deadline); time.Sleep(time.Millisecond) {
		if cond() {
			return
		}
	}
	t.Fatal("condition not met within 5s")
}

func BenchmarkWatchStopPerConn(b *testing.B) {
	w, err := NewPerConn()
	require.NoError(b, err)
	defer w.Close()
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	defer ln.Close()
	cli, _ := net.Dial("tcp", ln.Addr().String())
	defer cli.Close()
	srv, _ := ln.Accept()
	defer srv.Close()
	b.ReportAllocs()
	for b.Loop() {
		stop, err := w.Watch(srv, func() {})
		if err != nil {
			b.Fatal(err)
		}
		stop()
	}
}
