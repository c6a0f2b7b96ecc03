package lifecycle

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"testing/synctest"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/lifecycle/lifecycletest"
)

// Ledger holds are a request's worst case; replica room and the fair-share
// cost are what it is expected to use: input + min(cap,
// server.expected_output_tokens) per choice.

func TestHoldIsTheCapRoomAndCostAreExpected(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, lifecycletest.Config(t, "server: {expected_output_tokens: 100, hold_prediction: {enabled: false}}\n", ""), led, &lifecycletest.Upstream{Out: 1})
	pol := s.pol.Load()
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		body     string
		wantOut  int64 // expected output over all choices
		wantHold int64 // output held
	}{
		{"cap above the expectation", `,"max_tokens":2000`, 100, 2000},
		{"cap below it", `,"max_tokens":40`, 40, 40},
		{"n multiplies", `,"max_tokens":2000,"n":3`, 300, 6000},
		{"ignore_eos runs to the cap", `,"max_tokens":2000,"ignore_eos":true`, 2000, 2000},
		{"min_tokens raises it", `,"max_tokens":2000,"min_tokens":500`, 500, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]` + tc.body + `}`)
			c, err := s.admit(ctx, pol.Tenants["acme"], pol, admission{ep: 1, body: body, reqID: tc.name})
			require.NoError(t, err)
			defer func() { s.release(c); s.forget(c) }()
			in := int64(c.plan.InputTokens)
			assert.Equal(t, tc.wantHold, c.held[ledger.OutputTokens], "the hold is the worst case")
			assert.Equal(t, in+tc.wantHold, c.held[ledger.Tokens])
			assert.Equal(t, in+tc.wantOut, c.size, "replica room: the expected use")
			assert.Equal(t, in+2*tc.wantOut, c.cost, "fair-share cost: w_in·in + w_out·expected")
		})
	}
}

// With hold_prediction (the default) the hold is the prediction where the
// cap allows more, and replica room and cost are sized on the same.
func TestHoldRoomAndCostArePredicted(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, lifecycletest.Config(t, "server: {hold_prediction: {floor_tokens: 100, step_tokens: 128}}\n", ""), led, &lifecycletest.Upstream{Out: 1})
	pol := s.pol.Load()
	ctx := context.Background()
	for _, tc := range []struct {
		name     string
		body     string
		wantOut  int64 // expected output over all choices
		wantHold int64 // output held
	}{
		{"cap above the prediction", `,"max_tokens":2000`, 100, 100},
		{"cap below it", `,"max_tokens":40`, 40, 40},
		{"n multiplies", `,"max_tokens":2000,"n":3`, 300, 300},
		{"ignore_eos: room for the cap, hold the prediction", `,"max_tokens":2000,"ignore_eos":true`, 2000, 100},
		{"min_tokens raises it", `,"max_tokens":2000,"min_tokens":500`, 500, 500},
		{"tools: the worst case", `,"max_tokens":2000,"tools":[{"type":"function","function":{"name":"f","parameters":{}}}]`, 100, 2000},
	} {
		t.Run(tc.name, func(t *testing.T) {
			body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]` + tc.body + `}`)
			c, err := s.admit(ctx, pol.Tenants["acme"], pol, admission{ep: 1, body: body, reqID: tc.name})
			require.NoError(t, err)
			defer func() { s.release(c); s.forget(c) }()
			in := int64(c.plan.InputTokens)
			assert.Equal(t, tc.wantHold, c.held[ledger.OutputTokens], "the hold")
			assert.Equal(t, in+tc.wantHold, c.held[ledger.Tokens])
			assert.Equal(t, in+tc.wantOut, c.size, "replica room: the prediction")
			assert.Equal(t, in+2*tc.wantOut, c.cost, "fair-share cost: w_in·in + w_out·predicted")
		})
	}
	// What the tenant's requests produced raises the prediction to its
	// percentile (0.95 of 20 outputs: the 19th smallest).
	for i := range 20 {
		localOf(s.pol.Load().Tenants["acme"]).pred.observe("m", int64(100+10*i), 64)
	}
	c, err := s.admit(ctx, pol.Tenants["acme"], pol, admission{ep: 1, body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4000}`), reqID: "learned"})
	require.NoError(t, err)
	defer func() { s.release(c); s.forget(c) }()
	assert.Equal(t, int64(280), c.held[ledger.OutputTokens], "the 95th percentile of 100..290")
}

// A request whose hold is more than any replica's KV capacity is admitted
// when its expected use fits: vLLM admits by the KV a request holds.
func TestHoldOverCapacityIsAdmittedWhenExpectedFits(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	up := &lifecycletest.Upstream{Out: 3}
	s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
	s.reps.Capacity = lifecycletest.FixedCapacity(map[string]int64{"r0": 1000})
	ctx, cancel := context.WithCancel(context.Background())
	defer cancel()
	go s.dispatchLoop(ctx)
	_, err := serve(ctx, s, admission{body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4000}`)})
	require.NoError(t, err, "hold 4000+ over a capacity of 1000, expected 256+ under it")
	assert.Equal(t, int64(1), up.Runs.Load())

	// Expected use over every replica's capacity is still refused.
	_, err = serve(ctx, s, admission{body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4000,"ignore_eos":true}`)})
	assert.Equal(t, 400, apierr.For(err).Status)
}

// Two requests whose caps together exceed a replica's room, but whose
// expected use fits, run side by side.
func TestRoomIsSizedOnExpectedUse(t *testing.T) {
	synctest.Test(t, func(t *testing.T) {
		led := lifecycletest.NewLedger(t)
		up := &lifecycletest.Upstream{Out: 2, Gate: make(chan struct{})}
		s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, up)
		s.reps.Capacity = lifecycletest.FixedCapacity(map[string]int64{"r0": 2000})
		ctx, cancel := context.WithCancel(context.Background())
		defer cancel()
		go s.dispatchLoop(ctx)
		var wg sync.WaitGroup
		errs := make([]error, 2)
		for i := range 2 {
			wg.Go(func() {
				_, errs[i] = serve(ctx, s, admission{body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":1024}`), reqID: fmt.Sprint("r", i)})
			})
		}
		synctest.Wait()
		assert.Equal(t, int64(2), up.Runs.Load(), "both dispatched: 2 × (in + 256) fit 2000, 2 × (in + 1024) would not")
		close(up.Gate)
		wg.Wait()
		require.NoError(t, errs[0])
		require.NoError(t, errs[1])
	})
}

// Without a tenant max_output_tokens, the abuse detector's "at the cap" is
// a client cap that fills the model's context, never every request.
func TestAtCapWithoutATenantCap(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, lifecycletest.Config(t, "", ""), led, &lifecycletest.Upstream{Out: 1})
	s.reps.List()[0].MaxModelLen.Store(4096)
	pol := s.pol.Load()
	require.Zero(t, pol.Tenants["acme"].Cfg.MaxOutputTokens, "unset: none")
	ctx := context.Background()
	for _, tc := range []struct {
		body string
		want bool
	}{
		{`,"max_tokens":8`, false},
		{`,"max_tokens":4090`, true},
	} {
		body := []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}]` + tc.body + `}`)
		c, err := s.admit(ctx, pol.Tenants["acme"], pol, admission{ep: 1, body: body, reqID: "r"})
		if err != nil {
			// A cap over the context on the bytes bound is counted; the
			// fake cannot, so the bound's answer stands.
			require.NoError(t, err)
		}
		assert.Equal(t, tc.want, s.atCap(c), tc.body)
		s.release(c)
		s.forget(c)
	}
}

// A request no replica can run is refused as invalid before any budget.
func TestOverCapacityIsInvalidBeforeTheBudget(t *testing.T) {
	led := lifecycletest.NewLedger(t)
	s := newTestEngine(t, lifecycletest.Config(t, "", "    budgets: [{dimension: tokens, limit: 100, window: 1h}]\n"), led, &lifecycletest.Upstream{Out: 1})
	s.reps.Capacity = lifecycletest.FixedCapacity(map[string]int64{"r0": 1000})
	_, err := serve(context.Background(), s, admission{body: []byte(`{"model":"m","messages":[{"role":"user","content":"hi"}],"max_tokens":4000,"ignore_eos":true}`)})
	ae := apierr.For(err)
	assert.Equal(t, 400, ae.Status)
	assert.Equal(t, "context_length_exceeded", ae.Code)
	assert.Zero(t, led.N("reserve"), "the ledger is never asked")
}
