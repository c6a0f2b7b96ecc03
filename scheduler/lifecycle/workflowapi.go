package lifecycle

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/internal/plainjson"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/policy"
)

// The workflow API's ports (docs/api.md "Workflow envelopes"): POST /v1/workflows
// creates an envelope with explicit limits, capped by the tenant's
// workflow_defaults; GET /v1/workflows/{id} shows its limits, use and
// what remains. The client edge serves both with the tenant's own key.

// CreateWorkflow creates an envelope from the body of POST /v1/workflows
// and returns its view (Workflow's shape); an error is the client's.
func (e *Engine) CreateWorkflow(ctx context.Context, c Caller, body []byte) ([]byte, error) {
	t := c.t
	var in struct {
		MaxCalls        int64  `json:"max_calls"`
		MaxInputTokens  int64  `json:"max_input_tokens"`
		MaxOutputTokens int64  `json:"max_output_tokens"`
		MaxDuration     string `json:"max_duration"`
		MaxUSDMicros    int64  `json:"max_usd_micros"`
		MaxRetries      int64  `json:"max_retries"`
		MaxToolCalls    int64  `json:"max_tool_calls"`
	}
	dec := json.NewDecoder(bytes.NewReader(body))
	dec.DisallowUnknownFields()
	if err := dec.Decode(&in); err != nil {
		return nil, apierr.Invalidf("", "workflow body: %v", err)
	}
	lim := config.WorkflowLimit{MaxCalls: in.MaxCalls, MaxInputTokens: in.MaxInputTokens, MaxOutputTokens: in.MaxOutputTokens,
		MaxUSDMicros: in.MaxUSDMicros, MaxRetries: in.MaxRetries, MaxToolCalls: in.MaxToolCalls}
	if in.MaxDuration != "" {
		d, err := time.ParseDuration(in.MaxDuration)
		if err != nil || d <= 0 {
			return nil, apierr.Invalidf("max_duration", "max_duration must be a positive duration such as 10m")
		}
		lim.MaxDuration = d
	}
	for name, v := range map[string]int64{"max_calls": lim.MaxCalls, "max_input_tokens": lim.MaxInputTokens,
		"max_output_tokens": lim.MaxOutputTokens, "max_usd_micros": lim.MaxUSDMicros, "max_retries": lim.MaxRetries,
		"max_tool_calls": lim.MaxToolCalls} {
		if v < 0 {
			return nil, apierr.Invalidf(name, "%s must be >= 0", name)
		}
	}
	if in.MaxOutputTokens == 0 && t.Cfg.Workflow.MaxOutputTokens == 0 {
		return nil, apierr.Invalidf("max_output_tokens", "max_output_tokens must be > 0")
	}
	wf := e.wfs.create(t.Name, capWorkflowLimits(lim, t.Cfg.Workflow), e.now())
	return e.workflowView(ctx, t, wf)
}

// Workflow is the body of GET /v1/workflows/{id}: the caller's envelope
// with its limits, use and what remains.
func (e *Engine) Workflow(ctx context.Context, c Caller, id string) ([]byte, error) {
	wf := e.wfs.get(c.t.Name, id)
	if wf == nil {
		return nil, fmt.Errorf("workflow %q: %w", id, apierr.ErrNotFound)
	}
	return e.workflowView(ctx, c.t, wf)
}

// workflowView renders an envelope with its ledger usage.
func (e *Engine) workflowView(ctx context.Context, t *policy.Tenant, wf *workflow) ([]byte, error) {
	ctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	u, err := e.led.Snapshot(ctx, t.ScopeKey, e.keyer.Key(ledger.KindWorkflow, t.Name+"\x00"+wf.id))
	if err != nil {
		return nil, err
	}
	used := map[string]int64{
		"calls": u.Reserved[ledger.Requests], "input_tokens": u.Reserved[ledger.InputTokens],
		"output_tokens": u.Reserved[ledger.OutputTokens], "usd_micros": u.Reserved[ledger.USDMicros],
	}
	for _, l := range u.Limits {
		switch l.Limit.Dim {
		case ledger.Requests:
			used["calls"] += l.Committed
		case ledger.InputTokens:
			used["input_tokens"] += l.Committed
		case ledger.OutputTokens:
			used["output_tokens"] += l.Committed
		case ledger.USDMicros:
			used["usd_micros"] += l.Committed
		}
	}
	wf.mu.Lock()
	used["retries"], used["tool_calls"] = wf.retries, wf.toolCalls
	wf.mu.Unlock()
	lim := wf.limits
	limits := map[string]any{"max_calls": lim.MaxCalls, "max_input_tokens": lim.MaxInputTokens, "max_output_tokens": lim.MaxOutputTokens,
		"max_usd_micros": lim.MaxUSDMicros, "max_retries": lim.MaxRetries, "max_tool_calls": lim.MaxToolCalls,
		"max_duration": lim.MaxDuration.String()}
	remaining := map[string]any{}
	for k, l := range map[string]int64{"calls": lim.MaxCalls, "input_tokens": lim.MaxInputTokens, "output_tokens": lim.MaxOutputTokens,
		"usd_micros": lim.MaxUSDMicros, "retries": lim.MaxRetries, "tool_calls": lim.MaxToolCalls} {
		if l > 0 {
			remaining[k] = max(0, l-used[k])
		}
	}
	if lim.MaxDuration > 0 {
		remaining["duration"] = max(0, lim.MaxDuration-e.now().Sub(wf.created)).Round(time.Millisecond).String()
	}
	b, _ := plainjson.Marshal(map[string]any{"id": wf.id, "object": "workflow", "created": wf.created.Unix(),
		"limits": limits, "used": used, "remaining": remaining})
	return b, nil
}
