package audit

import (
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// FuzzAppendJSONString checks the hand-written string encoder against
// encoding/json (without HTML escaping).
func FuzzAppendJSONString(f *testing.F) {
	for _, s := range []string{"", "plain", "é\t\"\\<>&\u2028\u2029\x00\x1f\x7f", "\xff\xfe", "a\xc3", "\U0001F600"} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		var want bytes.Buffer
		enc := json.NewEncoder(&want)
		enc.SetEscapeHTML(false)
		require.NoError(t, enc.Encode(s))
		got := appendJSONString(nil, s)
		assert.Equal(t, bytes.TrimSuffix(want.Bytes(), []byte{'\n'}), got)
	})
}

func TestWriteErrorIsSticky(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(Config{Path: path})
	require.NoError(t, err)
	require.NoError(t, l.Append(Record{Kind: KindAdmit}))
	require.NoError(t, l.f.Close()) // the next write fails
	err = l.Flush()
	require.Error(t, err)
	require.ErrorContains(t, err, "audit: write "+path)
	require.ErrorIs(t, l.Append(Record{Kind: KindAdmit}), err, "Append returns the sticky error")
	require.ErrorIs(t, l.Run(t.Context()), err, "Run returns the sticky error")
	assert.Error(t, l.Close())
}

func TestSyncModeWritesAndRotates(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(Config{Path: path, Sync: true, MaxBytes: 1024, FlushInterval: time.Hour})
	require.NoError(t, err)
	for range 20 {
		require.NoError(t, l.Append(Record{Kind: KindSettle, Tenant: "acme", TokensCharged: 5}))
	}
	require.NoError(t, l.Close())
	rep, err := Verify(path)
	require.NoError(t, err)
	assert.Equal(t, 20, rep.Lines)
	assert.Greater(t, len(rep.Files), 2)
}

func TestBufferWrittenPastFlushBytes(t *testing.T) {
	t.Parallel()
	path := filepath.Join(t.TempDir(), "audit.log")
	l, err := Open(Config{Path: path, FlushInterval: time.Hour})
	require.NoError(t, err)
	n := 0
	for l.size == 0 {
		require.NoError(t, l.Append(Record{Kind: KindAdmit, Reason: string(bytes.Repeat([]byte{'x'}, 1000))}))
		n++
		require.Less(t, n, 1000)
	}
	assert.GreaterOrEqual(t, l.size, int64(flushBytes), "written once the buffer passed %d bytes", flushBytes)
	assert.Empty(t, l.buf)
	require.NoError(t, l.Close())
}

// FuzzVerify feeds arbitrary bytes to the line parser and verifier: no
// panic, and a file that verifies has as many lines as newlines.
func FuzzVerify(f *testing.F) {
	f.Add([]byte(`{"seq":1,"ts":"2026-01-02T03:04:05.000000006Z","prev":"` + strings.Repeat("0", 64) + `","kind":"admit"}` + "\n"))
	f.Add([]byte("{}\n"))
	f.Add([]byte("\n\n"))
	f.Add([]byte(`{"seq":-1}`))
	f.Fuzz(func(t *testing.T, data []byte) {
		path := filepath.Join(t.TempDir(), "f.log")
		require.NoError(t, os.WriteFile(path, data, 0o600))
		rep, err := Verify(path)
		if err == nil {
			assert.Equal(t, bytes.Count(data, []byte{'\n'}), rep.Lines)
		}
		_, _, _ = parseHeader(data)
	})
}
