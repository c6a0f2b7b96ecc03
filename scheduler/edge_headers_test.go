package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/valyala/fasthttp"

	"github.com/sluicehq/sluice/ledger"
)

// TestSuccessHeaders pins the exact budget and Server-Timing header bytes
// (ARCHITECTURE §3.3), as fmt's %.3f and the old concatenations wrote them.
func TestSuccessHeaders(t *testing.T) {
	t.Parallel()
	t0 := time.Date(2026, 1, 2, 3, 4, 5, 0, time.UTC)
	var room ledger.Headroom
	room[ledger.Tokens] = ledger.Room{Tracked: true, Limit: 1000, Remaining: 250, ResetsAt: t0.Add(90*time.Second + 1500*time.Microsecond)}
	room[ledger.Requests] = ledger.Room{Tracked: true, Limit: 10, Remaining: 0, ResetsAt: t0.Add(time.Hour)}
	tests := []struct {
		name                         string
		arrival, dispatch, firstByte time.Time
		headroom                     ledger.Headroom
		want                         map[string]string
	}{
		{
			name: "queue and upstream", arrival: t0.Add(-2 * time.Millisecond), dispatch: t0.Add(-500 * time.Microsecond),
			firstByte: t0.Add(-249*time.Microsecond - 999*time.Nanosecond), headroom: room,
			want: map[string]string{
				"Server-Timing":                  "queue;dur=1.500, upstream;dur=0.250",
				"X-Ratelimit-Limit-Tokens":       "1000",
				"X-Ratelimit-Remaining-Tokens":   "250",
				"X-Ratelimit-Reset-Tokens":       "1m30.002s",
				"X-Ratelimit-Limit-Requests":     "10",
				"X-Ratelimit-Remaining-Requests": "0",
				"X-Ratelimit-Reset-Requests":     "1h0m0s",
			},
		},
		{
			name: "no first byte, untracked budgets", arrival: t0, dispatch: t0.Add(12345678 * time.Nanosecond),
			want: map[string]string{"Server-Timing": "queue;dur=12.345", "X-Ratelimit-Limit-Tokens": ""},
		},
		{
			name: "never dispatched", arrival: t0,
			want: map[string]string{"Server-Timing": "queue;dur=0.000"},
		},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			e := &Edge{s: &Server{now: func() time.Time { return t0 }}}
			c := &call{t: &tenant{}, arrival: tt.arrival, dispatchAt: tt.dispatch, firstByte: tt.firstByte,
				grant: ledger.Grant{Headroom: tt.headroom}}
			var rc fasthttp.RequestCtx
			e.successHeaders(&rc, c)
			for k, v := range tt.want {
				assert.Equal(t, v, string(rc.Response.Header.Peek(k)), k)
			}
		})
	}
}
