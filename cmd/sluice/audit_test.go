package main

import (
	"fmt"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/audit"
)

func writeAuditLog(t *testing.T, path string, n int, maxBytes int64) {
	t.Helper()
	l, err := audit.Open(audit.Config{Path: path, MaxBytes: maxBytes})
	require.NoError(t, err)
	for i := range n {
		require.NoError(t, l.Append(audit.Record{Kind: audit.KindAdmit, Tenant: "acme",
			RequestID: fmt.Sprintf("req-%d", i), TokensHeld: int64(i)}))
	}
	require.NoError(t, l.Close())
}

func TestAuditVerifyCLI(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.log")
	writeAuditLog(t, good, 300, 8192)
	files, err := audit.Files(good)
	require.NoError(t, err)
	require.GreaterOrEqual(t, len(files), 3)

	bad := filepath.Join(dir, "bad.log")
	writeAuditLog(t, bad, 10, 0)
	b, err := os.ReadFile(bad)
	require.NoError(t, err)
	lines := strings.SplitAfter(string(b), "\n")
	lines[4], lines[5] = lines[5], lines[4] // swap lines 5 and 6
	require.NoError(t, os.WriteFile(bad, []byte(strings.Join(lines, "")), 0o600))

	tests := []struct {
		name   string
		args   []string
		code   int
		outHas string
		errHas string
	}{
		{name: "no subcommand", args: []string{"audit"}, code: 2, errHas: "usage: sluice audit verify"},
		{name: "unknown subcommand", args: []string{"audit", "check", good}, code: 2, errHas: "usage: sluice audit verify"},
		{name: "no files", args: []string{"audit", "verify"}, code: 2, errHas: "usage: sluice audit verify"},
		{name: "bad flag", args: []string{"audit", "verify", "--nope", good}, code: 2, errHas: "unknown flag --nope"},
		{name: "discovers rotated files", args: []string{"audit", "verify", good}, code: 0,
			outHas: fmt.Sprintf("ok: 300 lines, seq 1..300, %d file(s), head ", len(files))},
		{name: "explicit files", args: append([]string{"audit", "verify"}, files...), code: 0, outHas: "ok: 300 lines"},
		{name: "missing middle file", args: []string{"audit", "verify", files[0], files[2]}, code: 1,
			errHas: files[2] + ":1: sequence broken"},
		{name: "partial", args: []string{"audit", "verify", "-partial", files[1], files[2]}, code: 0, outHas: "ok: "},
		{name: "strict start", args: []string{"audit", "verify", files[1]}, code: 1, errHas: files[1] + ":1: chain does not start at seq 1"},
		{name: "swapped lines", args: []string{"audit", "verify", bad}, code: 1,
			errHas: bad + ":5: sequence broken: seq 6 after seq 4 (" + bad + ":4), want 5: 1 line(s) missing or out of order (4 good lines before it)\n"},
		{name: "missing file", args: []string{"audit", "verify", filepath.Join(dir, "nope.log")}, code: 1, errHas: "nope.log: file does not exist\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := runCLI(t, "", tc.args...)
			assert.Equal(t, tc.code, code, "stdout %q stderr %q", out, errOut)
			assert.Contains(t, out, tc.outHas)
			assert.Contains(t, errOut, tc.errHas)
			if code == 1 {
				assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
			}
		})
	}
}
