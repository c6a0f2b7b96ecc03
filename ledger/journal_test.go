package ledger_test

import (
	"bufio"
	"context"
	"encoding/binary"
	"fmt"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

var (
	jTenant = ledger.ScopeKey{0x7e, 1}
	jOwner  = ledger.Owner{0x0c}
	jT0     = time.Date(2026, 11, 25, 12, 0, 0, 0, time.UTC)
	jLimits = []ledger.Limit{{Dim: ledger.Tokens, Window: 24 * time.Hour, Max: 1 << 40}, {Dim: ledger.Slots, Max: 1 << 20}}
)

func jID(i int) ledger.RequestID {
	var id ledger.RequestID
	id[0] = 0x1d
	binary.LittleEndian.PutUint64(id[8:], uint64(i))
	return id
}

func jReq(i int) ledger.ReserveRequest {
	return ledger.ReserveRequest{
		Ref: ledger.Ref{Tenant: jTenant, ID: jID(i)}, Owner: jOwner,
		Scopes:   []ledger.Scope{{Kind: ledger.KindTenant, Key: jTenant, Limits: jLimits}},
		Held:     ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: int64(i + 1), ledger.Tokens: int64(i + 1)},
		Dispatch: i%2 == 0,
	}
}

func jActual(i int) ledger.Amounts {
	return ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: int64(i/2 + 1), ledger.Tokens: int64(i/2 + 1)}
}

func fsyncFor(mode string) ledger.Fsync {
	if mode == "group" {
		return ledger.Group(2 * time.Millisecond)
	}
	return ledger.EveryOp
}

// TestJournalChild is the child process of TestT15JournalKill9; it only runs
// when re-executed with LEDGER_JOURNAL_CHILD set. It reserves (and every
// third request settles) forever, printing one line per acknowledged call.
func TestJournalChild(t *testing.T) {
	path := os.Getenv("LEDGER_JOURNAL_CHILD")
	if path == "" {
		t.Skip("child process of TestT15JournalKill9")
	}
	var i int
	clock := func() time.Time { return jT0.Add(time.Duration(i) * time.Millisecond) }
	m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: clock, Journal: path, Fsync: fsyncFor(os.Getenv("LEDGER_JOURNAL_FSYNC")), Logger: quiet})
	if err != nil {
		fmt.Println("error", err)
		os.Exit(3)
	}
	out := bufio.NewWriter(os.Stdout)
	ctx := context.Background()
	for i = 0; ; i++ {
		if _, err := m.Reserve(ctx, jReq(i)); err != nil {
			fmt.Fprintln(out, "error", err)
			_ = out.Flush()
			os.Exit(4)
		}
		fmt.Fprintln(out, "R", i)
		_ = out.Flush()
		if i%3 == 0 {
			if _, err := m.Settle(ctx, jReq(i).Ref, jActual(i), ledger.SourceFinal); err != nil {
				fmt.Fprintln(out, "error", err)
				_ = out.Flush()
				os.Exit(5)
			}
			fmt.Fprintln(out, "S", i)
		}
		_ = out.Flush()
	}
}

// TestT15JournalKill9: kill -9 a child with holds in flight, then restart.
func TestT15JournalKill9(t *testing.T) {
	for _, mode := range []string{"every_op", "group"} {
		t.Run(mode, func(t *testing.T) {
			path := filepath.Join(t.TempDir(), "ledger.journal")
			cmd := exec.Command(os.Args[0], "-test.run=^TestJournalChild$", "-test.count=1")
			cmd.Env = append(os.Environ(), "LEDGER_JOURNAL_CHILD="+path, "LEDGER_JOURNAL_FSYNC="+mode)
			stdout, err := cmd.StdoutPipe()
			require.NoError(t, err)
			require.NoError(t, cmd.Start())
			sc := bufio.NewScanner(stdout)
			lastR, lastKind := -1, ""
			settled := map[int]bool{}
			killed := false
			for sc.Scan() { // after the kill, drain what the child acknowledged before dying
				f := strings.Fields(sc.Text())
				require.Len(t, f, 2, "child said %q", sc.Text())
				require.NotEqual(t, "error", f[0], "child failed: %s", sc.Text())
				i, err := strconv.Atoi(f[1])
				require.NoError(t, err)
				lastKind = f[0]
				if f[0] == "R" {
					lastR = i
				} else {
					settled[i] = true
				}
				if lastR >= 150 && !killed {
					require.NoError(t, cmd.Process.Signal(syscall.SIGKILL))
					killed = true
				}
			}
			_ = cmd.Wait()
			// Restart with a clock behind the child's: ledger time must not go back.
			m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: func() time.Time { return jT0.Add(-10 * time.Minute) }, Journal: path, Logger: quiet})
			require.NoError(t, err)
			defer m.Close()
			ctx := t.Context()
			u, err := m.Snapshot(ctx, jTenant, jTenant)
			require.NoError(t, err)
			assert.GreaterOrEqual(t, u.Now.UnixMilli(), jT0.Add(time.Duration(lastR)*time.Millisecond).UnixMilli(), "hwm not decreased")
			assert.Equal(t, int64(0), u.SlotsInUse, "DISPATCHED came back UNRESOLVED: n == 0")
			// The one call in flight at the kill may or may not have been applied.
			var wantR, wantC int64
			open := 0
			for i := 0; i <= lastR; i++ {
				if settled[i] {
					wantC += jActual(i)[ledger.Tokens]
					continue
				}
				if i%2 == 0 && (i != lastR || i%3 != 0) {
					wantR += jReq(i).Held[ledger.Tokens]
					open++
				}
			}
			inflight := lastR + 1
			if lastKind == "R" && lastR%3 == 0 {
				inflight = lastR // its Settle was in flight
			}
			gotC := committed(m, ledger.Tokens, 24*time.Hour)
			gotR := u.Reserved[ledger.Tokens]
			switch inflight {
			case lastR: // settle(lastR) in flight; lastR is even iff dispatched
				held := int64(0)
				if lastR%2 == 0 {
					held = jReq(lastR).Held[ledger.Tokens]
				}
				if gotC == wantC+jActual(lastR)[ledger.Tokens] {
					assert.Equal(t, wantR, gotR)
				} else {
					assert.Equal(t, wantC, gotC, "c identical to the acknowledged settles")
					assert.Equal(t, wantR+held, gotR)
				}
			default: // reserve(inflight) in flight
				assert.Equal(t, wantC, gotC, "c identical to the acknowledged settles")
				if gotR != wantR && inflight%2 == 0 {
					assert.Equal(t, wantR+jReq(inflight).Held[ledger.Tokens], gotR)
				} else {
					assert.Equal(t, wantR, gotR, "holds of DISPATCHED records kept, RESERVED ones expired")
				}
			}
			assert.GreaterOrEqual(t, u.Unresolved, open)
			// Every acknowledged operation is present.
			for i := 0; i <= lastR; i++ {
				err := m.MarkDispatched(ctx, jReq(i).Ref, ledger.Owner{0xff})
				switch {
				case settled[i]:
					require.ErrorIs(t, err, ledger.ErrAlreadyFinal, "request %d settled", i)
				case i == lastR && inflight == lastR:
					// its settle may have landed
				default:
					require.ErrorIs(t, err, ledger.ErrLeaseLost, "request %d is EXPIRED or UNRESOLVED", i)
				}
				if settled[i] {
					s, err := m.Settle(ctx, jReq(i).Ref, jActual(i), ledger.SourceFinal)
					require.NoError(t, err)
					assert.True(t, s.Replayed, "request %d", i)
				}
			}
			require.NoError(t, m.Audit())
		})
	}
}

func committed(m *ledger.Memory, d ledger.Dim, w time.Duration) int64 {
	return m.Committed(jTenant, jTenant, d, w)
}

func writeJournal(t *testing.T, path string, n int) {
	t.Helper()
	m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: func() time.Time { return jT0 }, Journal: path, Logger: quiet})
	require.NoError(t, err)
	for i := range n {
		_, err := m.Reserve(t.Context(), jReq(i))
		require.NoError(t, err)
	}
	require.NoError(t, m.Close())
}

func TestJournalTornTailTruncated(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		tail []byte
	}{
		{"torn header", []byte{0x40, 0}},
		{"torn body", []byte{0x40, 0, 0, 0, 1, 2, 3, 4, 5}},
		{"bad checksum of the last entry", append([]byte{4, 0, 0, 0, 9, 9, 9, 9}, 1, 2, 3, 4)},
		{"zero fill", make([]byte, 64)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "j")
			writeJournal(t, path, 5)
			f, err := os.OpenFile(path, os.O_APPEND|os.O_WRONLY, 0)
			require.NoError(t, err)
			_, err = f.Write(tc.tail)
			require.NoError(t, err)
			require.NoError(t, f.Close())
			m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: func() time.Time { return jT0 }, Journal: path, Logger: quiet})
			require.NoError(t, err)
			u, err := m.Snapshot(t.Context(), jTenant, jTenant)
			require.NoError(t, err)
			assert.Equal(t, int64(1+3+5), u.Reserved[ledger.Tokens], "the dispatched holds 0, 2, 4 survive")
			dump := m.Dump(jTenant)
			require.NoError(t, m.Close())
			again, err := ledger.NewMemory(ledger.MemoryConfig{Clock: func() time.Time { return jT0 }, Journal: path, Logger: quiet})
			require.NoError(t, err, "the compacted journal has no tail left")
			assert.Equal(t, dump, again.Dump(jTenant))
			require.NoError(t, again.Close())
		})
	}
}

// TestJournalCompaction: every start rewrites the journal as a snapshot, so
// its size follows the state, not the history, and replays to the same state.
func TestJournalCompaction(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "j")
	clock := &fakeClock{now: jT0}
	cfg := ledger.MemoryConfig{Clock: clock.Now, Journal: path, Logger: quiet}
	m, err := ledger.NewMemory(cfg)
	require.NoError(t, err)
	ctx := t.Context()
	for i := range 300 {
		_, err := m.Reserve(ctx, jReq(i))
		require.NoError(t, err)
		if i%3 != 2 {
			_, err = m.Settle(ctx, jReq(i).Ref, jActual(i), ledger.SourceFinal)
			require.NoError(t, err)
		}
		clock.Advance(10 * time.Millisecond)
	}
	require.NoError(t, m.Adjust(ctx, jTenant, jTenant, ledger.Tokens, 24*time.Hour, -1))
	before, err := os.Stat(path)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	sizes := []int64{}
	var dumps []string
	for range 3 {
		m, err = ledger.NewMemory(cfg)
		require.NoError(t, err)
		require.NoError(t, m.Audit())
		dumps = append(dumps, m.Dump(jTenant))
		require.NoError(t, m.Close())
		st, err := os.Stat(path)
		require.NoError(t, err)
		sizes = append(sizes, st.Size())
	}
	assert.Positive(t, before.Size())
	assert.Equal(t, sizes[1], sizes[2], "restarts without new operations keep the size")
	assert.Equal(t, dumps[1], dumps[2], "a compacted journal replays to the same state")
	clock.Advance(2 * time.Hour) // past TombstoneRetention: tombstones go, the journal shrinks
	m, err = ledger.NewMemory(cfg)
	require.NoError(t, err)
	_, err = m.Reclaim(ctx, jTenant, 0)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	m, err = ledger.NewMemory(cfg)
	require.NoError(t, err)
	defer m.Close()
	st, err := os.Stat(path)
	require.NoError(t, err)
	assert.Less(t, st.Size(), sizes[2]/4)
}

func TestJournalCorruptionRefusesStart(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "j")
	writeJournal(t, path, 5)
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	raw[len(raw)/2] ^= 0xff
	require.NoError(t, os.WriteFile(path, raw, 0o600))
	_, err = ledger.NewMemory(ledger.MemoryConfig{Clock: func() time.Time { return jT0 }, Journal: path, Logger: quiet})
	assert.ErrorIs(t, err, ledger.ErrCorrupt)
}

func TestJournalHasNoRawIDs(t *testing.T) {
	t.Parallel()
	k, err := ledger.NewKeyer([]byte("0123456789abcdef0123456789abcdef"))
	require.NoError(t, err)
	tenant, wf := k.Key(ledger.KindTenant, "acme-corp"), k.Key(ledger.KindWorkflow, "nightly-batch")
	path := filepath.Join(t.TempDir(), "j")
	m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: func() time.Time { return jT0 }, Journal: path, Logger: quiet})
	require.NoError(t, err)
	req := ledger.ReserveRequest{Ref: ledger.Ref{Tenant: tenant, ID: k.IdempotentID(tenant, "sk-secret-idem")}, Owner: jOwner,
		Scopes: []ledger.Scope{{Kind: ledger.KindTenant, Key: tenant, Limits: jLimits}, {Kind: ledger.KindWorkflow, Key: wf, Limits: jLimits}},
		Held:   ledger.Amounts{ledger.Requests: 1}, Dispatch: true}
	_, err = m.Reserve(t.Context(), req)
	require.NoError(t, err)
	_, err = m.Settle(t.Context(), req.Ref, ledger.Amounts{ledger.Requests: 1}, ledger.SourceFinal)
	require.NoError(t, err)
	require.NoError(t, m.Close())
	raw, err := os.ReadFile(path)
	require.NoError(t, err)
	for _, s := range []string{"acme", "nightly", "sk-secret"} {
		assert.NotContains(t, string(raw), s)
	}
}

// TestJournalFailureFailsClosed: a failed journal write is an unknown
// outcome for that call and refuses every later call (I9).
func TestJournalFailureFailsClosed(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "j")
	m, err := ledger.NewMemory(ledger.MemoryConfig{Clock: func() time.Time { return jT0 }, Journal: path, Logger: quiet})
	require.NoError(t, err)
	ctx := t.Context()
	_, err = m.Reserve(ctx, jReq(0))
	require.NoError(t, err)
	m.BreakJournalForTest()
	_, err = m.Reserve(ctx, jReq(1))
	require.ErrorIs(t, err, ledger.ErrAmbiguous)
	_, err = m.Settle(ctx, jReq(0).Ref, jActual(0), ledger.SourceFinal)
	require.ErrorIs(t, err, ledger.ErrUnavailable)
	assert.True(t, ledger.IsStoreError(err))
	again, err := ledger.NewMemory(ledger.MemoryConfig{Clock: func() time.Time { return jT0 }, Journal: path, Logger: quiet})
	require.NoError(t, err)
	defer again.Close()
	u, err := again.Snapshot(ctx, jTenant, jTenant)
	require.NoError(t, err)
	assert.Equal(t, int64(1), u.Reserved[ledger.Tokens], "only the acknowledged Reserve survived")
}

// TestJournalOnlineCompaction: Compact while calls are in flight loses no
// acknowledged operation.
func TestJournalOnlineCompaction(t *testing.T) {
	t.Parallel()
	path := filepath.Join(fastTempDirT(t), "j")
	clock := &fakeClock{now: jT0}
	cfg := ledger.MemoryConfig{Clock: clock.Now, Journal: path, Logger: quiet}
	m, err := ledger.NewMemory(cfg)
	require.NoError(t, err)
	ctx := t.Context()
	var wg sync.WaitGroup
	for g := range 4 {
		wg.Go(func() {
			for i := g; i < 400; i += 4 {
				if _, err := m.Reserve(ctx, jReq(i)); err != nil {
					t.Error(err)
					return
				}
				if i%3 == 0 {
					if _, err := m.Settle(ctx, jReq(i).Ref, jActual(i), ledger.SourceFinal); err != nil {
						t.Error(err)
						return
					}
				}
			}
		})
	}
	for range 5 {
		require.NoError(t, m.Compact(ctx))
	}
	wg.Wait()
	require.NoError(t, m.Compact(ctx))
	_, err = m.Reserve(ctx, jReq(1000))
	require.NoError(t, err)
	want := committed(m, ledger.Tokens, 24*time.Hour)
	require.NoError(t, m.Close())
	again, err := ledger.NewMemory(cfg)
	require.NoError(t, err)
	defer again.Close()
	assert.Equal(t, want, committed(again, ledger.Tokens, 24*time.Hour))
	for i := range 400 {
		err := again.MarkDispatched(ctx, jReq(i).Ref, ledger.Owner{0xff})
		if i%3 == 0 {
			require.ErrorIs(t, err, ledger.ErrAlreadyFinal, "request %d", i)
		} else {
			require.ErrorIs(t, err, ledger.ErrLeaseLost, "request %d", i)
		}
	}
	require.ErrorIs(t, again.MarkDispatched(ctx, jReq(1000).Ref, ledger.Owner{0xff}), ledger.ErrLeaseLost, "the entry after the compaction")
	require.NoError(t, again.Audit())
}

func fastTempDirT(t *testing.T) string { return fastTempDir(t) }
