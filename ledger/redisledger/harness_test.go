package redisledger_test

import (
	"context"
	"io"
	"net"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testport"
)

// redisServer is a real redis-server started by a test on a free loopback
// port, in its own temp dir. Stop and Start may be called to simulate a store
// outage; the port is kept.
type redisServer struct {
	t    testing.TB
	dir  string
	port int
	unix bool     // also listen on Sock
	args []string // more redis-server arguments (a Cluster node's)
	cmd  *exec.Cmd
	done chan struct{}
}

// Addr returns host:port of the server.
func (s *redisServer) Addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// Sock returns the path of the Unix socket a server of startRedisUnix also
// listens on (a Ledger given a path as its address dials it: go-redis takes
// an address that starts with "/" as a Unix socket).
func (s *redisServer) Sock() string { return filepath.Join(s.dir, "redis.sock") }

// startRedisUnix is startRedis with a Unix socket too, in a short temporary
// directory (a socket path has at most 107 bytes; test names run longer).
func startRedisUnix(t testing.TB) *redisServer {
	t.Helper()
	dir, err := os.MkdirTemp("", "rl")
	require.NoError(t, err)
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	s := &redisServer{t: t, dir: dir, port: testport.Free(t), unix: true}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// startRedis starts a redis-server or fails the test with a clear message
// when the binary is missing. It is stopped at test cleanup.
func startRedis(t testing.TB) *redisServer {
	t.Helper()
	return startRedisArgs(t)
}

// startRedisArgs is startRedis with more redis-server arguments.
func startRedisArgs(t testing.TB, args ...string) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found in PATH: the Redis ledger tests need a real Redis >= 7.0 " +
			"(run `make test`, which installs it via scripts/ensure-deps.sh, or `apt-get install redis-server`)")
	}
	s := &redisServer{t: t, dir: t.TempDir(), port: testport.Free(t), args: args}
	s.Start()
	t.Cleanup(s.Stop)
	return s
}

// Start (re)starts the server on its port and waits until it answers PING.
func (s *redisServer) Start() {
	s.t.Helper()
	if s.cmd != nil {
		return
	}
	cmd := exec.Command("redis-server",
		"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--dir", s.dir, "--save", "", "--appendonly", "no",
		"--maxmemory-policy", "noeviction", "--daemonize", "no",
		"--logfile", filepath.Join(s.dir, "redis.log"))
	if s.unix {
		cmd.Args = append(cmd.Args, "--unixsocket", s.Sock(), "--unixsocketperm", "700")
	}
	cmd.Args = append(cmd.Args, s.args...)
	cmd.Stdout, cmd.Stderr = io.Discard, io.Discard
	require.NoError(s.t, cmd.Start(), "start redis-server")
	s.cmd = cmd
	s.done = make(chan struct{})
	go func(done chan struct{}) { _ = cmd.Wait(); close(done) }(s.done)

	c := redis.NewClient(&redis.Options{Addr: s.Addr(), MaxRetries: -1, DialTimeout: 100 * time.Millisecond})
	defer c.Close()
	deadline := time.Now().Add(10 * time.Second)
	for {
		ctx, cancel := context.WithTimeout(context.Background(), 200*time.Millisecond)
		err := c.Ping(ctx).Err()
		cancel()
		if err == nil {
			return
		}
		select {
		case <-s.done:
			log, _ := os.ReadFile(filepath.Join(s.dir, "redis.log"))
			s.t.Fatalf("redis-server exited during start-up: %s", log)
		default:
		}
		if time.Now().After(deadline) {
			s.t.Fatalf("redis-server on %s not ready after 10s: %v", s.Addr(), err)
		}
		// Polling a starting child process: there is no readiness event to wait on.
		time.Sleep(10 * time.Millisecond)
	}
}

// Stop kills the server and waits until it has exited.
func (s *redisServer) Stop() {
	if s.cmd == nil {
		return
	}
	_ = s.cmd.Process.Kill()
	<-s.done
	s.cmd = nil
}

// Client returns a plain client for assertions and set-up, closed at cleanup.
func (s *redisServer) Client(t testing.TB) *redis.Client {
	c := redis.NewClient(&redis.Options{Addr: s.Addr()})
	t.Cleanup(func() { _ = c.Close() })
	return c
}

// delayProxy is a loopback TCP proxy that forwards client bytes at once and
// delays every reply chunk from the server by a fixed duration, so that a
// client read timeout fires after the server has already run the command.
type delayProxy struct {
	ln     net.Listener
	target string
	delay  time.Duration
	every  int // delay every Nth reply chunk of a connection; ≤ 1 delays all

	wg    sync.WaitGroup
	mu    sync.Mutex // guards conns
	conns map[net.Conn]struct{}
}

func startDelayProxy(t testing.TB, target string, delay time.Duration) *delayProxy {
	return startDelayProxyEvery(t, target, delay, 1)
}

// startDelayProxyEvery delays only every Nth reply chunk per connection, so a
// retry on a fresh connection gets a prompt reply.
func startDelayProxyEvery(t testing.TB, target string, delay time.Duration, every int) *delayProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &delayProxy{ln: ln, target: target, delay: delay, every: every, conns: map[net.Conn]struct{}{}}
	p.wg.Add(1)
	go p.acceptLoop()
	t.Cleanup(p.Close)
	return p
}

func (p *delayProxy) Addr() string { return p.ln.Addr().String() }

func (p *delayProxy) track(c net.Conn) bool {
	p.mu.Lock()
	defer p.mu.Unlock()
	if p.conns == nil {
		return false
	}
	p.conns[c] = struct{}{}
	return true
}

func (p *delayProxy) acceptLoop() {
	defer p.wg.Done()
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		if !p.track(c) || !p.track(up) {
			_ = c.Close()
			_ = up.Close()
			return
		}
		p.wg.Add(2)
		go func() {
			defer p.wg.Done()
			_, _ = io.Copy(up, c)
			_ = up.Close()
			_ = c.Close()
		}()
		go func() {
			defer p.wg.Done()
			p.delayedCopy(c, up)
			_ = up.Close()
			_ = c.Close()
		}()
	}
}

type chunk struct {
	at    time.Time
	data  []byte
	delay bool
}

// delayedCopy reads from src and writes each chunk to dst delay after it was
// read. The first chunk of a connection (the HELLO handshake reply) is never
// delayed, so connections can be established.
func (p *delayProxy) delayedCopy(dst, src net.Conn) {
	ch := make(chan chunk, 1024)
	var wg sync.WaitGroup
	wg.Add(1)
	go func() {
		defer wg.Done()
		for c := range ch {
			if d := time.Until(c.at.Add(p.delay)); c.delay && d > 0 {
				time.Sleep(d) // the delay is the point of this proxy
			}
			if _, err := dst.Write(c.data); err != nil {
				for range ch { //nolint:revive // drain
				}
				return
			}
		}
	}()
	buf := make([]byte, 64<<10)
	for i := 1; ; i++ {
		n, err := src.Read(buf)
		if n > 0 {
			ch <- chunk{at: time.Now(), data: append([]byte(nil), buf[:n]...), delay: i > 1 && (p.every <= 1 || i%p.every == 0)}
		}
		if err != nil {
			break
		}
	}
	close(ch)
	wg.Wait()
}

// Close stops accepting, closes every connection and waits for the copiers.
func (p *delayProxy) Close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for c := range p.conns {
		_ = c.Close()
	}
	p.conns = nil
	p.mu.Unlock()
	p.wg.Wait()
}

type quietLogger struct{}

func (quietLogger) Printf(context.Context, string, ...any) {}

// TestMain silences go-redis' connection logging (the outage tests provoke
// thousands of dial failures on purpose).
func TestMain(m *testing.M) {
	redis.SetLogger(quietLogger{})
	os.Exit(m.Run())
}
