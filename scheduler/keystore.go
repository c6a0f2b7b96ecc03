package scheduler

import (
	"context"
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"slices"
	"sort"
	"time"

	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

// Keys at run time (docs/operations.md "API keys at run time"): POST /admin/keys
// creates a key, returns it once and stores only its hash in the shared
// state store (Redis with the Redis ledger, a file next to the journal
// with the embedded one); every instance polls the document and swaps in
// a new key snapshot when the revision changes, so a new or revoked key takes
// effect fleet-wide within one poll interval, and at once on the instance
// that made the change. Authentication reads the key snapshot once, so a
// revoked key is refused from the next request; requests already admitted
// finish.

// KeysDoc is the state-store document holding the run-time keys.
const KeysDoc = "api-keys"

// KeysPoll is how often instances poll the keys document.
const KeysPoll = 250 * time.Millisecond

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

type KeysState struct {
	Keys []StoredKey `json:"keys"`
	// Revoked keeps a tombstone of every revoked key, so that a revocation
	// survives a store that goes back: an instance merging what it
	// applied into what the store holds never brings a revoked key back
	// (keysync.go).
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

func (k StoredKey) Config() (config.APIKey, error) {
	ck := config.APIKey{Hash: k.Hash, Name: k.Name, Concurrency: k.Concurrency, ExpiresAt: k.ExpiresAt, Runtime: true}
	for i, b := range k.Budgets {
		w, err := time.ParseDuration(b.Window)
		if err != nil {
			return ck, inputErr(fmt.Sprintf("budgets[%d].window", i), "must be a duration such as 24h (got %q)", b.Window)
		}
		ck.Budgets = append(ck.Budgets, config.Budget{Dimension: b.Dimension, Limit: b.Limit, Window: w, Mode: b.Mode, WarnRatio: b.WarnRatio})
	}
	config.DefaultKey(&ck)
	return ck, nil
}

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
	sk := StoredKey{Tenant: in.Tenant, Name: in.Name, CreatedAt: now, Budgets: in.Budgets, Concurrency: in.Concurrency}
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
	doc, err := statestore.Update(ctx, s.keys, KeysDoc, func(old []byte) ([]byte, error) {
		st, err := s.keysToWrite(old, now)
		if err != nil {
			return nil, err
		}
		if in.Name != "" && slices.ContainsFunc(st.Keys, func(k StoredKey) bool { return k.Tenant == in.Tenant && k.Name == in.Name }) {
			return nil, inputErr("name", "tenant %q already has a key named %q", in.Tenant, in.Name)
		}
		st.Keys = append(st.Keys, sk)
		return json.Marshal(st)
	})
	if err != nil {
		return CreatedKey{}, keyStoreErr(err)
	}
	s.installWritten(doc)
	s.log.Info("api key created", "tenant", sk.Tenant, "key_id", sk.ID, "name", sk.Name)
	s.record(audit.Record{Kind: audit.KindKeyCreate, Tenant: sk.Tenant, Source: "admin",
		Reason: keyAuditReason(sk)})
	return CreatedKey{KeyRow: s.storedRow(sk, true), Key: raw}, nil
}

// RevokeKey deletes a run-time key by id and keeps its tombstone. New
// requests with it get 401 at once on this instance and within a poll
// interval on the others. A key this instance authenticates is revocable
// even when the store lost it (keysync.go).
func (s *Server) RevokeKey(ctx context.Context, id string) (KeyRow, error) {
	var gone StoredKey
	now := s.now().UTC()
	doc, err := statestore.Update(ctx, s.keys, KeysDoc, func(old []byte) ([]byte, error) {
		st, err := s.keysToWrite(old, now)
		if err != nil {
			return nil, err
		}
		i := slices.IndexFunc(st.Keys, func(k StoredKey) bool { return k.ID == id })
		if i < 0 {
			return nil, fmt.Errorf("key %q (keys in the config file are revoked by editing it): %w", id, ErrNotFound)
		}
		gone = st.Keys[i]
		st.Keys = slices.Delete(st.Keys, i, i+1)
		st.Revoked = append(st.Revoked, RevokedKey{ID: gone.ID, Tenant: gone.Tenant, Hash: gone.Hash, RevokedAt: now, ExpiresAt: gone.ExpiresAt})
		return json.Marshal(st)
	})
	if err != nil {
		return KeyRow{}, keyStoreErr(err)
	}
	s.installWritten(doc)
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
	var stored []StoredKey
	if idx := s.rtKeys.Load(); idx != nil {
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

func (s *Server) storedRow(k StoredKey, tenantKnown bool) KeyRow {
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

func keyAuditReason(k StoredKey) string {
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
