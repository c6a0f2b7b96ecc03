package main

import (
	"bytes"
	"context"
	"os"
	"path/filepath"
	"runtime"
	"runtime/debug"
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
		{name: "version bad flag", args: []string{"version", "--nope"}, code: 2, errHas: "unknown flag --nope"},
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
	assert.Equal(t, []string{
		bad + `:1: tenants[0].api_keys[0] must be "sha256:<64 hex digits>" (run 'sluice key hash'); raw keys are never stored`,
		bad + ":1: tenants[0].weight must be >= 1",
		bad + ": upstream.replicas must list at least one replica (or upstream.discovery a source)",
		"sluice config check: 3 problem(s) in " + bad,
	}, strings.Split(strings.TrimSuffix(errOut, "\n"), "\n"), "one problem a line, each with its line")
}

// TestConfigCheckListsEveryProblem: an unknown key does not hide the
// validation problems after it; each problem is on its own line with the
// line of the file that sets it; duplicate replica URLs are a warning.
func TestConfigCheckListsEveryProblem(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	bad := filepath.Join(dir, "bad.yaml")
	os.WriteFile(bad, []byte(`upstream:
  replicas:
    - {url: "http://127.0.0.1:8100"}
tenants:
  - name: a
    wieght: 2
    api_keys: [raw]
    queue:
      max_wait: -1s
`), 0o600)
	code, _, errOut := runCLI(t, "", "config", "check", bad)
	assert.Equal(t, 2, code)
	assert.Equal(t, []string{
		bad + ":6: tenants[0].wieght is not a known key (did you mean weight?)",
		bad + `:7: tenants[0].api_keys[0] must be "sha256:<64 hex digits>" (run 'sluice key hash'); raw keys are never stored`,
		bad + ":9: tenants[0].queue.max_wait must be > 0",
		"sluice config check: 3 problem(s) in " + bad,
	}, strings.Split(strings.TrimSuffix(errOut, "\n"), "\n"))

	// serve refuses the same file with the same lines.
	code, _, serveErr := runCLI(t, "", "serve", "--config", bad)
	assert.Equal(t, 2, code)
	assert.Equal(t, strings.Replace(errOut, "sluice config check:", "sluice serve:", 1), serveErr)

	dup := filepath.Join(dir, "dup.yaml")
	os.WriteFile(dup, []byte(`upstream:
  replicas:
    - {name: a, url: "http://127.0.0.1:8100"}
    - {name: b, url: "http://127.0.0.1:8101"}
    - {name: c, url: "HTTP://127.0.0.1:8100/"}
tenants: [{name: a, api_keys: ["sha256:2c26b46b68ffc68ff99b453c1d30413413422d706483bfa0f98a5e886266e7ae"]}]
`), 0o600)
	code, out, errOut := runCLI(t, "", "config", "check", dup)
	assert.Equal(t, 0, code, errOut)
	assert.Contains(t, out, "ok (1 tenants, 3 replicas")
	assert.Equal(t, dup+`:5: warning: upstream.replicas[2].url "HTTP://127.0.0.1:8100/" is the same server as upstream.replicas[0] (a): its capacity would be counted twice`+"\n", errOut)
}

func TestVersion(t *testing.T) {
	t.Parallel()
	for _, args := range [][]string{{"version"}, {"--version"}, {"-version"}} {
		code, out, errOut := runCLI(t, "", args...)
		assert.Equal(t, 0, code, "%v: %s", args, errOut)
		assert.Regexp(t, `^sluice \S+\nrevision: \S+.*\ngo: go1\.\d+`, out, args)
		assert.Contains(t, out, "go: "+runtime.Version(), args)
	}
	bi := &debug.BuildInfo{GoVersion: "go1.26.8", Main: debug.Module{Path: "github.com/sluicehq/sluice", Version: "v0.4.1"},
		Settings: []debug.BuildSetting{{Key: "vcs.revision", Value: "c3b532e0"}, {Key: "vcs.time", Value: "2026-12-05T08:00:00Z"}, {Key: "vcs.modified", Value: "true"}}}
	assert.Equal(t, "sluice v0.4.1\nrevision: c3b532e0 (2026-12-05T08:00:00Z) with uncommitted changes\ngo: go1.26.8\n", versionText("", bi))
	assert.Equal(t, "sluice v1.0.0\nrevision: c3b532e0 (2026-12-05T08:00:00Z) with uncommitted changes\ngo: go1.26.8\n", versionText("v1.0.0", bi), "a link-time version wins")
}

// TestDidYouMean: a mistyped command or flag gets the likely one; a flag
// where a group needs its command is reported as such.
func TestDidYouMean(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		args   []string
		errHas string
	}{
		{[]string{"verison"}, "sluice: unknown command \"verison\"\nDid you mean \"version\"?\n"},
		{[]string{"budget", "lsit"}, "sluice: unknown command \"budget lsit\"\nDid you mean \"budget list\"?\n"},
		{[]string{"bench", "run", "--base-ur", "x"}, "sluice bench run: unknown flag --base-ur (did you mean --base-url?)\n"},
		{[]string{"bench", "--bogus"}, "sluice bench: --bogus is a flag; name a command first (ab, compare, run, sweep)\n"},
		{[]string{"--bogus"}, "sluice: --bogus is a flag; name a command first ("},
	} {
		code, out, errOut := runCLI(t, "", tc.args...)
		assert.Equal(t, 2, code, tc.args)
		assert.Empty(t, out)
		assert.True(t, strings.HasPrefix(errOut, tc.errHas), "%v: %q", tc.args, errOut)
		assert.NotContains(t, errOut, "unknown command \"bench --bogus\"")
	}
}
