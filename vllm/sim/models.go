package sim

import (
	"fmt"
	"slices"
	"strings"
)

// LoRAModule is one LoRA adapter the replica serves under its own model
// name (vLLM's --lora-modules name=path).
type LoRAModule struct {
	Name string
	Path string
	// Base is the base model it applies to; "" is the first served name.
	Base string
}

// ParseLoRAModule parses vLLM's --lora-modules "name=path" form.
func ParseLoRAModule(s string) (LoRAModule, error) {
	name, path, ok := strings.Cut(s, "=")
	if !ok || name == "" || path == "" {
		return LoRAModule{}, fmt.Errorf("lora module %q must be name=path: %w", s, ErrConfig)
	}
	return LoRAModule{Name: name, Path: path}, nil
}

// baseNames is every --served-model-name: Model, then ServedModelNames.
func (c *Config) baseNames() []string {
	return append([]string{c.Model}, c.ServedModelNames...)
}

// serves reports whether a request for model is accepted, as vLLM's
// OpenAIServing._check_model does (vllm/entrypoints/openai/serving_engine.py):
// no model means the first base model; otherwise a base model name or a
// loaded LoRA adapter.
func (c *Config) serves(model string) bool {
	if model == "" || slices.Contains(c.baseNames(), model) {
		return true
	}
	return slices.ContainsFunc(c.LoRAModules, func(l LoRAModule) bool { return l.Name == model })
}

// loraOf returns model when it names a LoRA adapter, else "".
func (c *Config) loraOf(model string) string {
	if slices.ContainsFunc(c.LoRAModules, func(l LoRAModule) bool { return l.Name == model }) {
		return model
	}
	return ""
}

// validateModels checks names are unique across base models and adapters.
func (c *Config) validateModels() []error {
	var errs []error
	seen := map[string]bool{}
	for _, n := range c.baseNames() {
		if n == "" || seen[n] {
			errs = append(errs, fmt.Errorf("served model name %q is empty or repeated: %w", n, ErrConfig))
		}
		seen[n] = true
	}
	for _, l := range c.LoRAModules {
		if l.Name == "" || l.Path == "" || seen[l.Name] {
			errs = append(errs, fmt.Errorf("lora module %q needs a unique name and a path: %w", l.Name, ErrConfig))
		}
		if l.Base != "" && !slices.Contains(c.baseNames(), l.Base) {
			errs = append(errs, fmt.Errorf("lora module %q: base model %q is not served: %w", l.Name, l.Base, ErrConfig))
		}
		seen[l.Name] = true
	}
	return errs
}

// appendModelList appends the /v1/models body as vLLM's
// show_available_models builds it (vllm/entrypoints/openai/serving_models.py):
// one card per base model with max_model_len, then one per LoRA adapter
// with root = its path, parent = its base model and max_model_len null.
func (r *Replica) appendModelList(b []byte) []byte {
	b = append(b, `{"object":"list","data":[`...)
	card := func(id, root, parent string, mml int) {
		if b[len(b)-1] != '[' {
			b = append(b, ',')
		}
		b = append(b, `{"id":`...)
		b = appendJSONString(b, id)
		b = append(b, `,"object":"model","created":`...)
		b = appendInt(b, int(r.created))
		b = append(b, `,"owned_by":"vllm","root":`...)
		b = appendJSONString(b, root)
		b = append(b, `,"parent":`...)
		if parent == "" {
			b = append(b, "null"...)
		} else {
			b = appendJSONString(b, parent)
		}
		b = append(b, `,"max_model_len":`...)
		if mml > 0 {
			b = appendInt(b, mml)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"permission":[]}`...)
	}
	for _, n := range r.cfg.baseNames() {
		card(n, r.cfg.Model, "", r.cfg.MaxModelLen)
	}
	for _, l := range r.cfg.LoRAModules {
		base := l.Base
		if base == "" {
			base = r.cfg.Model
		}
		card(l.Name, l.Path, base, 0)
	}
	return append(b, `]}`...)
}

// responseModel is the "model" of a response: the adapter's name for a
// LoRA request, else the first served name, as vLLM's
// OpenAIServingModels.model_name answers (serving_models.py).
func (c *Config) responseModel(model string) string {
	if slices.ContainsFunc(c.LoRAModules, func(l LoRAModule) bool { return l.Name == model }) {
		return model
	}
	return c.Model
}
