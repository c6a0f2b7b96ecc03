package lifecycle

import (
	"context"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

type opKey struct{}

// opCtx behaves as context.WithTimeout(context.WithoutCancel(parent), d):
// values pass, the parent's cancel does not, the deadline ends it whether
// or not Done was asked, and cancel ends it.
func TestOpCtxIsWithTimeoutOfWithoutCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		parent, leave := context.WithCancelCause(context.WithValue(context.Background(), opKey{}, "v"))
		c, cancel := newOpCtx(parent, time.Second)
		defer cancel()
		leave(apierr.ErrClientGone)
		assert.Equal(t, "v", c.Value(opKey{}))
		require.NoError(t, c.Err(), "the request's cancel does not reach a ledger call")
		assert.NoError(t, context.Cause(c), "nor its cause")
		dl, ok := c.Deadline()
		assert.True(t, ok)
		assert.Equal(t, time.Now().Add(time.Second), dl)
		time.Sleep(time.Second)
		require.ErrorIs(t, c.Err(), context.DeadlineExceeded, "without Done: from the clock")

		// With Done asked first: a real timer closes it at the deadline.
		d, cancel2 := newOpCtx(parent, time.Second)
		defer cancel2()
		done := d.Done()
		time.Sleep(999 * time.Millisecond)
		select {
		case <-done:
			t.Fatal("closed before its deadline")
		default:
		}
		time.Sleep(time.Millisecond)
		<-done
		require.ErrorIs(t, d.Err(), context.DeadlineExceeded)
		assert.ErrorIs(t, context.Cause(d), context.DeadlineExceeded)
	})
}

func TestOpCtxCancel(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, cancel := newOpCtx(context.Background(), time.Minute)
		cancel()
		require.ErrorIs(t, c.Err(), context.Canceled)
		<-c.Done() // asked after the cancel: already closed
		require.ErrorIs(t, c.Err(), context.Canceled)

		d, cancel2 := newOpCtx(context.Background(), time.Minute)
		done := d.Done()
		cancel2()
		<-done
		require.ErrorIs(t, d.Err(), context.Canceled)
		cancel2() // idempotent
	})
}

// A context derived from it (the Redis ledger's own store timeout) ends
// with it, and registers on its timer context rather than a goroutine.
func TestOpCtxChildren(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		c, cancel := newOpCtx(context.Background(), time.Second)
		defer cancel()
		child, stop := context.WithTimeout(c, time.Hour)
		defer stop()
		dl, _ := child.Deadline()
		assert.Equal(t, time.Now().Add(time.Second), dl, "the earlier deadline wins")
		fired := make(chan struct{})
		stopAfter := context.AfterFunc(c, func() { close(fired) })
		defer stopAfter()
		time.Sleep(time.Second)
		<-child.Done()
		<-fired
		require.ErrorIs(t, child.Err(), context.DeadlineExceeded)

		e, cancel3 := newOpCtx(context.Background(), time.Hour)
		grand, stop2 := context.WithCancel(e)
		defer stop2()
		cancel3()
		<-grand.Done()
		assert.ErrorIs(t, grand.Err(), context.Canceled)
	})
}

func BenchmarkLedgerCtx(b *testing.B) {
	parent, cancel := context.WithCancel(context.Background())
	defer cancel()
	b.Run("WithTimeout", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ctx, stop := context.WithTimeout(context.WithoutCancel(parent), ledgerOpTimeout)
			_ = ctx.Err()
			stop()
		}
	})
	b.Run("opCtx", func(b *testing.B) {
		b.ReportAllocs()
		for b.Loop() {
			ctx, stop := newOpCtx(parent, ledgerOpTimeout)
			_ = ctx.Err()
			stop()
		}
	})
	// A call's ledger operation as the embedded ledger sees it: made, asked
	// Err twice (before and under its lock), ended.
	b.Run("ledgerOp", func(b *testing.B) {
		c := &call{ctx: parent}
		b.ReportAllocs()
		for b.Loop() {
			op := c.ledgerOp()
			_, _ = op.Err(), op.Err()
			op.cancel()
		}
	})
}

// The first three ledger operations of a call use the contexts embedded in
// it, each its own: none is handed out twice, and ending one ends no other.
func TestLedgerOpsLiveInTheCall(t *testing.T) {
	c := &call{ctx: context.Background()}
	ops := []*opCtx{c.ledgerOp(), c.ledgerOp(), c.ledgerOp(), c.ledgerOp()}
	for i := range len(c.ops) {
		if ops[i] != &c.ops[i] {
			t.Fatalf("op %d is not the call's slot %d", i, i)
		}
	}
	for i := range len(c.ops) {
		if ops[3] == &c.ops[i] {
			t.Fatalf("op 3 reuses slot %d", i)
		}
	}
	if n := testing.AllocsPerRun(100, func() {
		c.nops = 0
		for range len(c.ops) {
			c.ledgerOp()
		}
	}); n != 0 {
		t.Fatalf("the call's first %d ledger ops allocate %v times", len(c.ops), n)
	}
	ops[1].cancel()
	for i, o := range ops {
		want := error(nil)
		if i == 1 {
			want = context.Canceled
		}
		if err := o.Err(); err != want {
			t.Fatalf("op %d: Err() = %v, want %v", i, err, want)
		}
	}
}
