package policy

import (
	"encoding/hex"
	"fmt"
	"strings"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// Key is one API key of a tenant in a snapshot: its hash, how it is shown
// (name or short hash, never the key), and its own ledger scope when it
// has budgets or a concurrency cap. Immutable but for the Admitted cache;
// RT survives reloads.
type Key struct {
	Hash      [32]byte
	Name      string // configured name; "" when none
	Label     string // name, else a short hash prefix
	Tenant    string
	Scope     ledger.Scope // KindAPIKey; Limits empty when the key has none
	Slots     int64        // key concurrency; 0 = none of its own
	ExpiresAt time.Time    // zero: never
	Runtime   bool         // created through the admin API
	RT        *KeyRuntime
	// Admitted caches the server's sluice_api_key_admissions_total{result="admitted"}
	// child of this key (a snapshot's key, so a reload's rename gets its own).
	Admitted atomic.Pointer[prometheus.Counter]
}

// KeyRuntime is a key's live counters, kept across reloads.
type KeyRuntime struct {
	Inflight atomic.Int64 // dispatched, not yet settled (this instance)
}

// MetricLabel is the key's value of the "key" metric label: only
// configured names become label values (bounded, chosen by operators).
func (k *Key) MetricLabel() string {
	if k.Name == "" {
		return "_unnamed"
	}
	return k.Name
}

// BuildKey turns a config key into a snapshot's key; trt, when not nil,
// keeps the key's live counters across rebuilds. The ledger scope key is
// the Keyer of the key's hash, never of the key.
func BuildKey(tenant string, kc config.APIKey, keyer *ledger.Keyer, trt *TenantRuntime) (*Key, error) {
	norm := strings.ToLower(kc.Hash)
	k := &Key{Name: kc.Name, Label: kc.Label(), Tenant: tenant, Slots: int64(kc.Concurrency), ExpiresAt: kc.ExpiresAt, Runtime: kc.Runtime}
	if _, err := hex.Decode(k.Hash[:], []byte(strings.TrimPrefix(norm, "sha256:"))); err != nil {
		return nil, fmt.Errorf("bad key hash")
	}
	k.Scope = ledger.Scope{Kind: ledger.KindAPIKey, Key: keyer.Key(ledger.KindAPIKey, norm)}
	for _, b := range kc.Budgets {
		l, err := LimitOf(b)
		if err != nil {
			return nil, err
		}
		k.Scope.Limits = append(k.Scope.Limits, l)
	}
	if k.Slots > 0 {
		k.Scope.Limits = append(k.Scope.Limits, ledger.Limit{Dim: ledger.Slots, Max: k.Slots})
	}
	if trt == nil {
		k.RT = &KeyRuntime{}
		return k, nil
	}
	if k.RT = trt.Keys[k.Hash]; k.RT == nil {
		k.RT = &KeyRuntime{}
		if trt.Keys == nil {
			trt.Keys = map[[32]byte]*KeyRuntime{}
		}
		trt.Keys[k.Hash] = k.RT
	}
	return k, nil
}
