package audit_test

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/audit"
)

var t0 = time.Date(2026, 1, 2, 3, 4, 5, 6, time.UTC)

// fakeClock returns t0, t0+1ms, t0+2ms, … ; safe for concurrent use.
func fakeClock() func() time.Time {
	var mu sync.Mutex
	n := 0
	return func() time.Time {
		mu.Lock()
		defer mu.Unlock()
		n++
		return t0.Add(time.Duration(n-1) * time.Millisecond)
	}
}

// mixed returns the i-th record of a deterministic mix of kinds.
func mixed(i int) audit.Record {
	tenant := fmt.Sprintf("tenant-%d", i%7)
	id := fmt.Sprintf("req-%06d", i)
	switch i % 6 {
	case 0:
		return audit.Record{Kind: audit.KindAdmit, Tenant: tenant, RequestID: id, TokensHeld: int64(100 + i), GPUMs: int64(i % 50), USDMicros: int64(i * 3)}
	case 1:
		return audit.Record{Kind: audit.KindDeny, Tenant: tenant, RequestID: id, Code: "rate_limit_exceeded", Reason: "tokens/min budget \"exhausted\"\nretry later"}
	case 2:
		return audit.Record{Kind: audit.KindSettle, Tenant: tenant, RequestID: id, State: "SETTLED", Source: "usage", TokensCharged: int64(i), GPUMs: 7, USDMicros: 12}
	case 3:
		return audit.Record{Kind: audit.KindResolve, Tenant: tenant, RequestID: id, State: "CHARGED", Source: "operator", Fields: map[string]any{"operator": "ops@example", "charged": i}}
	case 4:
		return audit.Record{Kind: audit.KindClamp, Tenant: tenant, Reason: "abuse", Fields: map[string]any{"until": "2026-01-03T00:00:00Z"}}
	default:
		return audit.Record{Kind: audit.KindBudgetSet, Tenant: tenant, Fields: map[string]any{"dim": "tokens", "limit": 1000 + i, "window": "1m"}}
	}
}

// writeLog appends n mixed records sequentially and closes the log.
func writeLog(t *testing.T, cfg audit.Config, n int) {
	t.Helper()
	if cfg.Now == nil {
		cfg.Now = fakeClock()
	}
	l, err := audit.Open(cfg)
	require.NoError(t, err)
	for i := range n {
		require.NoError(t, l.Append(mixed(i)))
	}
	require.NoError(t, l.Close())
}

func readLines(t *testing.T, path string) [][]byte {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	require.True(t, len(b) > 0 && b[len(b)-1] == '\n', "file ends with a newline")
	return bytes.Split(b[:len(b)-1], []byte{'\n'})
}

func TestLineFormat(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: path, Now: fakeClock()})
	require.NoError(t, err)
	require.NoError(t, l.Append(audit.Record{Kind: audit.KindSettle, Tenant: "acme", RequestID: "r1",
		TokensCharged: 42, GPUMs: -3, Fields: map[string]any{"b": "x", "a": 1}}))
	require.NoError(t, l.Append(audit.Record{Kind: audit.KindDeny, Tenant: "é\t\"<>&\u2028\x01", Code: "budget_exhausted"}))
	seq, head := l.Head()
	require.NoError(t, l.Close())

	lines := readLines(t, path)
	require.Len(t, lines, 2)
	want0 := `{"seq":1,"ts":"2026-01-02T03:04:05.000000006Z","prev":"` + strings.Repeat("0", 64) +
		`","kind":"settle","tenant":"acme","request_id":"r1","tokens_charged":42,"gpu_ms":-3,"fields":{"a":1,"b":"x"}}`
	assert.Equal(t, want0, string(lines[0]))
	sum0 := sha256.Sum256(lines[0])
	want1 := `{"seq":2,"ts":"2026-01-02T03:04:05.001000006Z","prev":"` + hex.EncodeToString(sum0[:]) +
		`","kind":"deny","tenant":"é\t\"<>&\u2028\u0001","code":"budget_exhausted"}`
	assert.Equal(t, want1, string(lines[1]))
	sum1 := sha256.Sum256(lines[1])
	assert.Equal(t, uint64(2), seq)
	assert.Equal(t, hex.EncodeToString(sum1[:]), head)

	var m map[string]any
	require.NoError(t, json.Unmarshal(lines[1], &m))
	assert.Equal(t, "é\t\"<>&\u2028\x01", m["tenant"])
}

// Not parallel: its subtests share one log and must finish before the
// checks that follow them.
func TestAppendRejects(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: path, Now: fakeClock()})
	require.NoError(t, err)
	require.NoError(t, l.Append(audit.Record{Kind: audit.KindAdmit, Tenant: "a"}))

	tests := []struct {
		name string
		rec  audit.Record
		want error
	}{
		{name: "no kind", rec: audit.Record{Tenant: "a"}, want: audit.ErrNoKind},
		{name: "api_key field", rec: audit.Record{Kind: audit.KindAdmit, Fields: map[string]any{"api_key": "sk-123"}}, want: audit.ErrForbiddenField},
		{name: "Authorization field", rec: audit.Record{Kind: audit.KindAdmit, Fields: map[string]any{"Authorization": "Bearer x"}}, want: audit.ErrForbiddenField},
		{name: "x-api-key field", rec: audit.Record{Kind: audit.KindAdmit, Fields: map[string]any{"x-api-key": "x"}}, want: audit.ErrForbiddenField},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			err := l.Append(tc.rec)
			require.ErrorIs(t, err, tc.want)
			assert.NotContains(t, err.Error(), "sk-123")
		})
	}
	bad := l.Append(audit.Record{Kind: audit.KindAdmit, Fields: map[string]any{"ch": make(chan int)}})
	require.ErrorContains(t, bad, "encode fields")
	seq, _ := l.Head()
	assert.Equal(t, uint64(1), seq, "rejected records leave the chain alone")
	require.NoError(t, l.Close())
	require.ErrorIs(t, l.Append(audit.Record{Kind: audit.KindAdmit}), audit.ErrClosed)
	require.NoError(t, l.Close(), "second Close")
	assert.Len(t, readLines(t, path), 1)
}

func TestOpenValidates(t *testing.T) {
	t.Parallel()
	_, err := audit.Open(audit.Config{MaxBytes: -1, FlushInterval: -time.Second})
	require.Error(t, err)
	require.ErrorContains(t, err, "audit.path must be set")
	require.ErrorContains(t, err, "audit.max_bytes must be >= 0")
	assert.ErrorContains(t, err, "audit.flush_interval must be >= 0")
}

// TestConcurrentMixedVerifies is the acceptance run: 10,000 mixed
// records from 8 goroutines, rotating along the way, verify end to end.
func TestConcurrentMixedVerifies(t *testing.T) {
	t.Parallel()
	const total, workers = 10_000, 8
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: path, MaxBytes: 512 << 10, FlushInterval: time.Millisecond})
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(t.Context())
	runErr := make(chan error, 1)
	go func() { runErr <- l.Run(ctx) }() // flushes race with the appends and rotations
	var wg sync.WaitGroup
	for w := range workers {
		wg.Go(func() {
			for i := w; i < total; i += workers {
				assert.NoError(t, l.Append(mixed(i)))
			}
		})
	}
	wg.Wait()
	cancel()
	require.NoError(t, <-runErr)
	_, head := l.Head()
	require.NoError(t, l.Close())

	rep, err := audit.Verify(path)
	require.NoError(t, err)
	assert.Equal(t, total, rep.Lines)
	assert.Equal(t, uint64(1), rep.FirstSeq)
	assert.Equal(t, uint64(total), rep.LastSeq)
	assert.Equal(t, head, rep.LastHash)
	assert.GreaterOrEqual(t, len(rep.Files), 3, "rotated: %v", rep.Files)

	seen := make(map[string]int)
	for _, f := range rep.Files {
		for _, ln := range readLines(t, f) {
			var m struct {
				Kind      string `json:"kind"`
				Tenant    string `json:"tenant"`
				RequestID string `json:"request_id"`
			}
			require.NoError(t, json.Unmarshal(ln, &m))
			seen[m.Kind]++
		}
	}
	assert.Equal(t, map[string]int{"admit": 1667, "deny": 1667, "settle": 1667, "resolve": 1667, "clamp": 1666, "budget_set": 1666}, seen)
}

func TestRotationKeepsChain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	const maxBytes = 4096
	writeLog(t, audit.Config{Path: path, MaxBytes: maxBytes}, 200)

	files, err := audit.Files(path)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 4, "at least 3 rotated files plus the current one")
	for i, f := range files[:len(files)-1] {
		assert.Equal(t, fmt.Sprintf("%s.%d", path, i+1), f)
	}
	var last []byte
	var lastSeq uint64
	for _, f := range files {
		st, err := os.Stat(f)
		require.NoError(t, err)
		assert.LessOrEqual(t, st.Size(), int64(maxBytes), f)
		lines := readLines(t, f)
		var first struct {
			Seq  uint64 `json:"seq"`
			Prev string `json:"prev"`
		}
		require.NoError(t, json.Unmarshal(lines[0], &first))
		if last != nil {
			sum := sha256.Sum256(last)
			assert.Equal(t, hex.EncodeToString(sum[:]), first.Prev, "%s starts where the previous file ended", f)
			assert.Equal(t, lastSeq+1, first.Seq, f)
		}
		last = lines[len(lines)-1]
		lastSeq = first.Seq + uint64(len(lines)) - 1
	}
	rep, err := audit.Verify(path)
	require.NoError(t, err)
	assert.Equal(t, 200, rep.Lines)
	assert.Equal(t, files, rep.Files)
	rep2, err := audit.Verify(files...)
	require.NoError(t, err)
	assert.Equal(t, rep, rep2, "explicit list equals discovery")

	// Reopen continues the chain and the rotation numbering.
	writeLog(t, audit.Config{Path: path, MaxBytes: maxBytes}, 100)
	rep, err = audit.Verify(path)
	require.NoError(t, err)
	assert.Equal(t, 300, rep.Lines)
	assert.Equal(t, uint64(300), rep.LastSeq)

	// A missing middle file is found at the first line after the gap.
	files, err = audit.Files(path)
	require.NoError(t, err)
	require.NoError(t, os.Remove(files[1]))
	_, err = audit.Verify(path)
	var le *audit.LineError
	require.ErrorAs(t, err, &le)
	require.ErrorIs(t, err, audit.ErrSeq)
	assert.Equal(t, files[2], le.File)
	assert.Equal(t, 1, le.Line)
	assert.Contains(t, err.Error(), "a file missing between "+files[0]+" and "+files[2])

	// A chain whose oldest files were removed verifies only with Partial.
	_, err = audit.Verify(files[2:]...)
	require.ErrorIs(t, err, audit.ErrChainStart)
	rep, err = audit.VerifyOptions{Partial: true}.Verify(files[2:]...)
	require.NoError(t, err)
	assert.Equal(t, uint64(300), rep.LastSeq)
}

func TestReopenContinuesChain(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	for range 3 {
		writeLog(t, audit.Config{Path: path}, 10)
	}
	rep, err := audit.Verify(path)
	require.NoError(t, err)
	assert.Equal(t, 30, rep.Lines)
	assert.Equal(t, []string{path}, rep.Files)

	// Crash right after a rotation's rename: the current file is missing,
	// so the chain resumes from the newest rotated file.
	require.NoError(t, os.Rename(path, path+".1"))
	l, err := audit.Open(audit.Config{Path: path, Now: fakeClock()})
	require.NoError(t, err)
	seq, _ := l.Head()
	assert.Equal(t, uint64(30), seq)
	require.NoError(t, l.Append(mixed(1)))
	require.NoError(t, l.Close())
	rep, err = audit.Verify(path)
	require.NoError(t, err)
	assert.Equal(t, 31, rep.Lines)
	assert.Equal(t, []string{path + ".1", path}, rep.Files)

	// Same with an empty current file.
	require.NoError(t, os.Rename(path, path+".2"))
	require.NoError(t, os.WriteFile(path, nil, 0o600))
	writeLog(t, audit.Config{Path: path}, 1)
	rep, err = audit.Verify(path)
	require.NoError(t, err)
	assert.Equal(t, 32, rep.Lines)
}

func TestOpenRefusesCorruptTail(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		mutate func(lines [][]byte) []byte
		line   int
		want   error
	}{
		{name: "torn tail", line: 10, want: audit.ErrTorn, mutate: func(ls [][]byte) []byte {
			b := join(ls[:10])
			return b[:len(b)-7]
		}},
		{name: "malformed last line", line: 10, want: audit.ErrMalformed, mutate: func(ls [][]byte) []byte {
			ls[9] = ls[9][:len(ls[9])-1]
			return join(ls[:10])
		}},
		{name: "malformed second to last line", line: 9, want: audit.ErrMalformed, mutate: func(ls [][]byte) []byte {
			ls[8] = []byte("garbage")
			return join(ls[:10])
		}},
		{name: "last line does not chain", line: 10, want: audit.ErrHash, mutate: func(ls [][]byte) []byte {
			ls[8] = bytes.Replace(ls[8], []byte("tenant-1"), []byte("tenant-9"), 1)
			return join(ls[:10])
		}},
		{name: "last line out of sequence", line: 10, want: audit.ErrSeq, mutate: func(ls [][]byte) []byte {
			return join(append(ls[:9:9], ls[10]))
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "audit.log")
			writeLog(t, audit.Config{Path: path}, 11)
			lines := readLines(t, path)
			b := tc.mutate(lines)
			require.NoError(t, os.WriteFile(path, b, 0o600))
			_, err := audit.Open(audit.Config{Path: path})
			require.ErrorIs(t, err, audit.ErrCorruptTail)
			require.ErrorIs(t, err, tc.want)
			var le *audit.LineError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, path, le.File)
			assert.Equal(t, tc.line, le.Line, "%v", err)
			assert.Contains(t, err.Error(), fmt.Sprintf("%s:%d", path, tc.line))
			after, err := os.ReadFile(path)
			require.NoError(t, err)
			assert.Equal(t, b, after, "the file is left untouched")
		})
	}
}

func join(lines [][]byte) []byte {
	var b []byte
	for _, l := range lines {
		b = append(append(b, l...), '\n')
	}
	return b
}

func TestRunFlushesEveryInterval(t *testing.T) {
	t.Parallel()
	synctest.Test(t, func(t *testing.T) {
		path := filepath.Join(t.TempDir(), "audit.log")
		l, err := audit.Open(audit.Config{Path: path, FlushInterval: time.Second})
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(t.Context())
		done := make(chan error, 1)
		go func() { done <- l.Run(ctx) }()

		require.NoError(t, l.Append(audit.Record{Kind: audit.KindDrain}))
		size := func() int64 {
			st, err := os.Stat(path)
			require.NoError(t, err)
			return st.Size()
		}
		synctest.Wait()
		assert.Zero(t, size(), "buffered until the tick")
		time.Sleep(time.Second)
		synctest.Wait()
		first := size()
		assert.Positive(t, first, "flushed by the tick")

		require.NoError(t, l.Append(audit.Record{Kind: audit.KindReload}))
		cancel()
		require.NoError(t, <-done)
		assert.Greater(t, size(), first, "Run flushes when it stops")
		require.NoError(t, l.Close())
		rep, err := audit.Verify(path)
		require.NoError(t, err)
		assert.Equal(t, 2, rep.Lines)
	})
}

func TestSecondOpenIsRefused(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := audit.Open(audit.Config{Path: path})
	require.NoError(t, err)
	_, err = audit.Open(audit.Config{Path: path})
	require.ErrorIs(t, err, audit.ErrLocked)
	require.ErrorContains(t, err, path)
	require.NoError(t, l.Append(audit.Record{Kind: audit.KindReload}))
	require.NoError(t, l.Close())

	l, err = audit.Open(audit.Config{Path: path})
	require.NoError(t, err, "the lock goes with Close")
	require.NoError(t, l.Append(audit.Record{Kind: audit.KindReload}))
	require.NoError(t, l.Close())
	rep, err := audit.Verify(path)
	require.NoError(t, err)
	assert.Equal(t, 2, rep.Lines)
}
