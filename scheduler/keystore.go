package scheduler

import (
	"context"
	"errors"
	"fmt"
	"sort"
	"time"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/policy"
)

// The admin API's operations on run-time keys (policy.RuntimeKeys follows
// the shared document they write; docs/operations.md "API keys at run
// time").

// KeyBudget is a budget in the admin API's JSON form.
type KeyBudget = policy.KeyBudget

// KeyRow is one key as GET /admin/keys lists it (no secret).
type KeyRow = policy.KeyRow

// CreatedKey is the answer to POST /admin/keys: the only time the key is
// shown.
type CreatedKey = policy.CreatedKey

// KeyRequest is the body of POST /admin/keys.
type KeyRequest = policy.KeyRequest

// ErrKeyStore reports that the shared key store could not be read or
// written (503: nothing changed, or the change is unknown).
var ErrKeyStore = policy.ErrKeyStore

// CreateKey creates a run-time key for a configured tenant.
func (s *Server) CreateKey(ctx context.Context, in KeyRequest) (CreatedKey, error) {
	now := s.now().UTC()
	sk, raw, err := policy.NewStoredKey(s.pol.Load().File, in, now)
	if err != nil {
		return CreatedKey{}, err
	}
	if err := s.keys.Update(ctx, now, policy.AddKey(sk)); err != nil {
		return CreatedKey{}, keyStoreErr(err)
	}
	s.log.Info("api key created", "tenant", sk.Tenant, "key_id", sk.ID, "name", sk.Name)
	s.record(audit.Record{Kind: audit.KindKeyCreate, Tenant: sk.Tenant, Source: "admin", Reason: sk.AuditReason()})
	return CreatedKey{KeyRow: sk.Row(true, s.now()), Key: raw}, nil
}

// RevokeKey deletes a run-time key by id and keeps its tombstone. New
// requests with it get 401 at once on this instance and within a poll
// interval on the others. A key this instance authenticates is revocable
// even when the store lost it (policy.RuntimeKeys.Update).
func (s *Server) RevokeKey(ctx context.Context, id string) (KeyRow, error) {
	var gone policy.StoredKey
	now := s.now().UTC()
	err := s.keys.Update(ctx, now, func(st *policy.KeysState) error {
		var ok bool
		if gone, ok = policy.RevokeKey(st, id, now); !ok {
			return fmt.Errorf("key %q (keys in the config file are revoked by editing it): %w", id, apierr.ErrNotFound)
		}
		return nil
	})
	if err != nil {
		return KeyRow{}, keyStoreErr(err)
	}
	s.log.Info("api key revoked", "tenant", gone.Tenant, "key_id", gone.ID, "name", gone.Name)
	s.record(audit.Record{Kind: audit.KindKeyRevoke, Tenant: gone.Tenant, Source: "admin", Reason: gone.AuditReason()})
	return gone.Row(true, s.now()), nil
}

// ListKeys lists the keys of the config file and of the store, optionally
// of one tenant, without secrets.
func (s *Server) ListKeys(tenant string) []KeyRow {
	pol := s.pol.Load()
	rows := []KeyRow{}
	for _, t := range pol.File.Tenants {
		if tenant != "" && t.Name != tenant {
			continue
		}
		for _, k := range t.APIKeys {
			rows = append(rows, policy.ConfigKeyRow(t.Name, k))
		}
	}
	var stored []policy.StoredKey
	if idx := s.keys.Index(); idx != nil {
		stored = idx.Keys
	}
	now := s.now()
	for _, k := range stored {
		if tenant == "" || k.Tenant == tenant {
			rows = append(rows, k.Row(pol.Tenants[k.Tenant] != nil, now))
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Tenant < rows[j].Tenant })
	return rows
}

func keyStoreErr(err error) error {
	if errors.Is(err, ErrAdminInput) || errors.Is(err, apierr.ErrNotFound) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrKeyStore, err)
}

// SyncKeys loads the run-time keys once (before the listeners open).
func (s *Server) SyncKeys(ctx context.Context) error {
	if err := s.keys.Sync(ctx); err != nil {
		return fmt.Errorf("%w: %w", ErrKeyStore, err)
	}
	return nil
}

// WatchKeys polls the keys document until ctx ends and applies every
// change. It belongs to the process's background group.
func (s *Server) WatchKeys(ctx context.Context) error {
	return s.keys.Watch(ctx, func() time.Duration { return policy.KeysMaxStaleness(s.pol.Load().File) })
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

func (e *keysStaleError) APIError() *apierr.Error {
	return &apierr.Error{Status: 503, Code: "key_store_stale", Type: "service_unavailable", Message: e.Error(), RetryAfter: time.Second,
		Details: map[string]any{"stale_for_ms": e.age.Milliseconds(), "bound_ms": e.bound.Milliseconds()}}
}

// authenticate maps a bearer token to its tenant and key under pol, with
// the run-time keys in force now; a run-time key fails closed once the
// keys document is staler than admin.keys_max_staleness.
func (s *Server) authenticate(pol *policy.Snapshot, authz []byte) (*policy.Tenant, *policy.Key, error) {
	now := s.now()
	t, k, err := pol.Authenticate(authz, now, s.keys.Index())
	if err != nil || !k.Runtime {
		return t, k, err
	}
	if age, bound := s.keys.Age(now), policy.KeysMaxStaleness(pol.File); age > bound {
		return nil, nil, &keysStaleError{age: age, bound: bound}
	}
	return t, k, nil
}
