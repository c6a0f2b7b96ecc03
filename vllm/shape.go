package vllm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
)

// ShapeChunk appends to dst what a streaming client gets for upstream event
// ev, given the client's parsed request r, and reports whether anything is to
// be sent. Upstream always streams with include_usage and
// continuous_usage_stats (see [Request.Rewrite]); ShapeChunk removes what the
// client did not ask for:
//   - the final "choices": [] usage chunk is dropped unless the client's
//     stream_options asked for usage (include_usage defaults to true once
//     stream_options is present);
//   - per-chunk usage is removed unless the client asked for
//     continuous_usage_stats: the member is deleted on chat chunks and set to
//     null on completions chunks, as vLLM itself sends them.
//
// Everything else (including [DONE] and SSE error events) passes through
// byte for byte. ShapeChunk allocates only if dst must grow.
func ShapeChunk(dst []byte, ev Event, r *Request) ([]byte, bool) {
	switch {
	case ev.Done || ev.Err != nil:
		return append(dst, ev.Raw...), true
	case ev.Final:
		if r.HasStreamOptions && r.IncludeUsage {
			return append(dst, ev.Raw...), true
		}
		return dst, false
	case !ev.HasUsage || r.ContinuousUsage:
		return append(dst, ev.Raw...), true
	}
	d := ev.Data
	at := ev.at // parseChunk's scan (one JSON pass per chunk)
	if !at.ok {
		at = findUsage(d)
	}
	if !at.found {
		return append(dst, ev.Raw...), true
	}
	um := member{keyStart: at.keyStart, valStart: at.valStart, valEnd: at.valEnd}
	prevEnd, nextStart := at.prevEnd, at.nextStart
	dst = append(dst, "data: "...)
	if r.Endpoint == EndpointCompletions {
		dst = append(dst, d[:um.valStart]...)
		dst = append(dst, "null"...)
		dst = append(dst, d[um.valEnd:]...)
	} else {
		switch {
		case nextStart >= 0: // drop "usage":{…}, up to the next member
			dst = append(dst, d[:um.keyStart]...)
			dst = append(dst, d[nextStart:]...)
		case prevEnd >= 0: // last member: drop from the previous member's end
			dst = append(dst, d[:prevEnd]...)
			dst = append(dst, d[um.valEnd:]...)
		default: // only member
			dst = append(dst, d[:um.keyStart]...)
			dst = append(dst, d[um.valEnd:]...)
		}
	}
	return append(dst, "\n\n"...), true
}

// findUsage scans d for its first top-level "usage" member (for an Event
// that parseChunk did not fill in).
func findUsage(d []byte) usageAt {
	at := usageAt{ok: true, prevEnd: -1, nextStart: -1}
	_ = eachMember(d, 0, func(m member) bool {
		if at.found {
			at.nextStart = m.keyStart
			return false
		}
		if m.keyIs(d, "usage") {
			at.found, at.keyStart, at.valStart, at.valEnd = true, m.keyStart, m.valStart, m.valEnd
			return true
		}
		at.prevEnd = m.valEnd
		return true
	})
	return at
}

// Assembler rebuilds vLLM's non-streamed response body (chat.completion or
// text_completion) from the chunks of an upstream stream, for clients that
// did not ask to stream. Feed it every event with Add, then call Body. It is
// not safe for concurrent use.
type Assembler struct {
	endpoint Endpoint
	id       string
	created  int64
	model    string
	choices  []*asmChoice
	final    *asmUsage
	done     bool
	// last cumulative usage, if the final chunk never came
	prompt    int
	perChoice map[int]int
	chunks    int
	// whole is a non-streamed upstream body, passed through.
	whole []byte
	// fingerprint is the usage chunk's raw system_fingerprint.
	fingerprint []byte
	// scratch is reused by Add; its Choices' backing array survives.
	scratch asmChunk
	arena   asmArena
}

// NewAssembler returns an Assembler for endpoint e.
func NewAssembler(e Endpoint) *Assembler {
	return &Assembler{endpoint: e, perChoice: map[int]int{}}
}

type asmTool struct {
	index      int
	id, typ    string
	name, args bytes.Buffer
}

type asmChoice struct {
	index                 int
	role                  string
	content, reasoning    bytes.Buffer
	reasoningNew          bytes.Buffer
	hasContent, hasReason bool
	hasReasonNew          bool
	text                  bytes.Buffer
	tools                 []*asmTool
	lpContent             []json.RawMessage // chat logprobs.content elements
	lpOffset, lpTokLP     []json.RawMessage // completions logprobs lists
	lpTokens, lpTop       []json.RawMessage
	hasLogprobs           bool
	finishReason          json.RawMessage
	stopReason            json.RawMessage
	hasStopReason         bool
}

type asmUsage struct {
	PromptTokens        int             `json:"prompt_tokens"`
	CompletionTokens    int             `json:"completion_tokens"`
	TotalTokens         int             `json:"total_tokens"`
	PromptTokensDetails json.RawMessage `json:"prompt_tokens_details"`
}

// asmChunk is the part of a chunk the Assembler reads. decodeChunkFast
// fills it for the common case; anything unusual goes through
// encoding/json with the same types, so both paths agree.
type asmChunk struct {
	ID      string        `json:"id"`
	Created int64         `json:"created"`
	Model   string        `json:"model"`
	Choices []asmChoiceIn `json:"choices"`
	Usage   *asmUsage     `json:"usage"`
}

type asmChoiceIn struct {
	Index        int             `json:"index"`
	Delta        *asmDelta       `json:"delta"`
	Text         *string         `json:"text"`
	Logprobs     json.RawMessage `json:"logprobs"`
	FinishReason json.RawMessage `json:"finish_reason"`
	StopReason   json.RawMessage `json:"stop_reason"`
}

type asmDelta struct {
	Role             *string         `json:"role"`
	Content          *string         `json:"content"`
	ReasoningContent *string         `json:"reasoning_content"`
	Reasoning        *string         `json:"reasoning"`
	ToolCalls        []asmToolCallIn `json:"tool_calls"`
}

type asmToolCallIn struct {
	Index    int          `json:"index"`
	ID       *string      `json:"id"`
	Type     *string      `json:"type"`
	Function *asmFunction `json:"function"`
}

type asmFunction struct {
	Name      *string `json:"name"`
	Arguments *string `json:"arguments"`
}

// maxAsmChoices bounds the choices an Assembler tracks.
const maxAsmChoices = 4096

func (a *Assembler) choice(i int) *asmChoice {
	for _, c := range a.choices {
		if c.index == i {
			return c
		}
	}
	c := &asmChoice{index: i, role: "assistant"}
	a.choices = append(a.choices, c)
	return c
}

// Add feeds one event. An SSE error event is returned as its
// *UpstreamError; a chunk that is not valid JSON is an error.
func (a *Assembler) Add(ev Event) error {
	if ev.Err != nil {
		return ev.Err
	}
	if ev.Whole {
		// A non-streamed upstream response is the client's body as is.
		a.whole, a.done = bytes.Clone(ev.Raw), true
		if ev.HasUsage {
			a.final = &asmUsage{PromptTokens: ev.Usage.PromptTokens, CompletionTokens: ev.Usage.CompletionTokens}
		}
		return nil
	}
	if ev.Done {
		a.done = true
		return nil
	}
	a.scratch = asmChunk{Choices: a.scratch.Choices[:0]}
	ch := &a.scratch
	if !decodeChunkFast(ev.Data, ch, &a.arena) {
		*ch = asmChunk{}
		if err := json.Unmarshal(ev.Data, ch); err != nil {
			return fmt.Errorf("assemble: decode chunk: %w", err)
		}
	}
	if a.chunks == 0 || a.id == "" {
		a.id, a.created, a.model = ch.ID, ch.Created, ch.Model
	}
	a.chunks++
	if ch.Usage != nil {
		if len(ch.Choices) == 0 {
			u := *ch.Usage
			a.final = &u
			a.fingerprint = bytes.Clone(memberValue(ev.Data, "system_fingerprint"))
		} else {
			a.prompt = ch.Usage.PromptTokens
			i := ch.Choices[0].Index
			a.perChoice[i] = max(a.perChoice[i], ch.Usage.CompletionTokens)
		}
	}
	for _, cc := range ch.Choices {
		if cc.Index < 0 || (len(a.choices) >= maxAsmChoices && !slices.ContainsFunc(a.choices, func(c *asmChoice) bool { return c.index == cc.Index })) {
			return fmt.Errorf("assemble: choice index %d out of range", cc.Index)
		}
		c := a.choice(cc.Index)
		if d := cc.Delta; d != nil {
			if d.Role != nil && *d.Role != "" {
				c.role = *d.Role
			}
			if d.Content != nil {
				c.content.WriteString(*d.Content)
				c.hasContent = true
			}
			if d.ReasoningContent != nil {
				c.reasoning.WriteString(*d.ReasoningContent)
				c.hasReason = true
			}
			if d.Reasoning != nil {
				c.reasoningNew.WriteString(*d.Reasoning)
				c.hasReasonNew = true
			}
			for _, tc := range d.ToolCalls {
				var t *asmTool
				for _, x := range c.tools {
					if x.index == tc.Index {
						t = x
					}
				}
				if t == nil {
					if len(c.tools) >= maxAsmChoices {
						return fmt.Errorf("assemble: too many tool calls")
					}
					t = &asmTool{index: tc.Index, typ: "function"}
					c.tools = append(c.tools, t)
				}
				if tc.ID != nil && *tc.ID != "" && t.id == "" {
					t.id = *tc.ID
				}
				if tc.Type != nil && *tc.Type != "" {
					t.typ = *tc.Type
				}
				if f := tc.Function; f != nil {
					if f.Name != nil {
						t.name.WriteString(*f.Name)
					}
					if f.Arguments != nil {
						t.args.WriteString(*f.Arguments)
					}
				}
			}
		}
		if cc.Text != nil {
			c.text.WriteString(*cc.Text)
		}
		if len(cc.Logprobs) > 0 && string(cc.Logprobs) != "null" {
			if err := c.addLogprobs(a.endpoint, cc.Logprobs); err != nil {
				return err
			}
		}
		if len(cc.FinishReason) > 0 && string(cc.FinishReason) != "null" {
			c.finishReason = cc.FinishReason
		}
		if len(cc.StopReason) > 0 {
			if string(cc.StopReason) != "null" || !c.hasStopReason {
				c.stopReason = cc.StopReason
			}
			c.hasStopReason = true
		}
	}
	return nil
}

func (c *asmChoice) addLogprobs(e Endpoint, raw json.RawMessage) error {
	c.hasLogprobs = true
	if e == EndpointChat {
		var lp struct {
			Content []json.RawMessage `json:"content"`
		}
		if err := json.Unmarshal(raw, &lp); err != nil {
			return fmt.Errorf("assemble: logprobs: %w", err)
		}
		c.lpContent = append(c.lpContent, lp.Content...)
		return nil
	}
	var lp struct {
		TextOffset    []json.RawMessage `json:"text_offset"`
		TokenLogprobs []json.RawMessage `json:"token_logprobs"`
		Tokens        []json.RawMessage `json:"tokens"`
		TopLogprobs   []json.RawMessage `json:"top_logprobs"`
	}
	if err := json.Unmarshal(raw, &lp); err != nil {
		return fmt.Errorf("assemble: logprobs: %w", err)
	}
	c.lpOffset = append(c.lpOffset, lp.TextOffset...)
	c.lpTokLP = append(c.lpTokLP, lp.TokenLogprobs...)
	c.lpTokens = append(c.lpTokens, lp.Tokens...)
	c.lpTop = append(c.lpTop, lp.TopLogprobs...)
	return nil
}

// Usage returns the final usage if it arrived, else the last cumulative one.
func (a *Assembler) Usage() Usage {
	if a.final != nil {
		return Usage{PromptTokens: a.final.PromptTokens, CompletionTokens: a.final.CompletionTokens, Final: true, Known: true, Choices: len(a.perChoice)}
	}
	u := Usage{PromptTokens: a.prompt, Known: len(a.perChoice) > 0, Choices: len(a.perChoice)}
	for _, n := range a.perChoice {
		u.CompletionTokens += n
	}
	return u
}

// Body returns the assembled response body, laid out as vLLM lays out its
// non-streamed responses (field order and nulls included). It returns an
// error wrapping ErrStreamCut if [DONE] never arrived.
func (a *Assembler) Body() ([]byte, error) {
	if !a.done {
		return nil, fmt.Errorf("assemble: %w", ErrStreamCut)
	}
	if a.whole != nil {
		return a.whole, nil
	}
	slices.SortFunc(a.choices, func(x, y *asmChoice) int { return x.index - y.index })
	var b bytes.Buffer
	obj := "chat.completion"
	if a.endpoint == EndpointCompletions {
		obj = "text_completion"
	}
	b.WriteString(`{"id":`)
	writeJSONString(&b, a.id)
	b.WriteString(`,"object":"` + obj + `","created":`)
	b.WriteString(strconv.FormatInt(a.created, 10))
	b.WriteString(`,"model":`)
	writeJSONString(&b, a.model)
	b.WriteString(`,"choices":[`)
	for i, c := range a.choices {
		if i > 0 {
			b.WriteByte(',')
		}
		if a.endpoint == EndpointChat {
			c.writeChat(&b)
		} else {
			c.writeCompletion(&b)
		}
	}
	b.WriteString(`],"service_tier":null,"system_fingerprint":`)
	if len(a.fingerprint) > 0 {
		b.Write(a.fingerprint)
	} else {
		b.WriteString("null")
	}
	b.WriteString(`,"usage":`)
	u := a.Usage()
	b.WriteString(`{"prompt_tokens":` + strconv.Itoa(u.PromptTokens) +
		`,"total_tokens":` + strconv.Itoa(u.PromptTokens+u.CompletionTokens) +
		`,"completion_tokens":` + strconv.Itoa(u.CompletionTokens) + `,"prompt_tokens_details":`)
	if a.final != nil && len(a.final.PromptTokensDetails) > 0 {
		b.Write(a.final.PromptTokensDetails)
	} else {
		b.WriteString("null")
	}
	b.WriteByte('}')
	if a.endpoint == EndpointChat {
		b.WriteString(`,"prompt_logprobs":null`)
	}
	b.WriteString(`,"kv_transfer_params":null}`)
	return b.Bytes(), nil
}

// writeJSONString writes s as pydantic's model_dump_json does: raw UTF-8, no
// HTML escaping, short escapes for \b \f \n \r \t, \u00XX for other
// control characters.
func writeJSONString(b *bytes.Buffer, s string) {
	const hex = "0123456789abcdef"
	b.WriteByte('"')
	start := 0
	for i := 0; i < len(s); i++ {
		c := s[i]
		if c >= 0x20 && c != '"' && c != '\\' {
			continue
		}
		b.WriteString(s[start:i])
		switch c {
		case '"':
			b.WriteString(`\"`)
		case '\\':
			b.WriteString(`\\`)
		case '\b':
			b.WriteString(`\b`)
		case '\f':
			b.WriteString(`\f`)
		case '\n':
			b.WriteString(`\n`)
		case '\r':
			b.WriteString(`\r`)
		case '\t':
			b.WriteString(`\t`)
		default:
			b.WriteString(`\u00`)
			b.WriteByte(hex[c>>4])
			b.WriteByte(hex[c&0xf])
		}
		start = i + 1
	}
	b.WriteString(s[start:])
	b.WriteByte('"')
}

func writeRawOrNull(b *bytes.Buffer, r json.RawMessage) {
	if len(r) == 0 {
		b.WriteString("null")
		return
	}
	b.Write(r)
}

func writeRawList(b *bytes.Buffer, xs []json.RawMessage) {
	b.WriteByte('[')
	for i, x := range xs {
		if i > 0 {
			b.WriteByte(',')
		}
		b.Write(x)
	}
	b.WriteByte(']')
}

func (c *asmChoice) writeChat(b *bytes.Buffer) {
	b.WriteString(`{"index":` + strconv.Itoa(c.index) + `,"message":{"role":`)
	writeJSONString(b, c.role)
	b.WriteString(`,"content":`)
	toolsOnly := len(c.tools) > 0 && c.content.Len() == 0
	if c.hasContent && !toolsOnly {
		writeJSONString(b, c.content.String())
	} else {
		b.WriteString("null")
	}
	// Current vLLM's message (chat_completion/protocol.py): tool_calls only
	// when there are some, the reasoning text as "reasoning".
	b.WriteString(`,"refusal":null,"annotations":null,"audio":null,"function_call":null`)
	if len(c.tools) > 0 {
		b.WriteString(`,"tool_calls":[`)
	}
	slices.SortFunc(c.tools, func(x, y *asmTool) int { return x.index - y.index })
	for i, t := range c.tools {
		if i > 0 {
			b.WriteByte(',')
		}
		b.WriteString(`{"id":`)
		writeJSONString(b, t.id)
		b.WriteString(`,"type":`)
		writeJSONString(b, t.typ)
		b.WriteString(`,"function":{"name":`)
		writeJSONString(b, t.name.String())
		b.WriteString(`,"arguments":`)
		writeJSONString(b, t.args.String())
		b.WriteString(`}}`)
	}
	if len(c.tools) > 0 {
		b.WriteByte(']')
	}
	b.WriteString(`,"reasoning":`)
	switch {
	case c.hasReasonNew:
		writeJSONString(b, c.reasoningNew.String())
	case c.hasReason:
		writeJSONString(b, c.reasoning.String())
	default:
		b.WriteString("null")
	}
	b.WriteString(`},"logprobs":`)
	if c.hasLogprobs {
		b.WriteString(`{"content":`)
		writeRawList(b, c.lpContent)
		b.WriteByte('}')
	} else {
		b.WriteString("null")
	}
	b.WriteString(`,"finish_reason":`)
	writeRawOrNull(b, c.finishReason)
	b.WriteString(`,"stop_reason":`)
	writeRawOrNull(b, c.stopReason)
	b.WriteByte('}')
}

func (c *asmChoice) writeCompletion(b *bytes.Buffer) {
	b.WriteString(`{"index":` + strconv.Itoa(c.index) + `,"text":`)
	writeJSONString(b, c.text.String())
	b.WriteString(`,"logprobs":`)
	if c.hasLogprobs {
		b.WriteString(`{"text_offset":`)
		writeRawList(b, c.lpOffset)
		b.WriteString(`,"token_logprobs":`)
		writeRawList(b, c.lpTokLP)
		b.WriteString(`,"tokens":`)
		writeRawList(b, c.lpTokens)
		b.WriteString(`,"top_logprobs":`)
		writeRawList(b, c.lpTop)
		b.WriteByte('}')
	} else {
		b.WriteString("null")
	}
	b.WriteString(`,"finish_reason":`)
	writeRawOrNull(b, c.finishReason)
	b.WriteString(`,"stop_reason":`)
	writeRawOrNull(b, c.stopReason)
	b.WriteString(`,"prompt_logprobs":null}`)
}
