package lifecycle

import (
	"bytes"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/config"
)

// Workflow envelopes (X-Workflow-Id) bound a whole agent run across calls.
// Calls, input and output tokens and spend are ledger limits of the
// workflow scope, so they hold across instances sharing a Redis ledger.
// Duration, retries and tool calls are counted by the instance that serves
// the workflow (explicit workflows live on the instance that created them;
// implicit ones start from the tenant's workflow_defaults wherever they are
// first seen).

// workflowLife is the ledger window of envelope limits: the longest window
// the ledger allows, so envelope counters never roll over while it lives.
const workflowLife = 31 * 24 * time.Hour

// minUsefulAttempt: a workflow call whose remaining time is below this is
// refused rather than started.
const minUsefulAttempt = time.Second

// completionHeadroom is kept back from a workflow's remaining time so the
// last call can finish and settle inside the envelope.
const completionHeadroom = 500 * time.Millisecond

// ErrWorkflow classifies envelope refusals (429 workflow_budget_exceeded).
var ErrWorkflow = errors.New("workflow budget exceeded")

// workflowError names the exhausted envelope dimension.
type workflowError struct {
	dim   string
	limit int64
	used  int64
}

func (e *workflowError) Error() string {
	return fmt.Sprintf("workflow %s exhausted: %d of %d used", e.dim, e.used, e.limit)
}
func (e *workflowError) Is(target error) bool { return target == ErrWorkflow }

func (e *workflowError) APIError() *apierr.Error {
	return &apierr.Error{Status: 429, Code: "workflow_budget_exceeded", Type: "rate_limit_error", Message: e.Error(), NoRetry: true,
		Details: map[string]any{"scope": "workflow", "dimension": e.dim, "limit": e.limit, "used": e.used}}
}

// workflow is one envelope's local state.
type workflow struct {
	id      string
	tenant  string
	limits  config.WorkflowLimit
	created time.Time

	mu        sync.Mutex // guards retries, toolCalls
	retries   int64
	toolCalls int64
}

// workflows holds the envelopes this instance knows, dropped once their
// duration (or a day when unbounded) has passed.
type workflows struct {
	mu sync.Mutex
	m  map[string]*workflow // by tenant + "\x00" + id
}

func (w *workflows) get(tenant, id string) *workflow {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.m[tenant+"\x00"+id]
}

// getOrCreate returns the envelope, creating it from defaults on first use;
// ok is false when the tenant has no defaults and the id is unknown.
func (w *workflows) getOrCreate(tenant, id string, defaults config.WorkflowLimit, now time.Time) (*workflow, bool) {
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expireLocked(now)
	if wf := w.m[tenant+"\x00"+id]; wf != nil {
		return wf, true
	}
	if defaults == (config.WorkflowLimit{}) {
		return nil, false
	}
	wf := &workflow{id: id, tenant: tenant, limits: defaults, created: now}
	w.m[tenant+"\x00"+id] = wf
	return wf, true
}

func (w *workflows) create(tenant string, limits config.WorkflowLimit, now time.Time) *workflow {
	var b [12]byte
	_, _ = rand.Read(b[:])
	wf := &workflow{id: "wf_" + hex.EncodeToString(b[:]), tenant: tenant, limits: limits, created: now}
	w.mu.Lock()
	defer w.mu.Unlock()
	w.expireLocked(now)
	w.m[tenant+"\x00"+wf.id] = wf
	return wf
}

func (w *workflows) expireLocked(now time.Time) {
	for k, wf := range w.m {
		life := wf.limits.MaxDuration
		if life <= 0 {
			life = 24 * time.Hour
		}
		if now.Sub(wf.created) > life+time.Hour {
			delete(w.m, k)
		}
	}
}

// scope is the envelope's ledger scope (lifetime limits).
func (wf *workflow) scope(key ledger.ScopeKey) (ledger.Scope, bool) {
	var lim []ledger.Limit
	add := func(d ledger.Dim, v int64) {
		if v > 0 {
			lim = append(lim, ledger.Limit{Dim: d, Window: workflowLife, Max: v})
		}
	}
	add(ledger.Requests, wf.limits.MaxCalls)
	add(ledger.InputTokens, wf.limits.MaxInputTokens)
	add(ledger.OutputTokens, wf.limits.MaxOutputTokens)
	add(ledger.USDMicros, wf.limits.MaxUSDMicros)
	if len(lim) == 0 {
		// Duration/retry/tool-only envelopes still get a ledger scope so
		// their calls are counted: an effectively unbounded call limit.
		lim = append(lim, ledger.Limit{Dim: ledger.Requests, Window: workflowLife, Max: 1 << 50})
	}
	return ledger.Scope{Kind: ledger.KindWorkflow, Key: key, Limits: lim}, true
}

// admitCall checks the envelope's local limits for one call and returns
// the time the call may take (0: unbounded). retry marks a retried call.
func (wf *workflow) admitCall(now time.Time, retry bool) (time.Duration, error) {
	wf.mu.Lock()
	defer wf.mu.Unlock()
	if l := wf.limits.MaxToolCalls; l > 0 && wf.toolCalls >= l {
		return 0, &workflowError{dim: "tool_calls", limit: l, used: wf.toolCalls}
	}
	if retry {
		if l := wf.limits.MaxRetries; l > 0 && wf.retries >= l {
			return 0, &workflowError{dim: "retries", limit: l, used: wf.retries}
		}
		wf.retries++
	}
	if d := wf.limits.MaxDuration; d > 0 {
		left := d - now.Sub(wf.created) - completionHeadroom
		if left < minUsefulAttempt {
			return 0, &workflowError{dim: "duration", limit: d.Milliseconds(), used: now.Sub(wf.created).Milliseconds()}
		}
		return left, nil
	}
	return 0, nil
}

// countToolCalls adds the tool calls a response carried.
func (wf *workflow) countToolCalls(n int64) {
	if n <= 0 {
		return
	}
	wf.mu.Lock()
	wf.toolCalls += n
	wf.mu.Unlock()
}

// toolCallsIn counts tool calls started in a chat response or chunk: each
// call's first fragment carries its "id" next to "type":"function".
func toolCallsIn(b []byte) int64 {
	if !bytes.Contains(b, []byte(`"tool_calls"`)) {
		return 0
	}
	return int64(bytes.Count(b, []byte(`"type":"function"`)))
}

// capWorkflowLimits caps requested envelope limits by the tenant's
// workflow_defaults (a zero default leaves that limit as requested).
func capWorkflowLimits(in, ceiling config.WorkflowLimit) config.WorkflowLimit {
	c := func(v, m int64) int64 {
		if m > 0 && (v <= 0 || v > m) {
			return m
		}
		return v
	}
	out := config.WorkflowLimit{
		MaxCalls: c(in.MaxCalls, ceiling.MaxCalls), MaxInputTokens: c(in.MaxInputTokens, ceiling.MaxInputTokens),
		MaxOutputTokens: c(in.MaxOutputTokens, ceiling.MaxOutputTokens), MaxUSDMicros: c(in.MaxUSDMicros, ceiling.MaxUSDMicros),
		MaxRetries: c(in.MaxRetries, ceiling.MaxRetries), MaxToolCalls: c(in.MaxToolCalls, ceiling.MaxToolCalls),
		MaxDuration: in.MaxDuration,
	}
	if ceiling.MaxDuration > 0 && (out.MaxDuration <= 0 || out.MaxDuration > ceiling.MaxDuration) {
		out.MaxDuration = ceiling.MaxDuration
	}
	return out
}
