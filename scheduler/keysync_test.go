package scheduler

import (
	"context"
	"errors"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

// keysFleet is two instances sharing one key store and one clock.
type keysFleet struct {
	store *statestore.Memory
	a, b  *Server
	mu    sync.Mutex
	now   time.Time
}

func newKeysFleet(t *testing.T, keys statestore.Store, mem *statestore.Memory) *keysFleet {
	f := &keysFleet{store: mem, now: time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)}
	cfg := lifecycletest.Config(t, "", "")
	led := lifecycletest.NewLedger(t)
	mk := func() *Server {
		keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
		require.NoError(t, err)
		mon, err := gpu.NewMonitor(gpu.Config{Telemetry: gpu.ModeOff, Replicas: []gpu.Replica{{Name: "r0", CapacityTokens: 1 << 20}}}, gpu.Deps{})
		require.NoError(t, err)
		s, err := New(cfg, Deps{Ledger: led, Upstream: &lifecycletest.Upstream{Out: 3}, Keyer: keyer, GPU: mon, Keys: keys, Now: f.clock})
		require.NoError(t, err)
		require.NoError(t, s.SyncKeys(t.Context()))
		return s
	}
	f.a, f.b = mk(), mk()
	return f
}

func (f *keysFleet) clock() time.Time {
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.now
}

func (f *keysFleet) advance(d time.Duration) {
	f.mu.Lock()
	f.now = f.now.Add(d)
	f.mu.Unlock()
}

// poll is one tick of s's watch loop.
func poll(t *testing.T, s *Server) {
	t.Helper()
	require.NoError(t, s.SyncKeys(t.Context()))
}

// authCode is what a request with key gets from s: "" when it
// authenticates, else the error code of the answer.
func authCode(s *Server, key string) string {
	_, _, err := s.authenticate(s.pol.Load(), []byte("Bearer "+key))
	if err == nil {
		return ""
	}
	return apierr.For(err).Code
}

func createKey(t *testing.T, s *Server, name string) CreatedKey {
	t.Helper()
	k, err := s.CreateKey(t.Context(), KeyRequest{Tenant: "acme", Name: name})
	require.NoError(t, err)
	return k
}

// TestKeysSurviveAStoreThatGoesBack: the key store loses acknowledged
// writes (a failover to a replica that missed them), then forgets the
// document (a restart without persistence). Every instance notices, the
// store is repaired with what the instances had applied, a key revoked
// before or after the loss stays revoked everywhere, a key only the
// instances still know can be revoked, and a key handed out before the
// loss keeps working.
func TestKeysSurviveAStoreThatGoesBack(t *testing.T) {
	mem := statestore.NewMemory()
	f := newKeysFleet(t, mem, mem)
	a, b := f.a, f.b
	ctx := t.Context()

	k1, k2 := createKey(t, a, "k1"), createKey(t, a, "k2")
	before, err := mem.Get(ctx, policy.KeysDoc)
	require.NoError(t, err)
	require.Equal(t, uint64(2), before.Rev)
	poll(t, b)
	assert.Equal(t, "", authCode(b, k1.Key))

	_, err = a.RevokeKey(ctx, k1.ID)
	require.NoError(t, err)
	poll(t, b)
	require.Equal(t, "invalid_api_key", authCode(b, k1.Key))

	// The loss: the store is back at revision 2, k1 present, no tombstone.
	mem.Restore(before)
	poll(t, b)
	poll(t, a)
	for _, s := range []*Server{a, b} {
		assert.Equal(t, "invalid_api_key", authCode(s, k1.Key), "a key revoked before the loss stays revoked")
		assert.Equal(t, "", authCode(s, k2.Key), "a key handed out before the loss keeps working")
	}
	repaired, err := mem.Get(ctx, policy.KeysDoc)
	require.NoError(t, err)
	st, err := policy.DecodeKeys(repaired.Data)
	require.NoError(t, err)
	require.Len(t, st.Revoked, 1, "the store learns the revocation again")
	assert.Equal(t, k1.ID, st.Revoked[0].ID)

	// A revoke after the loss applies at once on A and at B's next poll.
	mem.Restore(before)
	_, err = a.RevokeKey(ctx, k2.ID)
	require.NoError(t, err)
	assert.Equal(t, "invalid_api_key", authCode(a, k2.Key), "revoked after the loss: refused at once")
	assert.Equal(t, "invalid_api_key", authCode(a, k1.Key))
	poll(t, b)
	assert.Equal(t, "invalid_api_key", authCode(b, k2.Key), "and on the other instance at its next poll")
	assert.Equal(t, "invalid_api_key", authCode(b, k1.Key))

	// A restart without persistence: the document is gone. A key the
	// instances know is revocable through an instance that has not polled
	// since (B), and a key they know survives.
	k3, k4 := createKey(t, a, "k3"), createKey(t, a, "k4")
	poll(t, b)
	mem.Delete(policy.KeysDoc)
	_, err = b.RevokeKey(ctx, k3.ID)
	require.NoError(t, err, "a key missing from the store but authenticating is revocable")
	assert.Equal(t, "invalid_api_key", authCode(b, k3.Key))
	poll(t, a)
	assert.Equal(t, "invalid_api_key", authCode(a, k3.Key), "the revoke reaches the instance that made the key")
	for _, s := range []*Server{a, b} {
		assert.Equal(t, "", authCode(s, k4.Key), "a key created before the restart keeps working")
		assert.Equal(t, "invalid_api_key", authCode(s, k1.Key))
	}
	now, err := mem.Get(ctx, policy.KeysDoc)
	require.NoError(t, err)
	assert.NotEqual(t, before.Epoch, now.Epoch, "the recreated document is another history")
	st, err = policy.DecodeKeys(now.Data)
	require.NoError(t, err)
	assert.Len(t, st.Keys, 1, "k4 only")
	assert.Len(t, st.Revoked, 3)

	// Both instances converged on the store's document.
	poll(t, a)
	poll(t, b)
	assert.True(t, a.keys.Index().Doc.Same(now))
	assert.True(t, b.keys.Index().Doc.Same(now))
}

// flakyStore fails every Get while down is set.
type flakyStore struct {
	statestore.Store
	down atomic.Bool
}

func (f *flakyStore) Get(ctx context.Context, name string) (statestore.Doc, error) {
	if f.down.Load() {
		return statestore.Doc{}, errors.New("connection refused")
	}
	return f.Store.Get(ctx, name)
}

// TestKeysFailClosedPastTheStalenessBound: an instance that cannot read the
// keys document keeps its run-time keys for admin.keys_max_staleness (30s
// by default), then refuses them with 503 key_store_stale; keys of the
// config file keep working, and the run-time keys come back with the
// store.
func TestKeysFailClosedPastTheStalenessBound(t *testing.T) {
	mem := statestore.NewMemory()
	flaky := &flakyStore{Store: mem}
	f := newKeysFleet(t, flaky, mem)
	k := createKey(t, f.a, "k")
	require.Equal(t, "", authCode(f.a, k.Key))

	flaky.down.Store(true)
	require.Error(t, f.a.SyncKeys(t.Context()))
	f.advance(30 * time.Second)
	assert.Equal(t, "", authCode(f.a, k.Key), "within the bound the last keys read apply")
	f.advance(time.Millisecond)
	_, _, err := f.a.authenticate(f.a.pol.Load(), []byte("Bearer "+k.Key))
	ae := apierr.For(err)
	require.NotNil(t, ae)
	assert.Equal(t, 503, ae.Status)
	assert.Equal(t, "key_store_stale", ae.Code)
	assert.Equal(t, "service_unavailable", ae.Type)
	assert.Contains(t, ae.Message, "admin.keys_max_staleness 30s")
	assert.Equal(t, int64(30_000), ae.Details["bound_ms"])
	assert.Equal(t, "", authCode(f.a, "sk-acme"), "config keys do not depend on the key store")

	flaky.down.Store(false)
	poll(t, f.a)
	assert.Equal(t, "", authCode(f.a, k.Key), "the store answers: the keys apply again")
}
