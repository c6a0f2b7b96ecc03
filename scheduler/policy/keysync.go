package scheduler

import (
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

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
// repaired document at its next poll (keysPoll).
//
// An instance that cannot read the document at all keeps authenticating
// the run-time keys it last read for admin.keys_max_staleness only; past
// it those keys get 503 key_store_stale, because a key revoked meanwhile
// through another instance must not keep working here. Keys of the config
// file do not depend on the store.

// DefaultKeysMaxStaleness is admin.keys_max_staleness's default, for a
// config built without defaults.
const DefaultKeysMaxStaleness = 30 * time.Second

// KeyIndex is an immutable snapshot of the run-time keys at one revision
// of the keys document.
type KeyIndex struct {
	Doc   statestore.Doc // the revision applied, bytes included
	State KeysState
	Keys  []StoredKey // state.Keys
	ByKey map[[32]byte]*Key
}

// SyncKeys loads the run-time keys once (before the listeners open).
func (s *Server) SyncKeys(ctx context.Context) error {
	d, err := s.keys.Get(ctx, KeysDoc)
	if err != nil {
		return fmt.Errorf("%w: %w", ErrKeyStore, err)
	}
	s.keysSeen.Store(s.now().UnixNano())
	s.keysRead(ctx, d)
	return nil
}

// WatchKeys polls the keys document until ctx ends and applies every
// change. It belongs to the process's background group.
func (s *Server) WatchKeys(ctx context.Context) error {
	failing := false
	err := statestore.Watcher{
		Every: KeysPoll,
		OnRead: func(statestore.Doc) {
			s.keysSeen.Store(s.now().UnixNano())
			if failing {
				s.log.Info("key store answers again")
				failing = false
			}
		},
		OnChange: func(d statestore.Doc) { s.keysRead(ctx, d) },
		OnError: func(err error) {
			if !failing {
				s.log.Warn("key store unreachable; keeping the run-time keys last read for at most admin.keys_max_staleness",
					"bound", s.keysMaxStaleness(s.pol.Load()), "err", err)
				failing = true
			}
		},
	}.Run(ctx, s.keys, KeysDoc)
	if errors.Is(err, context.Canceled) {
		return nil
	}
	return err
}

// keysRead handles one read d of the keys document.
func (s *Server) keysRead(ctx context.Context, d statestore.Doc) {
	cur := s.rtKeys.Load()
	switch {
	case cur == nil || d.After(cur.Doc):
		s.installKeys(d, cur)
		return
	case d.Same(cur.Doc):
		return
	}
	// Neither what is applied nor later: a read that raced a write of this
	// instance, or a store that went back. A read issued now follows every
	// write this instance applied, so it tells the two apart.
	d2, err := s.keys.Get(ctx, KeysDoc)
	if err != nil {
		return // the next poll reads again
	}
	cur = s.rtKeys.Load()
	switch {
	case d2.After(cur.Doc):
		s.installKeys(d2, cur)
	case d2.Same(cur.Doc):
	default:
		s.recoverKeys(ctx, cur, d2)
	}
}

// recoverKeys repairs a keys document that went back from cur's revision
// to d: the union of both is written over d and installed.
func (s *Server) recoverKeys(ctx context.Context, cur *KeyIndex, d statestore.Doc) {
	st, err := DecodeKeys(d.Data)
	if err != nil {
		s.log.Error("the keys document is corrupt; rewriting it with the keys this instance applied", "err", err)
		st = KeysState{}
	}
	now := s.now()
	merged := MergeKeys(st, cur.State, now)
	s.log.Warn("the key store went back (failover, restart without persistence or a deleted document); re-adopting it with the keys and revocations this instance had applied",
		"applied_rev", cur.Doc.Rev, "applied_epoch", cur.Doc.Epoch, "store_rev", d.Rev, "store_epoch", d.Epoch,
		"store_keys", len(st.Keys), "merged_keys", len(merged.Keys), "merged_revocations", len(merged.Revoked))
	if b1, b2 := mustJSON(merged), mustJSON(MergeKeys(st, KeysState{}, now)); err == nil && bytes.Equal(b1, b2) {
		s.installKeys(d, cur) // the store holds everything this instance knew
		return
	}
	b, err := json.Marshal(merged)
	if err != nil {
		return
	}
	nd, err := s.keys.CompareAndSet(ctx, KeysDoc, d.Rev, b)
	if err != nil {
		// Another instance repaired it first, or the store failed: the
		// next poll reads the outcome.
		s.log.Info("key store repair not written; reading it again at the next poll", "err", err)
		return
	}
	s.keysSeen.Store(s.now().UnixNano())
	s.installKeys(nd, cur)
}

func mustJSON(v any) []byte {
	b, _ := json.Marshal(v)
	return b
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

// keysToWrite is the state a write of the keys document starts from: the
// stored one merged with what this instance applied, so that a write to a
// store that went back (before a poll noticed) restores what it lost, and
// a key this instance still authenticates can be revoked.
func (s *Server) keysToWrite(old []byte, now time.Time) (KeysState, error) {
	st, err := DecodeKeys(old)
	if err != nil {
		return st, err
	}
	if cur := s.rtKeys.Load(); cur != nil {
		st = MergeKeys(st, cur.State, now)
	}
	return st, nil
}

// installWritten installs the document a write of this instance just
// stored, unless a later revision of the same history is already applied.
func (s *Server) installWritten(d statestore.Doc) {
	s.keysSeen.Store(s.now().UnixNano())
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	if cur := s.rtKeys.Load(); cur != nil && cur.Doc.After(d) {
		return
	}
	s.installKeysLocked(d)
}

// installKeys installs d if the applied snapshot is still expect.
func (s *Server) installKeys(d statestore.Doc, expect *KeyIndex) {
	s.keysMu.Lock()
	defer s.keysMu.Unlock()
	if s.rtKeys.Load() != expect {
		return // a write or another read installed something meanwhile
	}
	s.installKeysLocked(d)
}

// installKeysLocked builds and swaps in the snapshot of d (s.keysMu held).
// The policy is not rebuilt: a run-time key names its tenant, resolved at
// each authentication, and its limits travel in its own api_key scope.
func (s *Server) installKeysLocked(d statestore.Doc) {
	st, err := DecodeKeys(d.Data)
	if err != nil {
		s.log.Error("ignoring the keys document", "rev", d.Rev, "err", err)
		return
	}
	st = MergeKeys(st, KeysState{}, s.now()) // a key and its tombstone both present: revoked
	old := s.rtKeys.Load()
	idx := &KeyIndex{Doc: d, State: st, Keys: st.Keys, ByKey: make(map[[32]byte]*Key, len(st.Keys))}
	for _, sk := range st.Keys {
		ck, err := sk.Config()
		if err == nil {
			err = config.ValidateKey("key", ck)
		}
		var k *Key
		if err == nil {
			k, err = BuildKey(sk.Tenant, ck, s.keyer, nil)
		}
		if err != nil {
			s.log.Warn("skipping a run-time key", "tenant", sk.Tenant, "key_id", sk.ID, "err", oneLine(err))
			continue
		}
		if old != nil {
			if prev := old.ByKey[k.Hash]; prev != nil {
				k.RT = prev.RT // in-flight counts survive the swap
			}
		}
		idx.ByKey[k.Hash] = k
	}
	s.rtKeys.Store(idx)
}

// keysStaleError refuses a run-time key while the keys document has not
// been read for longer than admin.keys_max_staleness.
type keysStaleError struct {
	age, bound time.Duration
}

func (e *keysStaleError) Error() string {
	return fmt.Sprintf("run-time API keys cannot be checked: the key store has not answered for %s (admin.keys_max_staleness %s)",
		e.age.Round(time.Second), e.bound)
}

func (e *keysStaleError) apiError() *apiError {
	return &apiError{Status: 503, Code: "key_store_stale", Type: "service_unavailable", Message: e.Error(), RetryAfter: time.Second,
		Details: map[string]any{"stale_for_ms": e.age.Milliseconds(), "bound_ms": e.bound.Milliseconds()}}
}

func (s *Server) keysMaxStaleness(pol *Snapshot) time.Duration {
	if b := pol.File.Admin.KeysMaxStaleness; b > 0 {
		return b
	}
	return DefaultKeysMaxStaleness
}

// authenticate maps a bearer token to its tenant and key under pol, with
// the run-time keys in force now; a run-time key fails closed once the
// keys document is staler than admin.keys_max_staleness.
func (s *Server) authenticate(pol *Snapshot, authz []byte) (*Tenant, *Key, error) {
	now := s.now()
	t, k, err := pol.Authenticate(authz, now, s.rtKeys.Load())
	if err != nil || !k.Runtime {
		return t, k, err
	}
	if age, bound := now.Sub(time.Unix(0, s.keysSeen.Load())), s.keysMaxStaleness(pol); age > bound {
		return nil, nil, &keysStaleError{age: age, bound: bound}
	}
	return t, k, nil
}
