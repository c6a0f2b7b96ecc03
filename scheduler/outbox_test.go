package scheduler

import (
	"bytes"
	"context"
	"fmt"
	"log/slog"
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
	s1.outbox.ahead = true // as with ledger.backend redis (the fake is embedded)
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
	require.Equal(t, 2, s2.outbox.len(), "both lines read")
	s2.flushOutbox(ctx)
	assert.Zero(t, s2.outbox.len())
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

// TestOutboxFileStaysSmall: the lines of landed Settles are dropped by the
// next pass, which empties the file when nothing is pending and rewrites it
// with what is pending once the appended lines pass compactAt.
func TestOutboxFileStaysSmall(t *testing.T) {
	cfg, path := outboxTestConfig(t)
	led := newFakeLedger(t)
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	s := newTestServer(t, cfg, led, &fakeUpstream{out: 3})
	require.False(t, s.outbox.ahead, "the embedded ledger's Settles are not written ahead")
	go s.dispatchLoop(ctx)
	_, err := serve(ctx, s, admission{body: chatBody("")})
	require.NoError(t, err)
	require.Zero(t, lines(t, path))
	s.outbox.ahead = true // as with ledger.backend redis

	for range 3 {
		_, err := serve(ctx, s, admission{body: chatBody("")})
		require.NoError(t, err)
	}
	require.Equal(t, 3, lines(t, path))
	s.flushOutbox(ctx)
	assert.Zero(t, lines(t, path))

	// One Settle the store refuses: pending, its line kept.
	led.set(func() {
		led.settle = func(context.Context, ledger.Ref) (ledger.Settlement, error, bool) {
			return ledger.Settlement{}, ledger.ErrUnavailable, true
		}
	})
	_, err = serve(ctx, s, admission{body: chatBody(""), reqID: "refused"})
	require.NoError(t, err)
	s.outbox.mu.Lock()
	require.Len(t, s.outbox.pending, 1)
	refused := s.outbox.pending[0].ref.ID
	s.outbox.mu.Unlock()
	led.set(func() {
		led.settle = func(_ context.Context, ref ledger.Ref) (ledger.Settlement, error, bool) {
			if ref.ID == refused { // still refused below
				return ledger.Settlement{}, ledger.ErrUnavailable, true
			}
			return ledger.Settlement{}, nil, false
		}
	})
	n := 1
	for fileSize(t, path) < compactAt {
		_, err := serve(ctx, s, admission{body: chatBody("")})
		require.NoError(t, err)
		n++
	}
	require.Equal(t, n, lines(t, path), "one line per Settle, the refused one once")
	s.flushOutbox(ctx)
	assert.Equal(t, 1, s.outbox.len())
	assert.Equal(t, 1, lines(t, path), "rewritten with the pending entry only")

	led.set(func() { led.settle = nil })
	s.flushOutbox(ctx)
	assert.Zero(t, s.outbox.len())
	assert.Zero(t, lines(t, path))
	u := tenantUsage(t, s, led.Memory)
	assert.Equal(t, int64(1+3+n), committed(u, ledger.Requests, time.Hour), "every call charged once")
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}

func fileSize(t *testing.T, path string) int64 {
	t.Helper()
	fi, err := os.Stat(path)
	require.NoError(t, err)
	return fi.Size()
}

// BenchmarkOutboxWriteAhead: what writing a Settle ahead costs a call on a
// node with an outbox file (one JSON line appended, then forgotten), with a
// pass every 1,000 calls as the loop's second would at that rate.
func BenchmarkOutboxWriteAhead(b *testing.B) {
	o := outbox{kick: make(chan struct{}, 1)}
	_, err := o.load(config.StatePaths{Pending: b.TempDir() + "/x.pending.jsonl"}, slog.New(slog.DiscardHandler))
	require.NoError(b, err)
	o.ahead = true
	e := outboxEntry{op: opSettle, ref: ledger.Ref{Tenant: ledger.ScopeKey{1, 2, 3}, ID: ledger.NewRequestID()},
		actual: ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 812, ledger.OutputTokens: 230, ledger.Tokens: 1042, ledger.GPUMs: 431},
		src:    ledger.SourceFinal, reqID: "3f1c2a9e-7b0d-4c55-9a51-0c2b8f3e6d71"}
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		e.ref.ID = ledger.NewRequestID()
		o.writeAhead(e)
		o.landed(e.ref.ID)
		if i++; i%1000 == 0 {
			o.compact(false)
		}
	}
}
