package lifecycle

import (
	"context"
	"sync"
	"testing"
	"testing/synctest"
	"time"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// An Idempotency-Key names the client's request, not the holds Sluice
// sized for it: a retry of the same body after a reload that changes its
// holds is the same request (in flight, then its original response), and
// another body under the key is a conflict even when its holds are equal.

// chatWith is chatBody with another message text.
func chatWith(text string) []byte {
	return []byte(`{"model":"m","messages":[{"role":"user","content":"` + text + `"}],"max_tokens":8}`)
}

func TestIdempotencyOtherBodyWithEqualHoldsConflicts(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 2, Gate: make(chan struct{})}
		store := &memResponses{m: map[string][]byte{}}
		withStore := func(d *testDeps) { d.Responses = store }
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up, withStore)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		a, b := chatWith("hi"), chatWith("ho") // same length: the same bytes bound and holds

		first := make(chan error, 1)
		go func() { _, err := serve(ctx, s, admission{body: a, idemKey: "k"}); first <- err }()
		synctest.Wait()
		_, err := serve(ctx, s, admission{body: b, idemKey: "k"})
		ae := apierr.For(err)
		assert.Equal(t, 409, ae.Status)
		assert.Equal(t, map[string]any{"state": "conflict"}, ae.Details, "in flight: another body is a conflict")

		close(up.Gate)
		require.NoError(t, <-first)
		_, err = serve(ctx, s, admission{body: b, idemKey: "k"})
		ae = apierr.For(err)
		assert.Equal(t, 409, ae.Status, "completed: never the first body's response")
		assert.Equal(t, map[string]any{"state": "conflict"}, ae.Details)

		// Another instance of the fleet (only the shared store has it).
		other := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up, withStore)
		_, err = serve(ctx, other, admission{body: b, idemKey: "k"})
		assert.Equal(t, map[string]any{"state": "conflict"}, apierr.For(err).Details)
		other = newTestEngine(t, lifecycletest.Config(t, "", ""), led, up, withStore)
		_, err = serve(ctx, other, admission{body: a, idemKey: "k"})
		var replay *cachedResponse
		require.ErrorAs(t, err, &replay, "the first body still gets its response")
		assert.Equal(t, int64(1), up.Runs.Load())
	})
}

// memResponses is an in-memory ResponseStore.
type memResponses struct {
	mu sync.Mutex
	m  map[string][]byte
}

func (r *memResponses) Put(_ context.Context, name string, data []byte, _ time.Duration) error {
	r.mu.Lock()
	defer r.mu.Unlock()
	r.m[name] = append([]byte(nil), data...)
	return nil
}

func (r *memResponses) Get(_ context.Context, name string) ([]byte, bool, error) {
	r.mu.Lock()
	defer r.mu.Unlock()
	v, ok := r.m[name]
	return v, ok, nil
}

func TestIdempotencySameBodyAfterReloadIsTheSameRequest(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 2, Gate: make(chan struct{})}
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		first := make(chan error, 1)
		var firstBody []byte
		go func() {
			var err error
			firstBody, err = serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
			first <- err
		}()
		synctest.Wait()

		// The tenant's output cap drops below the request's max_tokens:
		// the same request is now held at 4 output tokens, not 8.
		reloadPolicy(t, s, lifecycletest.Config(t, "", "    max_output_tokens: 4\n"))
		_, err := serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
		ae := apierr.For(err)
		assert.Equal(t, 409, ae.Status)
		assert.Equal(t, map[string]any{"state": "in_flight"}, ae.Details, "the same request, still running: not a different request")

		close(up.Gate)
		require.NoError(t, <-first)
		_, err = serve(ctx, s, admission{body: lifecycletest.ChatBody(""), idemKey: "k"})
		var replay *cachedResponse
		require.ErrorAs(t, err, &replay, "completed: its original response")
		assert.Equal(t, firstBody, replay.body)
		assert.Equal(t, int64(1), up.Runs.Load(), "never executed twice")
	})
}
