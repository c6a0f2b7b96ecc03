package atomicfile

import (
	"os"
	"path/filepath"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestReplace(t *testing.T) {
	t.Parallel()
	for _, sync := range []bool{false, true} {
		dir := t.TempDir()
		path := filepath.Join(dir, "state.json")
		require.NoError(t, Replace(path, []byte("one"), sync))
		require.NoError(t, Replace(path, []byte("two"), sync))
		b, err := os.ReadFile(path)
		require.NoError(t, err)
		assert.Equal(t, "two", string(b))
		ents, err := os.ReadDir(dir)
		require.NoError(t, err)
		assert.Len(t, ents, 1, "no temporary file is left behind")
	}
}

// A failed replace leaves the old content and no temporary file.
func TestReplaceFailureKeepsTheOld(t *testing.T) {
	t.Parallel()
	dir := t.TempDir()
	path := filepath.Join(dir, "state.json")
	require.NoError(t, Replace(path, []byte("old"), true))
	// A directory in the way of the rename makes it fail.
	blocked := filepath.Join(dir, "sub")
	require.NoError(t, os.MkdirAll(filepath.Join(blocked, "x"), 0o755))
	require.Error(t, Replace(blocked, []byte("new"), true))
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	assert.Equal(t, "old", string(b))
	ents, err := os.ReadDir(dir)
	require.NoError(t, err)
	assert.Len(t, ents, 2, "state.json and sub only")
}
