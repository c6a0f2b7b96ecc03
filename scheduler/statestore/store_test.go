package statestore_test

import (
	"context"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

var (
	_ statestore.Store = (*statestore.File)(nil)
	_ statestore.Store = (*statestore.Redis)(nil)
	_ statestore.Store = (*statestore.Memory)(nil)
)

// backend opens two independent clients of one shared store, as two
// Sluice instances would.
type backend struct {
	name string
	open func(t *testing.T) (a, b statestore.Store)
}

func backends() []backend {
	return []backend{
		{"memory", func(*testing.T) (statestore.Store, statestore.Store) {
			m := statestore.NewMemory()
			return m, m
		}},
		{"file", func(t *testing.T) (statestore.Store, statestore.Store) {
			dir := t.TempDir()
			a, err := statestore.OpenFile(dir)
			require.NoError(t, err)
			b, err := statestore.OpenFile(dir)
			require.NoError(t, err)
			return a, b
		}},
		{"redis", func(t *testing.T) (statestore.Store, statestore.Store) {
			addr := startRedis(t)
			mk := func() statestore.Store {
				c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
				t.Cleanup(func() { _ = c.Close() })
				return statestore.NewRedis(c, "test")
			}
			return mk(), mk()
		}},
	}
}

func TestStore(t *testing.T) {
	t.Parallel()
	for _, be := range backends() {
		t.Run(be.name, func(t *testing.T) {
			t.Parallel()
			t.Run("GetMissing", func(t *testing.T) {
				a, _ := be.open(t)
				d, err := a.Get(t.Context(), "keys")
				require.NoError(t, err)
				assert.Equal(t, statestore.Doc{Name: "keys"}, d)
			})
			t.Run("CompareAndSet", func(t *testing.T) {
				a, b := be.open(t)
				ctx := t.Context()
				d, err := a.CompareAndSet(ctx, "keys", 0, []byte(`{"n":1}`))
				require.NoError(t, err)
				assert.Equal(t, uint64(1), d.Rev)

				_, err = b.CompareAndSet(ctx, "keys", 0, []byte(`{"n":2}`))
				require.ErrorIs(t, err, statestore.ErrConflict, "a second create must lose")
				_, err = b.CompareAndSet(ctx, "keys", 5, []byte(`{"n":2}`))
				require.ErrorIs(t, err, statestore.ErrConflict, "a future revision must lose")

				got, err := b.Get(ctx, "keys")
				require.NoError(t, err)
				assert.Equal(t, uint64(1), got.Rev)
				assert.JSONEq(t, `{"n":1}`, string(got.Data), "the losing writes changed nothing")

				d, err = b.CompareAndSet(ctx, "keys", 1, []byte(`{"n":3}`))
				require.NoError(t, err)
				assert.Equal(t, uint64(2), d.Rev)
				got, err = a.Get(ctx, "keys")
				require.NoError(t, err)
				assert.Equal(t, uint64(2), got.Rev)
				assert.JSONEq(t, `{"n":3}`, string(got.Data))
			})
			t.Run("BadName", func(t *testing.T) {
				a, _ := be.open(t)
				for _, n := range []string{"", "../x", "A", "a/b", ".hidden", "a b", string(make([]byte, 65))} {
					_, err := a.Get(t.Context(), n)
					require.ErrorIs(t, err, statestore.ErrName, "name %q", n)
					_, err = a.CompareAndSet(t.Context(), n, 0, []byte(`{}`))
					require.ErrorIs(t, err, statestore.ErrName, "name %q", n)
				}
			})
			t.Run("UpdateUnchangedAndError", func(t *testing.T) {
				a, _ := be.open(t)
				ctx := t.Context()
				d, err := statestore.Update(ctx, a, "doc", func([]byte) ([]byte, error) { return []byte(`[1]`), nil })
				require.NoError(t, err)
				require.Equal(t, uint64(1), d.Rev)
				d, err = statestore.Update(ctx, a, "doc", func([]byte) ([]byte, error) { return nil, statestore.ErrUnchanged })
				require.NoError(t, err)
				assert.Equal(t, uint64(1), d.Rev, "ErrUnchanged writes nothing")
				boom := errors.New("boom")
				_, err = statestore.Update(ctx, a, "doc", func([]byte) ([]byte, error) { return nil, boom })
				require.ErrorIs(t, err, boom)
				d, err = a.Get(ctx, "doc")
				require.NoError(t, err)
				assert.Equal(t, uint64(1), d.Rev)
			})
			// Two clients incrementing one counter concurrently: every
			// increment survives, and the revision counts every write.
			t.Run("ConcurrentUpdateLosesNothing", func(t *testing.T) {
				a, b := be.open(t)
				ctx := t.Context()
				const perWorker, workers = 25, 4
				var wg sync.WaitGroup
				errs := make(chan error, 2*workers)
				for i := range 2 * workers {
					s := a
					if i%2 == 1 {
						s = b
					}
					wg.Go(func() {
						for range perWorker {
							_, err := statestore.Update(ctx, s, "counter", incr)
							if err != nil {
								errs <- err
								return
							}
						}
					})
				}
				wg.Wait()
				close(errs)
				for err := range errs {
					require.NoError(t, err)
				}
				d, err := a.Get(ctx, "counter")
				require.NoError(t, err)
				var n int
				require.NoError(t, json.Unmarshal(d.Data, &n))
				assert.Equal(t, 2*workers*perWorker, n, "increments lost")
				assert.Equal(t, uint64(2*workers*perWorker), d.Rev, "one revision per write")
			})
			t.Run("WatchSeesOtherClientsWrite", func(t *testing.T) {
				a, b := be.open(t)
				ctx, cancel := context.WithCancel(t.Context())
				seen := make(chan statestore.Doc)
				done := make(chan error, 1)
				go func() {
					done <- statestore.Watch(ctx, a, "w", 10*time.Millisecond, func(d statestore.Doc) {
						select {
						case seen <- d:
						case <-ctx.Done():
						}
					}, nil)
				}()
				first := recv(t, seen)
				assert.Equal(t, uint64(0), first.Rev, "the first call reports the current (missing) doc")
				_, err := b.CompareAndSet(ctx, "w", 0, []byte(`"x"`))
				require.NoError(t, err)
				got := recv(t, seen)
				assert.Equal(t, uint64(1), got.Rev)
				assert.JSONEq(t, `"x"`, string(got.Data))
				cancel()
				require.ErrorIs(t, <-done, context.Canceled)
			})
		})
	}
}

func incr(old []byte) ([]byte, error) {
	var n int
	if old != nil {
		if err := json.Unmarshal(old, &n); err != nil {
			return nil, err
		}
	}
	return []byte(strconv.Itoa(n + 1)), nil
}

func recv(t *testing.T, ch <-chan statestore.Doc) statestore.Doc {
	t.Helper()
	select {
	case d := <-ch:
		return d
	case <-time.After(5 * time.Second):
		t.Fatal("no document from Watch within 5s")
		return statestore.Doc{}
	}
}

func TestFileKeepsJSONAndLeavesNoTempFiles(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	f, err := statestore.OpenFile(dir)
	require.NoError(t, err)
	_, err = f.CompareAndSet(t.Context(), "keys", 0, []byte("not json"))
	require.Error(t, err)
	_, err = f.CompareAndSet(t.Context(), "keys", 0, []byte(`{"a":1}`))
	require.NoError(t, err)
	b, err := os.ReadFile(filepath.Join(dir, "keys.json"))
	require.NoError(t, err)
	var fd struct {
		Rev   uint64
		Epoch string
		Data  json.RawMessage
	}
	require.NoError(t, json.Unmarshal(b, &fd))
	assert.Equal(t, uint64(1), fd.Rev)
	assert.Len(t, fd.Epoch, 16, "a new document gets an epoch")
	assert.JSONEq(t, `{"a":1}`, string(fd.Data))
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	var names []string
	for _, e := range ents {
		names = append(names, e.Name())
	}
	assert.ElementsMatch(t, []string{"keys.json", "keys.lock"}, names)

	require.NoError(t, os.WriteFile(filepath.Join(dir, "bad.json"), []byte("{"), 0o600))
	_, err = f.Get(t.Context(), "bad")
	require.ErrorContains(t, err, "corrupt")
}

// startRedis starts a real redis-server (internal/redistest).
func startRedis(t *testing.T) string { return redistest.Start(t) }

// TestRedisBlobs: a blob put by one client is read by another, expires
// with its TTL, and a missing one is not an error.
func TestRedisBlobs(t *testing.T) {
	addr := startRedis(t)
	mk := func() *statestore.RedisBlobs {
		c := redis.NewClient(&redis.Options{Addr: addr, ContextTimeoutEnabled: true})
		t.Cleanup(func() { _ = c.Close() })
		return statestore.NewRedisBlobs(c, "test")
	}
	a, b := mk(), mk()
	ctx := t.Context()
	_, ok, err := b.Get(ctx, "x")
	require.NoError(t, err)
	assert.False(t, ok)
	require.NoError(t, a.Put(ctx, "x", []byte(`{"id":"1"}`), time.Hour))
	got, ok, err := b.Get(ctx, "x")
	require.NoError(t, err)
	require.True(t, ok)
	assert.Equal(t, `{"id":"1"}`, string(got))
	raw := redis.NewClient(&redis.Options{Addr: addr})
	defer raw.Close()
	ttl, err := raw.PTTL(ctx, "test:{blob:x}").Result()
	require.NoError(t, err)
	assert.Greater(t, ttl, 59*time.Minute, "stored with its TTL")
	require.NoError(t, raw.PExpire(ctx, "test:{blob:x}", time.Millisecond).Err())
	require.Eventually(t, func() bool { _, ok, _ := b.Get(ctx, "x"); return !ok }, 5*time.Second, 5*time.Millisecond, "expired")
}

// TestEpochNamesTheHistory pins what lets an instance notice that its
// backend forgot writes: every write keeps the document's epoch, a
// document forgotten and written again gets a new one, and Watch reports a
// revision that went back (not only one that moved on).
func TestEpochNamesTheHistory(t *testing.T) {
	t.Parallel()
	type forgetful struct {
		name string
		open func(t *testing.T) (s statestore.Store, forget func(name string), restore func(d statestore.Doc))
	}
	cases := []forgetful{
		{"memory", func(*testing.T) (statestore.Store, func(string), func(statestore.Doc)) {
			m := statestore.NewMemory()
			return m, m.Delete, m.Restore
		}},
		{"file", func(t *testing.T) (statestore.Store, func(string), func(statestore.Doc)) {
			dir := t.TempDir()
			f, err := statestore.OpenFile(dir)
			require.NoError(t, err)
			return f, func(name string) { require.NoError(t, os.Remove(filepath.Join(dir, name+".json"))) },
				func(d statestore.Doc) {
					b, err := json.Marshal(map[string]any{"rev": d.Rev, "epoch": d.Epoch, "data": json.RawMessage(d.Data)})
					require.NoError(t, err)
					require.NoError(t, os.WriteFile(filepath.Join(dir, d.Name+".json"), b, 0o600))
				}
		}},
		{"redis", func(t *testing.T) (statestore.Store, func(string), func(statestore.Doc)) {
			c := redis.NewClient(&redis.Options{Addr: startRedis(t), ContextTimeoutEnabled: true})
			t.Cleanup(func() { _ = c.Close() })
			key := func(name string) string { return "test:{state:" + name + "}" }
			return statestore.NewRedis(c, "test"),
				func(name string) { require.NoError(t, c.Del(context.Background(), key(name)).Err()) },
				func(d statestore.Doc) {
					require.NoError(t, c.HSet(context.Background(), key(d.Name), "rev", d.Rev, "epoch", d.Epoch, "data", d.Data).Err())
				}
		}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			s, forget, restore := tc.open(t)
			ctx := t.Context()
			d1, err := statestore.Update(ctx, s, "w", incr)
			require.NoError(t, err)
			require.NotEmpty(t, d1.Epoch)
			d2, err := statestore.Update(ctx, s, "w", incr)
			require.NoError(t, err)
			assert.Equal(t, d1.Epoch, d2.Epoch, "a write keeps the epoch")
			got, err := s.Get(ctx, "w")
			require.NoError(t, err)
			assert.True(t, got.Same(d2))
			assert.True(t, d2.After(d1))
			assert.False(t, d1.After(d2))

			// A failover to a replica that missed d2: same epoch, lower rev.
			changes := make(chan statestore.Doc, 16)
			wctx, cancel := context.WithCancel(ctx)
			done := make(chan error, 1)
			go func() {
				done <- statestore.Watch(wctx, s, "w", 5*time.Millisecond, func(d statestore.Doc) { changes <- d }, nil)
			}()
			assert.Equal(t, uint64(2), recv(t, changes).Rev)
			restore(d1)
			back := recv(t, changes)
			assert.Equal(t, uint64(1), back.Rev, "Watch reports a revision that went back")
			assert.False(t, back.After(d2))
			assert.False(t, back.Same(d2))

			// A restart without persistence: the document is gone, and its
			// next creation is another history even at a higher revision.
			forget("w")
			assert.Equal(t, uint64(0), recv(t, changes).Rev)
			var d3 statestore.Doc
			for range 3 {
				d3, err = statestore.Update(ctx, s, "w", incr)
				require.NoError(t, err)
			}
			assert.Equal(t, uint64(3), d3.Rev)
			assert.NotEqual(t, d2.Epoch, d3.Epoch, "a recreated document has a new epoch")
			assert.False(t, d3.After(d2), "a higher revision of another history does not continue it")
			cancel()
			require.ErrorIs(t, <-done, context.Canceled)
		})
	}
}
