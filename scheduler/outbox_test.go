package scheduler

import (
	"context"
	"testing"
	"testing/synctest"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// TestLedgerRecoveryKicksPendingLog: the first ledger answer after store
// errors wakes the pending-writes log's loop at once, so owed outage
// charges and pending endings do not wait for the next tick (an instance
// killed shortly after a stall would otherwise die owing them); an answer
// while the ledger was answering wakes nothing.
func TestLedgerRecoveryKicksPendingLog(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		led.OnSettle = func(context.Context, ledger.Ref) (ledger.Settlement, error, bool) {
			return ledger.Settlement{}, ledger.ErrUnavailable, true
		}
		s := newTestServer(t, lifecycletest.Config(t, "", "    budgets:\n      - {dimension: requests, limit: 1000, window: 1h}\n"), led, &lifecycletest.Upstream{Out: 1})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go func() { _ = s.settler.Loop(ctx) }()
		// A pending ending the store keeps refusing: each pass of the loop
		// tries it once, so the Settles sent count the passes.
		s.settler.QueueSettle(ledger.Ref{ID: ledger.NewRequestID()}, ledger.Amounts{}, ledger.SourceNotSent, "pending")
		synctest.Wait()
		require.Equal(t, 1, led.N("settle"), "queued: one pass")
		require.Equal(t, 1, s.settler.Pending())

		s.ledgerErrs.Store(0) // the ledger was answering
		s.noteLedger("reserve", nil)
		synctest.Wait()
		assert.Equal(t, 1, led.N("settle"), "no pass while the ledger was answering")
		s.noteLedger("reserve", ledger.ErrUnavailable)
		s.noteLedger("reserve", ledger.ErrUnavailable)
		synctest.Wait()
		assert.Equal(t, 1, led.N("settle"), "nor on its errors")
		s.noteLedger("reserve", nil)
		synctest.Wait()
		assert.Equal(t, 2, led.N("settle"), "recovery: a pass at once, not at the next tick")
	})
}
