package node

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// TestOutageChargesSurviveRestartByDefault: the Redis fleet layout with no
// path keys at all (the config file's directory is the data directory).
// Three requests run on the outage allowance; the process stops while the
// store is still down, says how many charges it owes and where they are
// kept; the next process charges all three once the store answers.
func TestOutageChargesSurviveRestartByDefault(t *testing.T) {
	rds := startRedis(t)
	rep := startSim(t, sim.DefaultConfig())
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "sluice.yaml")
	text := strings.Replace(redisTop(rds), "store_timeout: 1s", "store_timeout: 300ms", 1) +
		oneReplicaYAML(rep.url, "") +
		"    outage_allowance: {requests: 3}\n    budgets: [{dimension: requests, limit: 1000, window: 1h}]\n"
	require.NoError(t, os.WriteFile(cfgFile, []byte(text), 0o600))
	cfg, err := config.Load(cfgFile)
	require.NoError(t, err)

	var logs logBuffer
	n := startNodeOpts(t, cfg, Options{ConfigPath: cfgFile, Log: logs.logger()})
	pendingFile := filepath.Join(dir, config.PendingName)
	assert.Contains(t, logs.String(), "outage_charges="+pendingFile, "the start log says where owed charges are kept")
	assert.InDelta(t, 1.0, n.metric(t, "sluice_durable_state", map[string]string{"what": "outage_charges"}), 1e-9)
	assert.InDelta(t, 1.0, n.metric(t, "sluice_durable_state", map[string]string{"what": "pending_endings"}), 1e-9)
	r := n.call(t, "/v1/chat/completions", keyAcme, chatBody)
	require.Equal(t, 200, r.StatusCode, string(r.Body))

	require.NoError(t, rds.cmd.Process.Signal(syscall.SIGSTOP))
	resumed := false
	defer func() {
		if !resumed {
			_ = rds.cmd.Process.Signal(syscall.SIGCONT)
		}
	}()
	for i := range 3 {
		r = n.call(t, "/v1/chat/completions", keyAcme, chatBody)
		require.Equal(t, 200, r.StatusCode, "outage request %d: %s", i, r.Body)
	}
	assert.Equal(t, int64(4), rep.Stats().Received, "all four ran on the GPUs")
	require.NoError(t, n.stop())
	assert.Contains(t, logs.String(), "owed_outage_charges=3 pending_endings=0 pending_file="+pendingFile, "shutdown names the count and the file")

	require.NoError(t, rds.cmd.Process.Signal(syscall.SIGCONT))
	resumed = true
	cfg, err = config.Load(cfgFile)
	require.NoError(t, err)
	n2 := startNodeOpts(t, cfg, Options{ConfigPath: cfgFile})
	eventually(t, "the three outage requests charged after the restart", func() bool {
		return n2.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "requests"}) == 4
	})
}

// TestMemoryOnlyIsSaid: data_dir: "" keeps everything in memory; the
// process stays ready and says so at start, in /readyz and in the gauge.
func TestMemoryOnlyIsSaid(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "sluice.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte("data_dir: \"\"\n"+oneReplicaYAML(rep.url, "")), 0o600))
	cfg, err := config.Load(cfgFile)
	require.NoError(t, err)
	var logs logBuffer
	n := startNodeOpts(t, cfg, Options{ConfigPath: cfgFile, Log: logs.logger()})
	assert.Contains(t, logs.String(), "memory_only=ledger,shared_state,admin_state,outage_charges,pending_endings")
	assert.InDelta(t, 0.0, n.metric(t, "sluice_durable_state", map[string]string{"what": "ledger"}), 1e-9)
	body, err := n.get(t, "/readyz", "")
	require.NoError(t, err)
	assert.Equal(t, "ok\nmemory only (lost on restart): ledger, shared_state, admin_state, outage_charges, pending_endings\n", body)
	entries, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, entries, 1, "nothing written beside the config")
}

// TestDataDirOneProcess: a second process on a data directory the first
// keeps its files in is refused at start, naming the lock, instead of
// overwriting the first one's owed charges and pending endings.
func TestDataDirOneProcess(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	dir := t.TempDir()
	cfgFile := filepath.Join(dir, "sluice.yaml")
	require.NoError(t, os.WriteFile(cfgFile, []byte(oneReplicaYAML(rep.url, "")), 0o600))
	cfg, err := config.Load(cfgFile)
	require.NoError(t, err)
	startNode(t, cfg)
	// Bounded: a second process that did start would serve until ctx ends.
	ctx, cancel := context.WithTimeout(t.Context(), 5*time.Second)
	defer cancel()
	err = Run(ctx, cfg, Options{ConfigPath: cfgFile})
	require.Error(t, err)
	assert.Contains(t, err.Error(), filepath.Join(dir, config.LockName))
	assert.Contains(t, err.Error(), "give each process its own data_dir")
}
