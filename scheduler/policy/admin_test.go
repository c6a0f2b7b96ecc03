package policy

import (
	"os"
	"path/filepath"
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

// TestAdminStateFileFormat pins admin.state_file's format: what EncodeFile
// writes, LoadAdminState reads back, and a file without one of the maps
// loads as an empty one.
func TestAdminStateFileFormat(t *testing.T) {
	t.Parallel()
	exp := time.Date(2026, 12, 5, 13, 0, 0, 0, time.UTC)
	st := AdminState{
		Budgets: map[string]BudgetOverride{"a:tokens:1h0m0s": {Tenant: "a", Budget: config.Budget{Dimension: "tokens", Limit: 99, Window: time.Hour, Mode: "block"}}},
		Clamps:  map[string]Clamp{"a": {Tenant: "a", Concurrency: 2, Reason: "probe", ExpiresAt: exp, Source: "admin"}},
	}
	b, err := st.EncodeFile()
	require.NoError(t, err)
	assert.Contains(t, string(b), `"clamps": {
    "a": {
      "tenant": "a",
      "concurrency": 2,
      "reason": "probe",
      "expires_at": "2026-12-05T13:00:00Z",
      "source": "admin"
    }
  }`)
	path := filepath.Join(t.TempDir(), "admin.json")
	require.NoError(t, os.WriteFile(path, b, 0o600))
	got, err := LoadAdminState(path)
	require.NoError(t, err)
	assert.Equal(t, st, got)

	require.NoError(t, os.WriteFile(path, []byte(`{"budgets": null}`), 0o600))
	got, err = LoadAdminState(path)
	require.NoError(t, err)
	assert.NotNil(t, got.Budgets)
	assert.NotNil(t, got.Clamps)
	got, err = LoadAdminState(filepath.Join(t.TempDir(), "absent.json"))
	require.NoError(t, err)
	assert.Empty(t, got.Clamps, "a missing file is an empty state")
}

// TestNormalizeBudgetID: any spelling of a window names the budget as
// BudgetID writes it; an id without three parts or with a bad window is
// an input error naming "id".
func TestNormalizeBudgetID(t *testing.T) {
	t.Parallel()
	for in, want := range map[string]string{"acme:tokens:24h": "acme:tokens:24h0m0s", "acme:tokens:1440m": "acme:tokens:24h0m0s", "_global:usd_micros:1h0m0s": "_global:usd_micros:1h0m0s"} {
		got, err := NormalizeBudgetID(in)
		require.NoError(t, err)
		assert.Equal(t, want, got, in)
	}
	for _, in := range []string{"acme:24h", "acme:tokens:soon", "acme:tokens:-1h"} {
		_, err := NormalizeBudgetID(in)
		var ie *InputError
		require.ErrorAs(t, err, &ie, in)
		assert.Equal(t, "id", ie.Param)
		assert.ErrorIs(t, err, ErrAdminInput)
	}
}
