package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
)

// TestBudgetRmRestoresConfig: removing an admin override of a config
// budget puts the config's limit back in force, never leaves the tenant
// without a budget on that dimension; the id's window may be spelled any
// way; a budget only the config sets is not removable.
func TestBudgetRmRestoresConfig(t *testing.T) {
	t.Parallel()
	cfg := lifecycletest.Config(t, "", "    budgets: [{dimension: tokens, limit: 200000, window: 24h}]\n")
	s := newTestServer(t, cfg, lifecycletest.NewLedger(t), &lifecycletest.Upstream{Out: 1})
	limitOf := func() (int64, string, int) {
		rows := s.Budgets("acme")
		if len(rows) != 1 {
			return 0, "", len(rows)
		}
		return rows[0].Limit, rows[0].Source, 1
	}

	_, err := s.SetBudget("acme", config.Budget{Dimension: "tokens", Limit: 500000, Window: 24 * time.Hour})
	require.NoError(t, err)
	limit, src, n := limitOf()
	require.Equal(t, 1, n)
	assert.Equal(t, int64(500000), limit)
	assert.Equal(t, "admin", src)
	assert.Equal(t, int64(500000), s.pol.Load().Tenants["acme"].Cfg.Budgets[0].Limit)

	out, err := s.RemoveBudget("acme:tokens:24h")
	require.NoError(t, err)
	assert.Equal(t, "acme:tokens:24h0m0s", out.Deleted)
	require.NotNil(t, out.Restored)
	assert.Equal(t, int64(200000), out.Restored.Limit)
	limit, src, n = limitOf()
	require.Equal(t, 1, n, "the tenant keeps a tokens budget")
	assert.Equal(t, int64(200000), limit, "the config's limit applies again")
	assert.Equal(t, "config", src)
	pb := s.pol.Load().Tenants["acme"].Cfg.Budgets
	require.Len(t, pb, 1, "the policy enforces it")
	assert.Equal(t, int64(200000), pb[0].Limit)

	_, err = s.RemoveBudget("acme:tokens:1440m")
	assert.ErrorIs(t, err, ErrConfigBudget, "a config budget is not removed through the admin API")
	_, _, n = limitOf()
	assert.Equal(t, 1, n)

	// An override with no config budget under it goes away entirely.
	_, err = s.SetBudget("acme", config.Budget{Dimension: "requests", Limit: 5, Window: time.Hour})
	require.NoError(t, err)
	out, err = s.RemoveBudget("acme:requests:60m")
	require.NoError(t, err)
	assert.Nil(t, out.Restored)
	_, _, n = limitOf()
	assert.Equal(t, 1, n)

	_, err = s.RemoveBudget("acme:requests:1h")
	assert.ErrorIs(t, err, apierr.ErrNotFound)
	_, err = s.RemoveBudget("acme:requests:soon")
	assert.ErrorIs(t, err, ErrAdminInput)
}
