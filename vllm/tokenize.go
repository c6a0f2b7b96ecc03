package vllm

import (
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"strings"
)

// Model is one entry of a replica's /v1/models.
type Model struct {
	// ID is the served model name.
	ID string
	// MaxModelLen is the context length in tokens (0 when not reported).
	MaxModelLen int
	// Parent is the base model of a LoRA adapter ("" for a base model;
	// vllm/entrypoints/openai/serving_models.py).
	Parent string
}

// Models lists a replica's served models (GET /v1/models).
func (c *Client) Models(ctx context.Context, baseURL string) ([]Model, error) {
	var out struct {
		Data []struct {
			ID          string `json:"id"`
			MaxModelLen *int   `json:"max_model_len"`
			Parent      string `json:"parent"`
		} `json:"data"`
	}
	if err := c.doJSON(ctx, http.MethodGet, strings.TrimSuffix(baseURL, "/")+"/v1/models", nil, &out); err != nil {
		return nil, fmt.Errorf("models %s: %w", baseURL, err)
	}
	ms := make([]Model, 0, len(out.Data))
	for _, d := range out.Data {
		m := Model{ID: d.ID, Parent: d.Parent}
		if d.MaxModelLen != nil {
			m.MaxModelLen = *d.MaxModelLen
		}
		ms = append(ms, m)
	}
	return ms, nil
}

type tokenizeChat struct {
	Model                string          `json:"model,omitempty"`
	Messages             json.RawMessage `json:"messages"`
	Tools                json.RawMessage `json:"tools,omitempty"`
	ChatTemplate         json.RawMessage `json:"chat_template,omitempty"`
	ChatTemplateKwargs   json.RawMessage `json:"chat_template_kwargs,omitempty"`
	AddGenerationPrompt  json.RawMessage `json:"add_generation_prompt"`
	ContinueFinalMessage json.RawMessage `json:"continue_final_message"`
	AddSpecialTokens     json.RawMessage `json:"add_special_tokens"`
}

type tokenizeCompletion struct {
	Model            string          `json:"model,omitempty"`
	Prompt           json.RawMessage `json:"prompt"`
	AddSpecialTokens json.RawMessage `json:"add_special_tokens"`
}

type tokenizeResponse struct {
	Count       int `json:"count"`
	MaxModelLen int `json:"max_model_len"`
}

func (r *Request) raw(s span, def string) json.RawMessage {
	if !s.ok() || isNull(r.body, s) {
		if def == "" {
			return nil
		}
		return json.RawMessage(def)
	}
	return json.RawMessage(r.body[s.start:s.end])
}

// Tokenize counts r's input tokens exactly with the replica's POST /tokenize
// (VLLM.md §1.6), sending the generation request's messages, tools, template,
// template kwargs, add_generation_prompt, continue_final_message and
// add_special_tokens (chat), or each text prompt with add_special_tokens
// (completions). It returns one count per prompt (see
// [Request.WithExactInput]) and the model's max_model_len. Token-id prompts
// are counted locally; maxModelLen is then 0 (unknown).
func (c *Client) Tokenize(ctx context.Context, baseURL, model string, r *Request) (perPrompt []int, maxModelLen int, err error) {
	url := strings.TrimSuffix(baseURL, "/") + "/tokenize"
	if r.Endpoint == EndpointChat {
		addGen := "true"
		if r.ContinueFinalMessage {
			// /tokenize refuses both set; vLLM continues the final message
			// without a generation prompt (serve/tokenize/protocol.py).
			addGen = "false"
		}
		in := tokenizeChat{
			Model:                model,
			Messages:             r.raw(r.messages, ""),
			Tools:                r.raw(r.tools, ""),
			ChatTemplate:         r.raw(r.chatTemplate, ""),
			ChatTemplateKwargs:   r.raw(r.chatTemplateKwargs, ""),
			AddGenerationPrompt:  r.raw(r.addGenerationPrompt, addGen),
			ContinueFinalMessage: r.raw(r.continueFinalMessage, "false"),
			AddSpecialTokens:     r.raw(r.addSpecialTokens, "false"),
		}
		var out tokenizeResponse
		if err := c.doJSON(ctx, http.MethodPost, url, in, &out); err != nil {
			return nil, 0, fmt.Errorf("tokenize %s: %w", baseURL, err)
		}
		return []int{out.Count}, out.MaxModelLen, nil
	}
	if len(r.textPrompts) == 0 {
		return append([]int(nil), r.InputTokens...), 0, nil
	}
	counts := make([]int, 0, len(r.textPrompts))
	for _, p := range r.textPrompts {
		in := tokenizeCompletion{
			Model:            model,
			Prompt:           r.raw(p, ""),
			AddSpecialTokens: r.raw(r.addSpecialTokens, "true"),
		}
		var out tokenizeResponse
		if err := c.doJSON(ctx, http.MethodPost, url, in, &out); err != nil {
			return nil, 0, fmt.Errorf("tokenize %s: %w", baseURL, err)
		}
		counts = append(counts, out.Count)
		maxModelLen = out.MaxModelLen
	}
	return counts, maxModelLen, nil
}

// CountText counts the tokens of text, a model's output, with the
// replica's POST /tokenize (no special tokens): what a stream cut before
// its usage showed of the output, re-counted by the model's own tokenizer.
func (c *Client) CountText(ctx context.Context, baseURL, model, text string) (int, error) {
	prompt, err := json.Marshal(text)
	if err != nil {
		return 0, err
	}
	in := tokenizeCompletion{Model: model, Prompt: prompt, AddSpecialTokens: json.RawMessage("false")}
	var out tokenizeResponse
	if err := c.doJSON(ctx, http.MethodPost, strings.TrimSuffix(baseURL, "/")+"/tokenize", in, &out); err != nil {
		return 0, fmt.Errorf("tokenize %s: %w", baseURL, err)
	}
	return out.Count, nil
}
