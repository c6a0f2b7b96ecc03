package scheduler

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// TestAuthenticateKeys covers the key paths: a config key with a name and
// budgets, a run-time key (resolved to its tenant by name), its expiry, and
// a run-time key whose tenant is gone.
func TestAuthenticateKeys(t *testing.T) {
	t.Parallel()
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	cfg := &config.File{Tenants: []config.Tenant{{Name: "a", Concurrency: 1, APIKeys: []config.APIKey{
		{Hash: config.HashKey("sk-ci"), Name: "ci", Concurrency: 2,
			Budgets: []config.Budget{{Dimension: "tokens", Limit: 100, Window: time.Hour, Mode: "block"}}},
		{Hash: config.HashKey("sk-plain")},
	}}}}
	pol, err := buildPolicy(cfg, 1, keyer, map[string]*tenantRuntime{})
	require.NoError(t, err)
	now := time.Unix(1_000_000, 0)
	exp := now.Add(time.Minute)
	rt, err := buildKey("a", config.APIKey{Hash: config.HashKey("sk-rt"), ExpiresAt: exp}, keyer, nil)
	require.NoError(t, err)
	orphan, err := buildKey("gone", config.APIKey{Hash: config.HashKey("sk-orphan")}, keyer, nil)
	require.NoError(t, err)
	idx := &keyIndex{byKey: map[[32]byte]*apiKey{rt.hash: rt, orphan.hash: orphan}}

	tn, k, err := pol.authenticate([]byte("Bearer sk-ci"), now, idx)
	require.NoError(t, err)
	assert.Equal(t, "a", tn.name)
	assert.Equal(t, "ci", k.label)
	assert.Equal(t, ledger.KindAPIKey, k.scope.Kind)
	assert.Equal(t, keyer.Key(ledger.KindAPIKey, config.HashKey("sk-ci")), k.scope.Key, "the scope key derives from the hash, never the key")
	assert.Equal(t, []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 100, Mode: ledger.Block}, {Dim: ledger.Slots, Max: 2}}, k.scope.Limits)

	_, k, err = pol.authenticate([]byte("Bearer sk-plain"), now, idx)
	require.NoError(t, err)
	assert.Empty(t, k.scope.Limits, "a key without limits adds no scope")
	assert.Equal(t, "_unnamed", k.metricLabel())
	assert.Equal(t, config.ShortHash(config.HashKey("sk-plain")), k.label)

	tn, k, err = pol.authenticate([]byte("Bearer sk-rt"), now, idx)
	require.NoError(t, err)
	assert.Equal(t, "a", tn.name)
	assert.Same(t, rt, k)
	_, _, err = pol.authenticate([]byte("Bearer sk-rt"), exp, idx)
	require.ErrorIs(t, err, ErrUnauthorized, "a key is unknown from its expiry on")
	_, _, err = pol.authenticate([]byte("Bearer sk-rt"), now, nil)
	require.ErrorIs(t, err, ErrUnauthorized, "run-time keys only through the index")
	_, _, err = pol.authenticate([]byte("Bearer sk-orphan"), now, idx)
	require.ErrorIs(t, err, ErrUnauthorized, "a key of an unconfigured tenant")
}

// TestKeyRuntimeSurvivesRebuild: a key's in-flight counter is the same
// object across policy rebuilds, so its concurrency cap holds over reloads.
func TestKeyRuntimeSurvivesRebuild(t *testing.T) {
	t.Parallel()
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	cfg := &config.File{Tenants: []config.Tenant{{Name: "a", Concurrency: 1, APIKeys: []config.APIKey{{Hash: config.HashKey("sk"), Concurrency: 1}}}}}
	runtimes := map[string]*tenantRuntime{}
	p1, err := buildPolicy(cfg, 1, keyer, runtimes)
	require.NoError(t, err)
	p2, err := buildPolicy(cfg, 2, keyer, runtimes)
	require.NoError(t, err)
	c := &call{key: p1.tenants["a"].keys[0]}
	c.keyInflight(1)
	assert.True(t, (&call{key: p2.tenants["a"].keys[0]}).keyAtCap(), "the rebuilt policy sees the key's request in flight")
	c.keyInflight(-1)
	assert.False(t, (&call{key: p2.tenants["a"].keys[0]}).keyAtCap())
}
