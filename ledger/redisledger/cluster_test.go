package redisledger_test

import (
	"context"
	"errors"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/testport"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// redisCluster is a real Redis Cluster of primaries on loopback, each its own
// redis-server with an equal share of the 16,384 slots and no replicas.
type redisCluster struct {
	nodes []*redisServer
}

// startCluster starts n Cluster nodes, splits the slots between them, gives
// each its own config epoch and waits until every node reports the cluster
// ok and knows every node and its epoch.
func startCluster(t testing.TB, n int) *redisCluster {
	t.Helper()
	c := &redisCluster{}
	bus := make([]int, n)
	for i := range n {
		// The bus port is given, not the default port+10000, which may be
		// out of range or taken; MEET names it.
		bus[i] = testport.Free(t)
		c.nodes = append(c.nodes, startRedisArgs(t, "--cluster-enabled", "yes",
			"--cluster-config-file", "nodes.conf", "--cluster-node-timeout", "5000",
			"--cluster-port", strconv.Itoa(bus[i])))
	}
	ctx := context.Background()
	clients := make([]*redis.Client, n)
	for i, s := range c.nodes {
		clients[i] = s.Client(t)
		lo, hi := i*16384/n, (i+1)*16384/n-1
		require.NoError(t, clients[i].Do(ctx, "CLUSTER", "ADDSLOTSRANGE", lo, hi).Err())
		// Distinct epochs before MEET, as redis-cli --cluster create sets
		// them. Left at 0, the nodes resolve the collision by bumping epochs
		// over gossip for seconds, and a move (finishMove) in that time can
		// leave the old owner with a greater epoch than the new one's: the
		// new owner is then told the slot is not its own and drops every key
		// it has in it (Redis's dirty-slot handling of an UPDATE).
		require.NoError(t, clients[i].Do(ctx, "CLUSTER", "SET-CONFIG-EPOCH", i+1).Err())
	}
	for i, s := range c.nodes[1:] {
		require.NoError(t, clients[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", s.port, bus[i+1]).Err())
	}
	// Gossip has no completion event to wait on: poll each node's view.
	deadline := time.Now().Add(30 * time.Second)
	for _, cl := range clients {
		for {
			info, err := cl.ClusterInfo(ctx).Result()
			if err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r") &&
				knowsEpochs(cl.ClusterNodes(ctx).Val(), n) {
				break
			}
			if time.Now().After(deadline) {
				t.Fatalf("cluster of %d not ready after 30s: %v %s", n, err, info)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return c
}

// knowsEpochs reports whether a CLUSTER NODES answer lists n nodes, none in
// handshake, with the epochs 1..n startCluster gave them.
func knowsEpochs(nodes string, n int) bool {
	seen := map[string]bool{}
	for _, ln := range strings.Split(strings.TrimSpace(nodes), "\n") {
		f := strings.Fields(ln)
		if len(f) < 8 || strings.Contains(f[2], "handshake") {
			return false
		}
		seen[f[6]] = true
	}
	for i := 1; i <= n; i++ {
		if !seen[strconv.Itoa(i)] {
			return false
		}
	}
	return len(seen) == n
}

// Addrs returns every node's address (a Ledger given several opens a Cluster
// client).
func (c *redisCluster) Addrs() []string {
	out := make([]string, len(c.nodes))
	for i, s := range c.nodes {
		out[i] = s.Addr()
	}
	return out
}

// Client returns a Cluster client for assertions and set-up, closed at
// cleanup.
func (c *redisCluster) Client(t testing.TB) *redis.ClusterClient {
	cc := redis.NewClusterClient(&redis.ClusterOptions{Addrs: c.Addrs()})
	t.Cleanup(func() { _ = cc.Close() })
	return cc
}

// nodeOf returns the node that holds tenant's partition.
func nodeOf(t testing.TB, cc *redis.ClusterClient, tenant ledger.ScopeKey) *redis.Client {
	t.Helper()
	c, err := cc.MasterForKey(context.Background(), metaKey(tenant))
	require.NoError(t, err)
	return c
}

// clusterLedger starts a three-node Cluster and a Ledger on it, its scripts
// loaded.
func clusterLedger(t *testing.T) (*redisCluster, *redis.ClusterClient, *redisledger.Ledger) {
	t.Helper()
	c := startCluster(t, 3)
	l := newLedgerAt(t, c.Addrs(), nil)
	require.NoError(t, l.LoadScripts(t.Context()))
	return c, c.Client(t), l
}

// beginMove starts moving slot from one node to another as redis-cli
// --cluster reshard does (IMPORTING, MIGRATING) and migrates keys, the
// slot's keys split between the two nodes until finishMove.
func beginMove(t *testing.T, from, to *redis.Client, slot int, keys ...string) {
	t.Helper()
	ctx := t.Context()
	fromID, toID := from.Do(ctx, "CLUSTER", "MYID").Val(), to.Do(ctx, "CLUSTER", "MYID").Val()
	require.NoError(t, to.Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", fromID).Err())
	require.NoError(t, from.Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", toID).Err())
	for _, k := range keys {
		require.NoError(t, from.Do(ctx, "MIGRATE", "127.0.0.1", port(to), k, 0, 5000).Err())
	}
}

// finishMove migrates the rest of slot's keys and gives every node the
// slot's new owner.
func (c *redisCluster) finishMove(t *testing.T, from, to *redis.Client, slot int) {
	t.Helper()
	ctx := t.Context()
	keys, err := from.ClusterGetKeysInSlot(ctx, slot, 1000).Result()
	require.NoError(t, err)
	args := []any{"MIGRATE", "127.0.0.1", port(to), "", 0, 5000, "KEYS"}
	for _, k := range keys {
		args = append(args, k)
	}
	require.NoError(t, from.Do(ctx, args...).Err())
	held, err := to.ClusterCountKeysInSlot(ctx, slot).Result()
	require.NoError(t, err)
	toID := to.Do(ctx, "CLUSTER", "MYID").Val()
	// The destination first: SETSLOT NODE there bumps its config epoch
	// (the one step that does so without agreement), so the old owner's
	// gossip cannot win the slot back on the others (CLUSTER SETSLOT's
	// documented order: destination, source, then the rest).
	clients := []*redis.Client{to, from}
	for _, s := range c.nodes {
		if cl := s.Client(t); cl.Options().Addr != to.Options().Addr && cl.Options().Addr != from.Options().Addr {
			clients = append(clients, cl)
		}
	}
	for _, cl := range clients {
		require.NoError(t, cl.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", toID).Err())
	}
	// Every node names the new owner (the destination's epoch, now the
	// greatest, wins any gossip) and it still holds every key of the slot:
	// a node that named another owner again would mean the destination had
	// been told the slot is not its own, and had dropped the slot's keys.
	for _, cl := range clients {
		slots, err := cl.ClusterSlots(ctx).Result()
		require.NoError(t, err)
		require.Equal(t, toID, ownerOf(slots, slot), "%s: owner of slot %d", cl.Options().Addr, slot)
	}
	n, err := to.ClusterCountKeysInSlot(ctx, slot).Result()
	require.NoError(t, err)
	require.Equal(t, held, n, "keys of slot %d on its new owner", slot)
}

// ownerOf is the id of the primary serving slot in a CLUSTER SLOTS answer.
func ownerOf(slots []redis.ClusterSlot, slot int) string {
	for _, r := range slots {
		if r.Start <= slot && slot <= r.End && len(r.Nodes) > 0 {
			return r.Nodes[0].ID
		}
	}
	return ""
}

func port(c *redis.Client) string { return strings.TrimPrefix(c.Options().Addr, "127.0.0.1:") }

// TestClusterSpread: on a three-node Cluster, concurrent pairs of 24 tenants
// that all share a global budget land on every node, and every count is
// exact: each tenant's committed tokens and the global scope's equal the
// actuals settled, nothing stays reserved, and every primary has the
// function library the batches call.
func TestClusterSpread(t *testing.T) {
	_, cc, l := clusterLedger(t)
	ctx := t.Context()
	owner := ledger.NewOwner()
	g := ledger.Scope{Kind: ledger.KindGlobal, Key: testKeyer.GlobalKey(),
		Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 40}}}
	const tenants, per = 24, 8
	scopes := make([][]ledger.Scope, tenants)
	var wg sync.WaitGroup
	for i := range tenants {
		scopes[i] = []ledger.Scope{tenantScope(fmt.Sprintf("spread-%d", i),
			ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30}), g}
		for j := range per {
			wg.Go(func() {
				req := reserveReq(scopes[i], held(100), owner)
				req.Dispatch = true
				if _, err := l.Reserve(ctx, req); err != nil {
					t.Errorf("reserve: %v", err)
					return
				}
				if _, err := l.Settle(ctx, req.Ref, held(int64(10+j)), ledger.SourceFinal); err != nil {
					t.Errorf("settle: %v", err)
				}
			})
		}
	}
	wg.Wait()
	const each = per*10 + per*(per-1)/2 // Σ (10 + j)
	nodes := map[string]int{}
	for _, sc := range scopes {
		u, err := l.Snapshot(ctx, sc[0].Key, sc[0].Key)
		require.NoError(t, err)
		require.Len(t, u.Limits, 1)
		assert.Equal(t, int64(each), u.Limits[0].Committed)
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
		nodes[nodeOf(t, cc, sc[0].Key).Options().Addr]++
	}
	u, err := l.Snapshot(ctx, g.Key, g.Key)
	require.NoError(t, err)
	require.Len(t, u.Limits, 1)
	assert.Equal(t, int64(tenants*each), u.Limits[0].Committed, "the global scope, charged on its own node")
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
	assert.Len(t, nodes, 3, "tenants on every node: %v", nodes)
	require.NoError(t, cc.ForEachMaster(ctx, func(ctx context.Context, n *redis.Client) error {
		libs, err := n.FunctionList(ctx, redis.FunctionListQuery{}).Result()
		if err == nil && len(libs) != 1 {
			err = fmt.Errorf("%s: %d function libraries", n.Options().Addr, len(libs))
		}
		return err
	}))
}

// TestClusterSlotMigrating: operations of a slot that is moving between
// nodes, batched on its old node with other slots' operations, never run
// there half: while the slot's scope hash is already on the new node, each
// of them fails "unavailable" (it never ran; not ambiguous, not corrupt) or
// succeeds, and once the slot has moved every count is exact.
func TestClusterSlotMigrating(t *testing.T) {
	c, cc, l := clusterLedger(t)
	ctx := t.Context()
	owner := ledger.NewOwner()
	lim := ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 30}
	moving := []ledger.Scope{tenantScope("moving", lim)}
	from := nodeOf(t, cc, moving[0].Key)
	var to *redis.Client
	for _, s := range c.nodes {
		if n := s.Client(t); n.Options().Addr != from.Options().Addr {
			to = n
			break
		}
	}
	// Tenants on the same node, in other slots: their operations share the
	// moving one's batches.
	var others [][]ledger.Scope
	for i := 0; len(others) < 12; i++ {
		sc := []ledger.Scope{tenantScope(fmt.Sprintf("neighbour-%d", i), lim)}
		if nodeOf(t, cc, sc[0].Key).Options().Addr == from.Options().Addr {
			others = append(others, sc)
		}
	}
	open := reserveReq(moving, held(100), owner)
	open.Dispatch = true
	_, err := l.Reserve(ctx, open)
	require.NoError(t, err)

	base := "sluice:{" + moving[0].Key.String() + "}:"
	slot := int(cc.ClusterKeySlot(ctx, base+"m").Val())
	beginMove(t, from, to, slot, base+"s:"+moving[0].Key.String())

	// The open request settles and new ones arrive while the slot moves,
	// among the neighbours' pairs. The old node holds writes for a moment,
	// so that they queue and go together in mixed batches.
	var mu sync.Mutex
	var ran, refused, settledOpen int
	var wg sync.WaitGroup
	const waves = 3 // (each is likelier than not to put one of them after another slot's)
	for wave := range waves {
		require.NoError(t, from.Do(ctx, "CLIENT", "PAUSE", 200, "WRITE").Err())
		// The neighbours first: the moving slot's operations then mostly queue
		// behind them and go later in mixed batches, where only the probe
		// guards them.
		for range 8 {
			for _, sc := range others {
				wg.Go(func() {
					req := reserveReq(sc, held(100), owner)
					req.Dispatch = true
					if _, err := l.Reserve(ctx, req); err != nil {
						t.Errorf("neighbour reserve: %v", err)
						return
					}
					if _, err := l.Settle(ctx, req.Ref, held(7), ledger.SourceFinal); err != nil {
						t.Errorf("neighbour settle: %v", err)
					}
				})
			}
		}
		for r := range 8 {
			wg.Go(func() {
				var err error
				if wave == 0 && r == 0 {
					_, err = l.Settle(ctx, open.Ref, held(10), ledger.SourceFinal)
				} else {
					req := reserveReq(moving, held(100), owner)
					req.Dispatch = true
					_, err = l.Reserve(ctx, req)
					if err == nil {
						_, err = l.Settle(ctx, req.Ref, held(1), ledger.SourceFinal)
					}
				}
				mu.Lock()
				defer mu.Unlock()
				switch {
				case err == nil:
					ran++
					if wave == 0 && r == 0 {
						settledOpen++
					}
				case errors.Is(err, ledger.ErrUnavailable):
					refused++
				default:
					t.Errorf("an operation of the moving slot: %v (want success or unavailable)", err)
				}
			})
		}
		wg.Wait()
	}
	require.Equal(t, 8*waves, ran+refused)
	require.Positive(t, refused, "the moving slot's operations were refused while its keys were split")

	// Finish the move: the rest of the slot's keys, then its new owner.
	c.finishMove(t, from, to, slot)
	if settledOpen == 0 {
		_, err = l.Settle(ctx, open.Ref, held(10), ledger.SourceFinal)
		require.NoError(t, err, "the open request settles on the slot's new node")
	}
	u, err := l.Snapshot(ctx, moving[0].Key, moving[0].Key)
	require.NoError(t, err)
	assert.Equal(t, int64(10+(ran-settledOpen)), u.Limits[0].Committed, "%d ran, %d refused", ran, refused)
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
	for _, sc := range others {
		u, err := l.Snapshot(ctx, sc[0].Key, sc[0].Key)
		require.NoError(t, err)
		assert.Equal(t, int64(waves*8*7), u.Limits[0].Committed)
		assert.Equal(t, ledger.Amounts{}, u.Reserved)
	}
}

// TestClusterReclaimAll: one tick of Run on a Cluster scans each node's
// partitions in one call and reclaims every due record exactly; a
// partition whose slot is moving (its keys split between two nodes) is
// left for a later tick, never half-read, and reclaimed once the move is
// done; an idle tick then costs one scan call per node.
func TestClusterReclaimAll(t *testing.T) {
	c := startCluster(t, 3)
	cc := c.Client(t)
	ctx := t.Context()
	crashed := newLedgerAt(t, c.Addrs(), nil)
	w := newReclaimWorld(t, crashed, "cluster-reclaim", 90)

	const moving = 3 // a RESERVED one
	mkey := metaKey(w.refs[moving].Tenant)
	from := nodeOf(t, cc, w.refs[moving].Tenant)
	var to *redis.Client
	for _, s := range c.nodes {
		if n := s.Client(t); n.Options().Addr != from.Options().Addr {
			to = n
			break
		}
	}
	// A partition of the same node goes first in its scan, so that the
	// moving one's keys are undeclared ones of that node's call.
	var first ledger.ScopeKey
	for i, ref := range w.refs {
		if i != moving && nodeOf(t, cc, ref.Tenant).Options().Addr == from.Options().Addr {
			first = ref.Tenant
			break
		}
	}
	require.False(t, first.IsZero())
	l := newLedgerAt(t, c.Addrs(), func(cfg *redisledger.Config) { cfg.Tenants = []ledger.ScopeKey{first} })
	later := time.Now().Add(2 * time.Hour).UnixMilli()
	redisledger.SetTimeFloor(l, func() int64 { return later })
	require.NoError(t, l.LoadScripts(ctx))

	slot := int(cc.ClusterKeySlot(ctx, mkey).Val())
	beginMove(t, from, to, slot, mkey)

	redisledger.ReclaimAll(ctx, l)
	w.check(t, l, cc, moving)

	c.finishMove(t, from, to, slot)
	redisledger.ReclaimAll(ctx, l)
	w.check(t, l, cc, -1)

	for _, s := range c.nodes {
		require.NoError(t, s.Client(t).ConfigResetStat(ctx).Err())
	}
	redisledger.ReclaimAll(ctx, l)
	var scans, writes int64
	for _, s := range c.nodes {
		scans += commandCalls(t, s.Client(t), "fcall_ro")
		writes += commandCalls(t, s.Client(t), "fcall")
	}
	assert.Equal(t, int64(3), scans, "an idle tick: one scan call per node")
	assert.Zero(t, writes)
}
