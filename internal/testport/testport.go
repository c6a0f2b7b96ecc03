// Package testport hands out loopback TCP ports for servers that tests start
// in another process (redis-server, sluice serve), which must be told their
// port before they bind it.
//
// A port read off a listener on ":0" is free only until that listener
// closes: the kernel may then give it to any outgoing connection as its
// ephemeral end (net.ipv4.ip_local_port_range), and the child fails with
// "address already in use" (the fault simulator saw it once in 32 worlds).
// Connections never take ports below that range, so Free picks one there at
// random, checks it with a listen, and never hands the same one out twice
// in a process. Another test process may still pick the same port in the
// moment between the check and the child's bind; at some 12,000 ports that
// is rare, not impossible.
package testport

import (
	"math/rand/v2"
	"net"
	"os"
	"strconv"
	"strings"
	"sync"
	"testing"
)

const low = 20000 // the first port Free considers

var (
	mu   sync.Mutex
	used = map[int]bool{}
)

// Free returns a loopback TCP port that is free now and that no outgoing
// connection will take.
func Free(t testing.TB) int {
	t.Helper()
	hi := ephemeralStart()
	if hi-low < 1000 { // an unusual range: fall back to the kernel's choice
		return kernelPort(t)
	}
	for range 1000 {
		p := low + rand.IntN(hi-low)
		mu.Lock()
		taken := used[p]
		used[p] = true
		mu.Unlock()
		if taken {
			continue
		}
		ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
		if err != nil {
			continue
		}
		_ = ln.Close()
		return p
	}
	t.Fatalf("testport: no free port in %d..%d", low, hi-1)
	return 0
}

// ephemeralStart is the first port of the kernel's ephemeral range (Linux;
// 32768, its usual value, where that cannot be read).
func ephemeralStart() int {
	b, err := os.ReadFile("/proc/sys/net/ipv4/ip_local_port_range")
	if err != nil {
		return 32768
	}
	f := strings.Fields(string(b))
	if len(f) == 0 {
		return 32768
	}
	n, err := strconv.Atoi(f[0])
	if err != nil {
		return 32768
	}
	return n
}

func kernelPort(t testing.TB) int {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("testport: %v", err)
	}
	p := ln.Addr().(*net.TCPAddr).Port
	_ = ln.Close()
	return p
}
