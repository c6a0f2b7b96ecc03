package redisledger_test

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// afterKeys runs fn once, after the first script reply that asks for the
// record's keys ("KEYS"), and counts those replies.
type afterKeys struct {
	commandHook
	mu   sync.Mutex
	fn   func()
	keys int
}

func (h *afterKeys) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		c, ok := cmd.(*redis.Cmd)
		if !ok {
			return err
		}
		r, _ := c.Val().([]any)
		if len(r) > 0 && r[0] == "KEYS" {
			h.mu.Lock()
			h.keys++
			fn := h.fn
			h.fn = nil
			h.mu.Unlock()
			if fn != nil {
				fn()
			}
		}
		return err
	}
}

// TestCompactTombstone: a SETTLED tombstone keeps no spec, admission windows
// or owner (finalize), only what its replays answer with; a Settle from an
// instance that never saw the record still replays, also when the record
// becomes that tombstone between the KEYS answer and the retry (the spec
// changes once, so the retry meets KEYS again, with an empty spec).
func TestCompactTombstone(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	a := newLedger(t, srv.Addr(), nil)
	sc := tenantScope("tomb", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000},
		ledger.Limit{Dim: ledger.Slots, Max: 4})
	req := reserveReq([]ledger.Scope{sc}, held(9), ledger.NewOwner())
	req.Dispatch = true
	_, err := a.Reserve(ctx, req)
	require.NoError(t, err)
	keys, err := rc.Keys(ctx, "*:q:*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	open, err := recordFields(ctx, rc, keys[0])
	require.NoError(t, err)
	require.NotEmpty(t, open["sp"])
	require.NotEmpty(t, open["wi"])
	require.NotEmpty(t, open["o"])

	// B never saw the record: its Settle sends the record's key alone and
	// is answered KEYS with the spec; before B retries, A settles.
	var first ledger.Settlement
	h := &afterKeys{fn: func() {
		var err error
		first, err = a.Settle(ctx, req.Ref, held(5), ledger.SourceFinal)
		assert.NoError(t, err)
	}}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	c.AddHook(h)
	t.Cleanup(func() { _ = c.Close() })
	b, err := redisledger.New(c, redisledger.Config{LeaseTTL: 10 * time.Second, StoreTimeout: 5 * time.Second,
		TombstoneRetention: time.Hour, MaxBatch: 1})
	require.NoError(t, err)
	s, err := b.Settle(ctx, req.Ref, held(5), ledger.SourceFinal)
	require.NoError(t, err)
	assert.False(t, first.Replayed)
	assert.True(t, s.Replayed)
	assert.Equal(t, 2, h.keys, "KEYS with the spec, then KEYS with none")

	tomb, err := recordFields(ctx, rc, keys[0])
	require.NoError(t, err)
	for _, f := range []string{"sp", "wi", "o"} {
		assert.NotContains(t, tomb, f)
	}
	assert.Equal(t, "3", tomb["st"])
	assert.Equal(t, open["h"], tomb["h"])
	assert.Equal(t, open["dg"], tomb["dg"])
	assert.NotEmpty(t, tomb["a"])
	ttl, err := rc.PTTL(ctx, keys[0]).Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 59*time.Minute)

	// Every later call on it answers from what it kept, charging nothing.
	_, err = a.Settle(ctx, req.Ref, held(6), ledger.SourceFinal)
	require.ErrorIs(t, err, ledger.ErrConflict)
	s, err = a.Settle(ctx, req.Ref, held(5), ledger.SourceFinal)
	require.NoError(t, err)
	assert.True(t, s.Replayed)
	_, err = a.Reserve(ctx, req)
	require.ErrorIs(t, err, ledger.ErrAlreadyFinal)
	require.ErrorIs(t, a.Release(ctx, req.Ref, req.Owner), ledger.ErrDispatched)
	u, err := a.Snapshot(ctx, sc.Key, sc.Key)
	require.NoError(t, err)
	assert.Equal(t, int64(0), u.Reserved[ledger.Tokens])
	assert.Equal(t, int64(5), u.Limits[0].Committed)
}

// TestReleasedTombstoneKeepsSpec: a RELEASED tombstone keeps its spec and
// windows, since a late Settle still charges them; the SETTLED_LATE
// tombstone that Settle leaves is compact.
func TestReleasedTombstoneKeepsSpec(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	l := newLedger(t, srv.Addr(), nil)
	sc := tenantScope("late", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})
	req := reserveReq([]ledger.Scope{sc}, held(9), ledger.NewOwner())
	_, err := l.Reserve(ctx, req)
	require.NoError(t, err)
	require.NoError(t, l.Release(ctx, req.Ref, req.Owner))
	keys, err := rc.Keys(ctx, "*:q:*").Result()
	require.NoError(t, err)
	require.Len(t, keys, 1)
	rel, err := recordFields(ctx, rc, keys[0])
	require.NoError(t, err)
	assert.Equal(t, "4", rel["st"])
	assert.NotEmpty(t, rel["sp"])
	assert.NotEmpty(t, rel["wi"])

	s, err := l.Settle(ctx, req.Ref, held(5), ledger.SourceFinal)
	require.NoError(t, err)
	assert.True(t, s.Late)
	late, err := recordFields(ctx, rc, keys[0])
	require.NoError(t, err)
	assert.Equal(t, "8", late["st"])
	assert.NotContains(t, late, "sp")
	assert.NotContains(t, late, "wi")
	u, err := l.Snapshot(ctx, sc.Key, sc.Key)
	require.NoError(t, err)
	assert.Equal(t, int64(0), u.Reserved[ledger.Tokens])
	assert.Equal(t, int64(5), u.Limits[0].Committed, "the late actual is charged once")
	s, err = l.Settle(ctx, req.Ref, held(5), ledger.SourceFinal)
	require.NoError(t, err)
	assert.True(t, s.Replayed)
}
