package main

import (
	"context"
	"net"
	"regexp"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/node"
)

func TestKeyCLIHelp(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		sub   string
		flags []string
	}{
		{"create", []string{"--tenant", "--name", "--expires-in", "--budget", "--concurrency", "--admin", "--json"}},
		{"list", []string{"--tenant", "--admin", "--json"}},
		{"revoke", []string{"--admin", "--json"}},
	} {
		code, out, errOut := runCLI(t, "", "key", tc.sub, "-h")
		assert.Equal(t, 0, code, errOut)
		assert.Contains(t, out, "usage: sluice key "+tc.sub)
		assert.Contains(t, out, "example:\n  sluice key "+tc.sub)
		for _, f := range tc.flags {
			assert.Contains(t, out, "  "+f, "sluice key %s -h lists %s", tc.sub, f)
		}
	}
	code, _, errOut := runCLI(t, "", "key", "create", "--budget", "tokens:x/1h", "--tenant", "a")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "limit must be an integer")
	code, _, errOut = runCLI(t, "", "key", "revoke")
	assert.Equal(t, 2, code)
	assert.Contains(t, errOut, "usage: sluice key revoke ID")
}

// TestKeyCLIAgainstServer creates, uses, lists and revokes a key through
// the CLI against a real node.
func TestKeyCLIAgainstServer(t *testing.T) {
	setAdminEnv(t, testAdminToken)
	cfg, err := config.Parse([]byte("upstream:\n  replicas:\n    - {name: r0, url: \"http://127.0.0.1:1\"}\n" +
		"gpu: {telemetry: off}\nserver: {drain_timeout: 1s}\ntenants:\n" +
		"  - {name: acme, api_keys: [\"" + config.HashKey("sk-acme-test") + "\"]}\n"))
	require.NoError(t, err)
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- node.Run(ctx, cfg, node.Options{APIListener: apiLn, AdminListener: adminLn, AdminToken: testAdminToken,
			Ready: func(string, string) { close(ready) }})
	}()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("node stopped: %v", err)
	}
	t.Setenv(adminURLEnv, "http://"+adminLn.Addr().String())

	code, out, errOut := runCLI(t, "", "key", "create", "--tenant", "acme", "--name", "ci-bot", "--expires-in", "24h",
		"--budget", "tokens:1000/24h", "--concurrency", "2")
	require.Equal(t, 0, code, errOut)
	key := regexp.MustCompile(`(?m)^key: (sk-sluice-\S+)$`).FindStringSubmatch(out)
	require.Len(t, key, 2, out)
	id := regexp.MustCompile(`(?m)^(key_[0-9a-f]{12}) `).FindStringSubmatch(out)
	require.Len(t, id, 2, out)
	assert.Contains(t, out, "tokens:1000/24h0m0s")

	code, out, errOut = runCLI(t, "", "key", "list", "--tenant", "acme")
	require.Equal(t, 0, code, errOut)
	assert.Contains(t, out, id[1]+"  acme    ci-bot")
	assert.Contains(t, out, "config", "the config key is listed")
	assert.NotContains(t, out, key[1], "list never shows a key")

	code, _, errOut = runCLI(t, "", "key", "create", "--tenant", "acme", "--name", "ci-bot")
	assert.Equal(t, 1, code)
	assert.Equal(t, `sluice key create: tenant "acme" already has a key named "ci-bot" (param: name)`+"\n", errOut)

	code, out, errOut = runCLI(t, "", "key", "revoke", id[1])
	require.Equal(t, 0, code, errOut)
	assert.Equal(t, "revoked "+id[1]+" (ci-bot, tenant acme)\n", out)
	code, out, _ = runCLI(t, "", "key", "list")
	require.Equal(t, 0, code)
	assert.NotContains(t, out, "ci-bot")
	assert.Equal(t, 2, strings.Count(out, "\n"), "header and the config key: %s", out)
	code, _, errOut = runCLI(t, "", "key", "revoke", id[1])
	assert.Equal(t, 1, code)
	assert.Contains(t, errOut, "not found")
}
