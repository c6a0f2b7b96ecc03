package redisledger_test

import (
	"context"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// crc16 is CRC16-CCITT (XMODEM), the Redis Cluster key hash.
func crc16(b string) uint16 {
	var crc uint16
	for i := 0; i < len(b); i++ {
		crc ^= uint16(b[i]) << 8
		for range 8 {
			if crc&0x8000 != 0 {
				crc = crc<<1 ^ 0x1021
			} else {
				crc <<= 1
			}
		}
	}
	return crc
}

// keySlot is the Redis Cluster slot of key, honouring {hash tags}.
func keySlot(key string) uint16 {
	if s := strings.IndexByte(key, '{'); s >= 0 {
		if e := strings.IndexByte(key[s+1:], '}'); e > 0 {
			key = key[s+1 : s+1+e]
		}
	}
	return crc16(key) % 16384
}

func TestKeySlotKnownValues(t *testing.T) {
	// Values from the Redis Cluster specification and CLUSTER KEYSLOT.
	assert.Equal(t, uint16(0x31C3), crc16("123456789"))
	assert.Equal(t, keySlot("{user1000}.following"), keySlot("{user1000}.followers"))
	assert.Equal(t, uint16(12182), keySlot("foo"))
}

// commandHook is the part of a go-redis hook that tests leave alone: it
// passes dials and pipelines through; a test's hook embeds it and adds
// ProcessHook.
type commandHook struct{}

func (commandHook) DialHook(next redis.DialHook) redis.DialHook { return next }
func (commandHook) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// scriptCalls records the KEYS of every script call a client makes.
type scriptCalls struct {
	commandHook
	mu   sync.Mutex
	keys [][]string
	cmds []string
}

func (s *scriptCalls) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		name := strings.ToLower(cmd.Name())
		if strings.HasPrefix(name, "eval") || strings.HasPrefix(name, "fcall") {
			args := cmd.Args()
			n, _ := args[2].(int)
			keys := make([]string, 0, n)
			for _, k := range args[3 : 3+n] {
				// The batcher passes keys as *string (not boxed per call).
				if p, ok := k.(*string); ok {
					k = *p
				}
				keys = append(keys, k.(string))
			}
			s.mu.Lock()
			s.keys = append(s.keys, keys)
			s.cmds = append(s.cmds, name)
			s.mu.Unlock()
		}
		return next(ctx, cmd)
	}
}

// TestT18SlotsAndScriptCache: all KEYS of every call share one Cluster slot,
// and after SCRIPT FLUSH and FUNCTION FLUSH between calls every call still
// succeeds (EVAL fallback, or the function library loaded again) and
// nothing is applied twice.
func TestT18SlotsAndScriptCache(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	rec := &scriptCalls{}
	c := redis.NewClient(&redis.Options{Addr: srv.Addr(), ContextTimeoutEnabled: true})
	c.AddHook(rec)
	t.Cleanup(func() { _ = c.Close() })
	l, err := redisledger.New(c, redisledger.Config{LeaseTTL: 10 * time.Second, StoreTimeout: 5 * time.Second})
	require.NoError(t, err)

	tenant := testKeyer.Key(ledger.KindTenant, "t18")
	scopes := []ledger.Scope{
		{Kind: ledger.KindTenant, Key: tenant, Limits: []ledger.Limit{
			{Dim: ledger.Tokens, Window: time.Hour, Max: 1000}, {Dim: ledger.Slots, Max: 4}}},
		{Kind: ledger.KindAPIKey, Key: testKeyer.Key(ledger.KindAPIKey, "t18-key"), Limits: []ledger.Limit{
			{Dim: ledger.Tokens, Window: 24 * time.Hour, Max: 800}}},
		{Kind: ledger.KindWorkflow, Key: testKeyer.Key(ledger.KindWorkflow, "t18-wf"), Limits: []ledger.Limit{
			{Dim: ledger.Requests, Window: time.Minute, Max: 10}}},
	}
	owner := ledger.NewOwner()
	flush := func() {
		require.NoError(t, rc.ScriptFlush(ctx).Err())
		require.NoError(t, rc.FunctionFlush(ctx).Err())
	}
	a := reserveReq(scopes, held(100), owner)
	b := reserveReq(scopes, held(50), owner)
	reloads := func() int64 {
		return commandCalls(t, rc, "eval") + commandCalls(t, rc, "eval_ro") + commandCalls(t, rc, "function|load")
	}
	evals0 := reloads()

	steps := []struct {
		name string
		run  func() error
	}{
		{"reserve a", func() error { _, err := l.Reserve(ctx, a); return err }},
		{"reserve a again", func() error {
			g, err := l.Reserve(ctx, a)
			if err == nil && !g.Replayed {
				t.Errorf("second reserve not replayed")
			}
			return err
		}},
		{"dispatch a", func() error { return l.MarkDispatched(ctx, a.Ref, owner) }},
		{"extend a", func() error { _, err := l.Extend(ctx, a.Ref, owner, 15*time.Second); return err }},
		{"reserve b", func() error { _, err := l.Reserve(ctx, b); return err }},
		{"snapshot", func() error { _, err := l.Snapshot(ctx, tenant, scopes[1].Key); return err }},
		{"settle a", func() error { _, err := l.Settle(ctx, a.Ref, held(70), ledger.SourceFinal); return err }},
		{"settle a again", func() error {
			s, err := l.Settle(ctx, a.Ref, held(70), ledger.SourceFinal)
			if err == nil && !s.Replayed {
				t.Errorf("second settle not replayed")
			}
			return err
		}},
		{"release b", func() error { return l.Release(ctx, b.Ref, owner) }},
		{"reclaim", func() error { _, err := l.Reclaim(ctx, tenant, 10); return err }},
	}
	for _, s := range steps {
		flush()
		require.NoError(t, s.run(), s.name)
	}
	evals := reloads() - evals0
	assert.GreaterOrEqual(t, evals, int64(len(steps)), "every call after a flush fell back to EVAL or loaded the library")

	for _, sc := range scopes {
		u, err := l.Snapshot(ctx, tenant, sc.Key)
		require.NoError(t, err)
		assert.Equal(t, int64(0), u.Reserved[ledger.Tokens], "%s r", sc.Kind)
		assert.Equal(t, int64(0), u.SlotsInUse, "%s n", sc.Kind)
		for _, lu := range u.Limits {
			switch lu.Limit.Dim {
			case ledger.Tokens:
				assert.Equal(t, int64(70), lu.Committed, "%s tokens charged once", sc.Kind)
			case ledger.Requests:
				assert.Equal(t, int64(1), lu.Committed, "%s requests charged once", sc.Kind)
			}
		}
	}

	rec.mu.Lock()
	defer rec.mu.Unlock()
	require.NotEmpty(t, rec.keys)
	for i, keys := range rec.keys {
		require.NotEmpty(t, keys, "call %d (%s) passes its keys", i, rec.cmds[i])
		slot := keySlot(keys[0])
		for _, k := range keys {
			assert.Equal(t, slot, keySlot(k), "call %d (%s): %s in slot %d, %s in slot %d", i, rec.cmds[i], keys[0], slot, k, keySlot(k))
			assert.True(t, strings.HasPrefix(k, "sluice:{"+tenant.String()+"}:"), "key %s carries the tenant hash tag", k)
		}
	}
}

// TestT17RawIDsNeverStored: after a multi-scope load no key or value in
// Redis contains a raw tenant id, API key or workflow id.
func TestT17RawIDsNeverStored(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	l := newLedger(t, srv.Addr(), nil)
	raw := []string{"tenant-acme-RAW-7f3a", "sk-live-SECRETKEY-0123456789", "wf-RAW-checkout-flow"}
	tenant := testKeyer.Key(ledger.KindTenant, raw[0])
	scopes := []ledger.Scope{
		{Kind: ledger.KindTenant, Key: tenant, Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30}, {Dim: ledger.Slots, Max: 100}}},
		{Kind: ledger.KindAPIKey, Key: testKeyer.Key(ledger.KindAPIKey, raw[1]), Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30}}},
		{Kind: ledger.KindWorkflow, Key: testKeyer.Key(ledger.KindWorkflow, raw[2]), Limits: []ledger.Limit{{Dim: ledger.Requests, Window: time.Minute, Max: 1000}}},
	}
	owner := ledger.NewOwner()
	for i := range 60 {
		req := reserveReq(scopes, held(int64(1+i)), owner)
		req.Dispatch = i%3 != 0
		_, err := l.Reserve(ctx, req)
		require.NoError(t, err)
		switch i % 3 {
		case 0:
			require.NoError(t, l.Release(ctx, req.Ref, owner))
		case 1:
			_, err = l.Settle(ctx, req.Ref, held(int64(i)), ledger.SourceFinal)
			require.NoError(t, err)
		}
	}
	var seen int
	iter := rc.Scan(ctx, 0, "*", 1000).Iterator()
	for iter.Next(ctx) {
		k := iter.Val()
		seen++
		var vals []string
		switch typ := rc.Type(ctx, k).Val(); typ {
		case "hash":
			for f, v := range rc.HGetAll(ctx, k).Val() {
				vals = append(vals, f, v)
			}
		case "string": // a record (packed)
			vals = []string{rc.Get(ctx, k).Val()}
		case "zset":
			vals = rc.ZRange(ctx, k, 0, -1).Val()
		case "set":
			require.Equal(t, "sluice:partitions", k, "the registry is the only set")
			vals = rc.SMembers(ctx, k).Val()
			for _, v := range vals {
				_, err := ledger.ParseScopeKey(v)
				require.NoError(t, err, "registry members are scope keys")
			}
		default:
			t.Fatalf("unexpected %s key %s", typ, k)
		}
		for _, r := range raw {
			assert.NotContains(t, k, r)
			for _, v := range vals {
				assert.NotContains(t, v, r, "value of %s", k)
			}
		}
	}
	require.NoError(t, iter.Err())
	assert.Greater(t, seen, 20, "the load stored keys")
}
