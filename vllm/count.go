package vllm

import (
	"bytes"
	"encoding/json"
	"fmt"
	"sync"
)

// The bytes bound of chat and completions prompts (see [CountOptions]).

// bufPool holds scratch buffers for json.Indent when measuring tools.
var bufPool = sync.Pool{New: func() any { return new(bytes.Buffer) }}

// indentedLen returns the length of v re-indented with four spaces per level.
func indentedLen(v []byte) int {
	buf := bufPool.Get().(*bytes.Buffer)
	buf.Reset()
	n := len(v)
	if err := json.Indent(buf, v, "", "    "); err == nil {
		n = max(n, buf.Len())
	}
	if buf.Cap() <= 1<<20 {
		bufPool.Put(buf)
	}
	return n
}

func (r *Request) countChat(o CountOptions) error {
	b := r.body
	if !r.messages.ok() || isNull(b, r.messages) {
		return invalid("messages", "is required")
	}
	if b[r.messages.start] != '[' {
		return invalid("messages", "must be an array")
	}
	total := o.TemplateTokensPerRequest
	idx := 0
	var ferr error
	_ = eachElement(b, r.messages.start, func(start, end int) bool {
		n, err := r.countMessage(idx, span{start, end})
		if err != nil {
			ferr = err
			return false
		}
		total += n + o.TemplateTokensPerMessage
		idx++
		return true
	})
	if ferr != nil {
		return ferr
	}
	if idx == 0 {
		return invalid("messages", "must not be empty")
	}
	if r.tools.ok() && !isNull(b, r.tools) {
		if b[r.tools.start] != '[' {
			return invalid("tools", "must be an array")
		}
		ti := 0
		_ = eachElement(b, r.tools.start, func(start, _ int) bool {
			if b[start] != '{' {
				ferr = invalid(fmt.Sprintf("tools[%d]", ti), "must be an object")
				return false
			}
			ti++
			return true
		})
		if ferr != nil {
			return ferr
		}
		total += indentedLen(b[r.tools.start:r.tools.end])
	}
	total += r.renderedExtras(o)
	r.InputTokens = append(r.inputOne[:0], total)
	return nil
}

// renderedExtras bounds what a chat template renders besides messages and
// tools: RAG documents (each with a message's allowance) and the values of
// chat_template_kwargs, which a template may print anywhere
// (vllm/entrypoints/chat_utils.py apply_hf_chat_template passes both to
// the template). Both are counted as their JSON re-indented, which bounds
// their decoded text and a tojson rendering alike.
func (r *Request) renderedExtras(o CountOptions) int {
	n := r.documentsBound(o)
	if b := r.body; r.chatTemplateKwargs.ok() && !isNull(b, r.chatTemplateKwargs) {
		n += indentedLen(b[r.chatTemplateKwargs.start:r.chatTemplateKwargs.end])
	}
	return n
}

func (r *Request) documentsBound(o CountOptions) int {
	b, n := r.body, 0
	if r.documents.ok() && !isNull(b, r.documents) {
		n += indentedLen(b[r.documents.start:r.documents.end])
		if b[r.documents.start] == '[' {
			_ = eachElement(b, r.documents.start, func(int, int) bool {
				n += o.TemplateTokensPerMessage
				return true
			})
		}
	}
	return n
}

// NeedsExactCount reports a request whose prompt no bytes bound covers: a
// chat_template sent in the body renders whatever it says (vLLM runs it
// only with --trust-request-chat-template), so only the replica's own
// rendering (/tokenize, which takes the template) counts it.
func (r *Request) NeedsExactCount() bool {
	return r.Endpoint == EndpointChat && r.chatTemplate.ok() && !isNull(r.body, r.chatTemplate)
}

// countMessage bounds one message's rendered bytes (without the allowance).
func (r *Request) countMessage(idx int, s span) (int, error) {
	b := r.body
	if b[s.start] != '{' {
		return 0, invalid(fmt.Sprintf("messages[%d]", idx), "must be an object")
	}
	n := 0
	var ferr error
	_ = eachMember(b, s.start, func(m member) bool {
		v := b[m.valStart:m.valEnd]
		switch {
		case m.keyIs(b, "content"):
			c, err := r.countContent(idx, span{m.valStart, m.valEnd})
			if err != nil {
				ferr = err
				return false
			}
			n += c
		case v[0] == '"':
			l, err := stringLen(v)
			if err != nil {
				ferr = invalid(fmt.Sprintf("messages[%d]", idx), "bad string")
				return false
			}
			n += l
		case v[0] == '{' || v[0] == '[':
			// tool_calls and other structured fields are rendered as JSON.
			n += indentedLen(v)
		default:
			n += len(v)
		}
		return true
	})
	return n, ferr
}

func (r *Request) countContent(idx int, s span) (int, error) {
	b := r.body
	v := b[s.start:s.end]
	param := func() string { return fmt.Sprintf("messages[%d].content", idx) }
	switch v[0] {
	case '"':
		l, err := stringLen(v)
		if err != nil {
			return 0, invalid(param(), "bad string")
		}
		return l, nil
	case 'n':
		return 0, nil
	case '[':
	default:
		return 0, invalid(param(), "must be a string, an array of content parts or null")
	}
	n := 0
	pi := 0
	var ferr error
	_ = eachElement(b, s.start, func(start, _ int) bool {
		part := pi
		pp := func() string { return fmt.Sprintf("%s[%d]", param(), part) }
		pi++
		if b[start] != '{' {
			ferr = invalid(pp(), "must be an object")
			return false
		}
		var typ, text span
		_ = eachMember(b, start, func(m member) bool {
			switch {
			case m.keyIs(b, "type"):
				typ = span{m.valStart, m.valEnd}
			case m.keyIs(b, "text"):
				text = span{m.valStart, m.valEnd}
			}
			return true
		})
		t := ""
		if typ.ok() && b[typ.start] == '"' {
			t, _ = unquoteJSON(b[typ.start:typ.end])
		}
		switch {
		case t == "text" || t == "input_text" || (t == "" && text.ok()):
			if !text.ok() || b[text.start] != '"' {
				ferr = invalid(pp()+".text", "must be a string")
				return false
			}
			l, err := stringLen(b[text.start:text.end])
			if err != nil {
				ferr = invalid(pp()+".text", "bad string")
				return false
			}
			n += l
		case t == "":
			ferr = invalid(pp()+".type", "is required")
			return false
		default:
			r.HasMedia = true
			r.MediaParts++
			n += r.mediaTokens
		}
		return true
	})
	return n, ferr
}

func (r *Request) countCompletions(o CountOptions) error {
	b := r.body
	if !r.prompt.ok() || isNull(b, r.prompt) {
		return invalid("prompt", "is required")
	}
	v := b[r.prompt.start:r.prompt.end]
	switch v[0] {
	case '"':
		l, err := stringLen(v)
		if err != nil {
			return invalid("prompt", "bad string")
		}
		r.InputTokens = append(r.inputOne[:0], l+o.SpecialTokensPerPrompt)
		r.textPrompts = append(r.promptOne[:0], r.prompt)
		return nil
	case '[':
	default:
		return invalid("prompt", "must be a string, an array of strings or of token ids")
	}
	// Array: of ints (one token prompt), of strings, or of int arrays.
	var (
		kind  byte // 'i' ints, 's' strings, 'a' arrays
		count int
		ferr  error
	)
	idx := 0
	_ = eachElement(b, r.prompt.start, func(start, end int) bool {
		e := b[start:end]
		var k byte
		switch {
		case e[0] == '"':
			k = 's'
		case e[0] == '[':
			k = 'a'
		case e[0] == '-' || (e[0] >= '0' && e[0] <= '9'):
			k = 'i'
		default:
			ferr = invalid(fmt.Sprintf("prompt[%d]", idx), "must be a string, a token id or an array of token ids")
			return false
		}
		if kind == 0 {
			kind = k
		} else if kind != k {
			ferr = invalid(fmt.Sprintf("prompt[%d]", idx), "mixes element types")
			return false
		}
		switch k {
		case 's':
			l, err := stringLen(e)
			if err != nil {
				ferr = invalid(fmt.Sprintf("prompt[%d]", idx), "bad string")
				return false
			}
			r.InputTokens = append(r.InputTokens, l+o.SpecialTokensPerPrompt)
			r.textPrompts = append(r.textPrompts, span{start, end})
		case 'i':
			if _, ok := parseInt(e); !ok {
				ferr = invalid(fmt.Sprintf("prompt[%d]", idx), "must be an integer token id")
				return false
			}
			count++
		case 'a':
			ids := 0
			_ = eachElement(b, start, func(s2, e2 int) bool {
				if _, ok := parseInt(b[s2:e2]); !ok {
					ferr = invalid(fmt.Sprintf("prompt[%d][%d]", idx, ids), "must be an integer token id")
					return false
				}
				ids++
				return true
			})
			if ferr != nil {
				return false
			}
			if ids == 0 {
				ferr = invalid(fmt.Sprintf("prompt[%d]", idx), "must not be empty")
				return false
			}
			r.InputTokens = append(r.InputTokens, ids)
		}
		idx++
		return true
	})
	if ferr != nil {
		return ferr
	}
	if idx == 0 {
		return invalid("prompt", "must not be empty")
	}
	switch kind {
	case 'i':
		r.InputTokens = append(r.inputOne[:0], count)
		r.InputExact = true
	case 'a':
		r.InputExact = true
	}
	return nil
}
