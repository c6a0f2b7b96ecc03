package lifecycle

import (
	"context"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
)

// TestOutboxEmbeddedLedgerNotWrittenAhead: the embedded ledger's Settle is
// a function call that applied or did not when the process dies, so a
// node on it writes no Settle ahead.
func TestOutboxEmbeddedLedgerNotWrittenAhead(t *testing.T) {
	cfg, path := lifecycletest.PendingLogConfig(t)
	led := lifecycletest.NewLedger(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newTestEngine(t, cfg, led, &lifecycletest.Upstream{Out: 3})
	go s.dispatchLoop(ctx)
	_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody("")})
	require.NoError(t, err)
	assert.Zero(t, lifecycletest.Lines(t, path))
	assert.Equal(t, 1, led.N("settle"))
}

// TestOutboxWriteAheadSurvivesKill: a process killed while a Settle is in
// flight (sent, not answered) leaves its line in the outbox file, written
// before the Settle went out; the restarted process settles that call with
// the usage it had, not its hold, and replays the Settle of a call that had
// landed before the kill without charging it twice.
func TestOutboxWriteAheadSurvivesKill(t *testing.T) {
	cfg, path := lifecycletest.PendingLogConfig(t)
	led := lifecycletest.NewLedger(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	// As with ledger.backend redis (the fake is embedded): Settles written
	// ahead.
	s1 := newTestEngine(t, cfg, led, &lifecycletest.Upstream{Out: 3}, func(d *testDeps) { d.WriteAhead = true })
	go s1.dispatchLoop(ctx)

	_, err := serve(ctx, s1, admission{body: lifecycletest.ChatBody("")})
	require.NoError(t, err)
	require.Equal(t, 1, lifecycletest.Lines(t, path), "the landed Settle's line stays until a pass")

	entered, hold := make(chan struct{}), make(chan struct{})
	led.Set(func() {
		led.OnSettle = func(context.Context, ledger.Ref) (ledger.Settlement, error, bool) {
			close(entered)
			<-hold // the process is killed before the store answers
			return ledger.Settlement{}, ledger.ErrUnavailable, true
		}
	})
	done := make(chan error, 1)
	go func() {
		_, err := serve(ctx, s1, admission{body: lifecycletest.ChatBody(""), reqID: "second"})
		done <- err
	}()
	<-entered
	led.Set(func() { led.OnSettle = nil })
	u := tenantUsage(t, s1, led.Memory)
	require.Equal(t, int64(1), lifecycletest.Committed(u, ledger.Requests, time.Hour))
	require.NotZero(t, u.Reserved[ledger.Tokens], "the second call still holds")
	require.Equal(t, 2, lifecycletest.Lines(t, path))

	// s1 is gone; s2 starts on its files.
	s2 := newTestEngine(t, cfg, led, &lifecycletest.Upstream{Out: 3})
	require.Equal(t, 2, s2.settler.Pending(), "both lines read")
	s2.settler.Flush(ctx)
	assert.Zero(t, s2.settler.Pending())
	u = tenantUsage(t, s2, led.Memory)
	assert.Equal(t, int64(2), lifecycletest.Committed(u, ledger.Requests, time.Hour), "each call charged once")
	assert.Equal(t, int64(2*(5+3)), lifecycletest.Committed(u, ledger.Tokens, time.Hour), "with the usage each had, not the hold")
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
	assert.Zero(t, lifecycletest.Lines(t, path), "nothing pending or in flight: emptied")
	assert.Equal(t, 4, led.N("settle"), "s1's two, s2's two (one a replay)")

	close(hold) // s1's late goroutine: its Settle failed; it writes nothing more
	require.NoError(t, <-done)
	assert.Zero(t, lifecycletest.Lines(t, path))
	assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s2, led.Memory).Reserved)
}
