package audit_test

import (
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/audit"
)

// admitRecord is what the server writes on every admission decision.
var admitRecord = audit.Record{Kind: audit.KindAdmit, Tenant: "tenant-3", RequestID: "req-01JD7Z8K4QW3XAMPLE",
	TokensHeld: 4096, GPUMs: 1200, USDMicros: 8192}

func openBench(b *testing.B, cfg audit.Config) *audit.Log {
	b.Helper()
	cfg.Path = filepath.Join(b.TempDir(), "audit.log")
	l, err := audit.Open(cfg)
	require.NoError(b, err)
	b.Cleanup(func() { require.NoError(b, l.Close()) })
	return l
}

func BenchmarkAppend(b *testing.B) {
	l := openBench(b, audit.Config{})
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Append(admitRecord); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkAppendParallel(b *testing.B) {
	l := openBench(b, audit.Config{})
	b.ReportAllocs()
	b.RunParallel(func(pb *testing.PB) {
		for pb.Next() {
			if err := l.Append(admitRecord); err != nil {
				b.Error(err)
				return
			}
		}
	})
}

func BenchmarkAppendFields(b *testing.B) {
	l := openBench(b, audit.Config{})
	rec := audit.Record{Kind: audit.KindBudgetSet, Tenant: "tenant-3",
		Fields: map[string]any{"dim": "tokens", "limit": 100000, "window": "1m"}}
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Append(rec); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkAppendSync fsyncs every 64 KiB write (Config.Sync).
func BenchmarkAppendSync(b *testing.B) {
	l := openBench(b, audit.Config{Sync: true})
	b.ReportAllocs()
	for b.Loop() {
		if err := l.Append(admitRecord); err != nil {
			b.Fatal(err)
		}
	}
}

// BenchmarkVerify reports the cost per line of verifying a 10,000-line log.
func BenchmarkVerify(b *testing.B) {
	path := filepath.Join(b.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: path})
	require.NoError(b, err)
	const lines = 10_000
	for range lines {
		require.NoError(b, l.Append(admitRecord))
	}
	require.NoError(b, l.Close())
	b.ReportAllocs()
	for b.Loop() {
		rep, err := audit.Verify(path)
		if err != nil || rep.Lines != lines {
			b.Fatal(rep, err)
		}
	}
	b.ReportMetric(float64(b.Elapsed().Nanoseconds())/float64(b.N*lines), "ns/line")
}
