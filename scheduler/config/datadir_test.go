package config

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func loadText(t *testing.T, text string) (*File, string, error) {
	t.Helper()
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	require.NoError(t, os.WriteFile(path, []byte(text), 0o600))
	f, err := Load(path)
	return f, dir, err
}

// A config file with no path keys keeps every piece of state in its own
// directory under the fixed names: the default is durable.
func TestDataDirDefaultsToConfigDir(t *testing.T) {
	t.Parallel()
	f, dir, err := loadText(t, minimal)
	require.NoError(t, err)
	p := f.Paths()
	assert.Equal(t, dir, p.Dir)
	assert.Equal(t, filepath.Join(dir, JournalName), f.Ledger.Journal)
	assert.Equal(t, filepath.Join(dir, AdminStateName), f.Admin.StateFile)
	assert.Equal(t, filepath.Join(dir, PendingName), p.Pending)
	assert.Equal(t, filepath.Join(dir, OutageName), p.LegacyOutage, "older versions' files are found where they were kept")
	assert.Equal(t, filepath.Join(dir, OutboxName), p.LegacyOutbox)
	for _, d := range f.Durability() {
		assert.NotEmpty(t, d.Path, "%s is durable by default", d.What)
	}
}

func TestDataDirExplicitAndOverrides(t *testing.T) {
	t.Parallel()
	data := t.TempDir()
	f, _, err := loadText(t, "data_dir: "+data+"\nledger: {journal: /elsewhere/j.log}\n"+minimal)
	require.NoError(t, err)
	p := f.Paths()
	assert.Equal(t, "/elsewhere/j.log", p.Journal, "an explicit key overrides data_dir")
	assert.Equal(t, filepath.Join(data, AdminStateName), p.AdminState)
	assert.Equal(t, "/elsewhere/j.log.pending.jsonl", p.Pending, "kept next to an explicit journal")
	assert.Equal(t, "/elsewhere/j.log.outage.json", p.LegacyOutage, "where older versions kept it")
	assert.Equal(t, "/elsewhere/j.log.outbox.jsonl", p.LegacyOutbox)

	// The Redis ledger has no journal; the process's own state still goes
	// to the data directory.
	f, _, err = loadText(t, "data_dir: "+data+"\nledger: {backend: redis}\n"+minimal)
	require.NoError(t, err)
	assert.Empty(t, f.Paths().Journal)
	assert.Equal(t, filepath.Join(data, PendingName), f.Paths().Pending)
	assert.Equal(t, Durable{"ledger", "redis"}, f.Durability()[0])
}

// data_dir: "" and ledger.journal: "" opt out; bytes with no file have
// no default directory.
func TestDataDirMemoryOnly(t *testing.T) {
	t.Parallel()
	f, _, err := loadText(t, "data_dir: \"\"\n"+minimal)
	require.NoError(t, err)
	for _, d := range f.Durability() {
		assert.Empty(t, d.Path, "%s with data_dir: \"\"", d.What)
	}
	f, dir, err := loadText(t, "ledger: {journal: \"\"}\n"+minimal)
	require.NoError(t, err)
	assert.Empty(t, f.Ledger.Journal, "an explicit empty journal keeps the ledger in memory")
	assert.Equal(t, filepath.Join(dir, PendingName), f.Paths().Pending)
	f, err = Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Empty(t, f.Ledger.Journal)
	assert.Empty(t, f.Paths().Pending)
	assert.Contains(t, f.Paths().DirFrom, "no config file path")
}

// admin.state_file named like the shared document next to the journal
// (the name docs/operations.md gives it) makes two writers of one file: a budget
// set through the admin API is acknowledged and not in force. Refused.
func TestDataDirCollisionRefused(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	_, _, err := loadText(t, "ledger: {journal: "+dir+"/sluice.journal}\nadmin: {state_file: "+dir+"/admin-state.json}\n"+minimal)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "admin.state_file")
	assert.Contains(t, err.Error(), "same file as the shared admin state")
	ps := Problems(err)
	require.Len(t, ps, 1)
	assert.Equal(t, 2, ps[0].Line, "located on the admin.state_file line")

	_, _, err = loadText(t, "data_dir: "+dir+"\nadmin: {state_file: "+dir+"/journal}\n"+minimal)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "same file as")

	_, _, err = loadText(t, "data_dir: "+dir+"\naudit: {path: "+dir+"/outage.json}\n"+minimal)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "audit.path")

	_, _, err = loadText(t, "data_dir: "+dir+"\naudit: {path: "+dir+"/pending.jsonl}\n"+minimal)
	require.Error(t, err)
	assert.Contains(t, err.Error(), "same file as the pending-writes log")
}
