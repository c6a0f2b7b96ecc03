package config

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestFairShareKey: server.fair_share defaults to fleet, takes local, and
// refuses anything else naming the key and the choices.
func TestFairShareKey(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, "fleet", f.Server.FairShare)
	f, err = Parse([]byte("server: {fair_share: local}\n" + minimal))
	require.NoError(t, err)
	assert.Equal(t, "local", f.Server.FairShare)
	_, err = Parse([]byte("server: {fair_share: global}\n" + minimal))
	require.Error(t, err)
	assert.Contains(t, err.Error(), "server.fair_share")
	assert.Contains(t, err.Error(), "local")
}
