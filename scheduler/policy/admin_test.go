package policy

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
)

func TestEffectiveConfig(t *testing.T) {
	t.Parallel()
	now := time.Unix(1000, 0)
	file := &config.File{Tenants: []config.Tenant{{Name: "a", Weight: 4, Concurrency: 8, MaxOutputTokens: 1024,
		Budgets: []config.Budget{{Dimension: "tokens", Limit: 10, Window: time.Hour}, {Dimension: "requests", Limit: 5, Window: time.Hour}}}}}
	st := &AdminState{
		Budgets: map[string]BudgetOverride{
			"a:tokens:1h0m0s":   {Tenant: "a", Budget: config.Budget{Dimension: "tokens", Limit: 99, Window: time.Hour}},
			"a:requests:1h0m0s": {Tenant: "a", Removed: true},
			"a:gpu_ms:24h0m0s":  {Tenant: "a", Budget: config.Budget{Dimension: "gpu_ms", Limit: 7, Window: 24 * time.Hour}},
		},
		Clamps: map[string]Clamp{"a": {Concurrency: 2, Weight: 1, MaxOutputTokens: 16, ExpiresAt: now.Add(time.Minute)}},
	}
	eff := EffectiveConfig(file, st, now)
	ta := eff.Tenants[0]
	require.Len(t, ta.Budgets, 2)
	assert.Equal(t, int64(99), ta.Budgets[0].Limit)
	assert.Equal(t, "gpu_ms", ta.Budgets[1].Dimension)
	assert.Equal(t, 2, ta.Concurrency)
	assert.Equal(t, 1, ta.Weight)
	assert.Equal(t, int64(16), ta.MaxOutputTokens)
	assert.Len(t, file.Tenants[0].Budgets, 2, "the file config is not modified")
	assert.Equal(t, 8, file.Tenants[0].Concurrency)

	expired := EffectiveConfig(file, st, now.Add(time.Hour))
	assert.Equal(t, 8, expired.Tenants[0].Concurrency, "an expired clamp no longer applies")
}
