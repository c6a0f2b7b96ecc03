package apierr

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/vllm"
)

// TestFor: the one error→status map, for the sentinels and the errors of
// the leaves (the pipeline's own Refusers: scheduler's tests).
func TestFor(t *testing.T) {
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
		{"bad header", Invalidf("X-Request-Timeout", "bad"), 400, "invalid_request", false, false},
		{"bad body", &vllm.InvalidRequestError{Param: "messages", Reason: "x"}, 400, "invalid_request", false, false},
		{"unknown model", fmt.Errorf("m: %w", ErrUnknownModel), 404, "model_not_found", false, false},
		{"context length", vllm.ErrContextLength, 400, "context_length_exceeded", false, false},
		{"queue full", &queue.FullError{Tenant: "a", Bound: queue.BoundTenantDepth, RetryAfter: 3 * time.Second}, 429, "queue_full", true, false},
		{"budget", &ledger.DeniedError{Scope: ledger.KindTenant, Dim: ledger.Tokens, Window: time.Hour, RetryAfter: time.Minute}, 429, "tenant_budget_exceeded", true, true},
		{"workflow budget", &ledger.DeniedError{Scope: ledger.KindWorkflow, Dim: ledger.Requests, Window: 24 * time.Hour}, 429, "workflow_budget_exceeded", true, true},
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
			ae := For(tc.err)
			assert.Equal(t, tc.status, ae.Status)
			assert.Equal(t, tc.code, ae.Code)
			assert.Equal(t, tc.retry, ae.RetryAfter > 0, "Retry-After")
			assert.Equal(t, tc.noRetry, ae.NoRetry, "x-should-retry: false")
		})
	}
}

// TestMidStreamIsNeverARefusal: after the 200 headers a failure is the
// replica's work cut (502) whatever its cause, except the deadline, the
// drain and the client leaving, which keep their own codes.
func TestMidStreamIsNeverARefusal(t *testing.T) {
	t.Parallel()
	assert.Equal(t, 502, For(MidStream(Invalidf("x", "bad"))).Status)
	assert.Equal(t, 502, For(MidStream(ErrTooLarge)).Status)
	assert.Equal(t, "deadline_exceeded", For(MidStream(queue.ErrExpired)).Code)
	assert.Equal(t, "draining", For(MidStream(ErrDraining)).Code)
	assert.Equal(t, 499, For(MidStream(ErrClientStalled)).Status)
	assert.True(t, IsMidStream(fmt.Errorf("pump: %w", MidStream(ErrNoReplica))))
	assert.False(t, IsMidStream(ErrNoReplica))
}
