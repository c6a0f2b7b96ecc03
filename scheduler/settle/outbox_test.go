package settle

import (
	"context"
	"log/slog"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
)

// TestOutboxFileStaysSmall: the lines of landed Settles are dropped by the
// next pass, which empties the file when nothing is pending and rewrites it
// with what is pending once the appended lines pass compactAt.
func TestOutboxFileStaysSmall(t *testing.T) {
	p := testPaths(t)
	led := newHookLedger(t)
	ctx := context.Background()
	s := newRoom(t, led, p, false)
	settleCall(t, s, reserve(t, led, s.owner), used)
	require.Zero(t, lines(t, p.Pending), "no Settle written ahead without write-ahead")

	s = newRoom(t, led, p, true) // as with ledger.backend redis
	for range 3 {
		settleCall(t, s, reserve(t, led, s.owner), used)
	}
	require.Equal(t, 3, lines(t, p.Pending))
	s.Flush(ctx)
	assert.Zero(t, lines(t, p.Pending))

	// One Settle the store refuses: pending, its line kept.
	refused := reserve(t, led, s.owner)
	led.set(func() {
		led.settle = func(ref ledger.Ref) error {
			if ref.ID == refused.ID { // still refused below
				return ledger.ErrUnavailable
			}
			return nil
		}
	})
	settleCall(t, s, refused, used)
	require.Equal(t, 1, s.Pending())
	n := 1
	for fileSize(t, p.Pending) < compactAt {
		settleCall(t, s, reserve(t, led, s.owner), used)
		n++
	}
	require.Equal(t, n, lines(t, p.Pending), "one line per Settle, the refused one once")
	s.Flush(ctx)
	assert.Equal(t, 1, s.Pending())
	assert.Equal(t, 1, lines(t, p.Pending), "rewritten with the pending entry only")

	led.set(func() { led.settle = nil })
	s.Flush(ctx)
	assert.Zero(t, s.Pending())
	assert.Zero(t, lines(t, p.Pending))
	u := acmeUsage(t, led.Memory)
	assert.Equal(t, int64(1+3+n), committed(u, ledger.Requests), "every call charged once")
	assert.Equal(t, ledger.Amounts{}, u.Reserved)
}

// TestOutboxEndings: each kind of pending ending runs until the store
// answers definitely, and turns into the one that fits what the store
// says: a Release of a record an ambiguous MarkDispatched made DISPATCHED
// becomes a zero NotSent Settle, and a replayed ambiguous keyed Reserve
// that turns out to be this attempt's is released.
func TestOutboxEndings(t *testing.T) {
	led := newHookLedger(t)
	ctx := context.Background()
	s := newRoom(t, led, testPaths(t), false)

	dispatched := reserve(t, led, s.owner)
	require.NoError(t, led.MarkDispatched(ctx, dispatched, s.owner))
	s.QueueRelease(dispatched, "dispatched")
	s.Flush(ctx)
	require.Equal(t, 1, s.Pending(), "Release answered ErrDispatched: a Settle next")
	s.Flush(ctx)
	assert.Zero(t, s.Pending())

	rr := ledger.ReserveRequest{Ref: ledger.Ref{Tenant: acme, ID: ledger.NewRequestID()}, Owner: s.owner, Scopes: acmeScopes,
		Held: ledger.Amounts{ledger.Requests: 1, ledger.InputTokens: 100, ledger.Tokens: 100}, Attempt: 7}
	_, err := led.Reserve(ctx, rr) // the ambiguous Reserve did apply
	require.NoError(t, err)
	s.QueueReplay(rr.Ref, rr, "keyed")
	s.Flush(ctx)
	assert.Zero(t, s.Pending(), "replayed as ours, then released")

	unknown := ledger.Ref{Tenant: acme, ID: ledger.NewRequestID()}
	led.set(func() { led.settle = func(ledger.Ref) error { return ledger.ErrUnavailable } })
	s.QueueSettle(unknown, used, ledger.SourceFinal, "gone")
	s.Flush(ctx)
	assert.Equal(t, 1, s.Pending(), "a store error: kept")
	led.set(func() { led.settle = nil })
	s.Flush(ctx)
	assert.Zero(t, s.Pending(), "a record the store does not know: nothing left to end")

	u := acmeUsage(t, led.Memory)
	assert.Equal(t, ledger.Amounts{}, u.Reserved, "every hold ended")
	assert.Zero(t, committed(u, ledger.Requests), "nothing charged: nothing ran")
}

// TestOutboxCountsWhatAPassRetries: an ending a pass has taken out to
// retry is still unacknowledged until the store answers it, and a second
// ending added meanwhile is kept behind it.
func TestOutboxCountsWhatAPassRetries(t *testing.T) {
	led := newHookLedger(t)
	ctx := context.Background()
	s := newRoom(t, led, testPaths(t), false)
	first := reserve(t, led, s.owner)
	entered, answer := make(chan struct{}), make(chan struct{})
	led.set(func() {
		led.settle = func(ref ledger.Ref) error {
			if ref == first {
				close(entered)
				<-answer
			}
			return ledger.ErrUnavailable
		}
	})
	s.QueueSettle(first, used, ledger.SourceFinal, "first")
	passed := make(chan struct{})
	go func() { s.Flush(ctx); close(passed) }()
	<-entered
	assert.Equal(t, 1, s.Unacked(), "taken out by the pass, not yet answered")
	assert.Equal(t, 1, s.Pending())
	second := reserve(t, led, s.owner)
	s.QueueSettle(second, used, ledger.SourceFinal, "second")
	assert.Equal(t, 2, s.Unacked())
	close(answer)
	<-passed
	assert.Equal(t, 2, s.Unacked(), "a store error: both kept")

	led.set(func() { led.settle = nil })
	s.Flush(ctx)
	assert.Zero(t, s.Unacked())
	assert.Equal(t, int64(2), committed(acmeUsage(t, led.Memory), ledger.Requests))
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
