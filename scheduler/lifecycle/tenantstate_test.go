package lifecycle

import (
	"testing"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestKeyCapHoldsOverReload: a key's request in flight under one policy
// snapshot counts against its concurrency in the snapshot a reload builds.
func TestKeyCapHoldsOverReload(t *testing.T) {
	t.Parallel()
	cfg := lifecycletest.Config(t, "", "")
	cfg.Tenants[0].APIKeys = append(cfg.Tenants[0].APIKeys, config.APIKey{Hash: config.HashKey("sk-capped"), Concurrency: 1})
	s := newTestEngine(t, cfg, lifecycletest.NewLedger(t), &lifecycletest.Upstream{Out: 1})
	_, k1, err := s.authenticate(s.pol.Load(), []byte("Bearer sk-capped"))
	require.NoError(t, err)
	c := &call{key: k1}
	c.keyInflight(1)
	reloadPolicy(t, s, cfg)
	_, k2, err := s.authenticate(s.pol.Load(), []byte("Bearer sk-capped"))
	require.NoError(t, err)
	require.NotSame(t, k1, k2, "the reload built a new snapshot")
	assert.True(t, (&call{key: k2}).keyAtCap(), "the rebuilt policy sees the key's request in flight")
	c.keyInflight(-1)
	assert.False(t, (&call{key: k2}).keyAtCap())
}
