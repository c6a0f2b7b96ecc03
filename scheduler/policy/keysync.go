package policy

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

// Keys at run time (docs/operations.md "API keys at run time"): the admin
// API creates a key, returns it once and stores only its hash in the
// shared state store (Redis with the Redis ledger, a file next to the
// journal with the embedded one); every instance polls the document and
// swaps in a new key snapshot when the revision changes, so a new or
// revoked key takes effect fleet-wide within one poll interval, and at once
// on the instance that made the change. Authentication reads the key
// snapshot once, so a revoked key is refused from the next request;
// requests already admitted finish.
//
// Following the shared keys document when the store forgets writes.
//
// A Redis failover can lose acknowledged writes, a Redis restarted without
// persistence forgets every key, an operator may delete one: the
// document's revision then goes back, or the document is created again
// under a new epoch (statestore.Doc). An instance that only ever accepted a
// higher revision would ignore the store from then on. Instead every read
// that is neither the revision applied nor a later one of the same history
// is checked with a second read (the first may simply have raced this
// instance's own write, which the second follows), and a confirmed
// regression is repaired: the instance merges what it had applied into
// what the store holds and writes the union back by compare-and-set. The
// keys form a two-phase set (keys, and tombstones of revoked keys), so the
// union loses no key that was handed out and brings back no key that was
// revoked anywhere: a revoke always wins. Every instance converges on the
// repaired document at its next poll (KeysPoll).
//
// An instance that cannot read the document at all keeps authenticating
// the run-time keys it last read for admin.keys_max_staleness only; past
// it those keys are refused (the server answers 503 key_store_stale),
// because a key revoked meanwhile through another instance must not keep
// working here. Keys of the config file do not depend on the store.

// KeysDoc is the state-store document holding the run-time keys.
const KeysDoc = "api-keys"

// KeysPoll is how often instances poll the keys document.
const KeysPoll = 250 * time.Millisecond

// DefaultKeysMaxStaleness is admin.keys_max_staleness's default, for a
// config built without defaults.
const DefaultKeysMaxStaleness = 30 * time.Second

// KeysMaxStaleness is how long run-time keys are trusted without a read of
// the keys document (admin.keys_max_staleness).
func KeysMaxStaleness(file *config.File) time.Duration {
	if b := file.Admin.KeysMaxStaleness; b > 0 {
		return b
	}
	return DefaultKeysMaxStaleness
}

// KeyBudget is a budget in the admin API's JSON form.
type KeyBudget struct {
	Dimension string  `json:"dimension"`
	Limit     int64   `json:"limit"`
	Window    string  `json:"window"`
	Mode      string  `json:"mode,omitempty"`
	WarnRatio float64 `json:"warn_ratio,omitempty"`
}

// StoredKey is one run-time key as the state store keeps it: its hash,
// never the key.
type StoredKey struct {
	ID          string      `json:"id"`
	Tenant      string      `json:"tenant"`
	Name        string      `json:"name,omitempty"`
	Hash        string      `json:"hash"`
	CreatedAt   time.Time   `json:"created_at"`
	ExpiresAt   time.Time   `json:"expires_at,omitzero"`
	Budgets     []KeyBudget `json:"budgets,omitempty"`
	Concurrency int         `json:"concurrency,omitempty"`
}

// KeysState is the keys document.
type KeysState struct {
	Keys []StoredKey `json:"keys"`
	// Revoked keeps a tombstone of every revoked key, so that a revocation
	// survives a store that goes back: an instance merging what it
	// applied into what the store holds never brings a revoked key back
	// (MergeKeys).
	Revoked []RevokedKey `json:"revoked,omitempty"`
}

// RevokedKey is a revoked key's tombstone. One whose key had an expiry is
// dropped once that passed: the key cannot authenticate any more anyway.
type RevokedKey struct {
	ID        string    `json:"id"`
	Tenant    string    `json:"tenant"`
	Hash      string    `json:"hash"`
	RevokedAt time.Time `json:"revoked_at"`
	ExpiresAt time.Time `json:"expires_at,omitzero"`
}

// Config is the stored key as a config key, defaults applied.
func (k StoredKey) Config() (config.APIKey, error) {
	ck := config.APIKey{Hash: k.Hash, Name: k.Name, Concurrency: k.Concurrency, ExpiresAt: k.ExpiresAt, Runtime: true}
	for i, b := range k.Budgets {
		w, err := time.ParseDuration(b.Window)
		if err != nil {
			return ck, InputErr(fmt.Sprintf("budgets[%d].window", i), "must be a duration such as 24h (got %q)", b.Window)
		}
		ck.Budgets = append(ck.Budgets, config.Budget{Dimension: b.Dimension, Limit: b.Limit, Window: w, Mode: b.Mode, WarnRatio: b.WarnRatio})
	}
	config.DefaultKey(&ck)
	return ck, nil
}

// DecodeKeys parses the keys document; an absent one is empty.
func DecodeKeys(b []byte) (KeysState, error) {
	var st KeysState
	if len(b) == 0 {
		return st, nil
	}
	if err := json.Unmarshal(b, &st); err != nil {
		return st, fmt.Errorf("keys document is corrupt: %w", err)
	}
	return st, nil
}

// MergeKeys is the union of a and b as a two-phase set: every tombstone
// of either (less those whose key has expired), and every key of either
// that no tombstone names, in a's order then b's.
func MergeKeys(a, b KeysState, now time.Time) KeysState {
	var out KeysState
	deadID, deadHash := map[string]bool{}, map[string]bool{}
	for _, r := range append(append([]RevokedKey(nil), a.Revoked...), b.Revoked...) {
		if deadID[r.ID] {
			continue
		}
		deadID[r.ID], deadHash[r.Hash] = true, true
		if r.ExpiresAt.IsZero() || now.Before(r.ExpiresAt) {
			out.Revoked = append(out.Revoked, r)
		}
	}
	seen := map[string]bool{}
	for _, k := range append(append([]StoredKey(nil), a.Keys...), b.Keys...) {
		if seen[k.ID] || deadID[k.ID] || deadHash[k.Hash] {
			continue
		}
		seen[k.ID] = true
		out.Keys = append(out.Keys, k)
	}
	return out
}

// KeyIndex is an immutable snapshot of the run-time keys at one revision
// of the keys document.
type KeyIndex struct {
	Doc   statestore.Doc // the revision applied, bytes included
	State KeysState
	Keys  []StoredKey // State.Keys
	ByKey map[[32]byte]*Key
}

// RuntimeKeys follows the shared keys document for one instance: the key
// index in force, when the document was last read, and the repair of a
// store that went back. Safe for concurrent use.
type RuntimeKeys struct {
	store statestore.Store
	keyer *ledger.Keyer
	log   *slog.Logger
	now   func() time.Time

	mu   sync.Mutex               // orders installs of idx
	idx  atomic.Pointer[KeyIndex] // swapped whole
	seen atomic.Int64             // unix ns of the last read or write of the keys document
}

// NewRuntimeKeys follows the keys document of store. Nothing is read
// until Sync or Watch.
func NewRuntimeKeys(store statestore.Store, keyer *ledger.Keyer, log *slog.Logger, now func() time.Time) *RuntimeKeys {
	return &RuntimeKeys{store: store, keyer: keyer, log: log, now: now}
}

// Index is the run-time keys in force; nil before the first read.
func (r *RuntimeKeys) Index() *KeyIndex { return r.idx.Load() }

// Age is how long before now the keys document was last read or written.
func (r *RuntimeKeys) Age(now time.Time) time.Duration {
	return now.Sub(time.Unix(0, r.seen.Load()))
}

// Sync reads the keys document once and applies it.
func (r *RuntimeKeys) Sync(ctx context.Context) error {
	d, err := r.store.Get(ctx, KeysDoc)
	if err != nil {
		return err
	}
	r.seen.Store(r.now().UnixNano())
	r.read(ctx, d)
	return nil
}

// Watch polls the keys document every KeysPoll until ctx ends and applies
// every change; bound names the staleness bound in the log when the store
// stops answering.
func (r *RuntimeKeys) Watch(ctx context.Context, bound func() time.Duration) error {
	failing := false
	err := statestore.Watcher{
		Every: KeysPoll,
		OnRead: func(statestore.Doc) {
			r.seen.Store(r.now().UnixNano())
			if failing {
				r.log.Info("key store answers again")
				failing = false
			}
		},
		OnChange: func(d statestore.Doc) { r.read(ctx, d) },
		OnError: func(err error) {
			if !failing {
				r.log.Warn("key store unreachable; keeping the run-time keys last read for at most admin.keys_max_staleness",
					"bound", bound(), "err", err)
				failing = true
			}
		},
	}.Run(ctx, r.store, KeysDoc)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// Update changes the keys document by compare-and-set and applies what it
// wrote. change starts from the stored state merged with what this
// instance applied, so that a write to a store that went back (before a
// poll noticed) restores what it lost, and a key this instance still
// authenticates can be revoked; tombstones are dropped by now. An error of
// change is returned as is and writes nothing.
func (r *RuntimeKeys) Update(ctx context.Context, now time.Time, change func(st *KeysState) error) error {
	doc, err := statestore.Update(ctx, r.store, KeysDoc, func(old []byte) ([]byte, error) {
		st, err := DecodeKeys(old)
		if err != nil {
			return nil, err
		}
		if cur := r.idx.Load(); cur != nil {
			st = MergeKeys(st, cur.State, now)
		}
		if err := change(&st); err != nil {
			return nil, err
		}
		return json.Marshal(st)
	})
	if err != nil {
		return err
	}
	r.installWritten(doc)
	return nil
}

// read handles one read d of the keys document.
func (r *RuntimeKeys) read(ctx context.Context, d statestore.Doc) {
	cur := r.idx.Load()
	switch {
	case cur == nil || d.After(cur.Doc):
		r.install(d, cur)
		return
	case d.Same(cur.Doc):
		return
	}
	// Neither what is applied nor later: a read that raced a write of this
	// instance, or a store that went back. A read issued now follows every
	// write this instance applied, so it tells the two apart.
	d2, err := r.store.Get(ctx, KeysDoc)
	if err != nil {
		return // the next poll reads again
	}
	cur = r.idx.Load()
	switch {
	case d2.After(cur.Doc):
		r.install(d2, cur)
	case d2.Same(cur.Doc):
	default:
		r.recover(ctx, cur, d2)
	}
}

// recover repairs a keys document that went back from cur's revision to
// d: the union of both is written over d and installed.
func (r *RuntimeKeys) recover(ctx context.Context, cur *KeyIndex, d statestore.Doc) {
	st, err := DecodeKeys(d.Data)
	if err != nil {
		r.log.Error("the keys document is corrupt; rewriting it with the keys this instance applied", "err", err)
		st = KeysState{}
	}
	now := r.now()
	merged := MergeKeys(st, cur.State, now)
	r.log.Warn("the key store went back (failover, restart without persistence or a deleted document); re-adopting it with the keys and revocations this instance had applied",
		"applied_rev", cur.Doc.Rev, "applied_epoch", cur.Doc.Epoch, "store_rev", d.Rev, "store_epoch", d.Epoch,
		"store_keys", len(st.Keys), "merged_keys", len(merged.Keys), "merged_revocations", len(merged.Revoked))
	if b1, b2 := mustJSON(merged), mustJSON(MergeKeys(st, KeysState{}, now)); err == nil && bytes.Equal(b1, b2) {
		r.install(d, cur) // the store holds everything this instance knew
		return
	}
	b, err := json.Marshal(merged)
	if err != nil {
		return
	}
	nd, err := r.store.CompareAndSet(ctx, KeysDoc, d.Rev, b)
	if err != nil {
		// Another instance repaired it first, or the store failed: the
		// next poll reads the outcome.
		r.log.Info("key store repair not written; reading it again at the next poll", "err", err)
		return
	}
	r.seen.Store(r.now().UnixNano())
	r.install(nd, cur)
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
}

// installWritten installs the document a write of this instance just
// stored, unless a later revision of the same history is already applied.
func (r *RuntimeKeys) installWritten(d statestore.Doc) {
	r.seen.Store(r.now().UnixNano())
	r.mu.Lock()
	defer r.mu.Unlock()
	if cur := r.idx.Load(); cur != nil && cur.Doc.After(d) {
		return
	}
	r.installLocked(d)
}

// install installs d if the applied index is still expect.
func (r *RuntimeKeys) install(d statestore.Doc, expect *KeyIndex) {
	r.mu.Lock()
	defer r.mu.Unlock()
	if r.idx.Load() != expect {
		return // a write or another read installed something meanwhile
	}
	r.installLocked(d)
}

// installLocked builds and swaps in the index of d (r.mu held). No
// snapshot is rebuilt: a run-time key names its tenant, resolved at each
// authentication, and its limits travel in its own api_key scope.
func (r *RuntimeKeys) installLocked(d statestore.Doc) {
	st, err := DecodeKeys(d.Data)
	if err != nil {
		r.log.Error("ignoring the keys document", "rev", d.Rev, "err", err)
		return
	}
	st = MergeKeys(st, KeysState{}, r.now()) // a key and its tombstone both present: revoked
	old := r.idx.Load()
	idx := &KeyIndex{Doc: d, State: st, Keys: st.Keys, ByKey: make(map[[32]byte]*Key, len(st.Keys))}
	for _, sk := range st.Keys {
		ck, err := sk.Config()
		if err == nil {
			err = config.ValidateKey("key", ck)
		}
		var k *Key
		if err == nil {
			k, err = BuildKey(sk.Tenant, ck, r.keyer, nil)
		}
		if err != nil {
			r.log.Warn("skipping a run-time key", "tenant", sk.Tenant, "key_id", sk.ID, "err", strings.ReplaceAll(err.Error(), "\n", "; "))
			continue
		}
		if old != nil {
			if prev := old.ByKey[k.Hash]; prev != nil {
				k.RT = prev.RT // in-flight counts survive the swap
			}
		}
		idx.ByKey[k.Hash] = k
	}
	r.idx.Store(idx)
}
