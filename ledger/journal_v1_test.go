package ledger_test

import (
	"os"
	"path/filepath"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// TestJournalFormat1Replays: testdata/journal-v1.bin was written by the
// ledger before the journal carried a dimension count and attempt nonces
// (7 dimensions, commit 6099134): one restart's snapshot followed by plain
// entries (reserve, settle, release, charge). It still replays to the same
// state, and once compacted into the current format, replays again.
func TestJournalFormat1Replays(t *testing.T) {
	data, err := os.ReadFile("testdata/journal-v1.bin")
	require.NoError(t, err)
	path := filepath.Join(t.TempDir(), "journal")
	require.NoError(t, os.WriteFile(path, data, 0o600))
	tenant, key := ledger.ScopeKey{0x51, 1}, ledger.ScopeKey{0x52, 2}
	id := func(i byte) ledger.Ref { return ledger.Ref{Tenant: tenant, ID: ledger.RequestID{0x60, i}} }
	clock := func() time.Time { return jT0.Add(time.Minute) }
	held := ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 100, ledger.OutputTokens: 50, ledger.Tokens: 150,
		ledger.GPUMs: 2000, ledger.USDMicros: 300}
	for round := range 2 {
		m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: clock, Journal: path, Logger: quiet})
		require.NoError(t, err, "round %d", round)
		ctx := t.Context()
		u, err := m.Snapshot(ctx, tenant, tenant)
		require.NoError(t, err)
		assert.Equal(t, held, u.Reserved, "the dispatched record is UNRESOLVED and keeps its hold")
		assert.Zero(t, u.SlotsInUse)
		assert.Equal(t, 1, u.Unresolved)
		assert.Equal(t, uint64(3), u.PolicyVersion)
		want := map[ledger.Dim]int64{ledger.Tokens: 295, ledger.GPUMs: 4100, ledger.USDMicros: 580}
		require.Len(t, u.Limits, 4)
		for _, l := range u.Limits {
			if l.Limit.Dim != ledger.Slots {
				assert.Equal(t, want[l.Limit.Dim], l.Committed, "committed %s", l.Limit.Dim)
			}
		}
		k, err := m.Snapshot(ctx, tenant, key)
		require.NoError(t, err)
		require.Len(t, k.Limits, 1)
		assert.Equal(t, int64(2), k.Limits[0].Committed, "api_key requests this minute")
		for i, st := range map[byte]ledger.State{1: ledger.Settled, 2: ledger.Expired, 3: ledger.Settled, 5: ledger.Released} {
			_, err := m.Reserve(ctx, ledger.ReserveRequest{Ref: id(i), Owner: ledger.Owner{0x0c}, Held: held,
				Scopes: []ledger.Scope{{Kind: ledger.KindTenant, Key: tenant, Limits: []ledger.Limit{u.Limits[0].Limit}}}})
			var fe *ledger.FinalError
			require.ErrorAs(t, err, &fe, "record %d: %v", i, err)
			assert.Equal(t, st, fe.State, "record %d", i)
		}
		require.NoError(t, m.Close())
	}
}
