package peers_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/redistest"
	"github.com/sluicehq/sluice/queue/fleet"
	"github.com/sluicehq/sluice/scheduler/peers"
)

// TestExchangeFlows: each instance reads the others' latest flow reports
// exactly (tenant names of any characters, fractional service, lifts and
// backlog), never its own; a malformed report is left out whole and
// named; LeaveFlows removes this instance's.
func TestExchangeFlows(t *testing.T) {
	addr := redistest.Start(t)
	ctx := t.Context()
	c := client(t, addr)
	a := peers.NewRedis(c, "t", "a", "h1", time.Minute)
	b := peers.NewRedis(client(t, addr), "t", "b", "h1", time.Minute)
	mine := []fleet.Flow{
		{Tenant: "team a/b c%", Band: 2, Service: 1234.5, Lifted: 1e12 + 0.25, Backlogged: true, Gen: 7},
		{Tenant: "acme", Service: -3},
	}
	got, err := a.ExchangeFlows(ctx, mine)
	require.NoError(t, err)
	assert.Empty(t, got, "alone")
	got, err = b.ExchangeFlows(ctx, nil)
	require.NoError(t, err)
	assert.Equal(t, map[string][]fleet.Flow{"a": mine}, got)

	tm, err := c.Time(ctx).Result()
	require.NoError(t, err)
	require.NoError(t, c.HSet(ctx, "t:{peers}:fair", "bad", fmt.Sprintf("%d acme 0 1 NaN 0 1", tm.UnixMilli())).Err())
	got, err = b.ExchangeFlows(ctx, nil)
	require.ErrorIs(t, err, peers.ErrMalformed)
	require.ErrorContains(t, err, `instance "bad"`)
	assert.Equal(t, map[string][]fleet.Flow{"a": mine}, got, "the others' still count")

	require.NoError(t, a.LeaveFlows(ctx))
	require.NoError(t, c.HDel(ctx, "t:{peers}:fair", "bad").Err())
	got, err = b.ExchangeFlows(ctx, nil)
	require.NoError(t, err)
	assert.Empty(t, got, "a left")
}
