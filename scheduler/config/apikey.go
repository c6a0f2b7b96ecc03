package config

import (
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// APIKey is one entry of tenants[].api_keys. In YAML it is either the bare
// hash string ("sha256:<hex>", the original form) or a mapping
//
//	{hash: "sha256:…", name: ci-bot, budgets: [...], concurrency: N}
//
// A key's budgets and concurrency are enforced in addition to the
// tenant's, reserved atomically with them.
type APIKey struct {
	// Hash is "sha256:<64 hex digits>" of the raw key (`sluice key hash`).
	Hash string `yaml:"hash"`
	// Name labels the key in metrics, status and error details. Optional;
	// unnamed keys are shown by a short hash prefix and are counted under
	// the metric label "_unnamed".
	Name string `yaml:"name"`
	// Budgets are the key's own windows (same shape as a tenant's).
	// Optional; none means only the tenant's budgets apply.
	Budgets []Budget `yaml:"budgets"`
	// Concurrency caps the key's requests in flight (fleet-wide, a ledger
	// slot). Optional; 0 means only the tenant's concurrency applies.
	Concurrency int `yaml:"concurrency"`
	// ExpiresAt ends a key created at run time (the admin API); zero never
	// expires. Not settable in YAML.
	ExpiresAt time.Time `yaml:"-"`
	// Runtime marks a key created through the admin API (not in YAML).
	Runtime bool `yaml:"-"`
}

// Keys turns hash strings into hash-only entries (for tests and tools).
func Keys(hashes ...string) []APIKey {
	out := make([]APIKey, len(hashes))
	for i, h := range hashes {
		out[i] = APIKey{Hash: h}
	}
	return out
}

// UnmarshalYAML accepts the bare hash string or the mapping form.
func (k *APIKey) UnmarshalYAML(n *yaml.Node) error {
	if n.Kind == yaml.ScalarNode {
		*k = APIKey{Hash: n.Value}
		return nil
	}
	type plain APIKey
	var p plain
	if err := n.Decode(&p); err != nil {
		return err
	}
	*k = APIKey(p)
	return nil
}

// MarshalYAML writes a hash-only key in the short string form.
func (k APIKey) MarshalYAML() (any, error) {
	if k.Name == "" && len(k.Budgets) == 0 && k.Concurrency == 0 {
		return k.Hash, nil
	}
	type plain APIKey
	return plain(k), nil
}

// Label is how the key appears in error details and the status page: its
// name, else "sha256:" and the first 8 hex digits of its hash (never the
// key).
func (k APIKey) Label() string {
	if k.Name != "" {
		return k.Name
	}
	return ShortHash(k.Hash)
}

// ShortHash is the first 8 hex digits of a "sha256:<hex>" key hash.
func ShortHash(h string) string {
	h = strings.ToLower(strings.TrimPrefix(h, "sha256:"))
	if len(h) > 8 {
		h = h[:8]
	}
	return "sha256:" + h
}

func (k *APIKey) applyDefaults() {
	for j := range k.Budgets {
		k.Budgets[j].applyDefaults()
	}
}

// validateKey checks one api_keys entry; keyIdx and names detect
// duplicates across the file and within the tenant.
func validateKey(v *validator, kp string, k APIKey, keyIdx, names map[string]string) {
	if !validKeyHash(k.Hash) {
		field := kp
		if k.Name != "" || len(k.Budgets) > 0 || k.Concurrency != 0 {
			field = kp + ".hash"
		}
		v.add("%s must be \"sha256:<64 hex digits>\" (run 'sluice key hash'); raw keys are never stored", field)
		return
	}
	h := strings.ToLower(k.Hash)
	if other, dup := keyIdx[h]; dup {
		v.add("%s duplicates %s", kp, other)
	}
	keyIdx[h] = kp
	if k.Name != "" {
		if !validKeyName(k.Name) {
			v.add("%s.name %q must be 1..64 of letters, digits, '.', '_' and '-'", kp, k.Name)
		}
		if other, dup := names[k.Name]; dup {
			v.add("%s.name %q duplicates %s", kp, k.Name, other)
		}
		names[k.Name] = kp
	}
	if k.Concurrency < 0 {
		v.add("%s.concurrency must be >= 0", kp)
	}
	validateBudgets(v, kp+".budgets", k.Budgets)
}

// ValidateKey checks a key created at run time as if it were entry
// tenants[tenant].api_keys[i] of a file without other keys.
func ValidateKey(path string, k APIKey) error {
	var v validator
	validateKey(&v, path, k, map[string]string{}, map[string]string{})
	return v.err()
}

// DefaultKey fills a run-time key's budget defaults (mode, warn_ratio).
func DefaultKey(k *APIKey) { k.applyDefaults() }

func validKeyName(s string) bool {
	if len(s) == 0 || len(s) > 64 {
		return false
	}
	for _, c := range s {
		switch {
		case c >= 'a' && c <= 'z', c >= 'A' && c <= 'Z', c >= '0' && c <= '9', c == '.', c == '_', c == '-':
		default:
			return false
		}
	}
	return true
}
