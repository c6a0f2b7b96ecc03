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

// appendUsage appends vLLM's usage object. With details
// (--enable-prompt-tokens-details) prompt_tokens_details carries
// cached_tokens, 0 without a prefix cache (completion/serving.py).
func appendUsage(b []byte, prompt, completion int, details bool) []byte {
	b = append(b, `{"prompt_tokens":`...)
	b = appendInt(b, prompt)
	b = append(b, `,"total_tokens":`...)
	b = appendInt(b, prompt+completion)
	b = append(b, `,"completion_tokens":`...)
	b = appendInt(b, completion)
	if details {
		b = append(b, `,"prompt_tokens_details":{"cached_tokens":0}}`...)
	} else {
		b = append(b, `,"prompt_tokens_details":null}`...)
	}
	return b
}

// simLogprob is the logprob the simulator reports for every token.
const simLogprob = "-0.5"

// appendLogprobs appends the logprobs of tokens [from, to) of a sequence:
// chat's {"content": [...]} or completions' four parallel lists
// (completion/serving.py _create_completion_logprobs).
func appendLogprobs(b []byte, k kind, key uint64, from, to int) []byte {
	if k == kindChat {
		b = append(b, `{"content":[`...)
		for i := from; i < to; i++ {
			if i > from {
				b = append(b, ',')
			}
			w := tokenText(key, i)
			b = append(b, `{"token":`...)
			b = appendJSONString(b, w)
			b = append(b, `,"logprob":`+simLogprob+`,"bytes":[`...)
			for j := 0; j < len(w); j++ {
				if j > 0 {
					b = append(b, ',')
				}
				b = appendInt(b, int(w[j]))
			}
			b = append(b, `],"top_logprobs":[]}`...)
		}
		return append(b, "]}"...)
	}
	var off, lps, toks, tops []byte
	pos := 0
	for i := from; i < to; i++ {
		if i > from {
			off, lps, toks, tops = append(off, ','), append(lps, ','), append(toks, ','), append(tops, ',')
		}
		w := tokenText(key, i)
		off = appendInt(off, pos)
		pos += len(w)
		lps = append(lps, simLogprob...)
		toks = appendJSONString(toks, w)
		tops = append(tops, '{')
		tops = appendJSONString(tops, w)
		tops = append(tops, ":"+simLogprob+"}"...)
	}
	b = append(b, `{"text_offset":[`...)
	b = append(b, off...)
	b = append(b, `],"token_logprobs":[`...)
	b = append(b, lps...)
	b = append(b, `],"tokens":[`...)
	b = append(b, toks...)
	b = append(b, `],"top_logprobs":[`...)
	b = append(b, tops...)
	return append(b, "]}"...)
}

// tokenText is token i of a sequence as its text delta: the word, with the
// separating space before every word but the first.
func tokenText(key uint64, i int) string {
	if i == 0 {
		return wordAt(key, i)
	}
	return " " + wordAt(key, i)
}

// appendPromptLogprobs appends prompt_logprobs for a prompt of n tokens:
// null for the first token (nothing precedes it), then one entry per
// token keyed by a token id, or null when not requested.
func appendPromptLogprobs(b []byte, on bool, n int) []byte {
	if !on {
		return append(b, "null"...)
	}
	b = append(b, "[null"...)
	for i := 1; i < n; i++ {
		b = append(b, `,{"`...)
		b = appendInt(b, i%vocabSize)
		b = append(b, `":{"logprob":`+simLogprob+`,"rank":1,"decoded_token":"t"}}`...)
	}
	return append(b, ']')
}

// chunkEncoder builds one response's SSE chunks by appending to a reused
// buffer. Not safe for concurrent use.
type chunkEncoder struct {
	kind     kind
	logprobs bool   // per-token logprobs in each chunk
	details  bool   // prompt_tokens_details in the final usage
	fp       string // system_fingerprint, "" for none
	fpOnLast bool   // on each choice's last chunk (no usage chunk follows)
	prefix   []byte // {"id":...,"object":...,"created":...,"model":...,"choices":[
	buf      []byte
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
	return &chunkEncoder{kind: k, prefix: p, buf: make([]byte, 0, 512)}
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
		b = appendUsage(b, prompt, 0, false)
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
		b = append(b, `"},"logprobs":`...)
	} else {
		b = append(b, `","logprobs":`...)
	}
	if c.logprobs {
		b = appendLogprobs(b, c.kind, key, from, to)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"finish_reason":`...)
	if finish == "" {
		b = append(b, `null,"stop_reason":null}]`...)
	} else {
		b = append(b, '"')
		b = append(b, finish...)
		b = append(b, `","stop_reason":null}]`...)
		if c.fpOnLast && c.fp != "" {
			b = append(b, `,"system_fingerprint":`...)
			b = appendJSONString(b, c.fp)
		}
	}
	switch {
	case usage:
		b = append(b, `,"usage":`...)
		b = appendUsage(b, prompt, to, false)
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
	b = appendUsage(b, prompt, completion, c.details)
	if c.fp != "" {
		b = append(b, `,"system_fingerprint":`...)
		b = appendJSONString(b, c.fp)
	}
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
