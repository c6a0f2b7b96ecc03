package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
)

// runCLI runs the binary's entry point in process.
func runCLI(t *testing.T, stdin string, args ...string) (code int, stdout, stderr string) {
	t.Helper()
	var out, errb bytes.Buffer
	code = run(context.Background(), args, strings.NewReader(stdin), &out, &errb)
	return code, out.String(), errb.String()
}

func TestCLIUsage(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name   string
		args   []string
		code   int
		errHas string
		outHas string
		stdin  string
	}{
		{name: "no command", args: nil, code: 2, errHas: "usage: sluice"},
		{name: "unknown command", args: []string{"frobnicate"}, code: 2, errHas: `unknown command "frobnicate"`},
		{name: "version", args: []string{"version"}, code: 0, outHas: "sluice "},
		{name: "version bad flag", args: []string{"version", "--nope"}, code: 2, errHas: "flag provided but not defined: -nope"},
		{name: "key hash", args: []string{"key", "hash"}, stdin: "foo\n", code: 0,
			outHas: "sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"},
		{name: "key hash empty", args: []string{"key", "hash"}, stdin: "\n", code: 2, errHas: "no key on stdin"},
		{name: "key no sub", args: []string{"key"}, code: 2, errHas: "sluice key: missing command\nusage: sluice key create|hash|list|revoke [flags]"},
		{name: "help", args: []string{"help"}, code: 0, outHas: "usage: sluice <command> [flags]"},
		{name: "-h", args: []string{"-h"}, code: 0, outHas: "\n  bench run "},
		{name: "help of a leaf", args: []string{"help", "config", "check"}, code: 0, outHas: "usage: sluice config check FILE\n"},
		{name: "help after a positional", args: []string{"config", "check", "x.yaml", "-h"}, code: 0, outHas: "usage: sluice config check FILE\n"},
		{name: "-h after --", args: []string{"audit", "verify", "--", "-h"}, code: 1, errHas: "-h"},
		{name: "config no file", args: []string{"config", "check"}, code: 2, errHas: "usage: sluice config check FILE"},
		{name: "config missing", args: []string{"config", "check", "/nonexistent.yaml"}, code: 2, errHas: "read config"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			code, out, errOut := runCLI(t, tc.stdin, tc.args...)
			assert.Equal(t, tc.code, code, "stderr: %s", errOut)
			assert.Contains(t, errOut, tc.errHas)
			assert.Contains(t, out, tc.outHas)
		})
	}
}

func TestConfigCheck(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	good := filepath.Join(dir, "good.yaml")
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(good, []byte("upstream: {replicas: [{url: \"http://127.0.0.1:8100\"}]}\ntenants: [{name: a, api_keys: [\"sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae\"]}]\n"), 0o600)
	os.WriteFile(bad, []byte("tenants: [{name: a, weight: -1, api_keys: [raw]}]\n"), 0o600)

	code, out, _ := runCLI(t, "", "config", "check", good)
	assert.Equal(t, 0, code)
	assert.Contains(t, out, "ok (1 tenants, 1 replicas, ledger memory)")

	code, _, errOut := runCLI(t, "", "config", "check", bad)
	assert.Equal(t, 2, code)
	assert.Equal(t, 1, strings.Count(errOut, "\n"), "one line: %q", errOut)
	assert.Contains(t, errOut, "tenants[0].weight must be >= 1")
	assert.Contains(t, errOut, "tenants[0].api_keys[0] must be")
	assert.Contains(t, errOut, "upstream.replicas must list at least one replica")
}
