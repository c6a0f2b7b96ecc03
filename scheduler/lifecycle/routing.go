package lifecycle

import (
	"fmt"

	"github.com/sluicehq/sluice/scheduler/apierr"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/scheduler/policy"
	"github.com/sluicehq/sluice/vllm"
)

// modelError is a model no replica serves, or one the tenant may not use:
// 404 model_not_found, the same answer either way (as OpenAI gives), so a
// tenant cannot probe which models exist.
type modelError struct{ model string }

func (e *modelError) Error() string { return "model " + e.model + " is not served or not allowed" }

// Is makes errors.Is(err, apierr.ErrUnknownModel) true.
func (e *modelError) Is(target error) bool { return target == apierr.ErrUnknownModel }

// APIError is OpenAI's and vLLM's answer: 404, param null.
func (e *modelError) APIError() *apierr.Error {
	return &apierr.Error{Status: 404, Code: "model_not_found", Type: "invalid_request_error",
		Message: fmt.Sprintf("The model `%s` does not exist or you do not have access to it.", e.model)}
}

// checkModel refuses a model the tenant may not use or no replica serves.
// A request without "model" gets vLLM's default (the first served model),
// which the tenant must be allowed.
func (e *Engine) checkModel(t *policy.Tenant, model string) error {
	m := model
	if m == "" {
		m = e.reps.DefaultModel()
	}
	if m != "" && !t.Allowed(m) {
		return &modelError{model: m}
	}
	if model != "" && !e.reps.KnowsModel(model) {
		return &modelError{model: model}
	}
	return nil
}

// routeOf is what the replica choice needs from a parsed request: its
// model, and under affinity routing its prompt's chunk hashes.
func (e *Engine) routeOf(pol *policy.Snapshot, t *policy.Tenant, req *vllm.Request) fleet.Route {
	rt := fleet.Route{Model: req.Model, Tenant: t.Name}
	if pol.Cfg.Upstream.Routing != "least_load" {
		// vLLM hits only blocks cached under the request's salt: the
		// tenant's, else the client's own.
		salt := req.CacheSalt()
		if t.CacheSalt != "" {
			salt = []byte(t.CacheSalt)
		}
		rt.Prefix = fleet.PrefixHashes(salt, req.PromptBytes())
	}
	return rt
}

// rewriteOptions are what Sluice writes into the call's upstream body on
// its replica: the band as vLLM's priority where the replica schedules by
// it, the tenant's cache salt, and the evidence stream's interval of a
// non-streamed request (execute).
func (c *call) rewriteOptions() vllm.RewriteOptions {
	return vllm.RewriteOptions{SetPriority: c.rep.PrioritySched, Priority: c.band, CacheSalt: c.t.CacheSalt, StreamInterval: c.upInterval}
}

// modelCard is one entry of GET /v1/models, in vLLM's shape
// (vllm/entrypoints/openai/serving_models.py, show_available_models: LoRA
// adapters are listed after the base models with "parent" set and no
// max_model_len).
type modelCard struct {
	ID          string  `json:"id"`
	Object      string  `json:"object"`
	OwnedBy     string  `json:"owned_by"`
	Parent      *string `json:"parent"`
	MaxModelLen int64   `json:"max_model_len,omitempty"`
}

// modelList is what the tenant sees at GET /v1/models: the union of the
// replicas' served models that it may use.
func (e *Engine) modelList(t *policy.Tenant) []modelCard {
	out := []modelCard{}
	for _, m := range e.reps.Models() {
		if !t.Allowed(m.ID) {
			continue
		}
		c := modelCard{ID: m.ID, Object: "model", OwnedBy: "vllm"}
		if m.Parent != "" {
			p := m.Parent
			c.Parent = &p
		} else {
			c.MaxModelLen = m.MaxModelLen
		}
		out = append(out, c)
	}
	return out
}
