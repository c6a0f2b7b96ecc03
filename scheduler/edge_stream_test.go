package scheduler

import (
	"bytes"
	"context"
	"io"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm"
)

// streamedCall admits and dispatches one streamed chat call on the fakes
// and returns it with its upstream stream open, and its sseBody.
func streamedCall(t *testing.T, up *fakeUpstream) (*Server, *fakeLedger, *call, *sseBody, *int) {
	t.Helper()
	led := newFakeLedger(t)
	s := newTestServer(t, testConfig(t, "", ""), led, up)
	ctx, cancel := context.WithCancel(context.Background())
	t.Cleanup(cancel)
	go s.dispatchLoop(ctx)
	pol := s.pol.Load()
	c, _, err := s.start(context.Background(), pol.tenants["acme"], pol,
		admission{ep: vllm.EndpointChat, body: chatBody(`,"stream":true`), reqID: "r"})
	require.NoError(t, err)
	require.NotNil(t, c.stream)
	ended := 0
	b := &sseBody{e: &Edge{s: s}, c: c, end: func() { c.end(); ended++ }}
	return s, led, c, b, &ended
}

// fasthttp writes a streamed body through WriteTo on the connection's
// goroutine: every event passes, the call settles once, Close ends it once.
func TestSSEBodyWriteTo(t *testing.T) {
	_, led, c, b, ended := streamedCall(t, &fakeUpstream{out: 3})
	var buf bytes.Buffer
	n, err := b.WriteTo(&buf)
	require.NoError(t, err)
	assert.Equal(t, int64(buf.Len()), n)
	assert.Equal(t, 5, strings.Count(buf.String(), "data: "), "3 content chunks, the finish chunk and [DONE] (the usage chunk stripped): %s", buf.String())
	assert.True(t, strings.HasSuffix(buf.String(), "data: [DONE]\n\n"))
	assert.Equal(t, 1, led.n("settle"))
	require.NoError(t, b.Close())
	require.NoError(t, b.Close())
	assert.Equal(t, 1, *ended)
	assert.Equal(t, 1, led.n("settle"))
	assert.Equal(t, 0, led.n("release"))
	assert.Equal(t, phaseSettled, c.phase)
	_, err = b.WriteTo(&buf)
	assert.Error(t, err, "a second write is refused")
}

// A body fasthttp never wrote (the client left before the headers went
// out) is ended by Close: settled once as a client disconnect, its
// upstream stream closed.
func TestSSEBodyNeverWrittenSettlesOnClose(t *testing.T) {
	gate := make(chan struct{})
	defer close(gate)
	_, led, c, b, ended := streamedCall(t, &fakeUpstream{out: 3, gate: gate})
	require.NoError(t, b.Close())
	assert.Equal(t, 1, *ended)
	assert.Equal(t, 1, led.n("settle"))
	assert.Equal(t, 0, led.n("release"))
	assert.Equal(t, phaseSettled, c.phase)
	assert.ErrorIs(t, context.Cause(c.ctx), ErrClientGone)
	assert.Equal(t, "client_disconnect", c.abortCause)
	n, err := b.Read(make([]byte, 16))
	assert.Zero(t, n)
	assert.ErrorIs(t, err, io.EOF, "nothing to read after Close")
}

// The Read fallback passes the same bytes; a Close while its pump still
// waits upstream stops it (no hang) and settles once.
func TestSSEBodyReadFallback(t *testing.T) {
	_, led, _, b, ended := streamedCall(t, &fakeUpstream{out: 2})
	got, err := io.ReadAll(b)
	require.NoError(t, err)
	assert.Equal(t, 4, strings.Count(string(got), "data: "))
	require.NoError(t, b.Close())
	assert.Equal(t, 1, *ended)
	assert.Equal(t, 1, led.n("settle"))

	gate := make(chan struct{})
	defer close(gate)
	_, led, c, b, ended := streamedCall(t, &fakeUpstream{out: 2, gate: gate})
	read := make(chan error, 1)
	go func() { _, err := b.Read(make([]byte, 64)); read <- err }()
	require.NoError(t, b.Close()) // the pump waits upstream; Close must end it
	assert.Error(t, <-read)
	assert.Equal(t, 1, *ended)
	assert.Equal(t, 1, led.n("settle"))
	assert.Equal(t, "client_disconnect", c.abortCause)
}
