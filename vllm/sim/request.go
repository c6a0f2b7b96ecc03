package sim

import (
	"bytes"
	"encoding/json"
	"fmt"
	"hash/fnv"
	"net/http"
)

// apiError is an error answered in vLLM's shape:
// {"error": {"message", "type", "param", "code"}}.
type apiError struct {
	status int
	typ    string
	msg    string
	param  string // "" encodes as null
}

func (e *apiError) Error() string { return fmt.Sprintf("%d %s: %s", e.status, e.typ, e.msg) }

func errorType(status int) string {
	switch status {
	case http.StatusBadRequest:
		return "BadRequestError"
	case http.StatusNotFound:
		return "NotFoundError"
	case http.StatusServiceUnavailable:
		return "ServiceUnavailableError"
	case http.StatusTooManyRequests:
		return "RateLimitError"
	}
	if status >= 500 {
		return "InternalServerError"
	}
	return "BadRequestError"
}

func newAPIError(status int, param, format string, a ...any) *apiError {
	return &apiError{status: status, typ: errorType(status), msg: fmt.Sprintf(format, a...), param: param}
}

func badRequest(param, format string, a ...any) *apiError {
	return newAPIError(http.StatusBadRequest, param, format, a...)
}

// appendErrorJSON appends vLLM's error body for e.
func appendErrorJSON(b []byte, e *apiError) []byte {
	b = append(b, `{"error":{"message":`...)
	b = appendJSONString(b, e.msg)
	b = append(b, `,"type":`...)
	b = appendJSONString(b, e.typ)
	b = append(b, `,"param":`...)
	if e.param == "" {
		b = append(b, "null"...)
	} else {
		b = appendJSONString(b, e.param)
	}
	b = append(b, `,"code":`...)
	b = appendInt(b, e.status)
	b = append(b, "}}"...)
	return b
}

// maxSeqsPerRequest bounds n × prompts, so that one body cannot make the
// simulator allocate without bound (vLLM has no such limit).
const maxSeqsPerRequest = 4096

type kind int

const (
	kindChat kind = iota
	kindCompletion
)

// genRequest is a validated generation request.
type genRequest struct {
	kind            kind
	model           string // the response's "model" (models.go, responseModel)
	prompts         []int  // prompt tokens per prompt (chat: one)
	promptTotal     int    // sum of prompts
	cap             int    // output cap per sequence
	n               int
	stream          bool
	includeUsage    bool
	continuousUsage bool
	priority        int
	ignoreEOS       bool
	minTokens       int
	streamInterval  int // effective: max(server, request)
	// late is an error vLLM raises only when the engine adds the request
	// (vllm/v1/engine/input_processor.py), after a stream's 200 headers: a
	// streamed request gets it as an SSE error event, a non-streamed one as
	// its response.
	late *apiError
	// promptLogprobs asks for prompt_logprobs in a non-streamed response.
	promptLogprobs bool
	// logprobs asks for per-token logprobs (completions logprobs, chat
	// logprobs: true).
	logprobs bool
	// tokenIDs holds the largest token id of a token-id prompt, -1 if none.
	maxTokenID int
}

type streamOptions struct {
	IncludeUsage         *bool `json:"include_usage"`
	ContinuousUsageStats *bool `json:"continuous_usage_stats"`
}

type chatMessage struct {
	Role    string          `json:"role"`
	Content json.RawMessage `json:"content"`
}

type contentPart struct {
	Type string `json:"type"`
	Text string `json:"text"`
}

type wireRequest struct {
	Model    string          `json:"model"`
	Messages []chatMessage   `json:"messages"`
	Prompt   json.RawMessage `json:"prompt"`
	Tools    json.RawMessage `json:"tools"`
	// Documents are a chat request's RAG documents, which vLLM hands to
	// the chat template (serving_engine.py _preprocess_chat passes them to
	// apply_hf_chat_template); the simulator's template renders them.
	Documents           json.RawMessage `json:"documents"`
	MaxTokens           json.RawMessage `json:"max_tokens"`
	MaxCompletionTokens json.RawMessage `json:"max_completion_tokens"`
	N                   *int            `json:"n"`
	Stream              *bool           `json:"stream"`
	StreamOptions       *streamOptions  `json:"stream_options"`
	Priority            json.RawMessage `json:"priority"`
	CacheSalt           *string         `json:"cache_salt"`
	IgnoreEOS           bool            `json:"ignore_eos"`
	MinTokens           int             `json:"min_tokens"`
	Logprobs            json.RawMessage `json:"logprobs"`
	TopLogprobs         json.RawMessage `json:"top_logprobs"`
	PromptLogprobs      json.RawMessage `json:"prompt_logprobs"`
	UseBeamSearch       bool            `json:"use_beam_search"`
	ResponseFormat      json.RawMessage `json:"response_format"`
	StreamInterval      json.RawMessage `json:"stream_interval"`
	// /tokenize
	AddGenerationPrompt  *bool `json:"add_generation_prompt"`
	ContinueFinalMessage bool  `json:"continue_final_message"`
	ReturnTokenStrs      bool  `json:"return_token_strs"`
}

func decodeWire(body []byte) (*wireRequest, *apiError) {
	var w wireRequest
	dec := json.NewDecoder(bytes.NewReader(body))
	if err := dec.Decode(&w); err != nil {
		return nil, badRequest("", "invalid JSON body: %v", err)
	}
	if dec.More() {
		return nil, badRequest("", "invalid JSON body: trailing data")
	}
	return &w, nil
}

func isNull(r json.RawMessage) bool {
	return len(r) == 0 || string(bytes.TrimSpace(r)) == "null"
}

// tokenSink receives tokens; a nil sink only counts.
type tokenSink struct {
	ids  []int
	strs *[]string
}

var chatMsgTokens = [msgOverheadTokens]int{1, 2, 3, 4}
var chatGenTokens = [genPromptTokens]int{5, 6, 7}

// chatPromptTokens counts (and with a sink, lists) the tokens of a chat
// prompt rendered by the simulator's template.
func chatPromptTokens(msgs []chatMessage, tools json.RawMessage, addGen bool, sink *tokenSink) (int, *apiError) {
	n := 0
	for i, m := range msgs {
		if m.Role == "" {
			return 0, badRequest("messages", "messages[%d].role is required", i)
		}
		n += msgOverheadTokens
		if sink != nil {
			sink.ids = append(sink.ids, chatMsgTokens[:]...)
			if sink.strs != nil {
				for range msgOverheadTokens {
					*sink.strs = append(*sink.strs, "<|msg|>")
				}
			}
		}
		if isNull(m.Content) {
			continue
		}
		var texts []string
		var s string
		if err := json.Unmarshal(m.Content, &s); err == nil {
			texts = []string{s}
		} else {
			var parts []contentPart
			if err := json.Unmarshal(m.Content, &parts); err != nil {
				return 0, badRequest("messages", "messages[%d].content must be a string or a list of parts", i)
			}
			for _, p := range parts {
				if p.Type == "text" || p.Type == "" {
					texts = append(texts, p.Text)
				}
			}
		}
		for _, t := range texts {
			if sink != nil {
				before := len(sink.ids)
				sink.ids = tokenizeText(t, sink.ids, sink.strs)
				n += len(sink.ids) - before
			} else {
				n += countText(t)
			}
		}
	}
	if !isNull(tools) {
		t := string(tools)
		if sink != nil {
			before := len(sink.ids)
			sink.ids = tokenizeText(t, sink.ids, sink.strs)
			n += len(sink.ids) - before
		} else {
			n += countText(t)
		}
	}
	if addGen {
		n += genPromptTokens
		if sink != nil {
			sink.ids = append(sink.ids, chatGenTokens[:]...)
			if sink.strs != nil {
				for range genPromptTokens {
					*sink.strs = append(*sink.strs, "<|gen|>")
				}
			}
		}
	}
	return n, nil
}

// mediaParts counts the content parts of msgs that are not text (the
// image_url, input_audio, … parts that a multimodal processor expands).
func mediaParts(msgs []chatMessage) int {
	n := 0
	for _, m := range msgs {
		var parts []contentPart
		if isNull(m.Content) || json.Unmarshal(m.Content, &parts) != nil {
			continue
		}
		for _, p := range parts {
			switch p.Type {
			case "", "text", "input_text", "output_text", "refusal", "thinking":
			default:
				n++
			}
		}
	}
	return n
}

// completionPrompts returns the token counts of a completions prompt:
// a string, a list of strings, a list of token ids or a list of such lists.
func completionPrompts(raw json.RawMessage, sink *tokenSink) ([]int, *apiError) {
	if isNull(raw) {
		return nil, badRequest("prompt", "prompt is required")
	}
	var s string
	if err := json.Unmarshal(raw, &s); err == nil {
		return []int{textTokens(s, sink)}, nil
	}
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil {
		if len(ids) == 0 {
			return nil, badRequest("prompt", "prompt must not be empty")
		}
		if sink != nil {
			sink.ids = append(sink.ids, ids...)
			if sink.strs != nil {
				for _, id := range ids {
					*sink.strs = append(*sink.strs, fmt.Sprintf("<%d>", id))
				}
			}
		}
		return []int{len(ids)}, nil
	}
	var strs []string
	if err := json.Unmarshal(raw, &strs); err == nil {
		if len(strs) == 0 {
			return nil, badRequest("prompt", "prompt must not be empty")
		}
		out := make([]int, len(strs))
		for i, s := range strs {
			out[i] = textTokens(s, sink)
		}
		return out, nil
	}
	var lists [][]int
	if err := json.Unmarshal(raw, &lists); err == nil {
		if len(lists) == 0 {
			return nil, badRequest("prompt", "prompt must not be empty")
		}
		out := make([]int, len(lists))
		for i, l := range lists {
			if len(l) == 0 {
				return nil, badRequest("prompt", "prompt[%d] must not be empty", i)
			}
			out[i] = len(l)
			if sink != nil {
				sink.ids = append(sink.ids, l...)
			}
		}
		return out, nil
	}
	return nil, badRequest("prompt", "prompt must be a string, a list of strings, a list of token ids or a list of such lists")
}

func textTokens(s string, sink *tokenSink) int {
	if sink == nil {
		return countText(s)
	}
	before := len(sink.ids)
	sink.ids = tokenizeText(s, sink.ids, sink.strs)
	return len(sink.ids) - before
}

// optInt decodes an optional integer field: ok is false when absent or null.
func optInt(raw json.RawMessage, name string) (v int, ok bool, e *apiError) {
	if isNull(raw) {
		return 0, false, nil
	}
	if err := json.Unmarshal(raw, &v); err != nil {
		return 0, false, badRequest(name, "%s must be an integer", name)
	}
	return v, true, nil
}

// parseGeneration validates a chat or completions body the way vLLM does
// before queueing. The model check comes first (404), then the prompt, then
// the limits (400).
func parseGeneration(k kind, w *wireRequest, cfg *Config) (*genRequest, *apiError) {
	if !cfg.serves(w.Model) {
		return nil, newAPIError(http.StatusNotFound, "model", "The model `%s` does not exist.", w.Model)
	}
	g := &genRequest{kind: k, n: 1, ignoreEOS: w.IgnoreEOS, minTokens: w.MinTokens, maxTokenID: -1}
	if e := parseSampling(k, w, cfg, g); e != nil {
		return nil, e
	}
	if w.Stream != nil {
		g.stream = *w.Stream
	}
	if w.StreamOptions != nil {
		if !g.stream {
			return nil, badRequest("stream_options", "Stream options can only be defined when `stream=True`.")
		}
		g.includeUsage = true
		if w.StreamOptions.IncludeUsage != nil {
			g.includeUsage = *w.StreamOptions.IncludeUsage
		}
		if w.StreamOptions.ContinuousUsageStats != nil {
			g.continuousUsage = *w.StreamOptions.ContinuousUsageStats
		}
	}
	if w.N != nil {
		g.n = *w.N
	}
	if g.n < 1 {
		return nil, badRequest("n", "n must be at least 1, got %d.", g.n)
	}
	if g.n > maxSeqsPerRequest {
		return nil, badRequest("n", "n must be at most %d in the simulator, got %d.", maxSeqsPerRequest, g.n)
	}
	if g.minTokens < 0 {
		return nil, badRequest("min_tokens", "min_tokens must be greater than or equal to 0, got %d.", g.minTokens)
	}
	// prompt
	switch k {
	case kindChat:
		if len(w.Messages) == 0 {
			return nil, badRequest("messages", "messages must be a non-empty list")
		}
		addGen := true
		if w.AddGenerationPrompt != nil {
			addGen = *w.AddGenerationPrompt
		}
		n, e := chatPromptTokens(w.Messages, w.Tools, addGen, nil)
		if e != nil {
			return nil, e
		}
		if !isNull(w.Documents) {
			n += countText(string(w.Documents))
		}
		n += cfg.MediaTokens * mediaParts(w.Messages)
		g.prompts = []int{n}
	default:
		p, e := completionPrompts(w.Prompt, nil)
		if e != nil {
			return nil, e
		}
		g.prompts = p
		g.maxTokenID = maxTokenID(w.Prompt)
	}
	if len(g.prompts)*g.n > maxSeqsPerRequest {
		return nil, badRequest("n", "n × prompts must be at most %d in the simulator, got %d.", maxSeqsPerRequest, len(g.prompts)*g.n)
	}
	maxPrompt := 0
	for _, p := range g.prompts {
		g.promptTotal += p
		maxPrompt = max(maxPrompt, p)
	}
	// cap
	var capv int
	var hasCap bool
	var e *apiError
	switch k {
	case kindChat:
		capv, hasCap, e = optInt(w.MaxCompletionTokens, "max_completion_tokens")
		if e == nil && !hasCap {
			capv, hasCap, e = optInt(w.MaxTokens, "max_tokens")
		}
	default:
		if len(w.MaxTokens) == 0 {
			capv, hasCap = 16, true
		} else {
			capv, hasCap, e = optInt(w.MaxTokens, "max_tokens")
		}
	}
	if e != nil {
		return nil, e
	}
	if maxPrompt > cfg.MaxModelLen {
		return nil, badRequest("input_tokens",
			"This model's maximum context length is %d tokens. However, your request has %d input tokens. Please reduce the length of the input messages.",
			cfg.MaxModelLen, maxPrompt)
	}
	if hasCap {
		if capv < 1 {
			return nil, badRequest("max_tokens", "max_tokens must be at least 1, got %d.", capv)
		}
		if maxPrompt+capv > cfg.MaxModelLen {
			return nil, badRequest("input_tokens",
				"'max_tokens' or 'max_completion_tokens' is too large: %d. This model's maximum context length is %d tokens and your request has %d input tokens (%d > %d - %d).",
				capv, cfg.MaxModelLen, maxPrompt, capv, cfg.MaxModelLen, maxPrompt)
		}
		g.cap = capv
	} else {
		g.cap = cfg.MaxModelLen - maxPrompt
	}
	if g.late == nil && g.maxTokenID >= vocabSize {
		// vllm/v1/engine/input_processor.py _validate_model_input.
		g.late = badRequest("", "Token id %d is out of vocabulary", g.maxTokenID)
	}
	if g.late == nil && maxPrompt == cfg.MaxModelLen {
		// Only reachable without a cap (chat): the renderer's check passed
		// with 0 output tokens; input_processor.py _validate_prompt_len
		// refuses when the engine adds it.
		g.late = badRequest("", "The decoder prompt (length %d) plus the number of requested output tokens (at least 1) is longer than the maximum model length of %d. Make sure that `max_model_len` is no smaller than the number of text tokens (prompt + requested output tokens).",
			maxPrompt, cfg.MaxModelLen)
		g.cap = 1
	}
	if g.minTokens > g.cap && g.late == nil {
		return nil, badRequest("min_tokens", "min_tokens must be less than or equal to max_tokens=%d, got %d.", g.cap, g.minTokens)
	}
	return g, nil
}

// requestKey hashes the request id (X-Request-Id, else the body) for the
// request's random stream and id.
func requestKey(header string, body []byte) (uint64, string) {
	h := fnv.New64a()
	if header != "" {
		_, _ = h.Write([]byte(header))
		return h.Sum64(), header
	}
	_, _ = h.Write(body)
	s := h.Sum64()
	return s, fmt.Sprintf("%016x", s)
}

// mix is splitmix64's finalizer, used to derive independent keys.
func mix(x uint64) uint64 {
	x += 0x9E3779B97F4A7C15
	x = (x ^ (x >> 30)) * 0xBF58476D1CE4E5B9
	x = (x ^ (x >> 27)) * 0x94D049BB133111EB
	return x ^ (x >> 31)
}

// parseSampling validates the sampling fields vLLM checks, before the
// headers (pydantic validators in vllm/entrypoints/openai/*/protocol.py and
// the serving classes) or, for what the engine checks, in g.late.
func parseSampling(k kind, w *wireRequest, cfg *Config, g *genRequest) *apiError {
	stream := w.Stream != nil && *w.Stream
	// cache_salt: a non-empty string when given (check_cache_salt_support,
	// chat_completion/protocol.py).
	if w.CacheSalt != nil && *w.CacheSalt == "" {
		return badRequest("cache_salt", "Parameter 'cache_salt' must be non-empty if provided.")
	}
	// priority: any integer; ignored under fcfs (vLLM v1's FCFSRequestQueue).
	if !isNull(w.Priority) {
		var p int
		if err := json.Unmarshal(w.Priority, &p); err != nil {
			return badRequest("priority", "priority must be an integer")
		}
		g.priority = p
	}
	// stream_interval: ge=1, raises the server's (completion/protocol.py).
	g.streamInterval = cfg.StreamInterval
	if !isNull(w.StreamInterval) {
		var v int
		if err := json.Unmarshal(w.StreamInterval, &v); err != nil || v < 1 {
			return badRequest("stream_interval", "stream_interval must be an integer >= 1")
		}
		g.streamInterval = max(g.streamInterval, v)
	}
	// logprobs: completions takes a count; chat a bool plus top_logprobs.
	sample := -1
	switch k {
	case kindCompletion:
		if !isNull(w.Logprobs) {
			var v float64
			if err := json.Unmarshal(w.Logprobs, &v); err != nil {
				return badRequest("logprobs", "`logprobs` must be an integer.")
			}
			if v < 0 && v != -1 {
				return badRequest("logprobs", "`logprobs` must be a positive value or -1.")
			}
			sample = int(v)
			g.logprobs = true
		}
		if w.UseBeamSearch && stream {
			// completion/serving.py _create_completion.
			return badRequest("", "Streaming is not currently supported with beam search")
		}
	default:
		var on bool
		if !isNull(w.Logprobs) {
			if err := json.Unmarshal(w.Logprobs, &on); err != nil {
				return badRequest("logprobs", "logprobs must be a boolean")
			}
		}
		if !isNull(w.TopLogprobs) {
			var v int
			if err := json.Unmarshal(w.TopLogprobs, &v); err != nil {
				return badRequest("top_logprobs", "top_logprobs must be an integer")
			}
			if !on {
				// chat_completion/protocol.py check_logprobs.
				return badRequest("top_logprobs", "when using `top_logprobs`, `logprobs` must be set to true.")
			}
			if v < 0 && v != -1 {
				return badRequest("top_logprobs", "`top_logprobs` must be a positive value or -1.")
			}
			sample = v
		} else if on {
			sample = 0
		}
		g.logprobs = on
	}
	prompt := -1
	if !isNull(w.PromptLogprobs) {
		var v float64
		if err := json.Unmarshal(w.PromptLogprobs, &v); err != nil {
			return badRequest("prompt_logprobs", "`prompt_logprobs` must be an integer.")
		}
		if stream && (v > 0 || v == -1) {
			return badRequest("prompt_logprobs", "`prompt_logprobs` are not available when `stream=True`.")
		}
		if v < 0 && v != -1 {
			return badRequest("prompt_logprobs", "`prompt_logprobs` must be a positive value or -1.")
		}
		prompt = int(v)
		g.promptLogprobs = true
	}
	// response_format: json_schema needs its schema (protocol.py
	// validate_response_format, before the headers); a schema the grammar
	// backend cannot compile is refused by the engine (late).
	if !isNull(w.ResponseFormat) {
		var rf struct {
			Type       string          `json:"type"`
			JSONSchema json.RawMessage `json:"json_schema"`
		}
		if err := json.Unmarshal(w.ResponseFormat, &rf); err != nil {
			return badRequest("response_format", "response_format must be an object")
		}
		switch rf.Type {
		case "text", "json_object", "structural_tag":
		case "json_schema":
			if isNull(rf.JSONSchema) {
				return badRequest("response_format", "When response_format type is 'json_schema', the 'json_schema' field must be provided.")
			}
			var js struct {
				Schema json.RawMessage `json:"schema"`
			}
			if err := json.Unmarshal(rf.JSONSchema, &js); err != nil || !validSchema(js.Schema) {
				g.late = badRequest("", "Error in structured output: the JSON schema is invalid")
			}
		default:
			return badRequest("response_format", "response_format.type must be one of text, json_object, json_schema or structural_tag")
		}
	}
	// The engine's sampling-params checks (input_processor.py via
	// SamplingParams.verify): counts above --max-logprobs.
	if g.late == nil && sample > cfg.MaxLogprobs {
		// VLLMValidationError renders its parameter and value into the message.
		g.late = badRequest("logprobs", "Requested sample logprobs of %d, which is greater than max allowed: %d (parameter=logprobs, value=%d)", sample, cfg.MaxLogprobs, sample)
	}
	if g.late == nil && prompt > cfg.MaxLogprobs {
		g.late = badRequest("prompt_logprobs", "Requested prompt logprobs of %d, which is greater than max allowed: %d (parameter=prompt_logprobs, value=%d)", prompt, cfg.MaxLogprobs, prompt)
	}
	return nil
}

// validSchema accepts an absent schema or a JSON object whose "type", if
// any, is a JSON Schema type.
func validSchema(raw json.RawMessage) bool {
	if isNull(raw) {
		return true
	}
	var m map[string]json.RawMessage
	if err := json.Unmarshal(raw, &m); err != nil {
		return false
	}
	t, ok := m["type"]
	if !ok {
		return true
	}
	var ts string
	if err := json.Unmarshal(t, &ts); err != nil {
		return false
	}
	switch ts {
	case "object", "array", "string", "number", "integer", "boolean", "null":
		return true
	}
	return false
}

// maxTokenID returns the largest id of a token-id prompt, -1 for text.
func maxTokenID(raw json.RawMessage) int {
	m := -1
	var ids []int
	if err := json.Unmarshal(raw, &ids); err == nil {
		for _, id := range ids {
			m = max(m, id)
		}
		return m
	}
	var lists [][]int
	if err := json.Unmarshal(raw, &lists); err == nil {
		for _, l := range lists {
			for _, id := range l {
				m = max(m, id)
			}
		}
	}
	return m
}
