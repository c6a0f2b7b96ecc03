package ledger_test

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// A Reserve that names its client request's digest replays on that digest
// alone: the holds and scopes of a later attempt may differ (a limit,
// price or estimate changed), and another request under the same id is a
// conflict even with equal holds. The digest survives a journal replay
// (where the dispatched record becomes UNRESOLVED).
func TestReserveRequestDigestDecidesReplay(t *testing.T) {
	journal := t.TempDir() + "/j"
	open := func() *ledger.Memory {
		m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: func() time.Time { return jT0 }, Journal: journal, Fsync: ledger.EveryOp, Logger: quiet})
		require.NoError(t, err)
		return m
	}
	ctx := context.Background()
	m := open()
	first := jReq(2) // dispatched: UNRESOLVED after a restart, still open
	require.True(t, first.Dispatch)
	first.RequestDigest = 0xabc
	first.Attempt = 1
	_, err := m.Reserve(ctx, first)
	require.NoError(t, err)

	check := func(m *ledger.Memory) {
		t.Helper()
		retry := first
		retry.Attempt = 2
		retry.Held[ledger.GPUMs] = 999 // another estimate
		retry.Held[ledger.OutputTokens] += 7
		retry.Held[ledger.Tokens] += 7
		retry.Scopes = append([]ledger.Scope{}, first.Scopes...)
		retry.Scopes = append(retry.Scopes, ledger.Scope{Kind: ledger.KindGlobal, Key: ledger.ScopeKey{0x99}, Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: jLimits[0].Window, Max: 1 << 40}}})
		g, err := m.Reserve(ctx, retry)
		require.NoError(t, err, "same request digest, other holds and scopes: a replay")
		assert.True(t, g.Replayed)

		other := first
		other.Attempt = 3
		other.RequestDigest = 0xdef // another body, the same holds
		_, err = m.Reserve(ctx, other)
		require.ErrorIs(t, err, ledger.ErrConflict)
	}
	check(m)
	require.NoError(t, m.Close())
	m = open() // replays the journal
	defer func() { _ = m.Close() }()
	check(m)
}

func TestRequestDigestSetsDigestApart(t *testing.T) {
	a := jReq(1)
	b := jReq(1)
	b.Held[ledger.Tokens]++
	require.NotEqual(t, a.Digest(), b.Digest(), "without a request digest the holds decide")
	a.RequestDigest, b.RequestDigest = 5, 5
	assert.Equal(t, a.Digest(), b.Digest(), "with one, only it decides")
	b.RequestDigest = 6
	assert.NotEqual(t, a.Digest(), b.Digest())
}
