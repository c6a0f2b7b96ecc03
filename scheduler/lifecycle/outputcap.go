package lifecycle

import (
	"fmt"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
)

// The honest output cap (docs/api.md "Output caps"): a max_tokens or
// max_completion_tokens the client chose is never lowered to fit a
// tenant, key or global budget; the request is refused with 429 and
// details.fits_output_tokens. Sluice lowers only the cap it injected
// itself, or any cap to a workflow envelope's remaining output, never
// below server.min_output_tokens, and says so in X-Sluice-Output-Cap.

// budgetDeniedError is a budget refusal with what the client needs beyond
// the ledger's denial: which key refused, and how many output tokens per
// choice would have fit.
type budgetDeniedError struct {
	d     *ledger.DeniedError
	key   string // label of the key, when the api_key scope refused
	fits  int64  // output tokens per choice that fit; -1 when not a token budget
	floor int64  // server.min_output_tokens, when fits is below it
	input int64  // the request's input tokens
	bound string // ", an upper bound" when input is not an exact count
}

func (e *budgetDeniedError) Error() string { return e.d.Error() }
func (e *budgetDeniedError) Unwrap() error { return e.d }

func (e *budgetDeniedError) APIError() *apierr.Error {
	ae := apierr.Denied(e.d)
	if e.key != "" {
		ae.Details["key"] = e.key
	}
	if e.fits >= 0 {
		ae.Details["fits_output_tokens"] = e.fits
		switch {
		case e.fits == 0:
			// No max_tokens can help: only the window's reset can.
			if e.floor > 0 {
				ae.Details["min_output_tokens"] = e.floor
			}
			if e.d.Dim == ledger.Tokens {
				ae.Message += fmt.Sprintf("; the input alone (%d tokens%s) leaves no room for output: retry after the window resets", e.input, e.bound)
			} else {
				ae.Message += "; no output tokens are left: retry after the window resets"
			}
		case e.floor > 0:
			ae.Details["min_output_tokens"] = e.floor
			ae.Message += fmt.Sprintf("; %d output tokens would fit, below the server's minimum of %d", e.fits, e.floor)
		default:
			ae.Message += fmt.Sprintf("; %d output tokens would fit: lower max_tokens to retry", e.fits)
		}
	}
	return ae
}

// refusal wraps a reserve denial for the edge.
func refusal(c *call, d *ledger.DeniedError, floor int64) error {
	e := &budgetDeniedError{d: d, fits: fitsOutput(c, d), input: int64(c.plan.InputTokens)}
	if c.req != nil && !c.req.InputExact {
		e.bound = ", an upper bound"
	}
	if d.Scope == ledger.KindAPIKey && c.key != nil {
		e.key = c.key.Label
	}
	if e.fits >= 0 && e.fits < floor && (c.req == nil || c.req.MaxTokens == 0 || d.Scope == ledger.KindWorkflow) {
		e.floor = floor // Sluice could have lowered the cap, but not this far
	}
	return e
}

// fitsOutput is the output tokens per choice that a token budget denial
// leaves room for (0 when none); -1 when the denial is not on tokens.
func fitsOutput(c *call, d *ledger.DeniedError) int64 {
	if d.Dim != ledger.Tokens && d.Dim != ledger.OutputTokens {
		return -1
	}
	free := d.Limit - d.Committed - d.Reserved
	if d.Dim == ledger.Tokens {
		free -= int64(c.plan.InputTokens)
	}
	return max(0, free/int64(max(1, c.plan.Choices)))
}

// outputCapReason is why the cap sent upstream is below what the client
// asked for (or, without a client cap, why Sluice lowered its own to fit a
// budget), for X-Sluice-Output-Cap: budget or workflow (lowered at
// admission), tenant (the tenant's max_output_tokens or a clamp),
// model_len (the model's remaining context); "" when it is not.
func outputCapReason(c *call) string {
	reason := c.capReason
	if reason == "" && c.req != nil && c.req.MaxTokens > 0 && c.plan.Cap < c.req.MaxTokens {
		reason = "model_len"
		if int64(c.plan.Cap) == c.t.Cfg.MaxOutputTokens {
			reason = "tenant"
		}
	}
	return reason
}

// countKey counts an admission decision for the call's key.
func (e *Engine) countKey(c *call, result string) {
	if c.key == nil {
		return
	}
	if result != "admitted" {
		e.m.APIKeyAdmissions.WithLabelValues(c.t.Name, c.key.MetricLabel(), result).Inc()
		return
	}
	// Every admitted request counts: look its series up once per key.
	ctr := c.key.Admitted.Load()
	if ctr == nil {
		v := e.m.APIKeyAdmissions.WithLabelValues(c.t.Name, c.key.MetricLabel(), result)
		ctr = &v
		c.key.Admitted.Store(ctr)
	}
	(*ctr).Inc()
}
