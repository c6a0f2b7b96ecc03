package policy

import (
	"regexp"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
)

// TestNewStoredKey: a key request is checked field by field (each refusal
// an InputError naming its field), and a good one makes a random key, a
// public id that reveals nothing of it, and a stored hash, never the key.
func TestNewStoredKey(t *testing.T) {
	t.Parallel()
	file := &config.File{Tenants: []config.Tenant{{Name: "acme", APIKeys: []config.APIKey{{Hash: config.HashKey("sk-a"), Name: "ci"}}}}}
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	past := now.Add(-time.Second)
	for param, in := range map[string]KeyRequest{
		"expires_in":        {Tenant: "acme", ExpiresIn: "1h", ExpiresAt: &past},
		"expires_in ":       {Tenant: "acme", ExpiresIn: "-1h"},
		"expires_at":        {Tenant: "acme", ExpiresAt: &past},
		"tenant":            {Tenant: "nope"},
		"budgets[0].window": {Tenant: "acme", Budgets: []KeyBudget{{Dimension: "tokens", Limit: 1, Window: "soon"}}},
		"key":               {Tenant: "acme", Budgets: []KeyBudget{{Dimension: "bogus", Limit: 1, Window: "1h"}}},
		"name":              {Tenant: "acme", Name: "ci"},
	} {
		_, _, err := NewStoredKey(file, in, now)
		var ie *InputError
		require.ErrorAs(t, err, &ie, param)
		assert.Equal(t, param[:len(ie.Param)], ie.Param, param)
		assert.ErrorIs(t, err, ErrAdminInput)
	}

	sk, raw, err := NewStoredKey(file, KeyRequest{Tenant: "acme", Name: "batch", ExpiresIn: "24h", Concurrency: 2}, now)
	require.NoError(t, err)
	assert.Regexp(t, regexp.MustCompile(`^sk-sluice-[A-Za-z0-9_-]{43}$`), raw)
	assert.Regexp(t, regexp.MustCompile(`^key_[0-9a-f]{12}$`), sk.ID)
	assert.Equal(t, config.HashKey(raw), sk.Hash)
	assert.Equal(t, now.Add(24*time.Hour), sk.ExpiresAt)
	assert.Equal(t, "key "+sk.ID+" name batch expires 2026-12-06T12:00:00Z hash "+config.ShortHash(sk.Hash), sk.AuditReason())
	assert.NotContains(t, sk.AuditReason(), raw)
	_, raw2, err := NewStoredKey(file, KeyRequest{Tenant: "acme"}, now)
	require.NoError(t, err)
	assert.NotEqual(t, raw, raw2)

	row := sk.Row(true, now.Add(24*time.Hour))
	assert.True(t, row.Expired, "expired at its expiry")
	assert.Equal(t, "admin", row.Source)
	assert.Equal(t, config.ShortHash(sk.Hash), row.Hash)
	assert.False(t, sk.Row(false, now).Expired)
	assert.True(t, sk.Row(false, now).Orphaned)
	assert.Equal(t, "config", ConfigKeyRow("acme", file.Tenants[0].APIKeys[0]).Source)
}

// TestAddAndRevokeKey: a stored name clash is refused; a revoked key leaves
// the document with a tombstone that keeps its expiry.
func TestAddAndRevokeKey(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	sk := StoredKey{ID: "key_1", Tenant: "acme", Name: "batch", Hash: config.HashKey("sk-1"), ExpiresAt: now.Add(time.Hour)}
	var st KeysState
	require.NoError(t, AddKey(sk)(&st))
	err := AddKey(StoredKey{ID: "key_2", Tenant: "acme", Name: "batch"})(&st)
	var ie *InputError
	require.ErrorAs(t, err, &ie)
	assert.Equal(t, "name", ie.Param)
	require.NoError(t, AddKey(StoredKey{ID: "key_3", Tenant: "other", Name: "batch"})(&st), "names are per tenant")

	_, ok := RevokeKey(&st, "key_9", now)
	assert.False(t, ok)
	gone, ok := RevokeKey(&st, "key_1", now)
	require.True(t, ok)
	assert.Equal(t, sk, gone)
	require.Len(t, st.Keys, 1)
	assert.Equal(t, []RevokedKey{{ID: "key_1", Tenant: "acme", Hash: sk.Hash, RevokedAt: now, ExpiresAt: sk.ExpiresAt}}, st.Revoked)
}
