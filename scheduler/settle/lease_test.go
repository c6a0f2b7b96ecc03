package settle

import (
	"context"
	"sync/atomic"
	"testing"
	"testing/synctest"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
)

// TestLeaseFence: a tracked lease is extended every third of its ttl and
// never fenced while the store acknowledges; with the store failing, its
// call is fenced fenceMargin before the last acknowledged lease would end;
// a record the store says is no longer ours fences it at the next round;
// an untracked lease is neither extended nor fenced.
func TestLeaseFence(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := newHookLedger(t)
		ttl := time.Minute
		s, err := New(Deps{Ledger: led, Owner: ledger.NewOwner(), LeaseTTL: func() time.Duration { return ttl }}, testPaths(t), false)
		require.NoError(t, err)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = s.Heartbeat(ctx) }()

		type holder struct { // what a call keeps of its lease
			lease  Lease
			fenced atomic.Pointer[time.Time]
		}
		track := func() *holder {
			c := &holder{}
			ref := reserve(t, led, s.owner)
			s.Track(&c.lease, ref, func(cause error) {
				assert.ErrorIs(t, cause, ledger.ErrLeaseLost)
				now := time.Now()
				c.fenced.CompareAndSwap(nil, &now)
			}, time.Now(), ttl)
			return c
		}

		start := time.Now()
		kept := track()
		time.Sleep(5 * time.Minute) // synctest's clock
		synctest.Wait()
		assert.Nil(t, kept.fenced.Load(), "acknowledged: never fenced")
		assert.GreaterOrEqual(t, led.n("extend"), 14, "a round every 20s")

		// The store fails from now on: the fence fires 2s before the end
		// of the last acknowledged lease, whatever the rounds do.
		led.set(func() { led.extend = func(ledger.Ref) error { return ledger.ErrUnavailable } })
		failedAt := time.Now()
		time.Sleep(2 * time.Minute)
		synctest.Wait()
		at := kept.fenced.Load()
		require.NotNil(t, at, "fenced")
		lastAck := start.Add(failedAt.Sub(start) / (ttl / 3) * (ttl / 3))
		assert.Equal(t, lastAck.Add(ttl-2*time.Second), *at)
		s.Untrack(&kept.lease)

		// The record is gone: fenced at the next round.
		led.set(func() { led.extend = func(ledger.Ref) error { return ledger.ErrLeaseLost } })
		trackedAt := time.Now()
		lost := track()
		gone := track()
		s.Untrack(&gone.lease)
		time.Sleep(ttl / 3)
		synctest.Wait()
		require.NotNil(t, lost.fenced.Load())
		assert.LessOrEqual(t, lost.fenced.Load().Sub(trackedAt), ttl/3, "at the next round, not at its fence timer")
		time.Sleep(2 * ttl)
		synctest.Wait()
		assert.Nil(t, gone.fenced.Load(), "untracked: never fenced")
	})
}
