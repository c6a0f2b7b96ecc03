package edge

import (
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/stretchr/testify/assert"
	"github.com/valyala/fasthttp"
)

// TestSuccessHeaders pins the exact budget, output-cap, stop and
// Server-Timing header bytes (ARCHITECTURE §3.3), as fmt's %.3f and the
// old concatenations wrote them.
func TestSuccessHeaders(t *testing.T) {
	t.Parallel()
	tokens := lifecycle.Headroom{Tracked: true, Limit: 1000, Remaining: 250, ResetsIn: 90*time.Second + 1500*time.Microsecond}
	requests := lifecycle.Headroom{Tracked: true, Limit: 10, Remaining: 0, ResetsIn: time.Hour}
	tests := []struct {
		name string
		m    lifecycle.Meta
		want map[string]string
	}{
		{
			name: "queue and upstream",
			m: lifecycle.Meta{Sent: true, Tokens: tokens, Requests: requests, Queue: 1500 * time.Microsecond,
				Upstream: 250*time.Microsecond + 999*time.Nanosecond, Answered: true},
			want: map[string]string{
				"Server-Timing":                  "queue;dur=1.500, upstream;dur=0.250",
				"X-Ratelimit-Limit-Tokens":       "1000",
				"X-Ratelimit-Remaining-Tokens":   "250",
				"X-Ratelimit-Reset-Tokens":       "1m30.002s",
				"X-Ratelimit-Limit-Requests":     "10",
				"X-Ratelimit-Remaining-Requests": "0",
				"X-Ratelimit-Reset-Requests":     "1h0m0s",
				"X-Budget-Warning":               "",
				"X-Sluice-Output-Cap":            "",
				"X-Sluice-Stopped":               "",
			},
		},
		{
			name: "no first byte, untracked budgets", m: lifecycle.Meta{Queue: 12345678 * time.Nanosecond},
			want: map[string]string{"Server-Timing": "queue;dur=12.345", "X-Ratelimit-Limit-Tokens": ""},
		},
		{
			name: "never dispatched",
			want: map[string]string{"Server-Timing": "queue;dur=0.000"},
		},
		{
			name: "warned, capped and stopped",
			m:    lifecycle.Meta{Warning: true, OutputCap: 16, CapReason: "budget", Stopped: []byte("budget; scope=tenant; dimension=tokens; window=1h")},
			want: map[string]string{
				"X-Budget-Warning":    "soft_threshold",
				"X-Sluice-Output-Cap": "16; reason=budget",
				"X-Sluice-Stopped":    "budget; scope=tenant; dimension=tokens; window=1h",
			},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			var rc fasthttp.RequestCtx
			successHeaders(&rc.Response.Header, tt.m)
			for k, v := range tt.want {
				assert.Equal(t, v, string(rc.Response.Header.Peek(k)), k)
			}
		})
	}
}

// TestAppendMillis: the Server-Timing text of whole microseconds is what
// %.3f prints for their milliseconds, signs and carries included.
func TestAppendMillis(t *testing.T) {
	for _, us := range []int64{0, 1, 9, 10, 99, 100, 999, 1000, 1001, 12345, 999999, 1e9 + 7, 86400e6, -1, -999, -1000, -12345} {
		want := strconv.AppendFloat(nil, float64(us)/1000, 'f', 3, 64)
		assert.Equal(t, string(want), string(appendMillis(nil, us)), "%d µs", us)
	}
}

// TestRequestIDGenerated: without a usable X-Request-Id the edge makes
// "sluice-" and 24 lowercase hex digits, different each time; a client's
// printable one is kept.
func TestRequestIDGenerated(t *testing.T) {
	seen := map[string]bool{}
	for range 1000 {
		var rc fasthttp.RequestCtx
		id := requestID(&rc)
		assert.Regexp(t, `^sluice-[0-9a-f]{24}$`, id)
		assert.False(t, seen[id], "repeated id %s", id)
		seen[id] = true
	}
	var rc fasthttp.RequestCtx
	rc.Request.Header.Set("X-Request-Id", "client-7")
	assert.Equal(t, "client-7", requestID(&rc))
	rc.Request.Header.Set("X-Request-Id", "has space")
	assert.Regexp(t, `^sluice-`, requestID(&rc))
}

func TestRetryAfterSeconds(t *testing.T) {
	t.Parallel()
	assert.Equal(t, "1", retryAfterSeconds(10*time.Millisecond))
	assert.Equal(t, "2", retryAfterSeconds(1001*time.Millisecond))
	assert.Equal(t, "3600", retryAfterSeconds(time.Hour))
}
