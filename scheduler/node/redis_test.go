package node

import (
	"fmt"
	"net"
	"os/exec"
	"strconv"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testport"
)

// redisServer is a real redis-server on a free loopback port in a temp dir.
type redisServer struct {
	addr string
	cmd  *exec.Cmd
	port int
	dir  string
}

func startRedis(t *testing.T) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found: run `make test` (scripts/ensure-deps.sh installs it)")
	}
	port := testport.Free(t)
	r := &redisServer{port: port, addr: "127.0.0.1:" + strconv.Itoa(port), dir: t.TempDir()}
	r.start(t)
	t.Cleanup(func() { r.stop() })
	return r
}

func (r *redisServer) start(t *testing.T) {
	t.Helper()
	r.cmd = exec.Command("redis-server", "--port", strconv.Itoa(r.port), "--bind", "127.0.0.1",
		"--dir", r.dir, "--save", "", "--appendonly", "no", "--protected-mode", "no")
	require.NoError(t, r.cmd.Start())
	deadline := time.Now().Add(5 * time.Second)
	for {
		c, err := net.Dial("tcp", r.addr)
		if err == nil {
			c.Close()
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("redis-server did not start on %s", r.addr)
		}
		time.Sleep(10 * time.Millisecond) // waiting for a child process to listen
	}
}

func (r *redisServer) stop() {
	if r.cmd != nil && r.cmd.Process != nil {
		_ = r.cmd.Process.Kill()
		_ = r.cmd.Wait()
		r.cmd = nil
	}
}

func redisTop(r *redisServer) string {
	return fmt.Sprintf("ledger: {backend: redis, redis: {addrs: [%q], store_timeout: 1s}}\n", r.addr)
}
