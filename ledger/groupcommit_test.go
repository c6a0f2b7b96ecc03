package ledger

import (
	"log/slog"
	"os"
	"path/filepath"
	"runtime"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// fakeFile stands in for the journal's file: it keeps what was written, the
// prefix the last finished Sync covered (what a machine that went down
// would keep), counts Syncs and can hold each one until the test lets it go.
type fakeFile struct {
	mu      sync.Mutex
	data    []byte
	synced  int // bytes covered by a finished Sync
	syncs   int
	hold    bool          // Syncs wait for release
	entered chan struct{} // one send per Sync started while hold
	release chan struct{}
}

func newFakeFile() *fakeFile {
	return &fakeFile{entered: make(chan struct{}, 64), release: make(chan struct{})}
}

func (f *fakeFile) Write(b []byte) (int, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.data = append(f.data, b...)
	return len(b), nil
}

func (f *fakeFile) Sync() error {
	f.mu.Lock()
	n, hold := len(f.data), f.hold
	f.mu.Unlock()
	if hold {
		f.entered <- struct{}{}
		<-f.release
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.synced = max(f.synced, n)
	f.syncs++
	return nil
}

func (f *fakeFile) Close() error { return nil }

func (f *fakeFile) state() (written, synced, syncs int) {
	f.mu.Lock()
	defer f.mu.Unlock()
	return len(f.data), f.synced, f.syncs
}

func (f *fakeFile) setHold(h bool) {
	f.mu.Lock()
	f.hold = h
	f.mu.Unlock()
}

// durableImage is the journal a machine that went down now would leave.
func (f *fakeFile) durableImage() []byte {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]byte(nil), f.data[:f.synced]...)
}

// manualTimer replaces time.AfterFunc: the test fires the lazy-sync timer.
type manualTimer struct {
	mu    sync.Mutex
	armed []func()
	d     time.Duration
}

func (m *manualTimer) after(d time.Duration, f func()) {
	m.mu.Lock()
	defer m.mu.Unlock()
	m.armed, m.d = append(m.armed, f), d
}

func (m *manualTimer) pending() int {
	m.mu.Lock()
	defer m.mu.Unlock()
	return len(m.armed)
}

func (m *manualTimer) fire() {
	m.mu.Lock()
	fs := m.armed
	m.armed = nil
	m.mu.Unlock()
	for _, f := range fs {
		f()
	}
}

func newTestJournal(f journalFile, tm *manualTimer) *journal {
	j := &journal{f: f, lazyAfter: time.Hour, afterFunc: tm.after}
	j.cond = sync.NewCond(&j.mu)
	return j
}

func testEntry(i int) *entry {
	return &entry{op: opExtend, time: int64(i), ref: Ref{Tenant: ScopeKey{1}, ID: RequestID{byte(i), byte(i >> 8)}}, ttl: 1000}
}

// waitFor spins (yielding) until cond holds: the barrier for goroutines
// that must be parked inside the journal before the test goes on.
func waitFor(t *testing.T, what string, cond func() bool) {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for !cond() {
		if time.Now().After(deadline) {
			t.Fatalf("timed out waiting for %s", what)
		}
		runtime.Gosched()
	}
}

func (j *journal) waiting() int {
	j.mu.Lock()
	defer j.mu.Unlock()
	return j.waiters
}

// An idle journal fsyncs a waiting writer's entry at once: no timer, even
// one of an hour.
func TestGroupCommitIdleWriterSyncsAtOnce(t *testing.T) {
	t.Parallel()
	ff, tm := newFakeFile(), &manualTimer{}
	j := newTestJournal(ff, tm)
	seq := j.append(testEntry(1))
	require.NoError(t, j.waitDurable(seq))
	written, synced, syncs := ff.state()
	assert.Equal(t, 1, syncs)
	assert.Equal(t, written, synced, "the entry is covered by the fsync")
	assert.Zero(t, tm.pending(), "a waited-for entry arms no timer")
}

// Writers arriving while an fsync is in flight join the next batch: one
// more fsync acknowledges all of them, and none returns before an fsync
// covers its entry.
func TestGroupCommitBatchesWritersBehindAnFsync(t *testing.T) {
	t.Parallel()
	ff, tm := newFakeFile(), &manualTimer{}
	ff.setHold(true)
	j := newTestJournal(ff, tm)
	first := j.append(testEntry(0))
	firstDone := make(chan error, 1)
	go func() { firstDone <- j.waitDurable(first) }()
	<-ff.entered // fsync 1 is in flight, covering only entry 0

	const n = 50
	var returned atomic.Int32
	var wg sync.WaitGroup
	ends := make([]int, n)
	for i := range n {
		seq := j.append(testEntry(i + 1))
		ends[i], _, _ = ff.state() // entry i+1 ends here in the file
		wg.Add(1)
		go func() {
			defer wg.Done()
			assert.NoError(t, j.waitDurable(seq))
			_, synced, _ := ff.state()
			assert.GreaterOrEqual(t, synced, ends[i], "entry %d acknowledged before an fsync covered it", i+1)
			returned.Add(1)
		}()
	}
	waitFor(t, "every writer waiting behind fsync 1", func() bool { return j.waiting() == n })
	assert.Zero(t, returned.Load(), "no writer returns while the fsync it arrived behind is in flight")
	ff.release <- struct{}{} // fsync 1 ends
	require.NoError(t, <-firstDone)
	<-ff.entered // fsync 2: one of the waiters leads it for all
	ff.setHold(false)
	ff.release <- struct{}{}
	wg.Wait()
	_, _, syncs := ff.state()
	assert.Equal(t, 2, syncs, "%d writers behind one fsync need one more, not %d", n, n)
	assert.Equal(t, int32(n), returned.Load())
	assert.Zero(t, tm.pending())
}

// An entry no call waits for is written at once and fsynced by the next
// fsync anyone starts, or by the lazy timer when nobody does.
func TestGroupCommitLazyEntriesRideTheNextFsync(t *testing.T) {
	t.Parallel()
	ff, tm := newFakeFile(), &manualTimer{}
	j := newTestJournal(ff, tm)

	// Idle: the lazy entry is written, not synced, and arms the timer once.
	a := j.append(testEntry(1))
	require.NoError(t, j.lazy(a))
	b := j.append(testEntry(2))
	require.NoError(t, j.lazy(b))
	written, synced, syncs := ff.state()
	assert.Positive(t, written, "written at once")
	assert.Zero(t, syncs, "a lazy entry starts no fsync of its own")
	assert.Zero(t, synced)
	assert.Equal(t, 1, tm.pending(), "one timer for both")
	assert.Equal(t, time.Hour, tm.d, "armed for the configured bound")
	tm.fire()
	written, synced, syncs = ff.state()
	assert.Equal(t, 1, syncs)
	assert.Equal(t, written, synced, "the timer's fsync covers both")

	// A waited-for entry's fsync covers the lazy ones written before it.
	c := j.append(testEntry(3))
	require.NoError(t, j.lazy(c))
	d := j.append(testEntry(4))
	require.NoError(t, j.waitDurable(d))
	written, synced, syncs = ff.state()
	assert.Equal(t, 2, syncs)
	assert.Equal(t, written, synced)
	tm.fire() // armed by c; finds nothing left
	_, _, syncs = ff.state()
	assert.Equal(t, 2, syncs, "the timer finds nothing to sync")

	// A lazy entry written during an fsync is left to the timer the fsync
	// arms as it ends; a timer firing during an fsync starts one after it.
	ff.setHold(true)
	e := j.append(testEntry(5))
	done := make(chan error, 1)
	go func() { done <- j.waitDurable(e) }()
	<-ff.entered
	f := j.append(testEntry(6))
	require.NoError(t, j.lazy(f))
	assert.Zero(t, tm.pending(), "not armed while an fsync is in flight")
	ff.release <- struct{}{}
	require.NoError(t, <-done)
	assert.Equal(t, 1, tm.pending(), "armed by the fsync that left entry 6")
	go tm.fire() // fsync 4 starts and is held
	<-ff.entered
	g := j.append(testEntry(7))
	require.NoError(t, j.lazy(g))
	ff.setHold(false)
	ff.release <- struct{}{}
	// fsync 4 ended with entry 7 left over and no waiter: it armed the
	// timer (the timer that fired is spent).
	waitFor(t, "the timer re-armed for entry 7", func() bool { return tm.pending() == 1 })
	tm.fire()
	written, synced, syncs = ff.state()
	assert.Equal(t, 5, syncs)
	assert.Equal(t, written, synced, "every lazy entry fsynced")
}

// The lazy timer firing while an fsync is in flight starts another when it
// ends, without waiting for a second timer.
func TestGroupCommitTimerDuringFsyncKicksTheNext(t *testing.T) {
	t.Parallel()
	ff, tm := newFakeFile(), &manualTimer{}
	j := newTestJournal(ff, tm)
	a := j.append(testEntry(1))
	require.NoError(t, j.lazy(a)) // armed
	ff.setHold(true)
	b := j.append(testEntry(2))
	done := make(chan error, 1)
	go func() { done <- j.waitDurable(b) }()
	<-ff.entered // fsync 1 covers 1 and 2
	c := j.append(testEntry(3))
	require.NoError(t, j.lazy(c))
	tm.fire() // during fsync 1: kick
	ff.setHold(false)
	ff.release <- struct{}{}
	require.NoError(t, <-done)
	waitFor(t, "the kicked fsync", func() bool { _, _, s := ff.state(); return s == 2 })
	written, synced, _ := ff.state()
	assert.Equal(t, written, synced)
	assert.Zero(t, tm.pending())
}

// A request's life through the embedded ledger, 16 at once: only
// MarkDispatched waits for an fsync, and those arriving behind one share
// the next.
func TestGroupCommitRequestsShareFsyncs(t *testing.T) {
	t.Parallel()
	ff, tm := newFakeFile(), &manualTimer{}
	m := newFakeJournalMemory(t, ff, tm, nil)
	_, _, base := ff.state()
	ff.setHold(true)
	ctx := t.Context()
	const n = 16
	reserved := make(chan struct{}, n)
	marked := make(chan struct{}, n)
	var wg sync.WaitGroup
	run := func(i int) {
		defer wg.Done()
		q := gcReq(i)
		_, err := m.Reserve(ctx, q)
		assert.NoError(t, err)
		reserved <- struct{}{}
		assert.NoError(t, m.MarkDispatched(ctx, q.Ref, q.Owner))
		marked <- struct{}{}
		_, err = m.Settle(ctx, q.Ref, gcActual(), SourceFinal)
		assert.NoError(t, err)
	}
	wg.Add(1)
	go run(0)
	<-ff.entered // request 0's MarkDispatched fsync is in flight
	<-reserved
	for i := 1; i < n; i++ {
		wg.Add(1)
		go run(i)
	}
	for range n - 1 {
		<-reserved // Reserve returned without an fsync (one is held)
	}
	waitFor(t, "15 MarkDispatched behind the held fsync", func() bool { return m.jnl.waiting() == n-1 })
	assert.Empty(t, marked, "MarkDispatched returned before its fsync")
	ff.setHold(false)
	ff.release <- struct{}{}
	wg.Wait()
	_, _, syncs := ff.state()
	assert.Equal(t, 2, syncs-base, "48 calls of 16 requests: 2 fsyncs")
	written, synced, _ := ff.state()
	assert.Less(t, synced, written, "the Settles wait for the next fsync")
	assert.Equal(t, 1, tm.pending())
	tm.fire()
	written, synced, _ = ff.state()
	assert.Equal(t, written, synced, "the timer fsyncs the Settles")
}

func newFakeJournalMemory(t *testing.T, ff *fakeFile, tm *manualTimer, onUsage func(UsageEvent)) *Memory {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.journal")
	m, err := NewMemory(MemoryConfig{Journal: path, Clock: func() time.Time { return gcT0 }, OnUsage: onUsage,
		wrapFile: func(journalFile) journalFile { return ff }, afterFunc: tm.after, Logger: gcQuiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	// Runs first: a test that failed with an fsync held lets it go, so
	// Close does not wait for it forever.
	t.Cleanup(func() { ff.setHold(false); close(ff.release) })
	return m
}

var gcQuiet = slog.New(slog.DiscardHandler)

var gcT0 = time.Date(2026, 12, 5, 12, 0, 0, 0, time.UTC)

func gcReq(i int) ReserveRequest {
	var h Amounts
	h[Requests], h[InputTokens], h[OutputTokens], h[Tokens] = 1, 10, 100, 110
	return ReserveRequest{Ref: Ref{Tenant: ScopeKey{0x9c}, ID: RequestID{0x51, byte(i), byte(i >> 8)}}, Owner: Owner{0x0d}, Held: h,
		Scopes: []Scope{{Kind: KindTenant, Key: ScopeKey{0x9c}, Limits: []Limit{{Dim: Tokens, Window: 24 * time.Hour, Max: 1 << 40}, {Dim: Slots, Max: 1 << 20}}}}}
}

func gcActual() Amounts {
	var a Amounts
	a[Requests], a[InputTokens], a[OutputTokens], a[Tokens] = 1, 10, 40, 50
	return a
}

// crashImage reopens the ledger from what the machine would keep had it gone
// down now: the journal up to the last finished fsync.
func crashImage(t *testing.T, ff *fakeFile) *Memory {
	t.Helper()
	path := filepath.Join(t.TempDir(), "ledger.journal")
	require.NoError(t, os.WriteFile(path, ff.durableImage(), 0o600))
	m, err := NewMemory(MemoryConfig{Journal: path, Clock: func() time.Time { return gcT0.Add(time.Minute) }, Logger: gcQuiet})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	return m
}

// What recovery makes of the calls that do not wait for their fsync when the
// machine goes down before it: never less charged, never a hold kept open
// for good, never a charge twice.
func TestLazyCallsLostInACrash(t *testing.T) {
	t.Parallel()
	tenant := ScopeKey{0x9c}
	held, actual := gcReq(0).Held, gcActual()
	snap := func(m *Memory) Usage {
		u, err := m.Snapshot(t.Context(), tenant, tenant)
		require.NoError(t, err)
		return u
	}
	state := func(m *Memory, id RequestID) State {
		for _, st := range []State{Reserved, Dispatched, Unresolved} {
			l, err := m.List(t.Context(), tenant, st, 100)
			require.NoError(t, err)
			for _, r := range l {
				if r.Ref.ID == id {
					return st
				}
			}
		}
		return 0
	}

	t.Run("Reserve lost: nothing held, nothing ran", func(t *testing.T) {
		t.Parallel()
		ff, tm := newFakeFile(), &manualTimer{}
		m := newFakeJournalMemory(t, ff, tm, nil)
		q := gcReq(1)
		_, err := m.Reserve(t.Context(), q)
		require.NoError(t, err)
		r := crashImage(t, ff)
		u := snap(r)
		assert.Zero(t, u.Reserved[Tokens])
		assert.Zero(t, u.SlotsInUse)
		assert.ErrorIs(t, r.MarkDispatched(t.Context(), q.Ref, q.Owner), ErrNotFound, "no record")
	})

	t.Run("MarkDispatched is durable, and with it the Reserve", func(t *testing.T) {
		t.Parallel()
		ff, tm := newFakeFile(), &manualTimer{}
		m := newFakeJournalMemory(t, ff, tm, nil)
		q := gcReq(2)
		_, err := m.Reserve(t.Context(), q)
		require.NoError(t, err)
		require.NoError(t, m.MarkDispatched(t.Context(), q.Ref, q.Owner))
		r := crashImage(t, ff)
		assert.Equal(t, Unresolved, state(r, q.Ref.ID), "it may have run: kept, charged later")
		assert.Equal(t, held[Tokens], snap(r).Reserved[Tokens])
	})

	t.Run("Extend lost: the same recovery", func(t *testing.T) {
		t.Parallel()
		ff, tm := newFakeFile(), &manualTimer{}
		m := newFakeJournalMemory(t, ff, tm, nil)
		q := gcReq(3)
		_, err := m.Reserve(t.Context(), q)
		require.NoError(t, err)
		require.NoError(t, m.MarkDispatched(t.Context(), q.Ref, q.Owner))
		_, err = m.Extend(t.Context(), q.Ref, q.Owner, time.Minute)
		require.NoError(t, err)
		written, synced, _ := ff.state()
		assert.Less(t, synced, written, "Extend returned before its fsync")
		r := crashImage(t, ff)
		assert.Equal(t, Unresolved, state(r, q.Ref.ID))
		assert.Equal(t, held[Tokens], snap(r).Reserved[Tokens])
	})

	t.Run("Release lost: expired instead, the hold freed, nothing charged", func(t *testing.T) {
		t.Parallel()
		ff, tm := newFakeFile(), &manualTimer{}
		m := newFakeJournalMemory(t, ff, tm, nil)
		q := gcReq(4)
		_, err := m.Reserve(t.Context(), q)
		require.NoError(t, err)
		// A dispatched neighbour makes the Reserve durable; the Release is not.
		p := gcReq(40)
		_, err = m.Reserve(t.Context(), p)
		require.NoError(t, err)
		require.NoError(t, m.MarkDispatched(t.Context(), p.Ref, p.Owner))
		require.NoError(t, m.Release(t.Context(), q.Ref, q.Owner))
		r := crashImage(t, ff)
		assert.Equal(t, State(0), state(r, q.Ref.ID), "not open")
		assert.ErrorIs(t, r.MarkDispatched(t.Context(), q.Ref, q.Owner), ErrLeaseLost, "EXPIRED")
		assert.Equal(t, held[Tokens], snap(r).Reserved[Tokens], "only the dispatched neighbour's hold")
		assert.Zero(t, r.Committed(tenant, tenant, Tokens, 24*time.Hour))
	})

	t.Run("Settle within the hold lost: charged at the hold, once", func(t *testing.T) {
		t.Parallel()
		ff, tm := newFakeFile(), &manualTimer{}
		m := newFakeJournalMemory(t, ff, tm, nil)
		q := gcReq(5)
		_, err := m.Reserve(t.Context(), q)
		require.NoError(t, err)
		require.NoError(t, m.MarkDispatched(t.Context(), q.Ref, q.Owner))
		st, err := m.Settle(t.Context(), q.Ref, actual, SourceFinal)
		require.NoError(t, err)
		require.Equal(t, Settled, st.State)
		r := crashImage(t, ff)
		assert.Equal(t, Unresolved, state(r, q.Ref.ID))
		res, err := r.Resolve(t.Context(), q.Ref)
		require.NoError(t, err)
		assert.Equal(t, held, res.Charged, "charged at the hold, never below the actual")
		assert.Equal(t, held[Tokens], r.Committed(tenant, tenant, Tokens, 24*time.Hour), "charged once")
		assert.Zero(t, snap(r).Reserved[Tokens], "the hold ends with the charge")
		_, err = r.Settle(t.Context(), q.Ref, actual, SourceFinal)
		assert.ErrorIs(t, err, ErrAlreadyFinal, "no second charge")
	})

	t.Run("Settle above the hold waits for its fsync", func(t *testing.T) {
		t.Parallel()
		ff, tm := newFakeFile(), &manualTimer{}
		m := newFakeJournalMemory(t, ff, tm, nil)
		q := gcReq(6)
		_, err := m.Reserve(t.Context(), q)
		require.NoError(t, err)
		require.NoError(t, m.MarkDispatched(t.Context(), q.Ref, q.Owner))
		over := actual
		over[GPUMs] = 7 // held 0: an overrun
		_, err = m.Settle(t.Context(), q.Ref, over, SourceFinal)
		require.NoError(t, err)
		r := crashImage(t, ff)
		st, err := r.Settle(t.Context(), q.Ref, over, SourceFinal)
		require.NoError(t, err)
		assert.True(t, st.Replayed, "the Settle survived")
		assert.Equal(t, actual[Tokens], r.Committed(tenant, tenant, Tokens, 24*time.Hour))
	})

	t.Run("Settle of a record recovery would expire waits for its fsync", func(t *testing.T) {
		t.Parallel()
		ff, tm := newFakeFile(), &manualTimer{}
		m := newFakeJournalMemory(t, ff, tm, nil)
		q := gcReq(7)
		_, err := m.Reserve(t.Context(), q)
		require.NoError(t, err)
		_, err = m.Settle(t.Context(), q.Ref, actual, SourceFinal) // RESERVED, actual > 0
		require.NoError(t, err)
		r := crashImage(t, ff)
		assert.Equal(t, actual[Tokens], r.Committed(tenant, tenant, Tokens, 24*time.Hour))
	})

	t.Run("with a usage consumer the Settle waits: the event never precedes its entry", func(t *testing.T) {
		t.Parallel()
		ff, tm := newFakeFile(), &manualTimer{}
		var events atomic.Int32
		m := newFakeJournalMemory(t, ff, tm, func(UsageEvent) { events.Add(1) })
		q := gcReq(8)
		_, err := m.Reserve(t.Context(), q)
		require.NoError(t, err)
		require.NoError(t, m.MarkDispatched(t.Context(), q.Ref, q.Owner))
		_, err = m.Settle(t.Context(), q.Ref, actual, SourceFinal)
		require.NoError(t, err)
		assert.Equal(t, int32(1), events.Load())
		written, synced, _ := ff.state()
		assert.Equal(t, written, synced)
	})
}

// A MarkDispatched repeated while the first one's fsync is in flight answers
// no sooner than the first: both answers let the request go upstream.
func TestMarkDispatchedReplayWaitsForTheFirstsFsync(t *testing.T) {
	t.Parallel()
	ff, tm := newFakeFile(), &manualTimer{}
	m := newFakeJournalMemory(t, ff, tm, nil)
	ctx := t.Context()
	q := gcReq(1)
	_, err := m.Reserve(ctx, q)
	require.NoError(t, err)
	ff.setHold(true)
	first := make(chan error, 1)
	go func() { first <- m.MarkDispatched(ctx, q.Ref, q.Owner) }()
	<-ff.entered
	var again atomic.Bool
	second := make(chan error, 1)
	go func() {
		err := m.MarkDispatched(ctx, q.Ref, q.Owner)
		again.Store(true)
		second <- err
	}()
	waitFor(t, "the repeat waiting", func() bool { return m.jnl.waiting() == 1 })
	assert.False(t, again.Load(), "the repeat answered before the fsync")
	ff.setHold(false)
	ff.release <- struct{}{}
	require.NoError(t, <-first)
	require.NoError(t, <-second)
	// The same for a dispatching Reserve repeated by the same attempt.
	p := gcReq(2)
	p.Dispatch, p.Attempt = true, 7
	ff.setHold(true)
	go func() { _, err := m.Reserve(ctx, p); first <- err }()
	<-ff.entered
	again.Store(false)
	go func() {
		g, err := m.Reserve(ctx, p)
		assert.False(t, g.Replayed, "the same attempt")
		again.Store(true)
		second <- err
	}()
	waitFor(t, "the repeat waiting", func() bool { return m.jnl.waiting() == 1 })
	assert.False(t, again.Load(), "the repeat answered before the fsync")
	ff.setHold(false)
	ff.release <- struct{}{}
	require.NoError(t, <-first)
	require.NoError(t, <-second)
}

// Every fsync of the journal is observed in sluice_ledger_fsync_seconds,
// including the one a MarkDispatched waits for: a slow disk shows there.
func TestFsyncsAreObserved(t *testing.T) {
	t.Parallel()
	ff, tm := newFakeFile(), &manualTimer{}
	reg := prometheus.NewRegistry()
	m, err := NewMemory(MemoryConfig{Journal: filepath.Join(t.TempDir(), "ledger.journal"), Clock: func() time.Time { return gcT0 },
		wrapFile: func(journalFile) journalFile { return ff }, afterFunc: tm.after, Logger: gcQuiet, Registerer: reg})
	require.NoError(t, err)
	t.Cleanup(func() { _ = m.Close() })
	t.Cleanup(func() { ff.setHold(false); close(ff.release) })
	observed := func() uint64 {
		mfs, err := reg.Gather()
		require.NoError(t, err)
		for _, mf := range mfs {
			if mf.GetName() == "sluice_ledger_fsync_seconds" {
				return mf.GetMetric()[0].GetHistogram().GetSampleCount()
			}
		}
		t.Fatal("sluice_ledger_fsync_seconds not registered")
		return 0
	}
	ctx := t.Context()
	_, _, before := ff.state()
	q := gcReq(1)
	_, err = m.Reserve(ctx, q)
	require.NoError(t, err)
	require.NoError(t, m.MarkDispatched(ctx, q.Ref, q.Owner))
	_, _, after := ff.state()
	require.Greater(t, after, before, "MarkDispatched waited for an fsync")
	assert.Equal(t, uint64(after), observed(), "each fsync observed once")
}
