package scheduler

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

// apiKey is one API key of a tenant in a policy: its hash, how it is shown
// (name or short hash, never the key), and its own ledger scope when it
// has budgets or a concurrency cap. Immutable; rt survives reloads.
type apiKey struct {
	hash      [32]byte
	name      string // configured name; "" when none
	label     string // name, else a short hash prefix
	tenant    string
	scope     ledger.Scope // KindAPIKey; Limits empty when the key has none
	slots     int64        // key concurrency; 0 = none of its own
	expiresAt time.Time    // zero: never
	runtime   bool         // created through the admin API
	rt        *keyRuntime
	// admitted caches sluice_api_key_admissions_total{result="admitted"}
	// of this key (a policy's key, so a reload's rename gets its own).
	admitted atomic.Pointer[prometheus.Counter]
}

// keyRuntime is a key's live counters, kept across reloads.
type keyRuntime struct {
	inflight atomic.Int64 // dispatched, not yet settled (this instance)
}

// metricLabel is the key's value of the "key" metric label: only
// configured names become label values (bounded, chosen by operators).
func (k *apiKey) metricLabel() string {
	if k.name == "" {
		return "_unnamed"
	}
	return k.name
}

// buildKey turns a config key into a policy key. The ledger scope key is
// the Keyer of the key's hash, never of the key.
func buildKey(tenant string, kc config.APIKey, keyer *ledger.Keyer, trt *tenantRuntime) (*apiKey, error) {
	norm := strings.ToLower(kc.Hash)
	k := &apiKey{name: kc.Name, label: kc.Label(), tenant: tenant, slots: int64(kc.Concurrency), expiresAt: kc.ExpiresAt, runtime: kc.Runtime}
	if _, err := hex.Decode(k.hash[:], []byte(strings.TrimPrefix(norm, "sha256:"))); err != nil {
		return nil, fmt.Errorf("bad key hash")
	}
	k.scope = ledger.Scope{Kind: ledger.KindAPIKey, Key: keyer.Key(ledger.KindAPIKey, norm)}
	for _, b := range kc.Budgets {
		l, err := limitOf(b)
		if err != nil {
			return nil, err
		}
		k.scope.Limits = append(k.scope.Limits, l)
	}
	if k.slots > 0 {
		k.scope.Limits = append(k.scope.Limits, ledger.Limit{Dim: ledger.Slots, Max: k.slots})
	}
	if trt == nil {
		k.rt = &keyRuntime{}
		return k, nil
	}
	if k.rt = trt.keys[k.hash]; k.rt == nil {
		k.rt = &keyRuntime{}
		if trt.keys == nil {
			trt.keys = map[[32]byte]*keyRuntime{}
		}
		trt.keys[k.hash] = k.rt
	}
	return k, nil
}

// keyScope is the call's api_key scope for the Reserve, if its key has
// limits of its own.
func (c *call) keyScope() (ledger.Scope, bool) {
	if c.key == nil || len(c.key.scope.Limits) == 0 {
		return ledger.Scope{}, false
	}
	return c.key.scope, true
}

// keyAtCap reports whether the call's key has its concurrency in flight on
// this instance (the dispatch predicate parks the tenant then; the ledger
// slot enforces the cap fleet-wide).
func (c *call) keyAtCap() bool {
	k := c.key
	return k != nil && k.slots > 0 && k.rt.inflight.Load() >= k.slots
}

// keyInflight moves the call's key in-flight count by d.
func (c *call) keyInflight(d int64) {
	if c.key != nil {
		c.key.rt.inflight.Add(d)
	}
}
