package scheduler

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/policy"
)

func TestPriceCached(t *testing.T) {
	t.Parallel()
	p := &policy.Snapshot{Prices: map[string]config.Price{
		"m":     {Model: "m", InputPerMTok: 3_000_000, OutputPerMTok: 15_000_000, CachedInputPerMTok: 300_000},
		"plain": {Model: "plain", InputPerMTok: 3_000_000, OutputPerMTok: 15_000_000},
	}}
	// 1000 input of which 800 cached, 100 output: 200·3 + 800·0.3 + 100·15 = 2340 µUSD.
	assert.Equal(t, int64(2340), p.PriceCached("m", 1000, 800, 100))
	assert.Equal(t, p.PriceMicros("m", 1000, 100), p.PriceCached("m", 1000, 0, 100))
	assert.Equal(t, int64(4500), p.PriceCached("plain", 1000, 800, 100), "no cached price: all input at the input rate")
	assert.Equal(t, int64(1500+300), p.PriceCached("m", 1000, 5000, 100), "cached never exceeds input")
}
