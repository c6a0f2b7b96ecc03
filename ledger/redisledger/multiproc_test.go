package redisledger_test

import (
	"context"
	"encoding/hex"
	"errors"
	"fmt"
	"os"
	"os/exec"
	"strconv"
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

// Multi-process tests re-execute the test binary with SLUICE_CHILD set; the
// child runs TestChildProcess, which reads its job from the environment,
// synchronises with the parent through Redis lists (a barrier per round) and
// reports its counts into Redis hashes under "test:".

const (
	t1Procs      = 8
	t1Goroutines = 25
	t1Limit      = 1000
	t1Amount     = 7
)

func t1Scope(run string, round int) ledger.Scope {
	return tenantScope(fmt.Sprintf("t1-%s-%d", run, round), ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: t1Limit})
}

// spawn starts n children of the given mode and returns a wait function.
func spawn(t *testing.T, n int, env ...string) func() {
	t.Helper()
	cmds := make([]*exec.Cmd, n)
	outs := make([]*lockedBuf, n)
	for i := range cmds {
		c := exec.Command(os.Args[0], "-test.run=^TestChildProcess$", "-test.count=1", "-test.v")
		c.Env = append(append(os.Environ(), "SLUICE_CHILD=1", "SLUICE_CHILD_INDEX="+strconv.Itoa(i)), env...)
		outs[i] = &lockedBuf{}
		c.Stdout, c.Stderr = outs[i], outs[i]
		require.NoError(t, c.Start())
		cmds[i] = c
	}
	return func() {
		for i, c := range cmds {
			if err := c.Wait(); err != nil {
				t.Errorf("child %d: %v\n%s", i, err, outs[i].String())
			}
		}
	}
}

type lockedBuf struct {
	mu sync.Mutex
	b  []byte
}

func (b *lockedBuf) Write(p []byte) (int, error) {
	b.mu.Lock()
	defer b.mu.Unlock()
	b.b = append(b.b, p...)
	return len(p), nil
}

func (b *lockedBuf) String() string {
	b.mu.Lock()
	defer b.mu.Unlock()
	return string(b.b)
}

// barrier waits for n children to arrive at name, then releases them.
func barrier(ctx context.Context, t *testing.T, rc *redis.Client, name string, n int) {
	t.Helper()
	for range n {
		_, err := rc.BLPop(ctx, 30*time.Second, "test:ready:"+name).Result()
		require.NoError(t, err, "waiting for children at %s", name)
	}
	for range n {
		require.NoError(t, rc.RPush(ctx, "test:go:"+name, 1).Err())
	}
}

func childArrive(ctx context.Context, rc *redis.Client, name string) error {
	if err := rc.RPush(ctx, "test:ready:"+name, 1).Err(); err != nil {
		return err
	}
	_, err := rc.BLPop(ctx, 30*time.Second, "test:go:"+name).Result()
	return err
}

// TestChildProcess is the body of a re-executed child; it is skipped in a
// normal run.
func TestChildProcess(t *testing.T) {
	if os.Getenv("SLUICE_CHILD") != "1" {
		t.Skip("only runs as a child of a multi-process test")
	}
	ctx := context.Background()
	addr := os.Getenv("SLUICE_REDIS")
	rc := redis.NewClient(&redis.Options{Addr: os.Getenv("SLUICE_REDIS_DIRECT")})
	defer rc.Close()
	var l *redisledger.Ledger
	if rt, err := time.ParseDuration(os.Getenv("SLUICE_READ_TIMEOUT")); err == nil {
		// Behind the delaying proxy: short read timeouts, default retries.
		c := redis.NewClient(&redis.Options{Addr: addr, ReadTimeout: rt, WriteTimeout: rt, ContextTimeoutEnabled: true,
			Protocol: 2, DisableIdentity: true}) // no handshake replies, so the proxy counts command replies only
		defer c.Close()
		l, err = redisledger.New(c, redisledger.Config{LeaseTTL: 30 * time.Second, StoreTimeout: 20 * time.Second})
		require.NoError(t, err)
	} else {
		var err error
		l, err = redisledger.Open(redisledger.Config{Addrs: []string{addr}, LeaseTTL: 30 * time.Second, StoreTimeout: 5 * time.Second})
		require.NoError(t, err)
		defer l.Close()
	}
	owner := ledger.NewOwner()
	switch os.Getenv("SLUICE_CHILD_MODE") {
	case "t1":
		rounds, _ := strconv.Atoi(os.Getenv("SLUICE_ROUNDS"))
		run := os.Getenv("SLUICE_RUN")
		for round := range rounds {
			sc := []ledger.Scope{t1Scope(run, round)}
			name := fmt.Sprintf("%s:%d", run, round)
			require.NoError(t, childArrive(ctx, rc, name))
			var wg sync.WaitGroup
			start := make(chan struct{})
			for range t1Goroutines {
				wg.Add(1)
				go func() {
					defer wg.Done()
					req := reserveReq(sc, held(t1Amount), owner)
					<-start
					g, err := l.Reserve(ctx, req)
					// An unknown outcome is resolved by replaying the same id,
					// as the outbox does (LEDGER.md §4).
					for i := 0; i < 20 && errors.Is(err, ledger.ErrAmbiguous); i++ {
						rc.HIncrBy(ctx, "test:res:"+run, "ambiguous", 1)
						g, err = l.Reserve(ctx, req)
					}
					var de *ledger.DeniedError
					field := "other"
					switch {
					case err == nil:
						field = "granted"
						if g.Replayed { // a go-redis retry re-ran the script after a lost reply
							rc.HIncrBy(ctx, "test:res:"+run, "replayed", 1)
						}
						rc.RPush(ctx, "test:ids:"+name, hex.EncodeToString(req.Ref.ID[:])+owner.String())
					case errors.As(err, &de) && de.Dim == ledger.Tokens && de.Limit == t1Limit:
						field = "denied"
					default:
						rc.RPush(ctx, "test:errs:"+name, err.Error())
					}
					rc.HIncrBy(ctx, "test:res:"+name, field, 1)
				}()
			}
			close(start)
			wg.Wait()
			rc.RPush(ctx, "test:done:"+name, 1)
		}
	case "dupreserve":
		// T3: the same id 50x from each of 2 processes.
		sc := []ledger.Scope{tenantScope("t3", ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1000})}
		req := reserveReq(sc, held(7), owner)
		idb, _ := hex.DecodeString(os.Getenv("SLUICE_ID"))
		copy(req.Ref.ID[:], idb)
		require.NoError(t, childArrive(ctx, rc, "t3"))
		parallel(50, func() {
			g, err := l.Reserve(ctx, req)
			if err != nil {
				rc.HIncrBy(ctx, "test:res:t3", "other", 1)
				return
			}
			rc.HIncrBy(ctx, "test:res:t3", "replayed="+strconv.FormatBool(g.Replayed), 1)
			rc.SAdd(ctx, "test:lease:t3", g.LeaseExpiry.UnixMilli())
		})
	case "dupsettle":
		// T5: the same actual from 8 processes.
		idb, _ := hex.DecodeString(os.Getenv("SLUICE_ID"))
		ref := ledger.Ref{Tenant: testKeyer.Key(ledger.KindTenant, "t5")}
		copy(ref.ID[:], idb)
		require.NoError(t, childArrive(ctx, rc, "t5"))
		parallel(13, func() {
			s, err := l.Settle(ctx, ref, held(5), ledger.SourceFinal)
			if err != nil {
				rc.HIncrBy(ctx, "test:res:t5", "other", 1)
				return
			}
			rc.HIncrBy(ctx, "test:res:t5", "replayed="+strconv.FormatBool(s.Replayed), 1)
		})
	default:
		t.Fatalf("unknown child mode %q", os.Getenv("SLUICE_CHILD_MODE"))
	}
}

// parallel runs f on n goroutines released together and waits for them.
func parallel(n int, f func()) {
	var wg sync.WaitGroup
	start := make(chan struct{})
	for range n {
		wg.Add(1)
		go func() {
			defer wg.Done()
			<-start
			f()
		}()
	}
	close(start)
	wg.Wait()
}

func hgetInt(t *testing.T, rc *redis.Client, key, field string) int64 {
	t.Helper()
	v, err := rc.HGet(context.Background(), key, field).Int64()
	if errors.Is(err, redis.Nil) {
		return 0
	}
	require.NoError(t, err)
	return v
}

// TestT1ConcurrencyExactness: 8 processes x 25 goroutines per round on one
// Redis, limit 1000, amount 7 → exactly 142 grants and 58 denials per round;
// then half settled, half released → r == 0, n == 0, c == Σ actual.
func TestT1ConcurrencyExactness(t *testing.T) {
	if os.Getenv("SLUICE_CHILD") == "1" {
		t.Skip("parent test")
	}
	for _, tc := range []struct {
		name   string
		rounds int
		delay  time.Duration // every 3rd reply chunk of a connection delayed past the 500ms read timeout (generous: 2 shared cores under -race); 0 = direct
	}{
		{name: "direct", rounds: 10},
		{name: "delaying_proxy", rounds: 3, delay: 1500 * time.Millisecond},
	} {
		t.Run(tc.name, func(t *testing.T) {
			srv := startRedis(t)
			addr := srv.Addr()
			env := []string{}
			if tc.delay > 0 {
				addr = startDelayProxyEvery(t, srv.Addr(), tc.delay, 3).Addr()
				env = append(env, "SLUICE_READ_TIMEOUT=500ms")
			}
			rc := srv.Client(t)
			ctx := context.Background()
			l := newLedger(t, srv.Addr(), nil)
			require.NoError(t, l.LoadScripts(ctx)) // children behind the proxy never see NOSCRIPT

			// The sampler reads Snapshot every 1 ms and must never see c + r > limit.
			var violations, samples atomic.Int64
			var round atomic.Int64
			sctx, stop := context.WithCancel(ctx)
			var sw sync.WaitGroup
			sw.Add(1)
			go func() {
				defer sw.Done()
				tk := time.NewTicker(time.Millisecond)
				defer tk.Stop()
				for {
					select {
					case <-sctx.Done():
						return
					case <-tk.C:
					}
					sc := t1Scope(tc.name, int(round.Load()))
					u, err := l.Snapshot(sctx, sc.Key, sc.Key)
					if err != nil {
						continue
					}
					samples.Add(1)
					for _, lu := range u.Limits {
						if lu.Committed+lu.Reserved > lu.Limit.Max {
							violations.Add(1)
						}
					}
				}
			}()

			env = append(env, "SLUICE_CHILD_MODE=t1", "SLUICE_REDIS="+addr, "SLUICE_REDIS_DIRECT="+srv.Addr(),
				"SLUICE_ROUNDS="+strconv.Itoa(tc.rounds), "SLUICE_RUN="+tc.name)
			wait := spawn(t, t1Procs, env...)

			for r := range tc.rounds {
				round.Store(int64(r))
				name := fmt.Sprintf("%s:%d", tc.name, r)
				barrier(ctx, t, rc, name, t1Procs)
				for range t1Procs {
					_, err := rc.BLPop(ctx, 60*time.Second, "test:done:"+name).Result()
					require.NoError(t, err)
				}
				errs, _ := rc.LRange(ctx, "test:errs:"+name, 0, 5).Result()
				assert.Equal(t, int64(t1Limit/t1Amount), hgetInt(t, rc, "test:res:"+name, "granted"), "round %d grants", r)
				assert.Equal(t, int64(t1Procs*t1Goroutines-t1Limit/t1Amount), hgetInt(t, rc, "test:res:"+name, "denied"), "round %d denials", r)
				assert.Equal(t, int64(0), hgetInt(t, rc, "test:res:"+name, "other"), "round %d other errors: %v", r, errs)

				sc := t1Scope(tc.name, r)
				u, err := l.Snapshot(ctx, sc.Key, sc.Key)
				require.NoError(t, err)
				assert.Equal(t, int64(994), u.Reserved[ledger.Tokens], "round %d server r", r)

				// Half dispatched and settled (actual ≤ h), half released.
				ids, err := rc.LRange(ctx, "test:ids:"+name, 0, -1).Result()
				require.NoError(t, err)
				var sumActual int64
				for i, s := range ids {
					b, err := hex.DecodeString(s)
					require.NoError(t, err)
					ref := ledger.Ref{Tenant: sc.Key}
					copy(ref.ID[:], b[:16])
					var owner ledger.Owner
					copy(owner[:], b[16:])
					if i%2 == 0 {
						require.NoError(t, l.MarkDispatched(ctx, ref, owner))
						a := held(int64(i % 8)) // 0..7 ≤ h
						_, err := l.Settle(ctx, ref, a, ledger.SourceFinal)
						require.NoError(t, err)
						sumActual += a[ledger.Tokens]
					} else {
						require.NoError(t, l.Release(ctx, ref, owner))
					}
				}
				u, err = l.Snapshot(ctx, sc.Key, sc.Key)
				require.NoError(t, err)
				assert.Equal(t, int64(0), u.Reserved[ledger.Tokens], "round %d r after settle", r)
				assert.Equal(t, int64(0), u.SlotsInUse, "round %d n after settle", r)
				require.Len(t, u.Limits, 1)
				assert.Equal(t, sumActual, u.Limits[0].Committed, "round %d c == Σ actual", r)
			}
			wait()
			stop()
			sw.Wait()
			if tc.delay > 0 {
				replayed := hgetInt(t, rc, "test:res:"+tc.name, "replayed")
				t.Logf("%d grants came from a retried script run; %d calls were ambiguous and replayed by id",
					replayed, hgetInt(t, rc, "test:res:"+tc.name, "ambiguous"))
				assert.Positive(t, replayed, "some replies were lost and the retried script answered Replayed")
			}
			assert.Equal(t, int64(0), violations.Load(), "sampler saw c + r > limit (of %d samples)", samples.Load())
		})
	}
}

// TestT1SlotsExactness: with 5 slots, exactly 5 of 200 concurrent
// MarkDispatched calls (8 ledger instances, own pools) succeed.
func TestT1SlotsExactness(t *testing.T) {
	srv := startRedis(t)
	ctx := context.Background()
	ls := make([]*redisledger.Ledger, 8)
	for i := range ls {
		ls[i] = newLedger(t, srv.Addr(), nil)
	}
	owner := ledger.NewOwner()
	sc := []ledger.Scope{tenantScope("t1-slots",
		ledger.Limit{Dim: ledger.Tokens, Window: time.Hour, Max: 1 << 40},
		ledger.Limit{Dim: ledger.Slots, Max: 5})}
	refs := make([]ledger.Ref, 200)
	for i := range refs {
		req := reserveReq(sc, held(1), owner)
		_, err := ls[0].Reserve(ctx, req)
		require.NoError(t, err)
		refs[i] = req.Ref
	}
	var ok, denied, other atomic.Int64
	var next atomic.Int64
	parallel(200, func() {
		i := next.Add(1) - 1
		err := ls[i%8].MarkDispatched(ctx, refs[i], owner)
		var de *ledger.DeniedError
		switch {
		case err == nil:
			ok.Add(1)
		case errors.As(err, &de) && de.Dim == ledger.Slots:
			denied.Add(1)
		default:
			other.Add(1)
		}
	})
	assert.Equal(t, int64(5), ok.Load())
	assert.Equal(t, int64(195), denied.Load())
	assert.Equal(t, int64(0), other.Load())
	u, err := ls[0].Snapshot(ctx, sc[0].Key, sc[0].Key)
	require.NoError(t, err)
	assert.Equal(t, int64(5), u.SlotsInUse)
}
