package queue

import (
	"errors"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		cfg  Config
		want []string // substrings of the joined error; nil means valid
	}{
		{name: "empty is valid", cfg: Config{}},
		{name: "defaults valid", cfg: Config{Tenants: tenants("a", "b")}},
		{
			name: "every problem named",
			cfg: Config{
				MaxDepth:   -1,
				MaxBytes:   -1,
				ExpirySpin: -1,
				Tenants: []TenantConfig{
					{Name: "a", Weight: -1, Band: NumBands},
					{Name: "a", MaxDepth: -1, MaxBytes: -2, MaxWait: -time.Second, Order: 7},
					{},
				},
			},
			want: []string{
				"max_depth must be >= 0",
				"max_bytes must be >= 0",
				"expiry_spin must be in [0, 10ms]",
				"tenants[0].weight",
				"tenants[0].priority",
				`tenants[1].name "a" duplicates tenants[0]`,
				"tenants[1].queue.max_depth",
				"tenants[1].queue.max_bytes",
				"tenants[1].queue.max_wait",
				"tenants[1].queue.order",
				"tenants[2].name is required",
			},
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			err := tc.cfg.Validate()
			if tc.want == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			for _, w := range tc.want {
				assert.Contains(t, err.Error(), w)
			}
			_, nerr := New[int](tc.cfg, Deps[int]{})
			assert.Error(t, nerr)
		})
	}
}

func TestParseOrder(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name string
		in   string
		want Order
		err  bool
	}{
		{name: "empty", in: "", want: OrderFIFO},
		{name: "fifo", in: "fifo", want: OrderFIFO},
		{name: "edf", in: "edf", want: OrderEDF},
		{name: "bad", in: "lifo", err: true},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			got, err := ParseOrder(tc.in)
			if tc.err {
				assert.Error(t, err)
				return
			}
			require.NoError(t, err)
			assert.Equal(t, tc.want, got)
			assert.Equal(t, tc.want.String(), map[Order]string{OrderFIFO: "fifo", OrderEDF: "edf"}[got])
		})
	}
}

func TestEnqueueRefusals(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{Tenants: tenants("a")}, clk)
	_, err := q.Enqueue(Request[int]{Tenant: "nobody"})
	require.ErrorIs(t, err, ErrUnknownTenant)
	_, err = q.Enqueue(Request[int]{Tenant: "a", Cost: -1})
	require.ErrorIs(t, err, ErrInvalidRequest)
	_, err = q.Enqueue(Request[int]{Tenant: "a", BodyBytes: -1})
	require.ErrorIs(t, err, ErrInvalidRequest)
	d, b := q.Len()
	assert.Equal(t, 0, d)
	assert.Equal(t, int64(0), b)
}

func TestEnqueueEffectiveBandAndDeadline(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	now := clk.Now()
	cfg := Config{
		MaxWait: time.Minute,
		Tenants: []TenantConfig{
			{Name: "wait10", Band: 2, MaxWait: 10 * time.Second},
			{Name: "nowait"},
		},
	}
	q := newTestQueue(t, cfg, clk)
	tests := []struct {
		name     string
		req      Request[int]
		band     int
		deadline time.Time
	}{
		{name: "tenant max_wait", req: Request[int]{Tenant: "wait10"}, band: 2, deadline: now.Add(10 * time.Second)},
		{name: "client earlier", req: Request[int]{Tenant: "wait10", Deadline: now.Add(3 * time.Second)}, band: 2, deadline: now.Add(3 * time.Second)},
		{name: "client later ignored", req: Request[int]{Tenant: "wait10", Deadline: now.Add(time.Hour)}, band: 2, deadline: now.Add(10 * time.Second)},
		{name: "server max", req: Request[int]{Tenant: "nowait"}, band: 0, deadline: now.Add(time.Minute)},
		{name: "arrival given", req: Request[int]{Tenant: "nowait", Arrival: now.Add(-5 * time.Second)}, band: 0, deadline: now.Add(55 * time.Second)},
		{name: "cannot raise priority", req: Request[int]{Tenant: "wait10", Band: 0}, band: 2, deadline: now.Add(10 * time.Second)},
		{name: "may lower priority", req: Request[int]{Tenant: "wait10", Band: 5}, band: 5, deadline: now.Add(10 * time.Second)},
		{name: "clamped to last band", req: Request[int]{Tenant: "nowait", Band: 99}, band: NumBands - 1, deadline: now.Add(time.Minute)},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel() // the queue has no bound and the clock stands still: cases are independent
			it := mustEnqueue(t, q, tc.req)
			assert.Equal(t, tc.band, it.Band)
			assert.True(t, tc.deadline.Equal(it.Deadline), "deadline got %v want %v", it.Deadline, tc.deadline)
		})
	}
}

// TestBoundsExactUnderConcurrency enqueues from many goroutines at once; the
// number admitted must equal the bound exactly and every refusal must name it.
func TestBoundsExactUnderConcurrency(t *testing.T) {
	t.Parallel()
	const goroutines, perG, body = 32, 50, 100
	tests := []struct {
		name      string
		cfg       Config
		tenants   int
		wantAdmit int
		wantBound Bound
	}{
		{name: "tenant depth", cfg: Config{Tenants: []TenantConfig{{Name: "t0", MaxDepth: 777}}}, tenants: 1, wantAdmit: 777, wantBound: BoundTenantDepth},
		{name: "tenant bytes", cfg: Config{Tenants: []TenantConfig{{Name: "t0", MaxBytes: 55_050}}}, tenants: 1, wantAdmit: 550, wantBound: BoundTenantBytes},
		{name: "global depth", cfg: Config{MaxDepth: 999, Tenants: tenants("t0", "t1", "t2", "t3")}, tenants: 4, wantAdmit: 999, wantBound: BoundGlobalDepth},
		{name: "global bytes", cfg: Config{MaxBytes: 123_456, Tenants: tenants("t0", "t1", "t2", "t3")}, tenants: 4, wantAdmit: 1234, wantBound: BoundGlobalBytes},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			q := newTestQueue(t, tc.cfg, newManualClock())
			var (
				mu       sync.Mutex
				admitted int
				refused  int
				badBound []Bound
			)
			start := make(chan struct{})
			var wg sync.WaitGroup
			for g := range goroutines {
				wg.Go(func() {
					<-start
					for i := range perG {
						_, err := q.Enqueue(Request[int]{Tenant: fmt.Sprintf("t%d", (g+i)%tc.tenants), BodyBytes: body, Cost: 1})
						mu.Lock()
						var fe *FullError
						switch {
						case err == nil:
							admitted++
						case errors.As(err, &fe) && errors.Is(err, ErrFull):
							refused++
							if fe.Bound != tc.wantBound {
								badBound = append(badBound, fe.Bound)
							}
						default:
							t.Errorf("unexpected error %v", err)
						}
						mu.Unlock()
					}
				})
			}
			close(start)
			wg.Wait()
			assert.Equal(t, tc.wantAdmit, admitted)
			assert.Equal(t, goroutines*perG-tc.wantAdmit, refused)
			assert.Empty(t, badBound)
			d, b := q.Len()
			assert.Equal(t, tc.wantAdmit, d)
			assert.Equal(t, int64(tc.wantAdmit*body), b)
			checkInvariants(t, q)
		})
	}
}

func TestRetryAfterFromDrainRate(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{MaxDepth: 30, LIFOAfter: -1, Tenants: []TenantConfig{{Name: "a", MaxDepth: 20}, {Name: "b"}}}, clk)
	// No service yet: the minimum.
	for range 20 {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 100})
	}
	_, err := q.Enqueue(Request[int]{Tenant: "a", Cost: 100})
	var fe *FullError
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, BoundTenantDepth, fe.Bound)
	assert.Equal(t, "a", fe.Tenant)
	assert.Equal(t, MinRetryAfter, fe.RetryAfter)
	assert.Contains(t, fe.Error(), `tenant "a": tenant_depth bound`)

	// Serve 8 requests (800 cost units) within the 10 s window: 80 units/s.
	// Refill to the bound: 20 queued hold 2000 units → 25 s.
	for range 4 {
		next(t, q, always)
		clk.Advance(time.Second)
	}
	for range 4 {
		next(t, q, always)
	}
	for range 8 {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 100})
	}
	_, err = q.Enqueue(Request[int]{Tenant: "a", Cost: 100})
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, 25*time.Second, fe.RetryAfter)

	// Global bound: b fills the instance; everyone's queued 2200 over the
	// instance rate of 80/s = 27.5 s.
	for range 10 {
		mustEnqueue(t, q, Request[int]{Tenant: "b", Cost: 20})
	}
	_, err = q.Enqueue(Request[int]{Tenant: "b", Cost: 20})
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, BoundGlobalDepth, fe.Bound)
	assert.Equal(t, 27500*time.Millisecond, fe.RetryAfter)

	// A large backlog is clamped to 30 s.
	require.NoError(t, q.Reconfigure(Config{Tenants: []TenantConfig{{Name: "a"}, {Name: "b", MaxDepth: 10}}}))
	for range 200 {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 100})
	}
	_, err = q.Enqueue(Request[int]{Tenant: "b", Cost: 20})
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, BoundTenantDepth, fe.Bound)
	assert.Equal(t, 2500*time.Millisecond, fe.RetryAfter, "b's own backlog: 200 over 80/s")
	require.NoError(t, q.Reconfigure(Config{MaxDepth: 230, Tenants: tenants("a", "b")}))
	_, err = q.Enqueue(Request[int]{Tenant: "b", Cost: 20})
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, BoundGlobalDepth, fe.Bound)
	assert.Equal(t, MaxRetryAfter, fe.RetryAfter)

	// Ten seconds later the window is empty again.
	clk.Advance(10 * time.Second)
	_, err = q.Enqueue(Request[int]{Tenant: "a", Cost: 100})
	require.ErrorAs(t, err, &fe)
	assert.Equal(t, MinRetryAfter, fe.RetryAfter)
	st, ok := q.Stats("a")
	require.True(t, ok)
	assert.Equal(t, uint64(3), st.Rejected)
}

func TestFIFOAndEDFOrder(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name  string
		order Order
		want  []int
	}{
		{name: "fifo", order: OrderFIFO, want: []int{0, 1, 2, 3, 4}},
		{name: "edf", order: OrderEDF, want: []int{2, 4, 0, 3, 1}},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			clk := newManualClock()
			q := newTestQueue(t, Config{Tenants: []TenantConfig{{Name: "a", Order: tc.order}}}, clk)
			// deadlines in seconds: 0→30, 1→50, 2→10, 3→30 (tie, later arrival), 4→20
			for i, s := range []int{30, 50, 10, 30, 20} {
				mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: i, Deadline: clk.Now().Add(time.Duration(s) * time.Second)})
			}
			var got []int
			for range tc.want {
				got = append(got, next(t, q, always).Payload)
			}
			assert.Equal(t, tc.want, got)
		})
	}
}

func TestCancel(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{Tenants: tenants("a")}, clk)
	a := mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: 1, BodyBytes: 10, Cost: 5})
	b := mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: 2, BodyBytes: 20, Cost: 5})
	assert.True(t, q.Cancel(a.Handle), "first cancel wins")
	assert.False(t, q.Cancel(a.Handle), "second cancel loses")
	d, by := q.Len()
	assert.Equal(t, 1, d)
	assert.Equal(t, int64(20), by)
	got, ok := q.Next(always)
	require.True(t, ok)
	assert.Equal(t, 2, got.Payload)
	assert.False(t, q.Cancel(b.Handle), "cancel after dispatch loses")
	assert.False(t, q.Release(a.Handle), "release of a cancelled entry")
	assert.True(t, q.Release(b.Handle))
	assert.False(t, q.Release(b.Handle), "double release")
	assert.False(t, q.Cancel(Handle[int]{}), "zero handle")
	// The node is reused: the old handle must stay stale.
	c := mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: 3})
	assert.False(t, q.Cancel(b.Handle))
	assert.True(t, q.Cancel(c.Handle))
	st, _ := q.Stats("a")
	assert.Equal(t, uint64(2), st.Cancelled)
	assert.Equal(t, int64(5), st.Charged, "cancelled entries are never charged")
	checkInvariants(t, q)
}

func TestRequeueUndoesChargeAndParks(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{ParkBackoff: 50 * time.Millisecond, Tenants: tenants("a", "b")}, clk)
	a1 := mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: 1, Cost: 10})
	mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: 2, Cost: 10})
	mustEnqueue(t, q, Request[int]{Tenant: "b", Payload: 3, Cost: 10})

	got, ok := q.Next(always)
	require.True(t, ok)
	require.Equal(t, 1, got.Payload)
	v, _ := q.Counter("a", 0)
	assert.InDelta(t, 10.0, v, 0)

	require.True(t, q.Requeue(got.Handle))
	assert.False(t, q.Requeue(got.Handle), "requeue of a queued entry")
	v, _ = q.Counter("a", 0)
	assert.InDelta(t, 0.0, v, 0, "charge undone")
	st, _ := q.Stats("a")
	assert.True(t, st.Parked)
	assert.Equal(t, int64(0), st.Charged)
	assert.Equal(t, 2, st.Depth)
	assert.Equal(t, uint64(1), st.Requeued)

	// a is parked: b goes, then nothing.
	assert.Equal(t, 3, next(t, q, always).Payload)
	_, ok = q.Next(always)
	assert.False(t, ok)

	// The backoff ends a's park; its requeued entry is at the head again
	// and the handle still works.
	next, due := q.Tick()
	require.True(t, due)
	assert.True(t, clk.Now().Add(50*time.Millisecond).Equal(next), "next due %v", next)
	clk.Advance(50 * time.Millisecond)
	q.Tick()
	st, _ = q.Stats("a")
	assert.False(t, st.Parked)
	got, ok = q.Next(always)
	require.True(t, ok)
	assert.Equal(t, 1, got.Payload)
	assert.Equal(t, a1.Handle, got.Handle)
	require.True(t, q.Requeue(got.Handle))
	assert.True(t, q.Cancel(a1.Handle), "cancel after requeue")
	checkInvariants(t, q)
}

// TestTakeBackKeepsPlaceAndUndoesCharge: an entry dispatched, released and
// taken back goes ahead of its tenant's later arrivals, keeps its deadline,
// is not charged for the dispatch that never ran, and does not park its
// tenant; a removed tenant's entry is refused.
func TestTakeBackKeepsPlaceAndUndoesCharge(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{MaxWait: time.Minute, Tenants: []TenantConfig{{Name: "a", Weight: 2, MaxWait: 10 * time.Second}, {Name: "b"}}}, clk)
	r1 := Request[int]{Tenant: "a", Payload: 1, Cost: 10, Arrival: clk.Now()}
	mustEnqueue(t, q, r1)
	got := next(t, q, always)
	require.Equal(t, 1, got.Payload)
	clk.Advance(time.Second)
	mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: 2, Cost: 10})
	mustEnqueue(t, q, Request[int]{Tenant: "b", Payload: 3, Cost: 10})
	v, _ := q.Counter("a", 0)
	require.InDelta(t, 5.0, v, 0, "cost 10 at weight 2")

	back, err := q.TakeBack(r1, got.Place)
	require.NoError(t, err)
	assert.Equal(t, got.Deadline, back.Deadline, "the deadline it had")
	assert.Equal(t, got.Place, back.Place)
	v, _ = q.Counter("a", 0)
	assert.InDelta(t, 0.0, v, 0, "dispatch charge undone")
	st, _ := q.Stats("a")
	assert.False(t, st.Parked)
	assert.Equal(t, uint64(1), st.TakenBack)
	assert.Equal(t, uint64(0), st.Dispatched)
	assert.Equal(t, 2, st.Depth)
	checkInvariants(t, q)

	var order []int
	for range 3 {
		order = append(order, next(t, q, always).Payload)
	}
	assert.Equal(t, []int{1, 2, 3}, order, "a's taken-back entry first (its counter back at 0), then a and b tied at 5 (b lifted to a's counter as it arrived), a first by eligibility")

	require.NoError(t, q.Reconfigure(Config{MaxWait: time.Minute, Tenants: tenants("b")}))
	_, err = q.TakeBack(r1, got.Place)
	assert.ErrorIs(t, err, ErrUnknownTenant)
	checkInvariants(t, q)
}

func TestReconcileAdjustsCounter(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{Tenants: []TenantConfig{{Name: "a", Weight: 2}}}, clk)
	mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 100})
	next(t, q, always)
	v, _ := q.Counter("a", 0)
	assert.InDelta(t, 50.0, v, 0)
	assert.True(t, q.Reconcile("a", 0, 100, 40))
	v, _ = q.Counter("a", 0)
	assert.InDelta(t, 20.0, v, 0, "refund of 60 at weight 2")
	assert.True(t, q.Reconcile("a", 0, 10, 30))
	v, _ = q.Counter("a", 0)
	assert.InDelta(t, 30.0, v, 0, "overrun of 20 at weight 2")
	st, _ := q.Stats("a")
	assert.Equal(t, int64(60), st.Charged)
	assert.False(t, q.Reconcile("nobody", 0, 1, 2))
	assert.False(t, q.Reconcile("a", 3, 1, 2), "flow never used")
	assert.False(t, q.Reconcile("a", -1, 1, 2))
}

func TestReconfigureKeepsEntries(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{Tenants: tenants("a", "b")}, clk)
	for i := range 3 {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Payload: i, Cost: 10, Deadline: clk.Now().Add(time.Duration(10-i) * time.Second)})
		mustEnqueue(t, q, Request[int]{Tenant: "b", Payload: 10 + i, Cost: 10})
	}

	// Remove b, add c, switch a to EDF with weight 3, lower global depth.
	err := q.Reconfigure(Config{MaxDepth: 2, Tenants: []TenantConfig{{Name: "a", Weight: 3, Order: OrderEDF}, {Name: "c"}}})
	require.NoError(t, err)
	_, err = q.Enqueue(Request[int]{Tenant: "b"})
	require.ErrorIs(t, err, ErrUnknownTenant, "removed tenant refuses new requests")
	_, err = q.Enqueue(Request[int]{Tenant: "c"})
	require.ErrorIs(t, err, ErrFull, "lowered global bound applies to arrivals")
	d, _ := q.Len()
	assert.Equal(t, 6, d, "nothing lost")

	var got []int
	for range 6 {
		got = append(got, next(t, q, always).Payload)
	}
	// a at weight 3 gets three picks per b pick, in EDF order (2, 1, 0).
	assert.Equal(t, []int{2, 10, 1, 0, 11, 12}, got)
	_, ok := q.Stats("b")
	assert.False(t, ok, "removed tenant forgotten once drained")
	assert.False(t, q.Reconcile("b", 0, 10, 5))

	// Re-adding b brings it back fresh.
	require.NoError(t, q.Reconfigure(Config{Tenants: tenants("a", "b", "c")}))
	mustEnqueue(t, q, Request[int]{Tenant: "b"})
	checkInvariants(t, q)

	_, err = q.Prepare(Config{Tenants: []TenantConfig{{Name: ""}}})
	assert.Error(t, err)
}

func TestRemovedTenantWithPendingEntryStays(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{Tenants: tenants("a")}, clk)
	mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 10})
	it, ok := q.Next(always)
	require.True(t, ok)
	require.NoError(t, q.Reconfigure(Config{}))
	st, ok := q.Stats("a")
	require.True(t, ok, "pending entry keeps the tenant")
	assert.True(t, st.Removed)
	require.True(t, q.Requeue(it.Handle))
	q.Unpark("a")
	it2 := next(t, q, always)
	assert.Equal(t, it.Handle, it2.Handle)
	_, ok = q.Stats("a")
	assert.False(t, ok)
}

func TestReadySignals(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{ParkBackoff: -1, Tenants: tenants("a")}, clk)
	drain := func() bool {
		select {
		case <-q.Ready():
			return true
		default:
			return false
		}
	}
	drain() // New signals once
	assert.False(t, drain())
	mustEnqueue(t, q, Request[int]{Tenant: "a"})
	assert.True(t, drain(), "enqueue signals")
	_, ok := q.Next(func(Item[int]) Verdict { return Park })
	assert.False(t, ok)
	mustEnqueue(t, q, Request[int]{Tenant: "a"})
	assert.False(t, drain(), "enqueue to a parked tenant does not signal")
	q.Unpark("a")
	assert.True(t, drain(), "unpark signals")
	_, ok = q.Next(func(Item[int]) Verdict { return Block })
	assert.False(t, ok)
	assert.False(t, drain())
}

// TestRebaseKeepsDifferences: when a band's minimum counter passes the
// rebase threshold, every counter of the band shifts down by the same
// amount, keeping order and differences (and other bands untouched).
func TestRebaseKeepsDifferences(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{Tenants: []TenantConfig{{Name: "a"}, {Name: "b"}, {Name: "c", Band: 1}}}, clk)
	for range 3 {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 10})
		mustEnqueue(t, q, Request[int]{Tenant: "b", Cost: 10})
		mustEnqueue(t, q, Request[int]{Tenant: "c", Cost: 10})
	}
	next(t, q, always) // a: 10
	next(t, q, always) // b: 10
	// Push both far up (as after a very long run), b 500 above a.
	require.True(t, q.Reconcile("a", 0, 0, rebaseAt))
	require.True(t, q.Reconcile("b", 0, 0, rebaseAt+500))
	va, _ := q.Counter("a", 0)
	require.Greater(t, va, float64(rebaseAt))
	it := next(t, q, always) // a is the minimum: dispatch, then rebase
	assert.Equal(t, "a", it.Tenant)
	va, _ = q.Counter("a", 0)
	vb, _ := q.Counter("b", 0)
	vc, _ := q.Counter("c", 1)
	assert.Less(t, vb, float64(rebaseAt), "rebased")
	assert.InDelta(t, 490.0, vb-va, 0, "difference kept")
	assert.InDelta(t, 0.0, vc, 0, "other band untouched")
	checkInvariants(t, q)
	// Order still right: a (lower) goes first, and a newly backlogged flow
	// joins at the rebased minimum.
	assert.Equal(t, "a", next(t, q, always).Tenant)
}

// TestAdaptiveLIFO: a FIFO flow serves its oldest entry until that one has
// waited LIFOAfter; from then on (a standing queue) its newest first, so
// what is served can still start in time; EDF flows keep deadline order.
func TestAdaptiveLIFO(t *testing.T) {
	clk := newManualClock()
	cfg := Config{Tenants: []TenantConfig{{Name: "a"}, {Name: "e", Order: OrderEDF}}, LIFOAfter: time.Second}
	q := newTestQueue(t, cfg, clk)
	for i := 1; i <= 3; i++ {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 1, Payload: i})
		clk.Advance(100 * time.Millisecond)
	}
	it, ok := q.Next(always)
	require.True(t, ok)
	assert.Equal(t, 1, it.Payload, "head waited 300ms: FIFO")
	clk.Advance(time.Second)
	mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 1, Payload: 4})
	mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 1, Payload: 5})
	var got []int
	for range 4 {
		it, ok := q.Next(always)
		require.True(t, ok)
		got = append(got, it.Payload)
	}
	assert.Equal(t, []int{5, 4, 3, 2}, got, "head waited > 1s: newest first")

	for i := 1; i <= 3; i++ {
		mustEnqueue(t, q, Request[int]{Tenant: "e", Cost: 1, Payload: 10 + i, Deadline: clk.Now().Add(time.Duration(4-i) * time.Minute)})
	}
	clk.Advance(5 * time.Second)
	got = got[:0]
	for range 3 {
		it, ok := q.Next(always)
		require.True(t, ok)
		got = append(got, it.Payload)
	}
	assert.Equal(t, []int{13, 12, 11}, got, "EDF ignores LIFOAfter")

	strict := newTestQueue(t, Config{Tenants: tenants("a"), LIFOAfter: -1}, clk)
	for i := 1; i <= 3; i++ {
		mustEnqueue(t, strict, Request[int]{Tenant: "a", Cost: 1, Payload: i})
	}
	clk.Advance(2 * time.Minute)
	it, ok = strict.Next(always)
	require.True(t, ok)
	assert.Equal(t, 1, it.Payload, "negative LIFOAfter: strict FIFO")

	// Newest-first is an opt-in: the default keeps arrival order however
	// long the queue stands, and a tenant may opt in on its own.
	plain := newTestQueue(t, Config{Tenants: []TenantConfig{{Name: "a"}, {Name: "b", LIFOAfter: time.Second}}}, clk)
	for i := 1; i <= 3; i++ {
		mustEnqueue(t, plain, Request[int]{Tenant: "a", Cost: 1, Payload: i})
		mustEnqueue(t, plain, Request[int]{Tenant: "b", Cost: 1, Payload: 10 + i})
	}
	clk.Advance(2 * time.Minute)
	got = got[:0]
	for range 4 {
		it, ok := plain.Next(always)
		require.True(t, ok)
		got = append(got, it.Payload)
	}
	assert.ElementsMatch(t, []int{1, 2, 13, 12}, got, "default FIFO for a; b opted in: newest first")
}

// TestStandingQueueSheds: with ShedAfter set, an entry that has waited
// ShedAfter is shed (reported with ReasonShed and a Retry-After) when
// dispatch reaches it, not served late; younger ones are served newest
// first; nothing younger than ShedAfter is shed.
func TestStandingQueueSheds(t *testing.T) {
	clk := newManualClock()
	var expired []int
	var reasons []Reason
	q, err := New[int](Config{Tenants: tenants("a"), LIFOAfter: time.Second, ShedAfter: 2 * time.Second},
		Deps[int]{Clock: clk, OnExpire: func(it Item[int]) {
			expired = append(expired, it.Payload)
			reasons = append(reasons, it.Reason)
			assert.GreaterOrEqual(t, it.RetryAfter, MinRetryAfter)
		}})
	require.NoError(t, err)
	for i := 1; i <= 6; i++ {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 1, Payload: i})
		clk.Advance(500 * time.Millisecond)
	}
	// Now entry i has waited (7-i)·500 ms: 1 and 2 (3 s, 2.5 s) are past
	// ShedAfter, 3 is exactly at it, 4..6 are younger.
	it, ok := q.Next(always)
	require.True(t, ok)
	assert.Equal(t, 6, it.Payload, "newest first")
	assert.Equal(t, []int{1, 2, 3}, expired, "waited >= 2 s: shed")
	assert.Equal(t, []Reason{ReasonShed, ReasonShed, ReasonShed}, reasons)
	st, _ := q.Stats("a")
	assert.Equal(t, uint64(3), st.Shed)
	assert.Equal(t, uint64(0), st.Expired, "shed is counted apart from deadline expiry")
	assert.Equal(t, 2, st.Depth)
}

// TestNoShedByDefault: without ShedAfter a standing queue keeps every
// entry until its own deadline: an entry with a 30 s max_wait queued
// behind others is still served after 10 s, and when it does expire the
// expiry names the bound that set its deadline. A tenant's own ShedAfter
// turns shedding on for it alone.
func TestNoShedByDefault(t *testing.T) {
	clk := newManualClock()
	var expired []Item[int]
	q, err := New[int](Config{MaxWait: time.Minute, Tenants: []TenantConfig{
		{Name: "a", MaxWait: 30 * time.Second},
		{Name: "s", MaxWait: 30 * time.Second, ShedAfter: 2 * time.Second},
	}}, Deps[int]{Clock: clk, OnExpire: func(it Item[int]) { expired = append(expired, it) }})
	require.NoError(t, err)
	for i := 1; i <= 3; i++ {
		mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 1, Payload: i})
		mustEnqueue(t, q, Request[int]{Tenant: "s", Cost: 1, Payload: 10 + i})
	}
	clk.Advance(10 * time.Second)
	var got []int
	for {
		it, ok := q.Next(always)
		if !ok {
			break
		}
		got = append(got, it.Payload)
	}
	assert.Equal(t, []int{1, 2, 3}, got, "a: served in order after 10 s; s: shed")
	require.Len(t, expired, 3)
	for _, it := range expired {
		assert.Equal(t, "s", it.Tenant)
		assert.Equal(t, ReasonShed, it.Reason)
	}

	expired = expired[:0]
	mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 1, Payload: 4})
	mustEnqueue(t, q, Request[int]{Tenant: "a", Cost: 1, Payload: 5, Deadline: clk.Now().Add(5 * time.Second)})
	clk.Advance(29 * time.Second)
	q.Tick()
	require.Len(t, expired, 1)
	assert.Equal(t, ReasonClientDeadline, expired[0].Reason)
	clk.Advance(time.Second)
	q.Tick()
	require.Len(t, expired, 2)
	assert.Equal(t, ReasonMaxWait, expired[1].Reason, "the tenant's max_wait, at 30 s")
	assert.Equal(t, "max_wait", expired[1].Reason.String())
}

// A Deferred arrival wakes neither the Ready waiter nor the expiry loop;
// Wake signals both only while it is still queued.
func TestDeferredEnqueueWake(t *testing.T) {
	t.Parallel()
	clk := newManualClock()
	q := newTestQueue(t, Config{ParkBackoff: -1, MaxWait: time.Second, Tenants: tenants("a")}, clk)
	drain := func(ch <-chan struct{}) bool {
		select {
		case <-ch:
			return true
		default:
			return false
		}
	}
	drain(q.Ready())
	drain(q.rearm)

	// Dispatched by the caller's own pass: no signal at all.
	it := mustEnqueue(t, q, Request[int]{Tenant: "a", Deferred: true})
	assert.False(t, drain(q.Ready()), "a deferred enqueue does not signal Ready")
	assert.False(t, drain(q.rearm), "nor the expiry loop")
	got := next(t, q, always)
	assert.Equal(t, it.Handle, got.Handle)
	q.Wake(it.Handle)
	assert.False(t, drain(q.Ready()), "dispatched: nothing to wake")
	assert.False(t, drain(q.rearm))
	q.Release(got.Handle)

	// Left queued by the caller's pass: Wake gives both signals, and the
	// entry expires on time.
	var expired []int
	q2, err := New[int](Config{ParkBackoff: -1, MaxWait: time.Second, Tenants: tenants("a")},
		Deps[int]{Clock: clk, OnExpire: func(it Item[int]) { expired = append(expired, it.Payload) }})
	require.NoError(t, err)
	drain(q2.Ready())
	drain(q2.rearm)
	it = mustEnqueue(t, q2, Request[int]{Tenant: "a", Deferred: true, Payload: 7})
	_, ok := q2.Next(func(Item[int]) Verdict { return Block })
	assert.False(t, ok)
	q2.Wake(it.Handle)
	assert.True(t, drain(q2.Ready()), "still queued: Ready signalled")
	assert.True(t, drain(q2.rearm), "and the expiry loop rearmed")
	clk.Advance(time.Second)
	_, ok = q2.Tick()
	assert.False(t, ok)
	assert.Equal(t, []int{7}, expired)

	// A plain enqueue still signals at once.
	mustEnqueue(t, q, Request[int]{Tenant: "a"})
	assert.True(t, drain(q.Ready()))
}
