package redisledger

import (
	"context"

	"github.com/sluicehq/sluice/ledger"
)

// registryKey is the SET of every partition (tenant or global scope key, in
// base64url) that may hold records: "<prefix>:partitions". It has no hash
// tag of a tenant, so on a Cluster it lives in its own slot and is written
// with a plain SADD, never from a script.
func (l *Ledger) registryKey() string { return l.prefix + ":partitions" }

// register adds a partition to the registry before this process first
// writes a record in it, so that every instance's Run reclaims it (tenants
// added by a reload, and tenants only another, crashed instance knew). One SADD per partition per process, before its first
// Reserve there. A failed SADD does not fail the Reserve (the store is the
// same, so the script usually fails too); the partition stays pending and
// Run retries it every tick, and every later Reserve there tries again. The
// one gap: a SADD that fails, a Reserve that succeeds, and a crash before
// any retry succeeds; Config.Tenants still covers configured tenants.
func (l *Ledger) register(ctx context.Context, key ledger.ScopeKey) {
	if _, ok := l.registered.Load(key); ok {
		return
	}
	l.pending.Store(key, struct{}{})
	if err := l.sadd(ctx, key); err == nil {
		l.registered.Store(key, struct{}{})
		l.pending.Delete(key)
	}
}

func (l *Ledger) sadd(ctx context.Context, key ledger.ScopeKey) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	defer cancel()
	if err := l.c.SAdd(ctx, l.registryKey(), key.String()).Err(); err != nil {
		return l.storeErr(err)
	}
	return nil
}

// registerPending retries the registrations that failed (Run, every tick).
func (l *Ledger) registerPending(ctx context.Context) {
	l.pending.Range(func(k, _ any) bool {
		key := k.(ledger.ScopeKey)
		if l.sadd(ctx, key) == nil {
			l.registered.Store(key, struct{}{})
			l.pending.Delete(key)
		}
		return ctx.Err() == nil
	})
}

// partitions returns every partition Run reclaims: Config.Tenants, the
// registry and the global partitions this process reserved in, without
// duplicates. A registry read error leaves the partitions known locally.
func (l *Ledger) partitions(ctx context.Context) []ledger.ScopeKey {
	seen := make(map[ledger.ScopeKey]struct{}, len(l.cfg.Tenants))
	var out []ledger.ScopeKey
	add := func(k ledger.ScopeKey) {
		if _, ok := seen[k]; !ok && !k.IsZero() {
			seen[k] = struct{}{}
			out = append(out, k)
		}
	}
	for _, k := range l.cfg.Tenants {
		add(k)
	}
	l.globals.Range(func(k, _ any) bool {
		add(k.(ledger.ScopeKey))
		return true
	})
	sctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	defer cancel()
	it := l.c.SScan(sctx, l.registryKey(), 0, "", 1024).Iterator()
	for it.Next(sctx) {
		if k, err := ledger.ParseScopeKey(it.Val()); err == nil {
			add(k)
		}
	}
	if err := it.Err(); err != nil {
		_ = l.storeErr(err) // counted; the next tick retries
	}
	return out
}
