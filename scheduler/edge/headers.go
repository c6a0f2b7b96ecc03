package edge

import (
	"strconv"
	"time"

	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/valyala/fasthttp"
)

// successHeaders sets the budget, output-cap, stop and timing headers of
// ARCHITECTURE §3.3 from the call's Meta.
func successHeaders(h *fasthttp.ResponseHeader, m lifecycle.Meta) {
	var num [24]byte
	rateLimit(h, &num, &tokensHeaders, m.Tokens)
	rateLimit(h, &num, &requestsHeaders, m.Requests)
	if m.Warning {
		h.Set("X-Budget-Warning", "soft_threshold")
	}
	if m.Stopped != nil {
		h.SetBytesV("X-Sluice-Stopped", m.Stopped)
	}
	if m.CapReason != "" {
		// X-Sluice-Output-Cap: <n>; reason=<r> (docs/api.md "Output caps").
		h.SetBytesV("X-Sluice-Output-Cap", append(append(strconv.AppendInt(num[:0], int64(m.OutputCap), 10), "; reason="...), m.CapReason...))
	}
	// "queue;dur=%.3f[, upstream;dur=%.3f]" of whole microseconds, without
	// fmt nor float formatting.
	var st [64]byte
	b := append(st[:0], "queue;dur="...)
	b = appendMillis(b, m.Queue.Microseconds())
	if m.Answered {
		b = append(b, ", upstream;dur="...)
		b = appendMillis(b, m.Upstream.Microseconds())
	}
	h.SetBytesV("Server-Timing", b)
}

// appendMillis appends us microseconds as milliseconds with three decimals:
// the text %.3f prints for float64(us)/1000.
func appendMillis(b []byte, us int64) []byte {
	if us < 0 {
		b, us = append(b, '-'), -us
	}
	b = strconv.AppendInt(b, us/1000, 10)
	frac := us % 1000
	return append(b, '.', byte('0'+frac/100), byte('0'+frac/10%10), byte('0'+frac%10))
}

// rateLimitNames are one budget's headers (ARCHITECTURE §3.3).
type rateLimitNames struct{ limit, remaining, reset string }

var (
	tokensHeaders   = rateLimitNames{"x-ratelimit-limit-tokens", "x-ratelimit-remaining-tokens", "x-ratelimit-reset-tokens"}
	requestsHeaders = rateLimitNames{"x-ratelimit-limit-requests", "x-ratelimit-remaining-requests", "x-ratelimit-reset-requests"}
)

// rateLimit sets one budget's headers when a budget of its dimension
// applies.
func rateLimit(h *fasthttp.ResponseHeader, num *[24]byte, n *rateLimitNames, room lifecycle.Headroom) {
	if !room.Tracked {
		return
	}
	h.SetBytesV(n.limit, strconv.AppendInt(num[:0], room.Limit, 10))
	h.SetBytesV(n.remaining, strconv.AppendInt(num[:0], room.Remaining, 10))
	h.Set(n.reset, room.ResetsIn.Round(time.Millisecond).String())
}
