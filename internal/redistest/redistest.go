// Package redistest starts a real redis-server on loopback for tests.
package redistest

import (
	"net"
	"os/exec"
	"path/filepath"
	"strconv"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testport"
)

// Start starts a redis-server (no persistence) on a free loopback port,
// waits until it answers, and kills it at cleanup. It returns its address.
func Start(t testing.TB) string {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not found: run `make test` (scripts/ensure-deps.sh installs it)")
	}
	port := testport.Free(t)
	dir := t.TempDir()
	cmd := exec.Command("redis-server", "--port", strconv.Itoa(port), "--bind", "127.0.0.1",
		"--dir", dir, "--save", "", "--appendonly", "no", "--logfile", filepath.Join(dir, "redis.log"))
	if err := cmd.Start(); err != nil {
		t.Fatalf("redis-server: %v", err)
	}
	t.Cleanup(func() { _ = cmd.Process.Kill(); _ = cmd.Wait() })
	addr := net.JoinHostPort("127.0.0.1", strconv.Itoa(port))
	c := redis.NewClient(&redis.Options{Addr: addr, MaxRetries: -1})
	defer func() { _ = c.Close() }()
	deadline := time.Now().Add(10 * time.Second)
	for c.Ping(t.Context()).Err() != nil {
		if time.Now().After(deadline) {
			t.Fatalf("redis-server on %s not ready after 10s", addr)
		}
		time.Sleep(10 * time.Millisecond) // a starting child process has no readiness event
	}
	return addr
}
