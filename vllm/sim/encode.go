package sim

import (
	"strconv"
	"unicode/utf8"
)

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string; invalid UTF-8 becomes U+FFFD.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}

func appendInt(b []byte, v int) []byte { return strconv.AppendInt(b, int64(v), 10) }

// appendUsage appends vLLM's usage object; cached (when given and >= 0) is
// prompt_tokens_details.cached_tokens, else the details are null.
func appendUsage(b []byte, prompt, completion int, cached ...int) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = appendInt(b, prompt)
	b = append(b, `,"total_tokens":`...)
	b = appendInt(b, prompt+completion)
	b = append(b, `,"completion_tokens":`...)
	b = appendInt(b, completion)
	if len(cached) > 0 && cached[0] >= 0 {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":`...)
		b = appendInt(b, cached[0])
		return append(b, "}}"...)
	}
	b = append(b, `,"prompt_tokens_details":null}`...)
	return b
}

// chunkEncoder builds one response's SSE chunks by appending to a reused
// buffer. Not safe for concurrent use.
type chunkEncoder struct {
	kind   kind
	prefix []byte // {"id":...,"object":...,"created":...,"model":...,"choices":[
	buf    []byte
	cached int // the final usage's cached_tokens; -1: details null
}

func newChunkEncoder(k kind, id string, created int64, model string) *chunkEncoder {
	var p []byte
	p = append(p, `{"id":`...)
	obj := "chat.completion.chunk"
	if k == kindChat {
		p = appendJSONString(p, "chatcmpl-"+id)
	} else {
		p = appendJSONString(p, "cmpl-"+id)
		obj = "text_completion"
	}
	p = append(p, `,"object":"`...)
	p = append(p, obj...)
	p = append(p, `","created":`...)
	p = strconv.AppendInt(p, created, 10)
	p = append(p, `,"model":`...)
	p = appendJSONString(p, model)
	p = append(p, `,"choices":[`...)
	return &chunkEncoder{kind: k, prefix: p, buf: make([]byte, 0, 512), cached: -1}
}

// roleChunk appends the chat role chunk of a choice.
func (c *chunkEncoder) roleChunk(index int, usage bool, prompt int) {
	b := c.buf
	b = append(b, "data: "...)
	b = append(b, c.prefix...)
	b = append(b, `{"index":`...)
	b = appendInt(b, index)
	b = append(b, `,"delta":{"role":"assistant","content":""},"logprobs":null,"finish_reason":null}]`...)
	if usage {
		b = append(b, `,"usage":`...)
		b = appendUsage(b, prompt, 0)
	}
	b = append(b, "}\n\n"...)
	c.buf = b
}

// tokenChunk appends a content chunk carrying tokens [from, to) of a
// sequence; finish is "" while it runs. With usage, it carries the
// choice's cumulative usage (continuous_usage_stats).
func (c *chunkEncoder) tokenChunk(index int, key uint64, from, to int, finish string, usage bool, prompt int) {
	b := c.buf
	b = append(b, "data: "...)
	b = append(b, c.prefix...)
	b = append(b, `{"index":`...)
	b = appendInt(b, index)
	if c.kind == kindChat {
		b = append(b, `,"delta":{"content":"`...)
	} else {
		b = append(b, `,"text":"`...)
	}
	b = appendOutputText(b, key, from, to)
	if c.kind == kindChat {
		b = append(b, `"},"logprobs":null,"finish_reason":`...)
	} else {
		b = append(b, `","logprobs":null,"finish_reason":`...)
	}
	if finish == "" {
		b = append(b, `null,"stop_reason":null}]`...)
	} else {
		b = append(b, '"')
		b = append(b, finish...)
		b = append(b, `","stop_reason":null}]`...)
	}
	switch {
	case usage:
		b = append(b, `,"usage":`...)
		b = appendUsage(b, prompt, to)
	case c.kind == kindCompletion:
		b = append(b, `,"usage":null`...)
	}
	b = append(b, "}\n\n"...)
	c.buf = b
}

// usageChunk appends the final choices: [] chunk of include_usage.
func (c *chunkEncoder) usageChunk(prompt, completion int) {
	b := c.buf
	b = append(b, "data: "...)
	b = append(b, c.prefix...)
	b = append(b, `],"usage":`...)
	b = appendUsage(b, prompt, completion, c.cached)
	b = append(b, "}\n\n"...)
	c.buf = b
}

// errorEvent appends a mid-stream error event.
func (c *chunkEncoder) errorEvent(e *apiError) {
	b := c.buf
	b = append(b, "data: "...)
	b = appendErrorJSON(b, e)
	b = append(b, "\n\n"...)
	c.buf = b
}

func (c *chunkEncoder) done() { c.buf = append(c.buf, "data: [DONE]\n\n"...) }
