package policy

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
	pol, err := Build(cfg, 1, keyer, NewRuntimes(nil))
	require.NoError(t, err)
	now := time.Unix(1_000_000, 0)
	exp := now.Add(time.Minute)
	rt, err := BuildKey("a", config.APIKey{Hash: config.HashKey("sk-rt"), ExpiresAt: exp}, keyer, nil)
	require.NoError(t, err)
	orphan, err := BuildKey("gone", config.APIKey{Hash: config.HashKey("sk-orphan")}, keyer, nil)
	require.NoError(t, err)
	idx := &KeyIndex{ByKey: map[[32]byte]*Key{rt.Hash: rt, orphan.Hash: orphan}}

	tn, k, err := pol.Authenticate([]byte("Bearer sk-ci"), now, idx)
	require.NoError(t, err)
	assert.Equal(t, "a", tn.Name)
	assert.Equal(t, "ci", k.Label)
	assert.Equal(t, ledger.KindAPIKey, k.Scope.Kind)
	assert.Equal(t, keyer.Key(ledger.KindAPIKey, config.HashKey("sk-ci")), k.Scope.Key, "the scope key derives from the hash, never the key")
	assert.Equal(t, []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 100, Mode: ledger.Block}, {Dim: ledger.Slots, Max: 2}}, k.Scope.Limits)

	_, k, err = pol.Authenticate([]byte("Bearer sk-plain"), now, idx)
	require.NoError(t, err)
	assert.Empty(t, k.Scope.Limits, "a key without limits adds no scope")
	assert.Equal(t, "_unnamed", k.MetricLabel())
	assert.Equal(t, config.ShortHash(config.HashKey("sk-plain")), k.Label)

	tn, k, err = pol.Authenticate([]byte("Bearer sk-rt"), now, idx)
	require.NoError(t, err)
	assert.Equal(t, "a", tn.Name)
	assert.Same(t, rt, k)
	_, _, err = pol.Authenticate([]byte("Bearer sk-rt"), exp, idx)
	require.ErrorIs(t, err, ErrUnauthorized, "a key is unknown from its expiry on")
	_, _, err = pol.Authenticate([]byte("Bearer sk-rt"), now, nil)
	require.ErrorIs(t, err, ErrUnauthorized, "run-time keys only through the index")
	_, _, err = pol.Authenticate([]byte("Bearer sk-orphan"), now, idx)
	require.ErrorIs(t, err, ErrUnauthorized, "a key of an unconfigured tenant")
}

// TestKeyRuntimeSurvivesRebuild: a key's in-flight counter, and its
// tenant's runtime with the server's Local state, are the same objects
// across rebuilds, so a concurrency cap holds over reloads.
func TestKeyRuntimeSurvivesRebuild(t *testing.T) {
	t.Parallel()
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	cfg := &config.File{Tenants: []config.Tenant{{Name: "a", Concurrency: 1, APIKeys: []config.APIKey{{Hash: config.HashKey("sk"), Concurrency: 1}}}}}
	made := 0
	runtimes := NewRuntimes(func() any { made++; return &made })
	p1, err := Build(cfg, 1, keyer, runtimes)
	require.NoError(t, err)
	p2, err := Build(cfg, 2, keyer, runtimes)
	require.NoError(t, err)
	k1, k2 := p1.Tenants["a"].Keys[0], p2.Tenants["a"].Keys[0]
	assert.NotSame(t, k1, k2, "each snapshot has its own key")
	k1.RT.Inflight.Add(1)
	assert.Equal(t, int64(1), k2.RT.Inflight.Load(), "the rebuilt snapshot sees the key's request in flight")
	assert.Same(t, p1.Tenants["a"].RT, p2.Tenants["a"].RT)
	assert.Equal(t, 1, made, "the tenant's Local is made once")
	assert.NotNil(t, p2.Tenants["a"].RT.Local)
}

func TestAuthenticate(t *testing.T) {
	t.Parallel()
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	cfg := &config.File{Tenants: []config.Tenant{{Name: "a", APIKeys: config.Keys(config.HashKey("sk-a")), Concurrency: 1}}}
	pol, err := Build(cfg, 1, keyer, NewRuntimes(nil))
	require.NoError(t, err)
	tn, _, err := pol.Authenticate([]byte("Bearer sk-a"), time.Now(), nil)
	require.NoError(t, err)
	assert.Equal(t, "a", tn.Name)
	for _, h := range []string{"", "Bearer ", "Basic sk-a", "Bearer sk-b", "sk-a"} {
		_, _, err := pol.Authenticate([]byte(h), time.Now(), nil)
		assert.ErrorIs(t, err, ErrUnauthorized, "%q", h)
	}
}
