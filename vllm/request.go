package vllm

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"strconv"
)

// Endpoint is one of the two generation routes Sluice schedules.
type Endpoint uint8

// The generation endpoints.
const (
	EndpointChat        Endpoint = iota + 1 // POST /v1/chat/completions
	EndpointCompletions                     // POST /v1/completions
)

// Path returns the endpoint's URL path.
func (e Endpoint) Path() string {
	switch e {
	case EndpointChat:
		return "/v1/chat/completions"
	case EndpointCompletions:
		return "/v1/completions"
	}
	return extraPaths[e] // endpoints.go
}

// EndpointForPath maps a URL path to its Endpoint.
func EndpointForPath(path string) (Endpoint, bool) {
	switch path {
	case "/v1/chat/completions":
		return EndpointChat, true
	case "/v1/completions":
		return EndpointCompletions, true
	}
	e, ok := extraEndpoints[path] // endpoints.go
	return e, ok
}

// ErrInvalidRequest is matched (errors.Is) by every *InvalidRequestError.
var ErrInvalidRequest = errors.New("invalid request")

// ErrContextLength means an exactly counted prompt plus the requested output
// does not fit the model's context (vLLM would answer 400, param input_tokens).
// It is never returned for an upper-bound (bytes mode) count.
var ErrContextLength = errors.New("context length exceeded")

// ErrNoCap means no output cap could be derived: the client sent none, the
// model's context length is unknown and the scheduler passed no limit.
var ErrNoCap = errors.New("no output cap")

// InvalidRequestError reports a malformed body or a field of the wrong type.
// Param names the offending field (e.g. "messages[2].content"), "" for the
// body as a whole. The message never echoes body content.
type InvalidRequestError struct {
	Param  string
	Reason string
}

func (e *InvalidRequestError) Error() string {
	if e.Param == "" {
		return "invalid request: " + e.Reason
	}
	return fmt.Sprintf("invalid request: %s: %s", e.Param, e.Reason)
}

// Is makes errors.Is(err, ErrInvalidRequest) true.
func (e *InvalidRequestError) Is(target error) bool { return target == ErrInvalidRequest }

func invalid(param, reason string) error { return &InvalidRequestError{Param: param, Reason: reason} }

// Template allowances of the bytes counting mode, in tokens. See [CountOptions].
const (
	DefaultTemplateTokensPerMessage = 8
	DefaultTemplateTokensPerRequest = 64
	DefaultSpecialTokensPerPrompt   = 4
)

// CountOptions tunes the bytes counting mode.
//
// # Design rationale
//
// Byte-level BPE tokenizers never produce more tokens than the UTF-8 bytes
// they encode, so the bytes of everything the chat template renders bound the
// prompt's token count. The template's own text (role headers, special
// tokens, a default system prompt such as Llama 3.1's dates, tool-use
// instructions, the generation prompt) is not in the body, so it is covered by
// fixed allowances. Text values are counted decoded (JSON escapes undone);
// role and name strings are counted too. Tool definitions and tool calls are
// counted as their JSON re-indented with four spaces per level, which bounds
// templates that render them with tojson / tojson(indent=4). Image, audio and
// video parts are not bounded (Request.HasMedia reports them).
type CountOptions struct {
	// TemplateTokensPerMessage covers one message's role header and
	// separators. Optional; default 8; negative means 0.
	TemplateTokensPerMessage int
	// TemplateTokensPerRequest covers BOS, a default system prompt, tool
	// instructions and the generation prompt of a chat request. Optional;
	// default 64; negative means 0.
	TemplateTokensPerRequest int
	// SpecialTokensPerPrompt covers special tokens (BOS/EOS) that
	// add_special_tokens adds to a completions text prompt. Optional;
	// default 4; negative means 0.
	SpecialTokensPerPrompt int
	// MediaTokensPerPart bounds the tokens of one image, audio or video
	// content part, whose real count depends on the model's processor and
	// the media itself (unknown to Sluice). Optional; default 4096;
	// negative means 0.
	MediaTokensPerPart int
}

// DefaultMediaTokensPerPart is the default per-part media allowance: above
// the image token counts of common vLLM multimodal models at their default
// processor settings (LLaVA-1.5 576, LLaVA-NeXT ≤ 2928, Pixtral and
// Qwen2-VL images at ~1–2 MP), so a hold is rarely short; set it per model
// family for exactness.
const DefaultMediaTokensPerPart = 4096

func (o CountOptions) withDefaults() CountOptions {
	def := func(v, d int) int {
		switch {
		case v == 0:
			return d
		case v < 0:
			return 0
		}
		return v
	}
	o.TemplateTokensPerMessage = def(o.TemplateTokensPerMessage, DefaultTemplateTokensPerMessage)
	o.TemplateTokensPerRequest = def(o.TemplateTokensPerRequest, DefaultTemplateTokensPerRequest)
	o.SpecialTokensPerPrompt = def(o.SpecialTokensPerPrompt, DefaultSpecialTokensPerPrompt)
	o.MediaTokensPerPart = def(o.MediaTokensPerPart, DefaultMediaTokensPerPart)
	return o
}

type span struct{ start, end int }

func (s span) ok() bool { return s.end > s.start }

// Request is a parsed generation request. It keeps the original body; the
// body must not be modified while the Request is in use. A Request is
// immutable after Parse (except through WithExactInput, which returns a copy)
// and safe for concurrent reads.
type Request struct {
	Endpoint Endpoint
	// Model is the "model" field ("" when absent: vLLM's default model).
	Model string
	// Stream is the client's "stream" (default false).
	Stream bool
	// HasStreamOptions reports a non-null "stream_options" object.
	HasStreamOptions bool
	// IncludeUsage is the client's effective include_usage: true once
	// stream_options is present unless set false (VLLM.md §1.2).
	IncludeUsage bool
	// ContinuousUsage is the client's effective continuous_usage_stats:
	// set and include_usage in effect (vLLM needs both).
	ContinuousUsage bool
	// N is the number of choices per prompt (default 1).
	N int
	// MaxTokens is the client's output cap: chat max_completion_tokens, else
	// max_tokens; completions max_tokens. 0 when the client sent none.
	MaxTokens int
	// IgnoreEOS is the client's "ignore_eos".
	IgnoreEOS bool
	// MinTokens is the client's "min_tokens".
	MinTokens int
	// Priority is the client's vLLM "priority" (default 0, lower first).
	Priority int
	// InputTokens holds one input token count per prompt: one entry for chat
	// and for a single completions prompt, one per element of a list
	// prompt. Upper bounds unless InputExact.
	InputTokens []int
	// InputExact reports exact counts (token-id prompts, or set by
	// WithExactInput from /tokenize).
	InputExact bool
	// HasMedia reports image/audio/video content parts; the bytes count
	// adds CountOptions.MediaTokensPerPart for each (MediaParts).
	HasMedia bool
	// MediaParts counts image/audio/video content parts.
	MediaParts int
	// StreamInterval is the client's "stream_interval" (0 when absent).
	StreamInterval int
	// ContinueFinalMessage is the client's "continue_final_message".
	ContinueFinalMessage bool
	// Tokenized reports counts that came from the replica's rendering
	// (WithExactInput), even where an upper bound was added to them.
	Tokenized bool
	// ContextInput reports a /v1/responses prompt that includes a stored
	// conversation (previous_response_id, conversation) the body does not
	// show: Plan bounds its input by the model's context.
	ContextInput bool
	// TemplateMargin is the tokens a chat template may add beyond an exact
	// /tokenize count (see WithTokenizedInput); 0 otherwise.
	TemplateMargin int

	body []byte
	// spans of raw values, for /tokenize
	messages, tools, chatTemplate, chatTemplateKwargs, documents span
	cacheSalt                                                    span
	addGenerationPrompt, continueFinalMessage, addSpecialTokens  span
	prompt                                                       span
	// textPrompts holds the spans of completions string prompts.
	textPrompts []span
	// inputOne and promptOne back InputTokens and textPrompts for the
	// usual single prompt: two allocations fewer per request. Copies of a
	// Request share them read-only (WithExactInput replaces InputTokens).
	inputOne  [1]int
	promptOne [1]span
	// mediaTokens is CountOptions.MediaTokensPerPart, for counting.
	mediaTokens int
}

// HasTools reports a non-null "tools" member: vLLM's tool parser may then
// hold back chunks (and their usage) while it parses a call.
func (r *Request) HasTools() bool { return r.tools.ok() && !isNull(r.body, r.tools) }

// Body returns the original body (not a copy).
func (r *Request) Body() []byte { return r.body }

// TotalInputTokens sums InputTokens.
func (r *Request) TotalInputTokens() int {
	t := 0
	for _, n := range r.InputTokens {
		t += n
	}
	return t
}

// Prompts returns the number of prompts (1 for chat).
func (r *Request) Prompts() int { return max(1, len(r.InputTokens)) }

// WithExactInput returns a copy of r whose InputTokens are the exact counts
// given (one per prompt, e.g. from [Client.Tokenize]).
func (r *Request) WithExactInput(perPrompt []int) (*Request, error) {
	if len(perPrompt) != r.Prompts() {
		return nil, fmt.Errorf("exact input: %d counts for %d prompts", len(perPrompt), r.Prompts())
	}
	c := *r
	c.InputTokens = append([]int(nil), perPrompt...)
	c.InputExact = true
	c.TemplateMargin = 0
	c.Tokenized = true
	return &c, nil
}

// WithTokenizedInput is WithExactInput for counts from /tokenize, keeping
// margin tokens of the remaining context free on chat requests: /tokenize
// renders the chat template without the generation request's
// reasoning_effort, documents and the server's default template kwargs
// (vllm/entrypoints/serve/tokenize/protocol.py), so the prompt vLLM runs may
// be a little longer. The margin lowers an injected cap; it is never the
// reason for a refusal.
func (r *Request) WithTokenizedInput(perPrompt []int, margin int) (*Request, error) {
	c, err := r.WithExactInput(perPrompt)
	if err == nil && r.Endpoint == EndpointChat {
		c.TemplateMargin = max(0, margin)
		if r.documents.ok() && !isNull(r.body, r.documents) {
			// /tokenize takes no documents: the count plus their bound
			// is an upper bound again, never a reason for a 400.
			c.InputTokens[0] += r.documentsBound(CountOptions{}.withDefaults())
			c.InputExact = false
		}
		if r.MediaParts > 0 {
			// /tokenize renders a media part's placeholder, not the
			// tokens its processor expands it to: the allowance stays.
			c.InputTokens[0] += r.MediaParts * r.mediaTokens
			c.InputExact = false
		}
	}
	return c, err
}

// maxRequestInts bounds integers taken from the body.
const maxCount = 1 << 30

// Parse parses a generation request body for endpoint e. Only the fields
// Sluice needs are decoded; Rewrite keeps all others byte for byte. Errors
// are *InvalidRequestError (errors.Is ErrInvalidRequest) naming the field.
func Parse(e Endpoint, body []byte, opts CountOptions) (*Request, error) {
	if e != EndpointChat && e != EndpointCompletions {
		return parseOther(e, body, opts) // endpoints.go
	}
	// validJSON is the allocation-free check; it only gives up (false) on
	// invalid or very deep input, which json.Valid then decides.
	if !validJSON(body) && !json.Valid(body) {
		return nil, invalid("", "body is not valid JSON")
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, invalid("", "body must be a JSON object")
	}
	opts = opts.withDefaults()
	r := &Request{Endpoint: e, N: 1, body: body}
	var (
		maxTokens, maxCompletion   span
		stream, streamOpts, nSpan  span
		model, ignoreEOS, priority span
		minTokens, streamInterval  span
	)
	var keys [32]member
	seen := keys[:0]
	err := eachMember(body, i, func(m member) bool {
		seen = append(seen, m)
		v := span{m.valStart, m.valEnd}
		switch {
		case m.keyIs(body, "model"):
			model = v
		case m.keyIs(body, "stream"):
			stream = v
		case m.keyIs(body, "stream_options"):
			streamOpts = v
		case m.keyIs(body, "n"):
			nSpan = v
		case m.keyIs(body, "max_tokens"):
			maxTokens = v
		case m.keyIs(body, "max_completion_tokens"):
			maxCompletion = v
		case m.keyIs(body, "ignore_eos"):
			ignoreEOS = v
		case m.keyIs(body, "min_tokens"):
			minTokens = v
		case m.keyIs(body, "priority"):
			priority = v
		case m.keyIs(body, "stream_interval"):
			streamInterval = v
		case m.keyIs(body, "messages"):
			r.messages = v
		case m.keyIs(body, "tools"):
			r.tools = v
		case m.keyIs(body, "prompt"):
			r.prompt = v
		case m.keyIs(body, "chat_template"):
			r.chatTemplate = v
		case m.keyIs(body, "chat_template_kwargs"):
			r.chatTemplateKwargs = v
		case m.keyIs(body, "add_generation_prompt"):
			r.addGenerationPrompt = v
		case m.keyIs(body, "continue_final_message"):
			r.continueFinalMessage = v
		case m.keyIs(body, "add_special_tokens"):
			r.addSpecialTokens = v
		case m.keyIs(body, "documents"):
			r.documents = v
		case m.keyIs(body, "cache_salt"):
			r.cacheSalt = v
		}
		return true
	})
	if err != nil {
		return nil, invalid("", tooDeep)
	}
	if k, dup := dupKey(body, seen); dup {
		return nil, invalid(k, "appears more than once in the body")
	}
	if model.ok() && !isNull(body, model) {
		if body[model.start] != '"' {
			return nil, invalid("model", "must be a string")
		}
		s, err := unquoteJSON(body[model.start:model.end])
		if err != nil {
			return nil, invalid("model", "must be a string")
		}
		r.Model = s
	}
	if r.Stream, err = optBool(body, stream, "stream", false); err != nil {
		return nil, err
	}
	if r.IgnoreEOS, err = optBool(body, ignoreEOS, "ignore_eos", false); err != nil {
		return nil, err
	}
	if streamOpts.ok() && !isNull(body, streamOpts) {
		if body[streamOpts.start] != '{' {
			return nil, invalid("stream_options", "must be an object")
		}
		r.HasStreamOptions = true
		var inc, cont span
		_ = eachMember(body, streamOpts.start, func(m member) bool {
			switch {
			case m.keyIs(body, "include_usage"):
				inc = span{m.valStart, m.valEnd}
			case m.keyIs(body, "continuous_usage_stats"):
				cont = span{m.valStart, m.valEnd}
			}
			return true
		})
		if r.IncludeUsage, err = optBool(body, inc, "stream_options.include_usage", true); err != nil {
			return nil, err
		}
		if r.ContinuousUsage, err = optBool(body, cont, "stream_options.continuous_usage_stats", false); err != nil {
			return nil, err
		}
		r.ContinuousUsage = r.ContinuousUsage && r.IncludeUsage
	}
	if n, set, err := optInt(body, nSpan, "n"); err != nil {
		return nil, err
	} else if set {
		if n < 1 {
			return nil, invalid("n", "must be at least 1")
		}
		r.N = n
	}
	capSpan, capName := maxTokens, "max_tokens"
	if e == EndpointChat && maxCompletion.ok() && !isNull(body, maxCompletion) {
		capSpan, capName = maxCompletion, "max_completion_tokens"
	}
	if v, set, err := optInt(body, capSpan, capName); err != nil {
		return nil, err
	} else if set {
		if v < 1 {
			return nil, invalid(capName, "must be at least 1")
		}
		r.MaxTokens = v
	}
	if e == EndpointChat && capName == "max_completion_tokens" {
		// max_tokens is still checked for its type, as vLLM would.
		if _, _, err := optInt(body, maxTokens, "max_tokens"); err != nil {
			return nil, err
		}
	}
	minTok, _, err := optInt(body, minTokens, "min_tokens")
	if err != nil {
		return nil, err
	}
	if minTok < 0 {
		return nil, invalid("min_tokens", "must be at least 0")
	}
	r.MinTokens = minTok
	prio, _, err := optSignedInt(body, priority, "priority")
	if err != nil {
		return nil, err
	}
	r.Priority = prio
	if si, set, err := optInt(body, streamInterval, "stream_interval"); err != nil {
		return nil, err
	} else if set {
		if si < 1 {
			return nil, invalid("stream_interval", "must be at least 1")
		}
		r.StreamInterval = si
	}
	if r.ContinueFinalMessage, err = optBool(body, r.continueFinalMessage, "continue_final_message", false); err != nil {
		return nil, err
	}
	r.mediaTokens = opts.MediaTokensPerPart
	switch e {
	case EndpointChat:
		if r.prompt.ok() {
			// vLLM ignores unknown fields; so do we.
			r.prompt = span{}
		}
		if err := r.countChat(opts); err != nil {
			return nil, err
		}
	case EndpointCompletions:
		if err := r.countCompletions(opts); err != nil {
			return nil, err
		}
	}
	return r, nil
}

func isNull(b []byte, s span) bool { return bytes.Equal(b[s.start:s.end], []byte("null")) }

func optBool(b []byte, s span, name string, def bool) (bool, error) {
	if !s.ok() || isNull(b, s) {
		return def, nil
	}
	switch string(b[s.start:s.end]) {
	case "true":
		return true, nil
	case "false":
		return false, nil
	}
	return false, invalid(name, "must be a boolean")
}

func optSignedInt(b []byte, s span, name string) (int, bool, error) {
	if !s.ok() || isNull(b, s) {
		return 0, false, nil
	}
	v, ok := parseInt(b[s.start:s.end])
	if !ok {
		// vLLM (pydantic) accepts integral floats such as 5.0.
		f, err := strconv.ParseFloat(string(b[s.start:s.end]), 64)
		if err != nil || f != float64(int64(f)) {
			return 0, false, invalid(name, "must be an integer")
		}
		v = int64(f)
	}
	if v > maxCount || v < -maxCount {
		return 0, false, invalid(name, "is out of range")
	}
	return int(v), true, nil
}

func optInt(b []byte, s span, name string) (int, bool, error) {
	v, set, err := optSignedInt(b, s, name)
	return v, set, err
}
