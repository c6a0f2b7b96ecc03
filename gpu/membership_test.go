package gpu

import (
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestMonitorMembership: a replica added at run time has no capacity until
// a scrape of it is observed; a duplicate is refused; a removed one is
// unknown again.
func TestMonitorMembership(t *testing.T) {
	t.Parallel()
	m, err := NewMonitor(Config{Telemetry: ModeOff, Replicas: []Replica{{Name: "r0"}}}, Deps{})
	require.NoError(t, err)
	require.NoError(t, m.AddReplica(Replica{Name: "r1"}))
	assert.Error(t, m.AddReplica(Replica{Name: "r1"}))
	k, st, _ := m.Capacity("r1")
	assert.Equal(t, int64(0), k, "nothing routed before a scrape")
	assert.Equal(t, StateHealthy, st)
	require.NotNil(t, m.Clock("r1"))

	require.NoError(t, m.ObserveReplica("r1", ReplicaMetrics{OK: true, NumGPUBlocks: 100, BlockSize: 16}))
	k, _, _ = m.Capacity("r1")
	assert.GreaterOrEqual(t, k, int64(1600), "sized from its KV cache (times the overcommit)")

	require.NoError(t, m.RemoveReplica("r1"))
	_, st, why := m.Capacity("r1")
	assert.Equal(t, StateDown, st)
	assert.Equal(t, "unknown replica", why)
	assert.Nil(t, m.Clock("r1"))
	assert.ErrorIs(t, m.ObserveReplica("r1", ReplicaMetrics{OK: true}), ErrUnknownReplica)
	assert.Len(t, m.Snapshot().Replicas, 1)
}
