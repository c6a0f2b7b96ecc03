package testport

import (
	"net"
	"strconv"
	"testing"
)

// TestFreeIsOutsideTheEphemeralRange: every port Free returns is below the
// kernel's ephemeral range, bindable, and never returned twice.
func TestFreeIsOutsideTheEphemeralRange(t *testing.T) {
	hi := ephemeralStart()
	seen := map[int]bool{}
	for range 200 {
		p := Free(t)
		if p < low || p >= hi {
			t.Fatalf("port %d outside %d..%d", p, low, hi-1)
		}
		if seen[p] {
			t.Fatalf("port %d returned twice", p)
		}
		seen[p] = true
	}
	p := Free(t)
	ln, err := net.Listen("tcp", net.JoinHostPort("127.0.0.1", strconv.Itoa(p)))
	if err != nil {
		t.Fatalf("the port Free returned does not bind: %v", err)
	}
	_ = ln.Close()
}
