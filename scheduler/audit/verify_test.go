package audit_test

import (
	"bytes"
	"fmt"
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/audit"
)

func TestVerifyFindsTampering(t *testing.T) {
	t.Parallel()
	replace := func(i int, old, repl string) func([][]byte) [][]byte {
		return func(ls [][]byte) [][]byte {
			require.True(t, bytes.Contains(ls[i], []byte(old)), "line %d has %q: %s", i+1, old, ls[i])
			ls[i] = bytes.Replace(ls[i], []byte(old), []byte(repl), 1)
			return ls
		}
	}
	tests := []struct {
		name   string
		mutate func(ls [][]byte) [][]byte
		raw    func(b []byte) []byte // applied to the joined file instead
		line   int
		want   error
	}{
		{name: "clean", mutate: func(ls [][]byte) [][]byte { return ls }},
		{name: "one byte of a middle line's content", line: 50, want: audit.ErrHash, mutate: replace(49, "req-000049", "req-000048")},
		{name: "number changed", line: 51, want: audit.ErrHash, mutate: replace(50, `"tokens_charged":50`, `"tokens_charged":10`)},
		{name: "one byte of a middle line's prev", line: 50, want: audit.ErrHash, mutate: func(ls [][]byte) [][]byte {
			i := bytes.Index(ls[49], []byte(`"prev":"`)) + 8
			ls[49][i] ^= 0x01
			return ls
		}},
		{name: "first line altered", line: 1, want: audit.ErrHash, mutate: replace(0, "tenant-0", "tenant-1")},
		{name: "last line prev altered", line: 100, want: audit.ErrHash, mutate: func(ls [][]byte) [][]byte {
			i := bytes.Index(ls[99], []byte(`"prev":"`)) + 8
			if ls[99][i] == 'f' {
				ls[99][i] = '0'
			} else {
				ls[99][i] = 'f'
			}
			return ls
		}},
		{name: "seq altered", line: 50, want: audit.ErrSeq, mutate: replace(49, `"seq":50,`, `"seq":60,`)},
		{name: "byte makes JSON invalid", line: 50, want: audit.ErrMalformed, mutate: replace(49, `"kind":`, `"kind"=`)},
		{name: "line deleted", line: 50, want: audit.ErrSeq, mutate: func(ls [][]byte) [][]byte {
			return append(ls[:49:49], ls[50:]...)
		}},
		{name: "first line deleted", line: 1, want: audit.ErrChainStart, mutate: func(ls [][]byte) [][]byte { return ls[1:] }},
		{name: "adjacent lines swapped", line: 50, want: audit.ErrSeq, mutate: func(ls [][]byte) [][]byte {
			ls[49], ls[50] = ls[50], ls[49]
			return ls
		}},
		{name: "distant lines swapped", line: 20, want: audit.ErrSeq, mutate: func(ls [][]byte) [][]byte {
			ls[19], ls[79] = ls[79], ls[19]
			return ls
		}},
		{name: "line duplicated", line: 51, want: audit.ErrSeq, mutate: func(ls [][]byte) [][]byte {
			return append(ls[:50:50], append([][]byte{ls[49]}, ls[50:]...)...)
		}},
		{name: "blank line inserted", line: 31, want: audit.ErrMalformed, mutate: func(ls [][]byte) [][]byte {
			return append(ls[:30:30], append([][]byte{{}}, ls[30:]...)...)
		}},
		{name: "tail truncated mid-line", line: 100, want: audit.ErrTorn, raw: func(b []byte) []byte { return b[:len(b)-20] }},
		{name: "newline removed between lines", line: 50, want: audit.ErrMalformed, raw: func(b []byte) []byte {
			ls := bytes.SplitAfter(b, []byte{'\n'})
			ls[49] = ls[49][:len(ls[49])-1]
			return bytes.Join(ls, nil)
		}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			path := filepath.Join(t.TempDir(), "audit.log")
			writeLog(t, audit.Config{Path: path}, 100)
			if tc.raw != nil {
				b, err := os.ReadFile(path)
				require.NoError(t, err)
				require.NoError(t, os.WriteFile(path, tc.raw(b), 0o600))
			} else {
				require.NoError(t, os.WriteFile(path, join(tc.mutate(readLines(t, path))), 0o600))
			}
			rep, err := audit.Verify(path)
			if tc.want == nil {
				require.NoError(t, err)
				assert.Equal(t, 100, rep.Lines)
				return
			}
			require.ErrorIs(t, err, tc.want)
			var le *audit.LineError
			require.ErrorAs(t, err, &le)
			assert.Equal(t, path, le.File)
			assert.Equal(t, tc.line, le.Line, "%v", err)
			assert.Contains(t, err.Error(), fmt.Sprintf("%s:%d: ", path, tc.line))
			assert.Equal(t, tc.line-1, rep.Lines, "good lines before the culprit")
			assert.Equal(t, uint64(tc.line-1), rep.LastSeq)
			assert.Empty(t, rep.LastHash)
		})
	}
}

// TestVerifyEveryByteFlip flips each bit of every byte of a middle line in
// turn; every single change must be reported at that line.
func TestVerifyEveryByteFlip(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "audit.log")
	writeLog(t, audit.Config{Path: path}, 7)
	clean := readLines(t, path)
	const target = 3 // 0-based: line 4, a resolve record with fields
	flips := 0
	for i := range clean[target] {
		for bit := range 8 {
			mask := byte(1) << bit
			if clean[target][i]^mask == '\n' {
				continue // a new line break splits the line; covered elsewhere
			}
			ls := make([][]byte, len(clean))
			for j := range clean {
				ls[j] = bytes.Clone(clean[j])
			}
			ls[target][i] ^= mask
			p := filepath.Join(dir, fmt.Sprintf("flip-%d-%d.log", i, bit))
			require.NoError(t, os.WriteFile(p, join(ls), 0o600))
			_, err := audit.Verify(p)
			var le *audit.LineError
			if assert.ErrorAs(t, err, &le, "byte %d bit %d", i, bit) {
				assert.Equal(t, target+1, le.Line, "byte %d bit %d: %v", i, bit, err)
			}
			require.NoError(t, os.Remove(p))
			flips++
		}
	}
	assert.Greater(t, flips, 8*100)
}

func TestVerifyFilesGivenOutOfOrder(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	writeLog(t, audit.Config{Path: path, MaxBytes: 4096}, 100)
	files, err := audit.Files(path)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 3)
	files[1], files[2] = files[2], files[1]
	_, err = audit.Verify(files...)
	var le *audit.LineError
	require.ErrorAs(t, err, &le)
	require.ErrorIs(t, err, audit.ErrSeq)
	assert.Equal(t, files[1], le.File)
	assert.Equal(t, 1, le.Line)
}

func TestVerifyNoFiles(t *testing.T) {
	t.Parallel()
	_, err := audit.Verify()
	require.ErrorIs(t, err, audit.ErrNoFiles)
	_, err = audit.Verify(filepath.Join(t.TempDir(), "missing.log"))
	require.ErrorIs(t, err, os.ErrNotExist)
}
