package lifecycle

import (
	"context"
	"fmt"
	"io"
	"math"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	dto "github.com/prometheus/client_model/go"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/gate"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/vllm"
)

// started is a Start that returned: its ticket, or its error.
type started struct {
	tk  *Ticket
	err error
}

// startStreams starts n streamed calls of acme on e, each on its own
// goroutine (Start returns once its stream's first event came), with
// contexts the test can cancel.
func startStreams(t *testing.T, e *Engine, n int) ([]chan started, []context.CancelFunc) {
	t.Helper()
	pol := e.pol.Load()
	outs := make([]chan started, n)
	cancels := make([]context.CancelFunc, n)
	for i := range n {
		ctx, cancel := context.WithCancel(context.Background())
		t.Cleanup(cancel)
		outs[i], cancels[i] = make(chan started, 1), cancel
		go func() {
			tk, err := e.begin(ctx, pol.Tenants["acme"], pol, admission{ep: vllm.EndpointChat,
				body: lifecycletest.ChatBody(`,"stream":true`), reqID: fmt.Sprintf("r%d", i)})
			outs[i] <- started{tk, err}
		}()
	}
	return outs, cancels
}

// unstartedOn counts e's calls on r awaiting their first event.
func (e *Engine) unstartedOn(name string) int {
	e.mu.Lock()
	defer e.mu.Unlock()
	n := 0
	for c := range e.unstarted {
		if c.rep.Name == name {
			n++
		}
	}
	return n
}

// makeHeavy has the gate of acme's pool assess acme as above its share: a
// pool of one sequence, acme holding what it holds, for ten seconds.
func makeHeavy(t *testing.T, e *Engine) {
	t.Helper()
	pol := e.pol.Load()
	key := e.reps.PoolKeyOf("m")
	names := func(i int) (string, float64) { return pol.Order[i].Name, float64(pol.Order[i].Cfg.Weight) }
	e.pools.Lock()
	defer e.pools.Unlock()
	pl := e.pools.PoolLocked(key)
	now := e.now().UnixNano()
	for _, dt := range []time.Duration{0, 10 * time.Second} {
		pl.Assess(now+int64(dt), "acme", len(pol.Order), names, gate.FleetLoad{Seqs: 3, SeqsCap: 1, TokensCap: 1 << 40}, 0, 0, 0, gate.BurstK, 1)
	}
	require.False(t, pl.Gate.WithinShare("acme", 1), "acme is above its share")
}

// TestTakeBackWaiting: streams that wait inside the replica (no first
// event) of a tenant above its share are taken back, the newest first and
// no more than the replica has waiting: each attempt is aborted upstream,
// the call waits in the queue again without a second MarkDispatched, and
// either runs again and settles once from its usage, or, ending while it
// waits, settles at zero as not sent (never released). A stream that
// started, and a tenant within its share, are never taken back.
func TestTakeBackWaiting(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	gateCh := make(chan struct{})
	up := &lifecycletest.Upstream{Out: 2, Gate: gateCh, Queued: true}
	e := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
	e.loopOnly = false
	// No dispatch loop yet: each call is dispatched inline as it is
	// admitted, and one taken back stays queued until the loop runs.
	outs, cancels := startStreams(t, e, 3)
	require.Eventually(t, func() bool { return e.unstartedOn("r0") == 3 }, 10*time.Second, time.Millisecond)
	r0 := e.reps.Get("r0")

	assert.Zero(t, e.TakeBackWaiting(r0, 2, math.MaxInt64), "acme within its share: nothing taken back")
	makeHeavy(t, e)
	assert.Zero(t, e.TakeBackWaiting(r0, 2, 0), "none sent before the scrape")
	require.Equal(t, 2, e.TakeBackWaiting(r0, 2, math.MaxInt64))
	assert.Equal(t, 1, e.unstartedOn("r0"), "the oldest is left: it is the one vLLM runs first")
	var m dto.Metric
	require.NoError(t, e.m.UpstreamAborts.WithLabelValues("r0", "taken_back").Write(&m))
	assert.Equal(t, 2.0, m.GetCounter().GetValue(), "sluice_upstream_aborts_total{cause=taken_back}")
	require.Eventually(t, func() bool { return up.Aborted.Load() == 2 }, 10*time.Second, time.Millisecond, "both attempts aborted upstream")
	require.Eventually(t, func() bool {
		q, _ := e.q.Len()
		return q == 2
	}, 10*time.Second, time.Millisecond, "both back in the queue")
	assert.Equal(t, int64(1), e.reps.Get("r0").Count.Load(), "their replica room given back")
	assert.Equal(t, int64(1), e.pol.Load().Tenants["acme"].RT.Inflight.Load())
	st, _ := e.q.Stats("acme")
	assert.Equal(t, uint64(2), st.TakenBack)

	// Which were taken back: the two newest by their seq on the replica.
	// One of them leaves while it waits: settled at zero, not released.
	e.mu.Lock()
	var back []*call
	for c := range e.queued {
		back = append(back, c)
	}
	e.mu.Unlock()
	require.Len(t, back, 2)
	var gone int
	for i := range outs {
		if back[0].reqID == fmt.Sprintf("r%d", i) {
			gone = i
		}
	}
	cancels[gone]()
	s := <-outs[gone]
	require.NoError(t, s.err)
	assert.Equal(t, outcomeCancelled, s.tk.Finish(nil))
	assert.Equal(t, phaseSettled, s.tk.c.phase)
	assert.Equal(t, 0, led.N("release"), "its record is DISPATCHED: it settles")
	assert.Equal(t, 1, led.N("settle"))
	got, ok := led.SettledOf(s.tk.c.ref.ID)
	require.True(t, ok)
	assert.Equal(t, ledger.SourceNotSent, got.Source)
	assert.Equal(t, ledger.Amounts{}, got.Actual, "it never ran: nothing charged")

	// The loop sends the other one again; the replica lets everything run.
	ctx, stop := context.WithCancel(context.Background())
	defer stop()
	go e.dispatchLoop(ctx)
	e.Wake()
	require.Eventually(t, func() bool { return up.Runs.Load() == 4 }, 10*time.Second, time.Millisecond, "sent again once")
	close(gateCh)
	for i := range outs {
		if i == gone {
			continue
		}
		s := <-outs[i]
		require.NoError(t, s.err)
		assert.Equal(t, outcomeOK, s.tk.Finish(&writerSink{w: io.Discard}))
		assert.Equal(t, phaseSettled, s.tk.c.phase)
	}
	assert.Equal(t, 3, led.N("settle"), "each call settled once")
	assert.Equal(t, 3, led.N("dispatch"), "one MarkDispatched per call, taken back or not")
	var qw dto.Metric
	require.NoError(t, e.m.QueueWait.WithLabelValues("acme").(prometheus.Histogram).Write(&qw))
	assert.Equal(t, uint64(3), qw.GetHistogram().GetSampleCount(), "one queue-wait sample per call, taken back or not")
	assert.Zero(t, e.pol.Load().Tenants["acme"].RT.Inflight.Load())
	assert.Zero(t, e.reps.Get("r0").Count.Load())
}

// TestTakeBackNeverAbortsAStartedStream: a stream whose first event came
// (the request runs) is not taken back however many the replica has
// waiting, and the setting off takes nothing back.
func TestTakeBackNeverAbortsAStartedStream(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	gateCh := make(chan struct{})
	up := &lifecycletest.Upstream{Out: 2, Gate: gateCh}
	e := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
	e.loopOnly = false
	outs, _ := startStreams(t, e, 3)
	var tks []*Ticket
	for _, o := range outs {
		s := <-o
		require.NoError(t, s.err)
		tks = append(tks, s.tk)
	}
	makeHeavy(t, e)
	assert.Zero(t, e.TakeBackWaiting(e.reps.Get("r0"), 5, math.MaxInt64))
	close(gateCh)
	for _, tk := range tks {
		assert.Equal(t, outcomeOK, tk.Finish(&writerSink{w: io.Discard}))
	}
	assert.Zero(t, up.Aborted.Load())

	off := lifecycletest.Config(t, "", "")
	no := false
	off.Upstream.TakeBackWaiting = &no
	e = newTestEngine(t, off, lifecycletest.NewLedger(t), &lifecycletest.Upstream{Out: 2, Gate: make(chan struct{}), Queued: true})
	e.loopOnly = false
	startStreams(t, e, 3)
	require.Eventually(t, func() bool { return e.unstartedOn("r0") == 0 && e.reps.Get("r0").Count.Load() == 3 }, 10*time.Second, time.Millisecond)
	makeHeavy(t, e)
	assert.Zero(t, e.TakeBackWaiting(e.reps.Get("r0"), 2, math.MaxInt64), "upstream.take_back_waiting: false")
}
