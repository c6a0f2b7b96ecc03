package lifecycle

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/vllm"
)

// streamedCall admits and dispatches one streamed chat call on the fakes
// and returns its ticket, the answer open.
func streamedCall(t *testing.T, up Upstream) (*Engine, *lifecycletest.Ledger, *Ticket) {
	return streamedCallOn(t, up, vllm.EndpointChat, lifecycletest.ChatBody(`,"stream":true`))
}

// streamedCallOn is streamedCall for a streamed body on any endpoint.
func streamedCallOn(t *testing.T, up Upstream, ep vllm.Endpoint, body []byte) (*Engine, *lifecycletest.Ledger, *Ticket) {
	t.Helper()
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.dispatchLoop(ctx)
	pol := s.pol.Load()
	tk, err := s.begin(context.Background(), pol.Tenants["acme"], pol, admission{ep: ep, body: body, reqID: "r"})
	require.NoError(t, err)
	require.True(t, tk.Streaming())
	return s, led, tk
}

// writerSink is a streamed answer's sink on w (conn: the write deadline's
// connection, nil none); it keeps the first failed write's error, and
// counts the whole and refused answers Finish must not give a stream.
type writerSink struct {
	w     io.Writer
	conn  WriteDeadliner
	err   error
	other int
}

func (o *writerSink) Write(b []byte) (int, error) {
	n, err := o.w.Write(b)
	if err != nil && o.err == nil {
		o.err = err
	}
	return n, err
}

func (o *writerSink) Stream() (io.Writer, WriteDeadliner) { return o, o.conn }
func (o *writerSink) Whole(Meta, []byte)                  { o.other++ }
func (o *writerSink) Refuse(error, *apierr.Error, Meta)   { o.other++ }

// Finish writes a streamed answer's every event to the sink and settles
// the call once.
func TestFinishStreamsEveryEventAndSettlesOnce(t *testing.T) {
	_, led, tk := streamedCall(t, &lifecycletest.Upstream{Out: 3})
	var buf bytes.Buffer
	out := &writerSink{w: &buf}
	assert.Equal(t, outcomeOK, tk.Finish(out))
	assert.Equal(t, 5, strings.Count(buf.String(), "data: "), "3 content chunks, the finish chunk and [DONE] (the usage chunk stripped): %s", buf.String())
	assert.True(t, strings.HasSuffix(buf.String(), "data: [DONE]\n\n"))
	assert.Zero(t, out.other)
	assert.Equal(t, 1, led.N("settle"))
	assert.Equal(t, 0, led.N("release"))
	assert.Equal(t, phaseSettled, tk.c.phase)
}

// A streamed answer never written (the client left before the headers
// went out: Finish with no sink) is settled once as a client disconnect,
// its upstream stream closed.
func TestFinishWithoutSinkSettlesAsDisconnect(t *testing.T) {
	gate := make(chan struct{})
	defer close(gate)
	_, led, tk := streamedCall(t, &lifecycletest.Upstream{Out: 3, Gate: gate})
	assert.Equal(t, outcomeCancelled, tk.Finish(nil))
	c := tk.c
	assert.Equal(t, 1, led.N("settle"))
	assert.Equal(t, 0, led.N("release"))
	assert.Equal(t, phaseSettled, c.phase)
	require.ErrorIs(t, context.Cause(c.ctx), apierr.ErrClientGone)
	assert.Equal(t, "client_disconnect", c.abortCause)
}

// writeLog records each Write the pump makes (one HTTP chunk each) and
// hands it to the test.
type writeLog struct {
	writes chan string
	fail   error
}

func (w *writeLog) Write(p []byte) (int, error) {
	if w.fail != nil {
		return 0, w.fail
	}
	w.writes <- string(p)
	return len(p), nil
}

// Events that arrived in one upstream read go to the client in one write:
// the 3 content chunks, the finish chunk and [DONE], exactly as the
// per-event writes carried them.
func TestPumpCoalescesEventsOfOneRead(t *testing.T) {
	_, led, tk := streamedCall(t, &lifecycletest.Upstream{Out: 3})
	w := &writeLog{writes: make(chan string, 16)}
	assert.Equal(t, outcomeOK, tk.Finish(&writerSink{w: w}))
	close(w.writes)
	var got []string
	for p := range w.writes {
		got = append(got, p)
	}
	require.Len(t, got, 1, "one upstream read, one client write")
	assert.Equal(t, 5, strings.Count(got[0], "data: "))
	assert.True(t, strings.HasSuffix(got[0], "data: [DONE]\n\n"))
	assert.Equal(t, 1, led.N("settle"))
	assert.Equal(t, phaseSettled, tk.c.phase)
}

// pipeUpstream streams what the test writes to its pipe, one event at a
// time.
type pipeUpstream struct {
	lifecycletest.Upstream
	pr *io.PipeReader
}

func (u *pipeUpstream) Stream(context.Context, string, string, []byte, string) (*vllm.Stream, error) {
	return vllm.NewStream(u.pr, "r0", 0), nil
}

// No event waits on the replica: each one is written to the client before
// the pump reads the upstream connection again, so the client has event k
// while the replica has not yet sent event k+1.
func TestPumpWritesBeforeWaitingOnReplica(t *testing.T) {
	pr, pw := io.Pipe()
	events := strings.SplitAfter(lifecycletest.SSECompletion(2), "\n\n")
	events = events[:len(events)-1] // SplitAfter's empty tail
	require.Len(t, events, 5)
	// Start returns with the stream's first event read (Engine.first).
	go func() { _, _ = io.WriteString(pw, events[0]) }()
	_, led, tk := streamedCall(t, &pipeUpstream{pr: pr})
	w := &writeLog{writes: make(chan string, 16)}
	done := make(chan Outcome, 1)
	go func() { done <- tk.Finish(&writerSink{w: w}) }()

	next := func() string {
		t.Helper()
		select {
		case p := <-w.writes:
			return p
		case <-time.After(10 * time.Second):
			t.Fatal("the pump held an event while waiting on the replica")
			return ""
		}
	}
	for i, ev := range events[:2] { // two content chunks, one at a time
		if i > 0 {
			_, err := io.WriteString(pw, ev)
			require.NoError(t, err)
		}
		p := next()
		assert.Equal(t, 1, strings.Count(p, "data: "), "event %d alone", i)
		assert.Contains(t, p, `"content":"x"`)
	}
	// The finish chunk, the usage chunk and [DONE] in one read: one write
	// (the usage chunk stripped for this client).
	_, err := io.WriteString(pw, events[2]+events[3]+events[4])
	require.NoError(t, err)
	p := next()
	assert.Equal(t, 2, strings.Count(p, "data: "), p)
	assert.True(t, strings.HasSuffix(p, "data: [DONE]\n\n"))
	require.NoError(t, pw.Close())
	assert.Equal(t, outcomeOK, <-done)
	assert.Equal(t, 1, led.N("settle"))
	assert.Empty(t, w.writes)
}

// A write that fails in the coalesced path is a client disconnect: the
// call is cancelled (its upstream closed), settled once, not written to
// again.
func TestPumpFailedCoalescedWriteIsDisconnect(t *testing.T) {
	_, led, tk := streamedCall(t, &lifecycletest.Upstream{Out: 3})
	w := &writeLog{writes: make(chan string, 16), fail: io.ErrClosedPipe}
	out := &writerSink{w: w}
	assert.Equal(t, outcomeCancelled, tk.Finish(out))
	require.ErrorIs(t, out.err, io.ErrClosedPipe)
	require.ErrorIs(t, context.Cause(tk.c.ctx), apierr.ErrClientGone)
	assert.Equal(t, 1, led.N("settle"))
	assert.Empty(t, w.writes)
}
