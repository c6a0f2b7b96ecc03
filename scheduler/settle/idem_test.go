package settle

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// memResponses is an in-memory ResponseStore.
type memResponses struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (r *memResponses) Put(_ context.Context, name string, data []byte, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[name] = append([]byte(nil), data...)
	return nil
}

func (r *memResponses) Get(_ context.Context, name string) ([]byte, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[name]
	return v, ok, nil
}

// TestResponsesKept: a kept response is answered here within the
// retention, and by another instance through the fleet's store with the
// digest of the request it answers; past the retention this instance
// forgets it; a store value of another format answers nobody; a body past
// idemMaxEntryBytes is not kept.
func TestResponsesKept(t *testing.T) {
	led := newHookLedger(t)
	store := &memResponses{m: map[string][]byte{}}
	now := time.Date(2026, 1, 1, 10, 0, 0, 0, time.UTC)
	room := func(responses ResponseStore) *Settler {
		s, err := New(Deps{Ledger: led, Owner: ledger.NewOwner(), LeaseTTL: func() time.Duration { return time.Minute },
			Now: func() time.Time { return now }, Responses: responses, Retention: 10 * time.Minute}, testPaths(t), false)
		require.NoError(t, err)
		return s
	}
	ctx := context.Background()
	a := room(store)
	id := ledger.NewRequestID()
	a.KeepResponse(ctx, id, 42, []byte(`{"ok":true}`))
	body, digest, ok := a.Response(ctx, id)
	require.True(t, ok)
	assert.Equal(t, `{"ok":true}`, string(body))
	assert.Equal(t, uint64(42), digest)

	b := room(store)
	body, digest, ok = b.Response(ctx, id)
	require.True(t, ok, "another instance: from the fleet's store")
	assert.Equal(t, `{"ok":true}`, string(body))
	assert.Equal(t, uint64(42), digest)
	_, _, ok = room(nil).Response(ctx, id)
	assert.False(t, ok, "no store, not kept here")

	now = now.Add(11 * time.Minute)
	store.m = map[string][]byte{}
	_, _, ok = a.Response(ctx, id)
	assert.False(t, ok, "past the retention")

	other := ledger.NewRequestID()
	store.m[responseName(other)] = []byte(`{"ok":true}`)
	_, _, ok = a.Response(ctx, other)
	assert.False(t, ok, "a value without the format's header")

	big := ledger.NewRequestID()
	a.KeepResponse(ctx, big, 1, make([]byte, idemMaxEntryBytes+1))
	_, _, ok = a.Response(ctx, big)
	assert.False(t, ok)
	assert.Empty(t, store.m[responseName(big)])
}
