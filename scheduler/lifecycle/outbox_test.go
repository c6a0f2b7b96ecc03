package scheduler

import (
	"bytes"
	"context"
	"fmt"
	"os"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// outboxTestConfig is a node with a state file (so a pending-writes log) and
// hourly tokens and requests budgets on acme.
func outboxTestConfig(t *testing.T) (*config.File, string) {
	dir := t.TempDir()
	cfg := testConfig(t, fmt.Sprintf("admin: {state_file: %q}\n", dir+"/admin.json"),
		"    budgets:\n      - {dimension: tokens, limit: 1000000, window: 1h}\n      - {dimension: requests, limit: 1000, window: 1h}\n")
	return cfg, dir + "/admin.json.pending.jsonl"
}

// lines counts the outbox file's lines.
func lines(t *testing.T, path string) int {
	t.Helper()
	b, err := os.ReadFile(path)
	require.NoError(t, err)
	return bytes.Count(b, []byte("\n"))
}

// TestOutboxWriteAheadSurvivesKill: a process killed while a Settle is in
// flight (sent, not answered) leaves its line in the outbox file, written
// before the Settle went out; the restarted process settles that call with
// the usage it had, not its hold, and replays the Settle of a call that had
// landed before the kill without charging it twice.
func TestOutboxWriteAheadSurvivesKill(t *testing.T) {
	cfg, path := outboxTestConfig(t)
	led := newFakeLedger(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s1 := newTestServer(t, cfg, led, &fakeUpstream{out: 3})
	// As with ledger.backend redis (the fake is embedded): Settles written
	// ahead.
	require.NoError(t, s1.openSettler(cfg.Paths(), true, nil))
	go s1.dispatchLoop(ctx)

	_, err := serve(ctx, s1, admission{body: chatBody("")})
	require.NoError(t, err)
	require.Equal(t, 1, lines(t, path), "the landed Settle's line stays until a pass")

	entered, hold := make(chan struct{}), make(chan struct{})
	led.set(func() {
		led.settle = func(context.Context, ledger.Ref) (ledger.Settlement, error, bool) {
			close(entered)
			<-hold // the process is killed before the store answers
			return ledger.Settlement{}, ledger.ErrUnavailable, true
		}
	})
	done := make(chan error, 1)
	go func() { _, err := serve(ctx, s1, admission{body: chatBody(""), reqID: "second"}); done <- err }()
	<-entered
	led.set(func() { led.settle = nil })
	u := tenantUsage(t, s1, led.Memory)
	require.Equal(t, int64(1), committed(u, ledger.Requests, time.Hour))
	require.NotZero(t, u.Reserved[ledger.Tokens], "the second call still holds")
	require.Equal(t, 2, lines(t, path))

	// s1 is gone; s2 starts on its files.
	s2 := newTestServer(t, cfg, led, &fakeUpstream{out: 3})
	require.Equal(t, 2, s2.settler.Pending(), "both lines read")
	s2.settler.Flush(ctx)
	assert.Zero(t, s2.settler.Pending())
	u = tenantUsage(t, s2, led.Memory)
	assert.Equal(t, int64(2), committed(u, ledger.Requests, time.Hour), "each call charged once")
	assert.Equal(t, int64(2*(5+3)), committed(u, ledger.Tokens, time.Hour), "with the usage each had, not the hold")
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
	assert.Zero(t, lines(t, path), "nothing pending or in flight: emptied")
	assert.Equal(t, 4, led.n("settle"), "s1's two, s2's two (one a replay)")

	close(hold) // s1's late goroutine: its Settle failed; it writes nothing more
	require.NoError(t, <-done)
	assert.Zero(t, lines(t, path))
	assert.Equal(t, ledger.Amounts{}, tenantUsage(t, s2, led.Memory).Reserved)
}

// TestOutboxEmbeddedLedgerNotWrittenAhead: the embedded ledger's Settle is
// a function call that applied or did not when the process dies, so a
// node on it writes no Settle ahead.
func TestOutboxEmbeddedLedgerNotWrittenAhead(t *testing.T) {
	cfg, path := outboxTestConfig(t)
	led := newFakeLedger(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newTestServer(t, cfg, led, &fakeUpstream{out: 3})
	go s.dispatchLoop(ctx)
	_, err := serve(ctx, s, admission{body: chatBody("")})
	require.NoError(t, err)
	assert.Zero(t, lines(t, path))
	assert.Equal(t, 1, led.n("settle"))
}
