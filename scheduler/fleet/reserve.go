package fleet

import (
	"math"

	"github.com/sluicehq/sluice/scheduler/gate"
)

// Reserve is what the split keeps for light tenants beside heavy ones, as
// the dispatch gate's reserve on one instance (SCHEDULING §6).
type Reserve struct {
	// Margin is server.reserve_margin: Poisson standard deviations of the
	// light tenants' claims (those their gates do not read steady).
	Margin float64
	// Headroom is server.headroom: the least of the batch the light
	// tenants are given beyond what they hold (0–1).
	Headroom float64
	// Cap is server.reserve_cap: the most of the batch the light tenants
	// are given beyond what they hold, margin and headroom included (0–1).
	Cap float64
}

// DefaultReserve is Reserve at the settings' defaults.
var DefaultReserve = Reserve{Margin: gate.BurstK, Headroom: 0.1, Cap: 1}

// reserveLight sets each light tenant's want beside heavy tenants, as the
// dispatch gate's reserve keeps room on one instance (SCHEDULING §6): its
// claim, a Poisson margin, at least server.headroom beyond what the light
// tenants hold and at most server.reserve_cap.
func (sp *shareSplit) reserveLight(light []*shareClaim, lightClaims float64) {
	// The gate's reserve: the light tenants' claims are counts of
	// requests, so their sum's Poisson deviations in requests, but
	// for a steady tenant's, which asks what it holds and never more
	// (gate.Gate.Steady): a loop of three beside a flood at another
	// instance kept the replica 0.63 busy.
	noisy := 0.0
	for _, c := range light {
		noisy += c.noisy
	}
	margin := sp.margin * math.Sqrt(noisy/1000) * 1000
	extra := 0.0
	for _, c := range light {
		if noisy > 0 {
			c.want = c.claim + margin*c.noisy/noisy
		}
		if c.noisy < c.claim {
			// A steady claim is its requests, whole: a pool's is spread
			// over its replicas (a loop of three is 1.5 on each of two),
			// and rounded down on one, the loop's third request waited
			// for its own completion.
			c.want = max(c.want, math.Ceil(c.claim/1000-1e-9)*1000)
		}
		extra += max(c.want-c.held, 0)
	}
	// server.headroom is the least they are given beyond what they
	// hold, as it is the gate's least reserve, spread by their claims.
	if least := sp.headroom * sp.limit; extra < least {
		for _, c := range light {
			c.want += (least - extra) * c.claim / lightClaims
		}
		extra = least
	}
	// server.reserve_cap bounds what they are given beyond what they
	// hold (queued, kept for peaks, margin), as it bounds the gate's
	// reserve; 1, its default, bounds nothing.
	if room := sp.cap * sp.limit; sp.cap < 1 && extra > room {
		for _, c := range light {
			c.want = min(c.want, c.held+max(c.want-c.held, 0)*room/extra)
		}
	}
}
