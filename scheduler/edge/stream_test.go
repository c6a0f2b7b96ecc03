package edge

import (
	"bytes"
	"context"
	"errors"
	"io"
	"testing"
	"time"

	"github.com/sluicehq/sluice/scheduler/lifecycle"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeTicket records the Finishes a streamed body runs and writes events
// to the sink's stream.
type fakeTicket struct {
	events   []string
	sinks    []lifecycle.Sink
	conn     lifecycle.WriteDeadliner // the deadline connection Finish was given
	finished int
}

func (f *fakeTicket) Finish(out lifecycle.Sink) lifecycle.Outcome {
	f.finished++
	f.sinks = append(f.sinks, out)
	if out == nil {
		return 0
	}
	w, conn := out.Stream()
	f.conn = conn
	for _, ev := range f.events {
		if _, err := w.Write([]byte(ev)); err != nil {
			break
		}
	}
	return 0
}

type deadlineConn struct{}

func (deadlineConn) SetWriteDeadline(time.Time) error { return nil }

// fasthttp writes a streamed body through WriteTo on the connection's
// goroutine: Finish runs once into the connection's writer (each event one
// write, the connection's write deadline passed on), WriteTo reports what
// was written, and Close ends the client's watch and context once without
// a second Finish.
func TestSSEBodyWriteToFinishesOnce(t *testing.T) {
	tk := &fakeTicket{events: []string{"data: 1\n\n", "data: [DONE]\n\n"}}
	stopped := 0
	ctx, gone := context.WithCancelCause(context.Background())
	b := &sseBody{tk: tk, conn: deadlineConn{}, stopWatch: func() { stopped++ }, gone: gone}
	var buf bytes.Buffer
	n, err := b.WriteTo(&buf)
	require.NoError(t, err)
	assert.Equal(t, "data: 1\n\ndata: [DONE]\n\n", buf.String())
	assert.Equal(t, int64(buf.Len()), n)
	assert.Equal(t, deadlineConn{}, tk.conn)
	require.Len(t, tk.sinks, 1)
	assert.NotNil(t, tk.sinks[0])
	assert.NoError(t, ctx.Err(), "the client context lives until Close")
	require.NoError(t, b.Close())
	require.NoError(t, b.Close())
	assert.Equal(t, 1, tk.finished, "Close after WriteTo does not finish again")
	assert.Equal(t, 1, stopped)
	assert.Error(t, ctx.Err())
	_, err = b.WriteTo(&buf)
	assert.Error(t, err, "a second write is refused")
	assert.Equal(t, 1, tk.finished)
}

// A body fasthttp never wrote (the client left before the headers went
// out) is ended by Close: Finish with no sink, once.
func TestSSEBodyNeverWrittenFinishesOnClose(t *testing.T) {
	tk := &fakeTicket{}
	stopped := 0
	b := &sseBody{tk: tk, stopWatch: func() { stopped++ }}
	require.NoError(t, b.Close())
	require.NoError(t, b.Close())
	assert.Equal(t, 1, tk.finished)
	require.Len(t, tk.sinks, 1)
	assert.Nil(t, tk.sinks[0])
	assert.Equal(t, 1, stopped)
	_, err := b.WriteTo(io.Discard)
	assert.Error(t, err, "no write after Close")
	assert.Equal(t, 1, tk.finished)
}

// failingWriter takes one write, then fails as a closed connection.
type failingWriter struct{ left int }

func (w *failingWriter) Write(p []byte) (int, error) {
	if w.left == 0 {
		return 0, errors.New("broken pipe")
	}
	w.left--
	return len(p), nil
}

// A failed write is what WriteTo returns (fasthttp then closes the
// connection), with the bytes that went out before it.
func TestSSEBodyReturnsTheFailedWrite(t *testing.T) {
	tk := &fakeTicket{events: []string{"data: 1\n\n", "data: 2\n\n"}}
	b := &sseBody{tk: tk}
	n, err := b.WriteTo(&failingWriter{left: 1})
	require.EqualError(t, err, "broken pipe")
	assert.Equal(t, int64(len("data: 1\n\n")), n)
	require.NoError(t, b.Close())
	assert.Equal(t, 1, tk.finished)
}
