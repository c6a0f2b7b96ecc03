package node

import (
	"context"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// TestSharedStateSurvivesRedisLosingWrites runs a two-instance fleet on a
// real redis-server through the two ways a shared store goes back: a
// failover that loses acknowledged writes (the keys hash put back as a
// replica that missed the last writes holds it) and a restart without
// persistence (everything gone). Each time, a revoke made anywhere stops
// the key on both instances within 3 s, a key the store lost but the
// instances know is revocable, and an admin change made after the loss
// applies on both instances.
func TestSharedStateSurvivesRedisLosingWrites(t *testing.T) {
	rds := startRedis(t)
	rep := startSim(t, sim.DefaultConfig())
	top := redisTop(rds)
	a := startNode(t, nodeConfig(t, []*simReplica{rep}, "", top))
	b := startNode(t, nodeConfig(t, []*simReplica{rep}, "", top))
	rc := redis.NewClient(&redis.Options{Addr: rds.addr})
	t.Cleanup(func() { _ = rc.Close() })
	ctx := context.Background()
	const keysHash = "sluice:{state:api-keys}"

	create := func(n *node, name string) (key, id string) {
		code, m, raw := n.adminDo(t, "POST", "/admin/keys", `{"tenant":"acme","name":"`+name+`"}`)
		require.Equal(t, 200, code, string(raw))
		return m["key"].(string), m["id"].(string)
	}
	// GET /v1/models authenticates without the ledger, which a Redis
	// restart also resets (this test is about the keys).
	status := func(n *node, key string) int {
		req, err := http.NewRequest(http.MethodGet, n.api+"/v1/models", nil)
		require.NoError(t, err)
		req.Header.Set("Authorization", "Bearer "+key)
		resp, err := http.DefaultClient.Do(req)
		require.NoError(t, err)
		_ = readAll(t, resp)
		return resp.StatusCode
	}
	within3s := func(what string, cond func() bool) {
		t.Helper()
		start := time.Now()
		eventually(t, what, cond)
		assert.Less(t, time.Since(start), 3*time.Second, what)
	}

	k1, id1 := create(a, "k1")
	k2, id2 := create(a, "k2")
	within3s("k2 works on B", func() bool { return status(b, k2) == 200 })
	snapshot, err := rc.HGetAll(ctx, keysHash).Result()
	require.NoError(t, err)
	require.Equal(t, "2", snapshot["rev"])

	code, _, raw := a.adminDo(t, "DELETE", "/admin/keys/"+id1, "")
	require.Equal(t, 200, code, string(raw))
	within3s("k1 refused on B", func() bool { return status(b, k1) == 401 })

	// The failover: revision 2 again, k1 present, its revocation lost.
	require.NoError(t, rc.HSet(ctx, keysHash, "rev", snapshot["rev"], "epoch", snapshot["epoch"], "data", snapshot["data"]).Err())
	within3s("the store relearns k1's revocation", func() bool {
		d, err := rc.HGet(ctx, keysHash, "data").Result()
		return err == nil && strings.Contains(d, `"revoked"`) && strings.Contains(d, id1)
	})
	for _, n := range []*node{a, b} {
		assert.Equal(t, 401, status(n, k1), "revoked before the loss: still refused")
		assert.Equal(t, 200, status(n, k2), "handed out before the loss: still works")
	}
	code, _, raw = b.adminDo(t, "DELETE", "/admin/keys/"+id2, "")
	require.Equal(t, 200, code, string(raw))
	assert.Equal(t, 401, status(b, k2))
	within3s("k2, revoked after the failover, refused on A", func() bool { return status(a, k2) == 401 })

	// The restart without persistence.
	code, _, raw = a.adminDo(t, "PUT", "/admin/budgets", `{"tenant":"acme","dimension":"requests","limit":1000,"window":"1h"}`)
	require.Equal(t, 200, code, string(raw))
	k3, id3 := create(a, "k3")
	k4, _ := create(a, "k4")
	within3s("k3 and k4 work on B", func() bool { return status(b, k3) == 200 && status(b, k4) == 200 })
	within3s("the budget applies on B", func() bool {
		_, _, raw := b.adminDo(t, "GET", "/admin/budgets", "")
		return strings.Contains(string(raw), `"limit":1000,`)
	})
	rds.stop()
	rds.start(t)
	eventually(t, "redis answers", func() bool { return rc.Ping(ctx).Err() == nil })

	code, _, raw = b.adminDo(t, "DELETE", "/admin/keys/"+id3, "")
	require.Equal(t, 200, code, "a key the store lost but the instances know is revocable: %s", raw)
	within3s("k3 refused on both", func() bool { return status(a, k3) == 401 && status(b, k3) == 401 })
	within3s("k4 works on both", func() bool { return status(a, k4) == 200 && status(b, k4) == 200 })
	for _, n := range []*node{a, b} {
		assert.Equal(t, 401, status(n, k1))
		assert.Equal(t, 401, status(n, k2))
	}

	code, _, raw = b.adminDo(t, "PUT", "/admin/budgets", `{"tenant":"acme","dimension":"tokens","limit":777777,"window":"1h"}`)
	require.Equal(t, 200, code, string(raw))
	for _, n := range []*node{a, b} {
		within3s("the budget set after the restart applies on every instance", func() bool {
			_, _, raw := n.adminDo(t, "GET", "/admin/budgets", "")
			return strings.Contains(string(raw), "777777") && strings.Contains(string(raw), `"limit":1000,`)
		})
	}
}
