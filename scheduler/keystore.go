package scheduler

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/policy"
)

// The admin API's operations on run-time keys (policy.RuntimeKeys follows
// the shared document they write; docs/operations.md "API keys at run
// time").

// KeyBudget is a budget in the admin API's JSON form.
type KeyBudget = policy.KeyBudget

// KeyRow is one key as GET /admin/keys lists it (no secret).
type KeyRow struct {
	ID          string      `json:"id,omitempty"` // run-time keys only
	Tenant      string      `json:"tenant"`
	Name        string      `json:"name,omitempty"`
	Label       string      `json:"label"`
	Hash        string      `json:"hash_prefix"`
	Source      string      `json:"source"` // config | admin
	CreatedAt   *time.Time  `json:"created_at,omitempty"`
	ExpiresAt   *time.Time  `json:"expires_at,omitempty"`
	Expired     bool        `json:"expired,omitempty"`
	Budgets     []KeyBudget `json:"budgets"`
	Concurrency int         `json:"concurrency,omitempty"`
	// Orphaned: the key's tenant is not in the config (the key is inert).
	Orphaned bool `json:"orphaned,omitempty"`
}

// CreatedKey is the answer to POST /admin/keys: the only time the key is
// shown.
type CreatedKey struct {
	KeyRow
	Key string `json:"key"`
}

// KeyRequest is the body of POST /admin/keys.
type KeyRequest struct {
	Tenant      string      `json:"tenant"`
	Name        string      `json:"name"`
	ExpiresIn   string      `json:"expires_in"` // duration, e.g. 720h; "" never
	ExpiresAt   *time.Time  `json:"expires_at"` // alternative to expires_in
	Budgets     []KeyBudget `json:"budgets"`
	Concurrency int         `json:"concurrency"`
}

// ErrKeyStore reports that the shared key store could not be read or
// written (503: nothing changed, or the change is unknown).
var ErrKeyStore = errors.New("key store unavailable")

// CreateKey creates a run-time key for a configured tenant.
func (s *Server) CreateKey(ctx context.Context, in KeyRequest) (CreatedKey, error) {
	now := s.now().UTC()
	sk := policy.StoredKey{Tenant: in.Tenant, Name: in.Name, CreatedAt: now, Budgets: in.Budgets, Concurrency: in.Concurrency}
	switch {
	case in.ExpiresIn != "" && in.ExpiresAt != nil:
		return CreatedKey{}, inputErr("expires_in", "set expires_in or expires_at, not both")
	case in.ExpiresIn != "":
		d, err := time.ParseDuration(in.ExpiresIn)
		if err != nil || d <= 0 {
			return CreatedKey{}, inputErr("expires_in", "must be a positive duration such as 720h (got %q)", in.ExpiresIn)
		}
		sk.ExpiresAt = now.Add(d)
	case in.ExpiresAt != nil:
		if !in.ExpiresAt.After(now) {
			return CreatedKey{}, inputErr("expires_at", "must be in the future")
		}
		sk.ExpiresAt = in.ExpiresAt.UTC()
	}
	file := s.pol.Load().File
	ti := slices.IndexFunc(file.Tenants, func(t config.Tenant) bool { return t.Name == in.Tenant })
	if ti < 0 {
		return CreatedKey{}, inputErr("tenant", "unknown tenant %q", in.Tenant)
	}
	raw, id, err := newKeySecret()
	if err != nil {
		return CreatedKey{}, err
	}
	sk.ID, sk.Hash = id, config.HashKey(raw)
	ck, err := sk.Config()
	if err != nil {
		return CreatedKey{}, err
	}
	if err := config.ValidateKey("key", ck); err != nil {
		return CreatedKey{}, inputErr("key", "%s", oneLine(err))
	}
	if in.Name != "" && slices.ContainsFunc(file.Tenants[ti].APIKeys, func(k config.APIKey) bool { return k.Name == in.Name }) {
		return CreatedKey{}, inputErr("name", "tenant %q already has a key named %q in its config", in.Tenant, in.Name)
	}
	err = s.keys.Update(ctx, now, func(st *policy.KeysState) error {
		if in.Name != "" && slices.ContainsFunc(st.Keys, func(k policy.StoredKey) bool { return k.Tenant == in.Tenant && k.Name == in.Name }) {
			return inputErr("name", "tenant %q already has a key named %q", in.Tenant, in.Name)
		}
		st.Keys = append(st.Keys, sk)
		return nil
	})
	if err != nil {
		return CreatedKey{}, keyStoreErr(err)
	}
	s.log.Info("api key created", "tenant", sk.Tenant, "key_id", sk.ID, "name", sk.Name)
	s.record(audit.Record{Kind: audit.KindKeyCreate, Tenant: sk.Tenant, Source: "admin",
		Reason: keyAuditReason(sk)})
	return CreatedKey{KeyRow: s.storedRow(sk, true), Key: raw}, nil
}

// RevokeKey deletes a run-time key by id and keeps its tombstone. New
// requests with it get 401 at once on this instance and within a poll
// interval on the others. A key this instance authenticates is revocable
// even when the store lost it (policy.RuntimeKeys.Update).
func (s *Server) RevokeKey(ctx context.Context, id string) (KeyRow, error) {
	var gone policy.StoredKey
	now := s.now().UTC()
	err := s.keys.Update(ctx, now, func(st *policy.KeysState) error {
		i := slices.IndexFunc(st.Keys, func(k policy.StoredKey) bool { return k.ID == id })
		if i < 0 {
			return fmt.Errorf("key %q (keys in the config file are revoked by editing it): %w", id, ErrNotFound)
		}
		gone = st.Keys[i]
		st.Keys = slices.Delete(st.Keys, i, i+1)
		st.Revoked = append(st.Revoked, policy.RevokedKey{ID: gone.ID, Tenant: gone.Tenant, Hash: gone.Hash, RevokedAt: now, ExpiresAt: gone.ExpiresAt})
		return nil
	})
	if err != nil {
		return KeyRow{}, keyStoreErr(err)
	}
	s.log.Info("api key revoked", "tenant", gone.Tenant, "key_id", gone.ID, "name", gone.Name)
	s.record(audit.Record{Kind: audit.KindKeyRevoke, Tenant: gone.Tenant, Source: "admin", Reason: keyAuditReason(gone)})
	return s.storedRow(gone, true), nil
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
			rows = append(rows, KeyRow{Tenant: t.Name, Name: k.Name, Label: k.Label(), Hash: config.ShortHash(k.Hash),
				Source: "config", Budgets: keyBudgets(k.Budgets), Concurrency: k.Concurrency})
		}
	}
	var stored []policy.StoredKey
	if idx := s.keys.Index(); idx != nil {
		stored = idx.Keys
	}
	for _, k := range stored {
		if tenant == "" || k.Tenant == tenant {
			rows = append(rows, s.storedRow(k, pol.Tenants[k.Tenant] != nil))
		}
	}
	sort.SliceStable(rows, func(i, j int) bool { return rows[i].Tenant < rows[j].Tenant })
	return rows
}

func (s *Server) storedRow(k policy.StoredKey, tenantKnown bool) KeyRow {
	ck, _ := k.Config()
	r := KeyRow{ID: k.ID, Tenant: k.Tenant, Name: k.Name, Label: ck.Label(), Hash: config.ShortHash(k.Hash), Source: "admin",
		Budgets: keyBudgets(ck.Budgets), Concurrency: k.Concurrency, Orphaned: !tenantKnown}
	created := k.CreatedAt
	r.CreatedAt = &created
	if !k.ExpiresAt.IsZero() {
		exp := k.ExpiresAt
		r.ExpiresAt, r.Expired = &exp, !s.now().Before(exp)
	}
	return r
}

func keyBudgets(bs []config.Budget) []KeyBudget {
	out := make([]KeyBudget, 0, len(bs))
	for _, b := range bs {
		out = append(out, KeyBudget{Dimension: b.Dimension, Limit: b.Limit, Window: b.Window.String(), Mode: b.Mode, WarnRatio: b.WarnRatio})
	}
	return out
}

func keyAuditReason(k policy.StoredKey) string {
	r := "key " + k.ID
	if k.Name != "" {
		r += " name " + k.Name
	}
	if !k.ExpiresAt.IsZero() {
		r += " expires " + k.ExpiresAt.Format(time.RFC3339)
	}
	return r + " hash " + config.ShortHash(k.Hash)
}

func keyStoreErr(err error) error {
	if errors.Is(err, ErrAdminInput) || errors.Is(err, ErrNotFound) {
		return err
	}
	return fmt.Errorf("%w: %w", ErrKeyStore, err)
}

// newKeySecret returns a new raw key ("sk-sluice-" and 43 base64url
// characters of 256 random bits) and its public id ("key_" and 12 hex
// digits, random too, so the id reveals nothing about the key).
func newKeySecret() (raw, id string, err error) {
	var b [32 + 6]byte
	if _, err := rand.Read(b[:]); err != nil {
		return "", "", fmt.Errorf("key generation: %w", err)
	}
	return "sk-sluice-" + base64.RawURLEncoding.EncodeToString(b[:32]), "key_" + hex.EncodeToString(b[32:]), nil
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

func (e *keysStaleError) apiError() *apiError {
	return &apiError{Status: 503, Code: "key_store_stale", Type: "service_unavailable", Message: e.Error(), RetryAfter: time.Second,
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
