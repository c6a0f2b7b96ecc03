package lifecycle

import (
	"testing"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// TestLowerCapNeverLowersAClientCap pins the honest output cap: only
// Sluice's own cap is lowered for tenant/key/global budgets, any cap for a
// workflow, never below the floor.
func TestLowerCapNeverLowersAClientCap(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name       string
		clientCap  int
		cap        int
		choices    int
		in         int
		d          ledger.DeniedError
		floor      int64
		wantLower  bool
		wantCap    int
		wantReason string
		wantFits   int64
	}{
		{name: "injected cap lowered to an output budget", cap: 80, choices: 1, in: 10, floor: 16,
			d: ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.OutputTokens, Limit: 100, Committed: 80}, wantLower: true, wantCap: 20, wantReason: "budget", wantFits: 20},
		{name: "tokens budget counts the input, per choice", cap: 80, choices: 2, in: 10, floor: 16,
			d: ledger.DeniedError{Scope: ledger.KindAPIKey, Dim: ledger.Tokens, Limit: 100, Committed: 30}, wantLower: true, wantCap: 30, wantReason: "budget", wantFits: 30},
		{name: "explicit cap is refused, not lowered", clientCap: 3500, cap: 3500, choices: 1, in: 12, floor: 16,
			d: ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.Tokens, Limit: 3000}, wantLower: false, wantCap: 3500, wantFits: 2988},
		{name: "explicit cap lowered to a workflow's remaining output", clientCap: 80, cap: 80, choices: 1, in: 1, floor: 16,
			d: ledger.DeniedError{Scope: ledger.KindWorkflow, Dim: ledger.OutputTokens, Limit: 100, Committed: 80}, wantLower: true, wantCap: 20, wantReason: "workflow", wantFits: 20},
		{name: "never below the floor", cap: 16, choices: 1, in: 4, floor: 16,
			d: ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.Tokens, Limit: 2859, Committed: 2840}, wantLower: false, wantCap: 16, wantFits: 15},
		{name: "nothing left", cap: 80, choices: 1, in: 10, floor: 1,
			d: ledger.DeniedError{Dim: ledger.Tokens, Limit: 100, Committed: 95}, wantLower: false, wantCap: 80, wantFits: 0},
		{name: "not a token budget", cap: 80, choices: 1, in: 10, floor: 1,
			d: ledger.DeniedError{Dim: ledger.Requests, Limit: 1, Committed: 1}, wantLower: false, wantCap: 80, wantFits: -1},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			c := &call{req: &vllm.Request{MaxTokens: tc.clientCap},
				plan: vllm.Plan{Cap: tc.cap, Choices: tc.choices, InputTokens: tc.in, OutputTokens: tc.cap * tc.choices}}
			assert.Equal(t, tc.wantFits, fitsOutput(c, &tc.d), "fits")
			assert.Equal(t, tc.wantLower, lowerCap(c, &tc.d, tc.floor), "lowered")
			assert.Equal(t, tc.wantCap, c.plan.Cap, "cap")
			assert.Equal(t, tc.wantCap*tc.choices, c.plan.OutputTokens, "output reservation")
			assert.Equal(t, tc.wantReason, c.capReason)
		})
	}
}

// A cap Sluice may lower never goes below the client's
// min_tokens (vLLM would refuse with a 400 naming a max_tokens the client
// never sent): the request is refused instead.
func TestLowerCapKeepsMinTokens(t *testing.T) {
	t.Parallel()
	c := &call{req: &vllm.Request{MinTokens: 25}, plan: vllm.Plan{Cap: 80, Choices: 1, InputTokens: 1, OutputTokens: 80}}
	assert.False(t, lowerCap(c, &ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.OutputTokens, Limit: 100, Committed: 80}, 1), "20 < min_tokens 25")
	assert.Equal(t, 80, c.plan.Cap)
	assert.True(t, lowerCap(c, &ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.OutputTokens, Limit: 100, Committed: 70}, 1))
	assert.Equal(t, 30, c.plan.Cap)
}

func TestRefusalDetails(t *testing.T) {
	t.Parallel()
	k := &policy.Key{Name: "ci-bot", Label: "ci-bot"}
	c := &call{key: k, req: &vllm.Request{MaxTokens: 3500}, plan: vllm.Plan{Cap: 3500, Choices: 1, InputTokens: 12}}
	ae := apierr.For(refusal(c, &ledger.DeniedError{Scope: ledger.KindAPIKey, Dim: ledger.Tokens, Limit: 3000}, 16))
	assert.Equal(t, 429, ae.Status)
	assert.Equal(t, "tenant_budget_exceeded", ae.Code)
	assert.Equal(t, "api_key", ae.Details["scope"])
	assert.Equal(t, "ci-bot", ae.Details["key"])
	assert.Equal(t, int64(2988), ae.Details["fits_output_tokens"])
	assert.NotContains(t, ae.Details, "min_output_tokens", "a client cap is refused for its size, not the floor")

	// Sluice's own cap refused below the floor says so; a tenant scope
	// names no key.
	c = &call{key: k, req: &vllm.Request{}, plan: vllm.Plan{Cap: 16, Choices: 1, InputTokens: 4}}
	ae = apierr.For(refusal(c, &ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.Tokens, Limit: 2859, Committed: 2840}, 16))
	assert.Equal(t, int64(15), ae.Details["fits_output_tokens"])
	assert.Equal(t, int64(16), ae.Details["min_output_tokens"])
	assert.NotContains(t, ae.Details, "key")
}
