package policy

import (
	"crypto/rand"
	"encoding/base64"
	"encoding/hex"
	"errors"
	"fmt"
	"slices"
	"strings"
	"time"

	"github.com/sluicehq/sluice/scheduler/config"
)

// The admin API's run-time keys as values: the request that creates one,
// the rows that list them, the audit text (docs/operations.md "API keys at
// run time"). RuntimeKeys stores and follows them.

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

// NewStoredKey checks a request for a key of a tenant of file at now and
// makes the key: the stored key (its hash) and the raw key, shown once.
// A bad request is an InputError naming its field; a name clash with a
// key already stored is the caller's to check (AddKey).
func NewStoredKey(file *config.File, in KeyRequest, now time.Time) (StoredKey, string, error) {
	sk := StoredKey{Tenant: in.Tenant, Name: in.Name, CreatedAt: now, Budgets: in.Budgets, Concurrency: in.Concurrency}
	switch {
	case in.ExpiresIn != "" && in.ExpiresAt != nil:
		return sk, "", InputErr("expires_in", "set expires_in or expires_at, not both")
	case in.ExpiresIn != "":
		d, err := time.ParseDuration(in.ExpiresIn)
		if err != nil || d <= 0 {
			return sk, "", InputErr("expires_in", "must be a positive duration such as 720h (got %q)", in.ExpiresIn)
		}
		sk.ExpiresAt = now.Add(d)
	case in.ExpiresAt != nil:
		if !in.ExpiresAt.After(now) {
			return sk, "", InputErr("expires_at", "must be in the future")
		}
		sk.ExpiresAt = in.ExpiresAt.UTC()
	}
	ti := slices.IndexFunc(file.Tenants, func(t config.Tenant) bool { return t.Name == in.Tenant })
	if ti < 0 {
		return sk, "", InputErr("tenant", "unknown tenant %q", in.Tenant)
	}
	raw, id, err := newKeySecret()
	if err != nil {
		return sk, "", err
	}
	sk.ID, sk.Hash = id, config.HashKey(raw)
	ck, err := sk.Config()
	if err != nil {
		return sk, "", err
	}
	if err := config.ValidateKey("key", ck); err != nil {
		return sk, "", InputErr("key", "%s", strings.ReplaceAll(err.Error(), "\n", "; "))
	}
	if in.Name != "" && slices.ContainsFunc(file.Tenants[ti].APIKeys, func(k config.APIKey) bool { return k.Name == in.Name }) {
		return sk, "", InputErr("name", "tenant %q already has a key named %q in its config", in.Tenant, in.Name)
	}
	return sk, raw, nil
}

// AddKey is the change to the keys document that stores sk, refused when
// its tenant already has a stored key of that name.
func AddKey(sk StoredKey) func(st *KeysState) error {
	return func(st *KeysState) error {
		if sk.Name != "" && slices.ContainsFunc(st.Keys, func(k StoredKey) bool { return k.Tenant == sk.Tenant && k.Name == sk.Name }) {
			return InputErr("name", "tenant %q already has a key named %q", sk.Tenant, sk.Name)
		}
		st.Keys = append(st.Keys, sk)
		return nil
	}
}

// RevokeKey deletes the stored key id from st and keeps its tombstone,
// revoked at now; it returns the key, or false when st has none with id.
func RevokeKey(st *KeysState, id string, now time.Time) (StoredKey, bool) {
	i := slices.IndexFunc(st.Keys, func(k StoredKey) bool { return k.ID == id })
	if i < 0 {
		return StoredKey{}, false
	}
	gone := st.Keys[i]
	st.Keys = slices.Delete(st.Keys, i, i+1)
	st.Revoked = append(st.Revoked, RevokedKey{ID: gone.ID, Tenant: gone.Tenant, Hash: gone.Hash, RevokedAt: now, ExpiresAt: gone.ExpiresAt})
	return gone, true
}

// ConfigKeyRow is the row of a key of the config file.
func ConfigKeyRow(tenant string, k config.APIKey) KeyRow {
	return KeyRow{Tenant: tenant, Name: k.Name, Label: k.Label(), Hash: config.ShortHash(k.Hash),
		Source: "config", Budgets: keyBudgets(k.Budgets), Concurrency: k.Concurrency}
}

// Row is k's row at now; tenantKnown tells whether its tenant is in the
// config (else the key is orphaned).
func (k StoredKey) Row(tenantKnown bool, now time.Time) KeyRow {
	ck, _ := k.Config()
	r := KeyRow{ID: k.ID, Tenant: k.Tenant, Name: k.Name, Label: ck.Label(), Hash: config.ShortHash(k.Hash), Source: "admin",
		Budgets: keyBudgets(ck.Budgets), Concurrency: k.Concurrency, Orphaned: !tenantKnown}
	created := k.CreatedAt
	r.CreatedAt = &created
	if !k.ExpiresAt.IsZero() {
		exp := k.ExpiresAt
		r.ExpiresAt, r.Expired = &exp, !now.Before(exp)
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

// AuditReason is the audit record's text for a change of k: its id, name,
// expiry and hash prefix, never the key.
func (k StoredKey) AuditReason() string {
	r := "key " + k.ID
	if k.Name != "" {
		r += " name " + k.Name
	}
	if !k.ExpiresAt.IsZero() {
		r += " expires " + k.ExpiresAt.Format(time.RFC3339)
	}
	return r + " hash " + config.ShortHash(k.Hash)
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
