package redisledger_test

import (
	"context"
	"os"
	"strconv"
	"sync"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// TestPairCPU is a measuring tool, not a test (it runs only with
// SLUICE_PAIRCPU=N): N Reserve(Dispatch)+Settle pairs of the benchmark's
// shape from SLUICE_G goroutines (default 8), against SLUICE_REDIS_ADDR (else
// its own server), with a global scope on every request when SLUICE_GLOBAL
// is set; it logs redis-server CPU per pair. testdata/pairinstr.sh runs it
// against a redis-server under callgrind, whose instruction counts do not
// depend on what else the machine is running.
func TestPairCPU(t *testing.T) {
	n, _ := strconv.Atoi(os.Getenv("SLUICE_PAIRCPU"))
	if n == 0 {
		t.Skip()
	}
	g, _ := strconv.Atoi(os.Getenv("SLUICE_G"))
	if g == 0 {
		g = 8
	}
	addr := os.Getenv("SLUICE_REDIS_ADDR")
	if addr == "" {
		addr = startRedis(t).Addr()
	}
	l := newLedger(t, addr, func(c *redisledger.Config) {
		c.StoreTimeout = time.Minute
		c.MaxBatch = *benchMaxBatch

	})
	if err := l.LoadScripts(context.Background()); err != nil {
		t.Fatal(err)
	}
	scopes := make([][]ledger.Scope, 16)
	for i := range scopes {
		scopes[i] = []ledger.Scope{
			{Kind: ledger.KindTenant, Key: testKeyer.Key(ledger.KindTenant, "bench-"+string(rune('a'+i))), Limits: []ledger.Limit{
				{Dim: ledger.Tokens, Window: time.Hour, Max: ledger.MaxAmount},
				{Dim: ledger.Requests, Window: time.Minute, Max: ledger.MaxAmount},
				{Dim: ledger.Slots, Max: 1 << 20}}},
			{Kind: ledger.KindAPIKey, Key: testKeyer.Key(ledger.KindAPIKey, "bench-key-"+string(rune('a'+i))), Limits: []ledger.Limit{
				{Dim: ledger.Tokens, Window: 24 * time.Hour, Max: ledger.MaxAmount}}},
		}
	}
	if os.Getenv("SLUICE_GLOBAL") != "" {
		g := ledger.Scope{Kind: ledger.KindGlobal, Key: testKeyer.Key(ledger.KindGlobal, ""), Limits: []ledger.Limit{
			{Dim: ledger.Tokens, Window: time.Hour, Max: ledger.MaxAmount}}}
		for i := range scopes {
			scopes[i] = append(scopes[i], g)
		}
	}
	ctx := context.Background()
	owner := ledger.NewOwner()
	for i := range 64 {
		_, _ = pair(ctx, l, scopes[i%len(scopes)], owner)
	}
	cpu0 := serverCPU(t, addr)
	var wg sync.WaitGroup
	for w := range g {
		wg.Go(func() {
			for i := range n / g {
				if _, err := pair(ctx, l, scopes[(w+i)%len(scopes)], owner); err != nil {
					t.Error(err)
					return
				}
			}
		})
	}
	wg.Wait()
	t.Logf("srv-µs/pair %.1f", (serverCPU(t, addr)-cpu0).Seconds()*1e6/float64(n))
}
