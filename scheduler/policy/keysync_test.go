package policy

import (
	"log/slog"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

// TestKeysReadRacingOwnWriteIsNoRegression: a poll that read the document
// just before this instance's own write must not roll the write back (a
// revoked key would authenticate again until the next poll).
func TestKeysReadRacingOwnWriteIsNoRegression(t *testing.T) {
	t.Parallel()
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	mem := statestore.NewMemory()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	r := NewRuntimeKeys(mem, keyer, slog.New(slog.DiscardHandler), func() time.Time { return now })
	ctx := t.Context()
	require.NoError(t, r.Sync(ctx))
	sk := StoredKey{ID: "key_1", Tenant: "acme", Hash: config.HashKey("sk-1"), CreatedAt: now}
	require.NoError(t, r.Update(ctx, now, func(st *KeysState) error {
		st.Keys = append(st.Keys, sk)
		return nil
	}))
	require.Len(t, r.Index().ByKey, 1)
	stale, err := mem.Get(ctx, KeysDoc)
	require.NoError(t, err)
	require.NoError(t, r.Update(ctx, now, func(st *KeysState) error {
		st.Keys = nil
		st.Revoked = append(st.Revoked, RevokedKey{ID: sk.ID, Tenant: sk.Tenant, Hash: sk.Hash, RevokedAt: now})
		return nil
	}))
	r.read(ctx, stale) // the watch loop's read from before the revoke
	assert.Empty(t, r.Index().ByKey, "the revoked key stays revoked")
	cur, err := mem.Get(ctx, KeysDoc)
	require.NoError(t, err)
	assert.Equal(t, uint64(2), cur.Rev, "nothing rewritten: the store never went back")
	assert.True(t, r.Index().Doc.Same(cur))
}

// TestMergeKeysRevokeWins: the union of two keys documents keeps every key
// either holds unless a tombstone of either names it (by id or hash), and
// drops a tombstone once its key's expiry has passed.
func TestMergeKeysRevokeWins(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	k1 := StoredKey{ID: "key_1", Tenant: "a", Hash: "h1"}
	k2 := StoredKey{ID: "key_2", Tenant: "a", Hash: "h2"}
	k3 := StoredKey{ID: "key_3", Tenant: "a", Hash: "h3"}
	a := KeysState{Keys: []StoredKey{k1, k2}}
	b := KeysState{Keys: []StoredKey{k2, k3}, Revoked: []RevokedKey{
		{ID: "key_1", Hash: "h1", RevokedAt: now},
		{ID: "key_9", Hash: "h9", RevokedAt: now, ExpiresAt: now},
	}}
	got := MergeKeys(a, b, now)
	assert.Equal(t, []StoredKey{k2, k3}, got.Keys, "k1 revoked in b; k2 once")
	assert.Equal(t, []RevokedKey{{ID: "key_1", Hash: "h1", RevokedAt: now}}, got.Revoked, "the expired key's tombstone is dropped")
	rev := MergeKeys(b, a, now)
	assert.ElementsMatch(t, got.Keys, rev.Keys, "the union does not depend on the side")
	assert.Equal(t, got.Revoked, rev.Revoked)
}
