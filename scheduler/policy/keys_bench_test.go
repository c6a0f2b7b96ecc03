package policy

import (
	"context"
	"log/slog"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// BenchmarkAuthenticate is the per-request cost of mapping a bearer token
// to its tenant and key: a config key, a run-time key (second map), and an
// unknown key.
func BenchmarkAuthenticate(b *testing.B) {
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		b.Fatal(err)
	}
	cfg := &config.File{Tenants: []config.Tenant{{Name: "a", Concurrency: 1,
		APIKeys: []config.APIKey{{Hash: config.HashKey("sk-config"), Name: "ci",
			Budgets: []config.Budget{{Dimension: "tokens", Limit: 1000, Window: time.Hour, Mode: "block"}}}}}}}
	pol, err := Build(cfg, 1, keyer, NewRuntimes(nil))
	if err != nil {
		b.Fatal(err)
	}
	rk, err := BuildKey("a", config.APIKey{Hash: config.HashKey("sk-runtime"), Name: "rt"}, keyer, nil)
	if err != nil {
		b.Fatal(err)
	}
	idx := &KeyIndex{ByKey: map[[32]byte]*Key{rk.Hash: rk}}
	now := time.Now()
	for _, bc := range []struct{ name, authz string }{
		{"config", "Bearer sk-config"}, {"runtime", "Bearer sk-runtime"}, {"unknown", "Bearer sk-nope"},
	} {
		b.Run(bc.name, func(b *testing.B) {
			authz := []byte(bc.authz)
			b.ReportAllocs()
			for b.Loop() {
				_, _, _ = pol.Authenticate(authz, now, idx)
			}
		})
	}
}

// BenchmarkReserveKeyScope is the embedded ledger's Reserve+Release with
// the tenant scope alone and with an api_key scope of its own.
func BenchmarkReserveKeyScope(b *testing.B) {
	keyer, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	if err != nil {
		b.Fatal(err)
	}
	tk := keyer.Key(ledger.KindTenant, "a")
	tenantScope := ledger.Scope{Kind: ledger.KindTenant, Key: tk, Limits: []ledger.Limit{
		{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 40, Mode: ledger.Block}, {Dim: ledger.Slots, Max: 1 << 20}}}
	keyScope := ledger.Scope{Kind: ledger.KindAPIKey, Key: keyer.Key(ledger.KindAPIKey, config.HashKey("k")), Limits: []ledger.Limit{
		{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 40, Mode: ledger.Block}}}
	for _, bc := range []struct {
		name   string
		scopes []ledger.Scope
	}{{"tenant", []ledger.Scope{tenantScope}}, {"tenant+api_key", []ledger.Scope{tenantScope, keyScope}}} {
		b.Run(bc.name, func(b *testing.B) {
			m, err := ledger.NewMemory(ledger.MemoryConfig{Registerer: prometheus.NewRegistry(), Logger: slog.New(slog.DiscardHandler)})
			if err != nil {
				b.Fatal(err)
			}
			owner := ledger.NewOwner()
			var held ledger.Amounts
			held[ledger.Requests], held[ledger.InputTokens], held[ledger.OutputTokens], held[ledger.Tokens] = 1, 20, 80, 100
			ctx := context.Background()
			b.ReportAllocs()
			for b.Loop() {
				ref := ledger.Ref{Tenant: tk, ID: ledger.NewRequestID()}
				if _, err := m.Reserve(ctx, ledger.ReserveRequest{Ref: ref, Owner: owner, Held: held, Scopes: bc.scopes,
					LeaseTTL: time.Minute, PolicyVersion: 1}); err != nil {
					b.Fatal(err)
				}
				if err := m.Release(ctx, ref, owner); err != nil {
					b.Fatal(err)
				}
			}
		})
	}
}
