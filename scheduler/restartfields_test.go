package scheduler

import (
	"bytes"
	"log/slog"
	"testing"

	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestReloadNamesRestartFields: a reload that changes fields read only at
// start-up (listen, a replica's URL) applies what it can and names the
// rest, in RestartNeeded (the admin API's answer) and in the log; fields a
// reload applies (a tenant's weight, lease_ttl) are not named. A second
// reload still names them: the process still runs with the start-up value.
func TestReloadNamesRestartFields(t *testing.T) {
	t.Parallel()
	boot := lifecycletest.Config(t, "listen: 127.0.0.1:8080\n", "    weight: 1\n")
	s := newTestServer(t, boot, lifecycletest.NewLedger(t), &lifecycletest.Upstream{Out: 1})
	var logBuf bytes.Buffer
	s.log = slog.New(slog.NewTextHandler(&logBuf, nil))
	assert.Empty(t, s.RestartNeeded())

	next := lifecycletest.Config(t, "listen: 127.0.0.1:9090\nledger: {lease_ttl: 30s}\n", "    weight: 3\n")
	next.Upstream.Replicas[0].URL = "http://r1.invalid"
	require.NoError(t, s.Reload(next))
	want := []string{"listen (127.0.0.1:8080 → 127.0.0.1:9090)", "upstream.replicas[0].url (http://r0.invalid → http://r1.invalid)"}
	assert.Equal(t, want, s.RestartNeeded())
	assert.Equal(t, 3, s.pol.Load().Tenants["acme"].Cfg.Weight, "what a reload can apply, it applies")
	assert.Contains(t, logBuf.String(), `level=WARN msg="config reloaded, but these fields apply only at a restart and still run with their start-up value" fields="listen (127.0.0.1:8080 → 127.0.0.1:9090); upstream.replicas[0].url (http://r0.invalid → http://r1.invalid)"`)

	require.NoError(t, s.Reload(next))
	assert.Equal(t, want, s.RestartNeeded(), "still pending after another reload")
	require.NoError(t, s.Reload(boot))
	assert.Empty(t, s.RestartNeeded(), "back to the start-up values: nothing pending")
}

// The trace exporter is built once, at start-up: a reload that changes
// tracing names it.
func TestReloadNamesTracing(t *testing.T) {
	t.Parallel()
	boot := lifecycletest.Config(t, "", "")
	s := newTestServer(t, boot, lifecycletest.NewLedger(t), &lifecycletest.Upstream{Out: 1})
	next := lifecycletest.Config(t, "tracing: {endpoint: \"http://127.0.0.1:4318\"}\n", "")
	require.NoError(t, s.Reload(next))
	assert.Equal(t, []string{"tracing.endpoint ( → http://127.0.0.1:4318)"}, s.RestartNeeded())
}
