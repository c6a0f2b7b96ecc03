package scheduler

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/vllm"
)

// Consumer-side compliance checks (HOUSE-STYLE §2).
var (
	_ Ledger   = (*ledger.Memory)(nil)
	_ Upstream = (*vllm.Client)(nil)
)

func TestStatusFor(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name    string
		err     error
		status  int
		code    string
		retry   bool
		noRetry bool
	}{
		{"unauthorized", ErrUnauthorized, 401, "invalid_api_key", false, false},
		{"too large", ErrTooLarge, 413, "request_too_large", false, false},
		{"bad header", invalidf("X-Request-Timeout", "bad"), 400, "invalid_request", false, false},
		{"bad body", &vllm.InvalidRequestError{Param: "messages", Reason: "x"}, 400, "invalid_request", false, false},
		{"unknown model", fmt.Errorf("m: %w", ErrUnknownModel), 404, "model_not_found", false, false},
		{"model not served", &modelError{model: "x"}, 404, "model_not_found", false, false},
		{"context length", vllm.ErrContextLength, 400, "context_length_exceeded", false, false},
		{"queue full", &queue.FullError{Tenant: "a", Bound: queue.BoundTenantDepth, RetryAfter: 3 * time.Second}, 429, "queue_full", true, false},
		{"budget", &ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.Tokens, Window: time.Hour, RetryAfter: time.Minute}, 429, "tenant_budget_exceeded", true, true},
		{"workflow budget", &ledger.DeniedError{Scope: ledger.KindWorkflow, Dim: ledger.Requests, Window: workflowLife}, 429, "workflow_budget_exceeded", true, true},
		{"workflow local", &workflowError{dim: "retries", limit: 1, used: 1}, 429, "workflow_budget_exceeded", false, true},
		{"queue deadline", queue.ErrExpired, 504, "deadline_exceeded", false, false},
		{"client deadline", ErrDeadline, 504, "deadline_exceeded", false, false},
		{"store timeout is not a deadline", fmt.Errorf("%w: %w", ledger.ErrAmbiguous, context.DeadlineExceeded), 503, "ledger_unavailable", true, false},
		{"store down", ledger.ErrUnavailable, 503, "ledger_unavailable", true, false},
		{"store recovering", ledger.ErrRecovering, 503, "ledger_unavailable", true, false},
		{"corrupt", ledger.ErrCorrupt, 500, "ledger_error", false, false},
		{"policy", ledger.ErrPolicy, 500, "ledger_error", false, false},
		{"no replica", ErrNoReplica, 503, "no_healthy_replica", true, false},
		{"draining", ErrDraining, 503, "draining", true, false},
		{"idempotent in flight", ErrInProgress, 409, "idempotency_conflict", false, true},
		{"clamped", ErrClamped, 403, "tenant_clamped", false, true},
		{"upstream 500", &vllm.UpstreamError{Status: 500}, 502, "upstream_error", false, false},
		{"upstream 400 passes", &vllm.UpstreamError{Status: 400, Param: "input_tokens"}, 400, "context_length_exceeded", false, false},
		{"stream cut", vllm.ErrStreamCut, 502, "upstream_error", false, false},
		{"client gone", ErrClientGone, 499, "client_cancelled", false, false},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			ae := statusFor(tc.err)
			assert.Equal(t, tc.status, ae.Status)
			assert.Equal(t, tc.code, ae.Code)
			assert.Equal(t, tc.retry, ae.RetryAfter > 0, "Retry-After")
			assert.Equal(t, tc.noRetry, ae.NoRetry, "x-should-retry: false")
		})
	}
}

// fixedCapacity sizes every replica the same.
func fixedCapacity(k map[string]int64) fleet.CapacityFunc {
	return func(name string) (int64, int64, gpu.State) {
		if v, ok := k[name]; ok {
			return v, v, gpu.StateHealthy
		}
		return 0, 0, gpu.StateDown
	}
}

func TestWorkflowLocalLimits(t *testing.T) {
	t.Parallel()
	now := time.Unix(0, 0)
	wf := &workflow{limits: config.WorkflowLimit{MaxRetries: 1, MaxToolCalls: 2, MaxDuration: 10 * time.Second}, created: now}
	left, err := wf.admitCall(now.Add(time.Second), true)
	require.NoError(t, err)
	assert.Equal(t, 10*time.Second-time.Second-completionHeadroom, left)
	_, err = wf.admitCall(now.Add(time.Second), true)
	var we *workflowError
	require.ErrorAs(t, err, &we)
	assert.Equal(t, "retries", we.dim)
	wf.countToolCalls(toolCallsIn([]byte(`{"tool_calls":[{"index":0,"id":"c1","type":"function","function":{"name":"f"}},{"index":1,"id":"c2","type":"function"}]}`)))
	_, err = wf.admitCall(now.Add(time.Second), false)
	require.ErrorAs(t, err, &we)
	assert.Equal(t, "tool_calls", we.dim)
	assert.Zero(t, toolCallsIn([]byte(`{"choices":[{"delta":{"content":"\"type\":\"function\""}}]}`)), "no tool_calls member")

	short := &workflow{limits: config.WorkflowLimit{MaxDuration: 2 * time.Second}, created: now}
	_, err = short.admitCall(now.Add(1200*time.Millisecond), false)
	require.ErrorAs(t, err, &we)
	assert.Equal(t, "duration", we.dim, "less than a useful attempt left")
}

func TestCapWorkflowLimits(t *testing.T) {
	t.Parallel()
	ceiling := config.WorkflowLimit{MaxCalls: 10, MaxOutputTokens: 1000, MaxDuration: time.Hour}
	got := capWorkflowLimits(config.WorkflowLimit{MaxCalls: 50, MaxOutputTokens: 100, MaxRetries: 3}, ceiling)
	assert.Equal(t, config.WorkflowLimit{MaxCalls: 10, MaxOutputTokens: 100, MaxRetries: 3, MaxDuration: time.Hour}, got)
}

var _ ReservationLister = (*ledger.Memory)(nil)
