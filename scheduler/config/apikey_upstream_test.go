package config

import (
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const upstreamKey = "sk-vllm-upstream-secret-42"

func withReplicaKey(line string) string {
	return strings.Replace(minimal, "url: http://127.0.0.1:8100}", "url: http://127.0.0.1:8100, "+line+"}", 1)
}

// TestReplicaAPIKey: api_key_env and api_key_file are read (the file
// trimmed), both set, an unset variable, an unreadable or empty file and
// a multi-line key are refused naming the field, and no error shows the
// key.
func TestReplicaAPIKey(t *testing.T) {
	dir := t.TempDir()
	good := filepath.Join(dir, "key")
	require.NoError(t, os.WriteFile(good, []byte("  "+upstreamKey+"\n"), 0o600))
	empty := filepath.Join(dir, "empty")
	require.NoError(t, os.WriteFile(empty, []byte("\n"), 0o600))
	twoLines := filepath.Join(dir, "two")
	require.NoError(t, os.WriteFile(twoLines, []byte(upstreamKey+"\nsecond-"+upstreamKey+"\n"), 0o600))
	t.Setenv("SLUICE_TEST_UPSTREAM_KEY", upstreamKey)
	t.Setenv("SLUICE_TEST_EMPTY_KEY", "")

	for _, line := range []string{"api_key_env: SLUICE_TEST_UPSTREAM_KEY", "api_key_file: " + good} {
		f, err := Parse([]byte(withReplicaKey(line)))
		require.NoError(t, err, line)
		k, err := f.Upstream.Replicas[0].APIKey()
		require.NoError(t, err)
		assert.Equal(t, upstreamKey, k.Reveal(), line)
	}
	f, err := Parse([]byte(minimal))
	require.NoError(t, err)
	k, err := f.Upstream.Replicas[0].APIKey()
	require.NoError(t, err)
	assert.False(t, k.Set(), "no key configured, none sent")

	for _, tt := range []struct{ line, want string }{
		{"api_key_env: SLUICE_TEST_UPSTREAM_KEY, api_key_file: " + good, "upstream.replicas[0]: set api_key_env or api_key_file, not both"},
		{"api_key_env: SLUICE_TEST_UNSET_KEY", "environment variable SLUICE_TEST_UNSET_KEY is not set or empty"},
		{"api_key_env: SLUICE_TEST_EMPTY_KEY", "environment variable SLUICE_TEST_EMPTY_KEY is not set or empty"},
		{"api_key_file: " + filepath.Join(dir, "missing"), "upstream.replicas[0]: api_key_file: open " + filepath.Join(dir, "missing")},
		{"api_key_file: " + empty, empty + " is empty"},
		{"api_key_file: " + twoLines, "the key holds a control character"},
	} {
		_, err := Parse([]byte(withReplicaKey(tt.line)))
		require.Error(t, err, tt.line)
		assert.Contains(t, err.Error(), tt.want)
		assert.NotContains(t, err.Error(), upstreamKey)
	}
}
