package lifecycle

import (
	"fmt"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm"
)

// Consumer-side compliance checks (HOUSE-STYLE §2).
var (
	_ Ledger   = (*ledger.Memory)(nil)
	_ Upstream = (*vllm.Client)(nil)
)

// TestRefusersOwnTheirAnswer: the pipeline's errors that carry numbers
// build their own refusal (apierr.Refuser), which apierr.For answers with
// ahead of the sentinels they match.
func TestRefusersOwnTheirAnswer(t *testing.T) {
	t.Parallel()
	ae := apierr.For(fmt.Errorf("routing: %w", &modelError{model: "x"}))
	assert.Equal(t, 404, ae.Status)
	assert.Equal(t, "model_not_found", ae.Code)
	assert.Equal(t, "The model `x` does not exist or you do not have access to it.", ae.Message)

	ae = apierr.For(&workflowError{dim: "retries", limit: 1, used: 1})
	assert.Equal(t, 429, ae.Status)
	assert.Equal(t, "workflow_budget_exceeded", ae.Code)
	assert.True(t, ae.NoRetry)
	assert.Equal(t, map[string]any{"scope": "workflow", "dimension": "retries", "limit": int64(1), "used": int64(1)}, ae.Details)

	ae = apierr.For(errIdemConflict)
	assert.Equal(t, 409, ae.Status)
	assert.Equal(t, map[string]any{"state": idemConflict}, ae.Details)
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
