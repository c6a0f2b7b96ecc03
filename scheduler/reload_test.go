package scheduler

import (
	"context"
	"fmt"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestIdempotencyCacheFollowsRetention: the response cache keeps a
// completed body for ledger.tombstone_retention, not a fixed hour; past it
// the ledger (which here keeps its tombstones longer) still answers 409
// completed, and nothing runs twice. A reload may not change the retention.
func TestIdempotencyCacheFollowsRetention(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 3}
		s := newTestServer(t, lifecycletest.Config(t, "ledger: {tombstone_retention: 5m}\n", ""), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.DispatchLoop(ctx)
		body, err := serve(ctx, s, lifecycle.Admission{Body: lifecycletest.ChatBody(""), IdempotencyKey: "k"})
		require.NoError(t, err)

		time.Sleep(5 * time.Minute)
		_, err = serve(ctx, s, lifecycle.Admission{Body: lifecycletest.ChatBody(""), IdempotencyKey: "k"})
		replay, ok := s.Replayed(acme(t, s), err)
		require.True(t, ok, "within the retention: the cached body")
		assert.Equal(t, body, replay)

		time.Sleep(time.Second)
		_, err = serve(ctx, s, lifecycle.Admission{Body: lifecycletest.ChatBody(""), IdempotencyKey: "k"})
		assert.Equal(t, 409, apierr.For(err).Status, "past it: the cache forgot the body")
		assert.Equal(t, int64(1), up.Runs.Load(), "never executed twice")

		err = s.Reload(lifecycletest.Config(t, "ledger: {tombstone_retention: 10m}\n", ""))
		require.ErrorContains(t, err, "ledger.tombstone_retention 10m0s differs from the ledger's 5m0s")
		require.NoError(t, s.Reload(lifecycletest.Config(t, "", "")), "unset keeps the retention it started with")
		assert.Equal(t, 5*time.Minute, s.retention)
	})
}

// TestLeaseTTLReload: a reload that shortens ledger.lease_ttl
// applies to the heartbeat period at once: a call admitted after it, with
// the new 3s lease, keeps its hold while it waits 30s.
func TestLeaseTTLReload(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 1, Gate: make(chan struct{})}
		cfg := lifecycletest.Config(t, "server: {max_wait: 60s}\n", "    concurrency: 1\n    queue: {max_wait: 60s, order: edf}\n")
		s := newTestServer(t, cfg, led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.DispatchLoop(ctx)
		go func() { _ = s.settler.Heartbeat(ctx) }()
		synctest.Wait()
		require.NoError(t, s.Reload(lifecycletest.Config(t, "ledger: {lease_ttl: 3s}\nserver: {max_wait: 60s}\n", "    concurrency: 1\n    queue: {max_wait: 60s, order: edf}\n")))
		require.Equal(t, 3*time.Second, s.pol.Load().LeaseTTL)

		errs := make(chan error, 2)
		for i := range 2 {
			go func() {
				_, err := serve(ctx, s, lifecycle.Admission{Body: lifecycletest.ChatBody(""), RequestID: fmt.Sprint(i)})
				errs <- err
			}()
			synctest.Wait()
		}
		for range 30 {
			time.Sleep(time.Second)
			_, err := led.Reclaim(context.Background(), s.pol.Load().Tenants["acme"].ScopeKey, 100)
			require.NoError(t, err)
		}
		assert.Equal(t, int64(2), tenantUsage(t, s, led.Memory).Reserved[ledger.Requests], "both 3s leases renewed for 30s")
		close(up.Gate)
		require.NoError(t, <-errs)
		require.NoError(t, <-errs)

		// A reload past the ledger's lease bound (2 × the start-up 60s) is refused.
		err := s.Reload(lifecycletest.Config(t, "ledger: {lease_ttl: 121s}\n", ""))
		assert.ErrorContains(t, err, "lease bound")
	})
}
