package lifecycle

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
	"github.com/sluicehq/sluice/vllm"
)

// countingUpstream counts /tokenize calls, which always fail here (the
// documented fallback: the bytes bound decides).
type countingUpstream struct {
	lifecycletest.Upstream
	tokenizes atomic.Int64
}

func (u *countingUpstream) Tokenize(ctx context.Context, url, model string, r *vllm.Request) ([]int, int, error) {
	u.tokenizes.Add(1)
	return u.Upstream.Tokenize(ctx, url, model, r)
}

// A token budget that refuses a hold sized on the bytes bound asks for an
// exact count only when one could change its answer; when the count fails
// its advice says the input is an upper bound.
func TestTokenBudgetAsksForACountOnlyWhenItCouldHelp(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	up := &countingUpstream{Upstream: lifecycletest.Upstream{Out: 1}}
	s := newTestEngine(t, lifecycletest.Config(t, "", "    budgets: [{dimension: tokens, limit: 100, window: 1h}]\n"), led, up)
	s.reps.List()[0].Obs.Store(&fleet.Obs{OK: true}) // scraped: asked to count
	ctx := context.Background()

	// The output alone is more than the budget: no count can help.
	_, err := serve(ctx, s, admission{body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":150}`)})
	require.Equal(t, 429, apierr.For(err).Status)
	assert.Zero(t, up.tokenizes.Load(), "an exhausted budget costs the replicas nothing")

	// A long message whose bound is over the budget may fit exactly.
	long := strings.Repeat("a", 300)
	_, err = serve(ctx, s, admission{body: []byte(`{"model":"m","messages":[{"role":"user","content":"` + long + `"}],"max_tokens":8}`)})
	ae := apierr.For(err)
	require.Equal(t, 429, ae.Status)
	assert.Equal(t, int64(1), up.tokenizes.Load(), "counted once before refusing")
	assert.Equal(t, int64(0), ae.Details["fits_output_tokens"])
	assert.Contains(t, ae.Message, "an upper bound) leaves no room for output: retry after the window resets")
	assert.NotContains(t, ae.Message, "lower max_tokens")
}
