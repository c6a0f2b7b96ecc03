package ledgertest

import (
	"errors"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// testGrow: Grow raises an open hold atomically against every scope, as a
// Reserve of the difference would be admitted; a retry is answered as
// applied, a stale from is ErrConflict; Settle frees the grown hold; a
// denial changes nothing; concurrent growth never takes a scope past its
// limit; a restart keeps grown holds.
func testGrow(t *testing.T, f Factory) {
	cfg := DefaultConfig()
	cfg.Durable = true
	b := f(t, cfg)
	ctx := t.Context()
	const w = time.Hour
	alignToWindow(b, w, time.Second)

	t.Run("grow, retry, conflict, settle", func(t *testing.T) {
		tenant, key := newKey(1), newKey(2)
		req := simpleReq(tenant, tokens(10, 20), true, lim(ledger.Tokens, w, 100))
		req.Scopes = append(req.Scopes, ledger.Scope{Kind: ledger.KindAPIKey, Key: key, Limits: []ledger.Limit{lim(ledger.OutputTokens, w, 50)}})
		_, err := b.Ledger.Reserve(ctx, req)
		require.NoError(t, err)
		to := tokens(10, 45)
		require.NoError(t, b.Ledger.Grow(ctx, req.Ref, req.Owner, req.Held, to))
		assert.Equal(t, int64(55), usage(t, b, tenant, tenant).Reserved[ledger.Tokens], "tenant r grew by 25")
		assert.Equal(t, int64(45), usage(t, b, tenant, key).Reserved[ledger.OutputTokens], "api_key r grew by 25")
		require.NoError(t, b.Ledger.Grow(ctx, req.Ref, req.Owner, req.Held, to), "a retry is answered as applied")
		assert.Equal(t, int64(55), usage(t, b, tenant, tenant).Reserved[ledger.Tokens], "and not applied twice")
		err = b.Ledger.Grow(ctx, req.Ref, req.Owner, tokens(10, 30), tokens(10, 40))
		assert.ErrorIs(t, err, ledger.ErrConflict, describe(err))
		err = b.Ledger.Grow(ctx, req.Ref, ledger.Owner{9}, to, tokens(10, 46))
		assert.ErrorIs(t, err, ledger.ErrLeaseLost, describe(err))
		err = b.Ledger.Grow(ctx, req.Ref, req.Owner, to, tokens(10, 44))
		assert.ErrorIs(t, err, ledger.ErrInvalid, "a hold never shrinks: %s", describe(err))

		// The api_key's output limit (50) refuses 45 → 51; nothing changes.
		before := usage(t, b, tenant, tenant)
		err = b.Ledger.Grow(ctx, req.Ref, req.Owner, to, tokens(10, 51))
		d, ok := isDenied(err)
		require.True(t, ok, describe(err))
		assert.Equal(t, ledger.KindAPIKey, d.Scope)
		assert.Equal(t, ledger.OutputTokens, d.Dim)
		assert.Equal(t, int64(6), d.Requested)
		assert.Equal(t, int64(45), d.Reserved)
		assert.Equal(t, before.Reserved, usage(t, b, tenant, tenant).Reserved, "a denied Grow changes nothing")

		st, err := b.Ledger.Settle(ctx, req.Ref, tokens(10, 40), ledger.SourceFinal)
		require.NoError(t, err)
		assert.Equal(t, ledger.Amounts{}, st.Overrun, "within the grown hold")
		u := usage(t, b, tenant, tenant)
		assert.Equal(t, int64(0), u.Reserved[ledger.Tokens], "settle frees the grown hold")
		assert.Equal(t, int64(50), committed(u, ledger.Tokens, w))
		assert.Equal(t, int64(0), usage(t, b, tenant, key).Reserved[ledger.OutputTokens])
		err = b.Ledger.Grow(ctx, req.Ref, req.Owner, to, tokens(10, 60))
		assert.ErrorIs(t, err, ledger.ErrAlreadyFinal, describe(err))
		auditClean(t, b, tenant)
	})

	t.Run("global scope", func(t *testing.T) {
		tenant, g := newKey(1), newKey(4)
		req := globalReq(tenant, g, tokens(1, 9), true, lim(ledger.Tokens, w, 30))
		_, err := b.Ledger.Reserve(ctx, req)
		require.NoError(t, err)
		require.NoError(t, b.Ledger.Grow(ctx, req.Ref, req.Owner, req.Held, tokens(1, 29)))
		assert.Equal(t, int64(30), usage(t, b, g, g).Reserved[ledger.Tokens])
		err = b.Ledger.Grow(ctx, req.Ref, req.Owner, tokens(1, 29), tokens(1, 30))
		d, ok := isDenied(err)
		require.True(t, ok, describe(err))
		assert.Equal(t, ledger.KindGlobal, d.Scope)
		_, err = b.Ledger.Settle(ctx, req.Ref, tokens(1, 12), ledger.SourceFinal)
		require.NoError(t, err)
		gu := usage(t, b, g, g)
		assert.Equal(t, int64(0), gu.Reserved[ledger.Tokens])
		assert.Equal(t, int64(13), committed(gu, ledger.Tokens, w))
		auditClean(t, b, tenant)
	})

	t.Run("concurrent growth never passes the limit", func(t *testing.T) {
		tenant := newKey(1)
		const limit, n, step = 1000, 16, 10
		reqs := make([]ledger.ReserveRequest, n)
		for i := range reqs {
			reqs[i] = simpleReq(tenant, tokens(5, 5), true, lim(ledger.Tokens, w, limit))
			_, err := b.Ledger.Reserve(ctx, reqs[i])
			require.NoError(t, err)
		}
		fes := frontEnds(b)
		var wg sync.WaitGroup
		grown := make([]int64, n)
		for i := range reqs {
			wg.Go(func() {
				held := reqs[i].Held
				for {
					to := tokens(5, held[ledger.OutputTokens]+step)
					err := fes[i%len(fes)].Grow(ctx, reqs[i].Ref, reqs[i].Owner, held, to)
					if err != nil {
						var de *ledger.DeniedError
						if !errors.As(err, &de) {
							t.Errorf("grow: %s", describe(err))
						}
						break
					}
					held = to
				}
				grown[i] = held[ledger.Tokens]
			})
		}
		wg.Wait()
		var sum int64
		for _, g := range grown {
			sum += g
		}
		u := usage(t, b, tenant, tenant)
		assert.Equal(t, sum, u.Reserved[ledger.Tokens], "r is the sum of the grown holds")
		assert.LessOrEqual(t, sum, int64(limit))
		assert.Greater(t, sum, int64(limit-step), "growth stops only when a step no longer fits")
		for _, r := range reqs {
			_, err := b.Ledger.Settle(ctx, r.Ref, tokens(5, 5), ledger.SourceFinal)
			require.NoError(t, err)
		}
		assert.Equal(t, int64(0), usage(t, b, tenant, tenant).Reserved[ledger.Tokens])
		auditClean(t, b, tenant)
	})

	t.Run("a grown hold survives a restart", func(t *testing.T) {
		if b.Restart == nil {
			t.Skip("no restart hook")
		}
		tenant := newKey(1)
		req := simpleReq(tenant, tokens(2, 3), true, lim(ledger.Tokens, w, 100))
		_, err := b.Ledger.Reserve(ctx, req)
		require.NoError(t, err)
		require.NoError(t, b.Ledger.Grow(ctx, req.Ref, req.Owner, req.Held, tokens(2, 30)))
		l, err := b.Restart()
		require.NoError(t, err)
		b.Ledger = l
		u := usage(t, b, tenant, tenant)
		assert.Equal(t, int64(32), u.Reserved[ledger.Tokens], "the restart keeps the grown hold (UNRESOLVED)")
		st, err := l.Settle(ctx, req.Ref, tokens(2, 20), ledger.SourceFinal)
		require.NoError(t, err)
		assert.True(t, st.Late)
		assert.Equal(t, int64(0), usage(t, b, tenant, tenant).Reserved[ledger.Tokens])
		auditClean(t, b, tenant)
	})
}
