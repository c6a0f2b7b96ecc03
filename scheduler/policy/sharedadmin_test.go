package policy

import (
	"context"
	"encoding/json"
	"fmt"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

// adminInstance is one instance's SharedAdmin with the server's side
// faked: the states it rebuilt from and the clamps it was told of.
type adminInstance struct {
	*SharedAdmin
	mu       sync.Mutex
	rebuilt  []AdminState
	clamped  []string
	lifted   []string
	failNext error
}

func newAdminInstance(t *testing.T, store statestore.Store, now func() time.Time, stateFile string) *adminInstance {
	t.Helper()
	y := fmt.Sprintf("upstream:\n  replicas:\n    - {name: r0, url: \"http://r0.invalid\"}\ngpu: {telemetry: off}\n"+
		"admin: {state_file: %q}\ntenants:\n  - name: acme\n    api_keys: [%q]\n", stateFile, config.HashKey("sk-acme"))
	if stateFile == "" {
		y = fmt.Sprintf("upstream:\n  replicas:\n    - {name: r0, url: \"http://r0.invalid\"}\ngpu: {telemetry: off}\n"+
			"tenants:\n  - name: acme\n    api_keys: [%q]\n", config.HashKey("sk-acme"))
	}
	file, err := config.Parse([]byte(y))
	require.NoError(t, err, y)
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	in := &adminInstance{}
	st, err := LoadAdminState(stateFile)
	require.NoError(t, err)
	in.SharedAdmin = NewSharedAdmin(st, SharedAdminDeps{
		Store: store,
		Lock:  &in.mu,
		File:  func() *config.File { return file },
		Keyer: keyer,
		Rebuild: func(st *AdminState) error {
			if err := in.failNext; err != nil {
				in.failNext = nil
				return err
			}
			in.rebuilt = append(in.rebuilt, st.Clone())
			return nil
		},
		Clamped: func(tenant string, _ time.Time) { in.clamped = append(in.clamped, tenant) },
		Lifted:  func(tenant string) { in.lifted = append(in.lifted, tenant) },
		Log:     slog.New(slog.DiscardHandler),
		Now:     now,
	})
	require.NoError(t, in.Load(context.Background()))
	return in
}

func (in *adminInstance) poll(t *testing.T, store statestore.Store) {
	t.Helper()
	d, err := store.Get(t.Context(), AdminDoc)
	require.NoError(t, err)
	in.Apply(d)
}

func setBudget(limit int64) func(st *AdminState) error {
	return func(st *AdminState) error {
		st.Budgets["acme:requests:1h0m0s"] = BudgetOverride{Tenant: "acme", Budget: config.Budget{Dimension: "requests", Limit: limit, Window: time.Hour, Mode: "block", WarnRatio: 0.8}}
		return nil
	}
}

// TestSharedAdminFleetWide: a change through one instance is written by
// compare-and-set and installed on another at its poll; a second change
// made on a stale instance is re-applied on top, so neither is lost; a
// clamp another instance set or lifted is reported to the server.
func TestSharedAdminFleetWide(t *testing.T) {
	t.Parallel()
	mem := statestore.NewMemory()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	a, b := newAdminInstance(t, mem, clock, ""), newAdminInstance(t, mem, clock, "")

	require.NoError(t, a.Change(setBudget(5)))
	require.Len(t, a.rebuilt, 1)
	assert.Equal(t, int64(5), a.State().Budgets["acme:requests:1h0m0s"].Budget.Limit)

	// b has not polled: its change still starts from the stored document.
	require.NoError(t, b.Change(func(st *AdminState) error {
		st.Clamps["acme"] = Clamp{Tenant: "acme", Concurrency: 1, Reason: "probe", ExpiresAt: now.Add(time.Hour), Source: "admin"}
		return nil
	}))
	bs := b.State()
	assert.Equal(t, int64(5), bs.Budgets["acme:requests:1h0m0s"].Budget.Limit, "a's budget survives b's write")
	assert.Equal(t, 1, bs.Clamps["acme"].Concurrency)

	a.poll(t, mem)
	assert.Equal(t, 1, a.State().Clamps["acme"].Concurrency, "b's clamp installed on a")
	assert.Equal(t, []string{"acme"}, a.clamped)

	had := false
	require.NoError(t, b.Change(func(st *AdminState) error {
		_, had = st.Clamps["acme"]
		delete(st.Clamps, "acme")
		return nil
	}))
	require.True(t, had)
	a.poll(t, mem)
	assert.Empty(t, a.State().Clamps)
	assert.Equal(t, []string{"acme"}, a.lifted)

	n := len(a.rebuilt)
	a.poll(t, mem)
	assert.Len(t, a.rebuilt, n, "the revision applied is not installed again")

	d, err := mem.Get(t.Context(), AdminDoc)
	require.NoError(t, err)
	var doc AdminState
	require.NoError(t, json.Unmarshal(d.Data, &doc))
	assert.Equal(t, int64(5), doc.Budgets["acme:requests:1h0m0s"].Budget.Limit, "the document is the AdminState JSON")
}

// TestSharedAdminRefusedChange: a change the config cannot take is
// ErrInvalidAdmin and writes nothing; ErrUnchanged writes nothing either;
// a rebuild that fails keeps the state in force.
func TestSharedAdminRefusedChange(t *testing.T) {
	t.Parallel()
	for _, store := range []statestore.Store{nil, statestore.NewMemory()} {
		now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
		a := newAdminInstance(t, store, func() time.Time { return now }, "")
		err := a.Change(func(st *AdminState) error {
			st.Budgets["acme:bogus:1h0m0s"] = BudgetOverride{Tenant: "acme", Budget: config.Budget{Dimension: "bogus", Limit: 1, Window: time.Hour, Mode: "block"}}
			return nil
		})
		require.ErrorIs(t, err, ErrInvalidAdmin)
		require.NoError(t, a.Change(func(*AdminState) error { return statestore.ErrUnchanged }))
		assert.Empty(t, a.rebuilt)
		if store != nil {
			d, err := store.Get(t.Context(), AdminDoc)
			require.NoError(t, err)
			assert.Zero(t, d.Rev, "nothing written")
		}
		a.failNext = assert.AnError
		require.ErrorIs(t, a.Change(setBudget(3)), assert.AnError)
		assert.Empty(t, a.State().Budgets, "a failed rebuild keeps the state in force")
	}
}

// TestSharedAdminStoreWentBack: a store that forgot the document, or went
// back to an older revision of the same history, is rewritten with the
// state this instance applied; another history already written is
// adopted as is.
func TestSharedAdminStoreWentBack(t *testing.T) {
	t.Parallel()
	mem := statestore.NewMemory()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	a := newAdminInstance(t, mem, func() time.Time { return now }, "")
	ctx := t.Context()

	require.NoError(t, a.Change(setBudget(5)))
	old, err := mem.Get(ctx, AdminDoc)
	require.NoError(t, err)
	require.NoError(t, a.Change(setBudget(7)))

	mem.Restore(old) // failover to a replica that missed the last write
	a.poll(t, mem)
	d, err := mem.Get(ctx, AdminDoc)
	require.NoError(t, err)
	st, err := DecodeAdmin(d.Data)
	require.NoError(t, err)
	assert.Equal(t, int64(7), st.Budgets["acme:requests:1h0m0s"].Budget.Limit, "the older revision is rewritten with what was applied")
	assert.Greater(t, d.Rev, old.Rev)

	mem.Delete(AdminDoc) // restart without persistence
	a.poll(t, mem)
	d, err = mem.Get(ctx, AdminDoc)
	require.NoError(t, err)
	require.NotZero(t, d.Rev, "the forgotten document is written again")
	st, err = DecodeAdmin(d.Data)
	require.NoError(t, err)
	assert.Equal(t, int64(7), st.Budgets["acme:requests:1h0m0s"].Budget.Limit)

	// Another history someone already wrote (a new epoch) is the fleet's.
	mem.Delete(AdminDoc)
	other, err := mem.CompareAndSet(ctx, AdminDoc, 0, []byte(`{"budgets":{},"clamps":{}}`))
	require.NoError(t, err)
	a.poll(t, mem)
	assert.Empty(t, a.State().Budgets, "the other history is adopted")
	d, err = mem.Get(ctx, AdminDoc)
	require.NoError(t, err)
	assert.True(t, d.Same(other), "and not overwritten")
}

// TestSharedAdminExpireClamps: an expired clamp is dropped from the shared
// document and returned once; with the store unreachable it is dropped
// locally all the same. The state is persisted to admin.state_file.
func TestSharedAdminExpireClamps(t *testing.T) {
	t.Parallel()
	now := time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)
	clock := func() time.Time { return now }
	store := &failingStore{Memory: statestore.NewMemory()}
	path := filepath.Join(t.TempDir(), "admin.json")
	a := newAdminInstance(t, store, clock, path)
	clamp := func(st *AdminState) error {
		st.Clamps["acme"] = Clamp{Tenant: "acme", Weight: 1, Reason: "probe", ExpiresAt: now.Add(time.Minute), Source: "admin"}
		return nil
	}
	require.NoError(t, a.Change(clamp))
	assert.Empty(t, a.ExpireClamps(), "not yet")
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Contains(t, string(b), `"reason": "probe"`, "persisted to admin.state_file")

	now = now.Add(time.Minute)
	got := a.ExpireClamps()
	require.Len(t, got, 1)
	assert.Equal(t, "probe", got[0].Reason)
	assert.Empty(t, a.ExpireClamps(), "returned once")
	d, err := store.Get(t.Context(), AdminDoc)
	require.NoError(t, err)
	assert.NotContains(t, string(d.Data), "probe", "dropped from the shared document")

	require.NoError(t, a.Change(func(st *AdminState) error {
		st.Clamps["acme"] = Clamp{Tenant: "acme", Weight: 1, Reason: "again", ExpiresAt: now.Add(time.Minute), Source: "admin"}
		return nil
	}))
	now = now.Add(time.Minute)
	store.fail = true
	got = a.ExpireClamps()
	require.Len(t, got, 1, "expired locally with the store unreachable")
	assert.Empty(t, a.State().Clamps)
	b, err = os.ReadFile(path)
	require.NoError(t, err)
	assert.NotContains(t, string(b), "again")
}

// failingStore is a memory store that fails every call while fail is set.
type failingStore struct {
	*statestore.Memory
	fail bool
}

func (f *failingStore) Get(ctx context.Context, name string) (statestore.Doc, error) {
	if f.fail {
		return statestore.Doc{}, assert.AnError
	}
	return f.Memory.Get(ctx, name)
}

func (f *failingStore) CompareAndSet(ctx context.Context, name string, rev uint64, data []byte) (statestore.Doc, error) {
	if f.fail {
		return statestore.Doc{}, assert.AnError
	}
	return f.Memory.CompareAndSet(ctx, name, rev, data)
}
