package ledger_test

import (
	"io"
	"log/slog"
	"os"
	"path/filepath"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/ledgertest"
)

// fakeClock is a manual ledger clock, safe for concurrent use.
type fakeClock struct {
	mu  sync.Mutex
	now time.Time
}

func (c *fakeClock) Now() time.Time {
	c.mu.Lock()
	defer c.mu.Unlock()
	return c.now
}

func (c *fakeClock) Advance(d time.Duration) {
	c.mu.Lock()
	c.now = c.now.Add(d)
	c.mu.Unlock()
}

var quiet = slog.New(slog.NewTextHandler(io.Discard, nil))

func memoryFactory(t *testing.T, cfg ledgertest.Config) *ledgertest.Backend {
	clock := &fakeClock{now: time.Date(2026, 11, 25, 12, 0, 0, 123e6, time.UTC)}
	var orphans atomic.Int64
	mc := ledger.MemoryConfig{
		Clock:              clock.Now,
		LeaseTTL:           cfg.LeaseTTL,
		MaxLeaseTTL:        cfg.MaxLeaseTTL,
		TombstoneRetention: cfg.TombstoneRetention,
		OnOrphan:           func(ledger.Ref) { orphans.Add(1) },
		Logger:             quiet,
	}
	if cfg.Durable {
		mc.Journal = filepath.Join(fastTempDir(t), "ledger.journal")
	}
	m, err := ledger.NewMemory(mc)
	require.NoError(t, err)
	cur := m
	t.Cleanup(func() { _ = cur.Close() })
	b := &ledgertest.Backend{
		Ledger:  m,
		Now:     clock.Now,
		Advance: clock.Advance,
		Audit:   func(tenant ledger.ScopeKey) error { return cur.AuditTenant(tenant) },
		Dump:    func(tenant ledger.ScopeKey) string { return cur.Dump(tenant) },
		Corrupt: func(kind ledgertest.Corruption, ref ledger.Ref, scope ledger.ScopeKey) error {
			return cur.CorruptForTest(int(kind), ref, scope)
		},
		Orphans:      func() int { return int(orphans.Load()) },
		AtomicGlobal: true,
	}
	if cfg.Durable {
		restarts := 0
		b.Restart = func() (ledger.Ledger, error) {
			restarts++
			if restarts%2 == 0 { // every other restart also replays an online compaction
				if err := cur.Compact(t.Context()); err != nil {
					return nil, err
				}
			}
			if err := cur.Close(); err != nil {
				return nil, err
			}
			next, err := ledger.NewMemory(mc)
			if err != nil {
				return nil, err
			}
			cur = next
			return next, nil
		}
	}
	return b
}

// fastTempDir is a temporary directory on tmpfs when there is one, so the
// model test's thousands of fsyncs stay cheap; T15 uses the real disk.
func fastTempDir(t *testing.T) string {
	dir, err := os.MkdirTemp("/dev/shm", "ledgertest")
	if err != nil {
		return t.TempDir()
	}
	t.Cleanup(func() { _ = os.RemoveAll(dir) })
	return dir
}

func TestMemoryConformance(t *testing.T) {
	ledgertest.Run(t, memoryFactory)
}

var _ ledger.Ledger = (*ledger.Memory)(nil)
