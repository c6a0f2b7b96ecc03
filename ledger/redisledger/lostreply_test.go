package redisledger_test

import (
	"context"
	"io"
	"net"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
)

// dropProxy forwards every byte between the client and Redis, except that
// when armed with n it throws away the n-th reply chunk from the server and
// closes that connection: Redis has run the command, the client reads EOF,
// and go-redis retries the command on a fresh connection.
type dropProxy struct {
	ln      net.Listener
	target  string
	arm     atomic.Int64 // replies left before the one to drop; 0: disarmed
	dropped atomic.Int64

	wg    sync.WaitGroup
	mu    sync.Mutex
	conns []net.Conn
}

func startDropProxy(t *testing.T, target string) *dropProxy {
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	p := &dropProxy{ln: ln, target: target}
	p.wg.Go(p.accept)
	t.Cleanup(p.close)
	return p
}

func (p *dropProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		up, err := net.Dial("tcp", p.target)
		if err != nil {
			_ = c.Close()
			continue
		}
		p.mu.Lock()
		p.conns = append(p.conns, c, up)
		p.mu.Unlock()
		p.wg.Go(func() {
			_, _ = io.Copy(up, c)
			_ = up.Close()
		})
		p.wg.Go(func() {
			defer c.Close()
			defer up.Close()
			buf := make([]byte, 64<<10)
			for {
				n, err := up.Read(buf)
				if n > 0 {
					if p.arm.Load() > 0 && p.arm.Add(-1) == 0 {
						p.dropped.Add(1)
						return // the reply is lost with its connection
					}
					if _, werr := c.Write(buf[:n]); werr != nil {
						return
					}
				}
				if err != nil {
					return
				}
			}
		})
	}
}

func (p *dropProxy) close() {
	_ = p.ln.Close()
	p.mu.Lock()
	for _, c := range p.conns {
		_ = c.Close()
	}
	p.mu.Unlock()
	p.wg.Wait()
}

// TestLostReplyIsNotADuplicate: the reply of a Reserve
// that Redis applied is lost with its connection; go-redis retries the
// EVALSHA, which finds the record it just wrote. With the attempt's nonce
// the retry answers the original grant (Replayed false) and the holds are
// taken once; a different attempt on the same id is still Replayed. With a
// global scope, losing the reply of either writing step does the same.
func TestLostReplyIsNotADuplicate(t *testing.T) {
	srv := startRedis(t)
	rc := srv.Client(t)
	ctx := context.Background()
	direct := newLedger(t, srv.Addr(), nil)
	require.NoError(t, direct.LoadScripts(ctx)) // so the first call is EVALSHA, not NOSCRIPT + EVAL
	proxy := startDropProxy(t, srv.Addr())
	client := redis.NewClient(&redis.Options{Addr: proxy.ln.Addr().String(), Protocol: 2, DisableIdentity: true,
		ContextTimeoutEnabled: true, MaxRetries: 3})
	t.Cleanup(func() { _ = client.Close() })
	lossy, err := redisledger.New(client, redisledger.Config{LeaseTTL: 10 * time.Second, StoreTimeout: 5 * time.Second})
	require.NoError(t, err)
	// Without batching a global Reserve runs its steps one by one, as on a
	// Cluster; batched on one server they are one operation.
	stepwise, err := redisledger.New(client, redisledger.Config{LeaseTTL: 10 * time.Second, StoreTimeout: 5 * time.Second,
		MaxBatch: 1})
	require.NoError(t, err)
	require.NoError(t, client.Ping(ctx).Err())
	owner := ledger.NewOwner()
	gkey := testKeyer.GlobalKey()

	for _, tc := range []struct {
		name     string
		global   bool
		drop     int64 // which script reply of the Reserve is lost
		scripts  int64 // scripts one Reserve runs
		stepwise bool
	}{
		{"tenant only", false, 1, 1, false},
		{"global, one operation: its reply", true, 1, 1, false},
		{"global, stepwise: the global hold's reply", true, 2, 3, true},
		{"global, stepwise: the tenant step's reply", true, 3, 3, true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			lossy := lossy
			if tc.stepwise {
				lossy = stepwise
			}
			sc := []ledger.Scope{tenantScope("lost-"+tc.name, ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})}
			if tc.global {
				sc = append(sc, ledger.Scope{Kind: ledger.KindGlobal, Key: gkey,
					Limits: []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 40}}})
			}
			var g0 ledger.Usage
			if tc.global {
				g0, err = direct.Snapshot(ctx, gkey, gkey)
				require.NoError(t, err)
			}
			// Warm up: the first Reserve of a partition also registers it
			// (one SADD reply the proxy would count).
			warm := reserveReq(sc, held(1), owner)
			_, err = lossy.Reserve(ctx, warm)
			require.NoError(t, err)
			require.NoError(t, lossy.Release(ctx, warm.Ref, owner))
			req := reserveReq(sc, held(100), owner)
			req.Attempt = 0x1234_5678_9abc_def0
			calls := fcallOrEvalsha(t, rc)
			dropped := proxy.dropped.Load()
			proxy.arm.Store(tc.drop)
			g, err := lossy.Reserve(ctx, req)
			proxy.arm.Store(0)
			require.NoError(t, err)
			require.Equal(t, dropped+1, proxy.dropped.Load(), "one reply was lost")
			assert.Equal(t, calls+tc.scripts+1, fcallOrEvalsha(t, rc), "go-redis ran the lost script again")
			assert.False(t, g.Replayed, "the retry of one attempt is not a duplicate")
			assert.Equal(t, ledger.Reserved, g.State)

			u, err := direct.Snapshot(ctx, sc[0].Key, sc[0].Key)
			require.NoError(t, err)
			assert.Equal(t, int64(100), u.Reserved[ledger.Tokens], "held once")
			if tc.global {
				gu, err := direct.Snapshot(ctx, gkey, gkey)
				require.NoError(t, err)
				assert.Equal(t, g0.Reserved[ledger.Tokens]+100, gu.Reserved[ledger.Tokens], "global hold taken once")
			}

			other := req
			other.Attempt = 42
			g2, err := direct.Reserve(ctx, other)
			require.NoError(t, err)
			assert.True(t, g2.Replayed, "another attempt is a duplicate")
			assert.Equal(t, ledger.Reserved, g2.State)

			require.NoError(t, lossy.Release(ctx, req.Ref, owner))
			u, err = direct.Snapshot(ctx, sc[0].Key, sc[0].Key)
			require.NoError(t, err)
			assert.Zero(t, u.Reserved[ledger.Tokens], "released: nothing stranded")
			if tc.global {
				gu, err := direct.Snapshot(ctx, gkey, gkey)
				require.NoError(t, err)
				assert.Equal(t, g0.Reserved, gu.Reserved, "global hold released")
			}
		})
	}
}
