package vllm

import (
	"bytes"
	"encoding/json"
	"strings"
	"unicode/utf8"
)

// decodeChunkFast decodes a stream chunk into ch without encoding/json, for
// the shapes vLLM sends. It reports false, leaving ch in an unspecified
// state, whenever its result could differ from json.Unmarshal's: invalid
// JSON, a value of an unexpected type, a duplicate or escaped key, a key
// that matches a field only case-insensitively, a string with a \u escape
// or invalid UTF-8, or a number that is not a plain integer. The caller
// then decodes with encoding/json, which yields the same value or error.
//
// # Design rationale
//
// Every request goes upstream as a stream, so a non-streamed response is
// re-assembled chunk by chunk; encoding/json's reflection and scanner were
// the largest CPU cost of a small non-streamed request. Retained raw values
// (finish_reason, stop_reason, prompt_tokens_details) are copied, since
// data aliases the Stream's buffer.
func decodeChunkFast(data []byte, ch *asmChunk, ar *asmArena) bool {
	ar.reset()
	if !validJSON(data) {
		return false
	}
	var seen uint8
	ok := true
	if eachMember(data, 0, func(m member) bool {
		v := data[m.valStart:m.valEnd]
		switch k := fastKey(data, m, &seen, "id", "created", "model", "choices", "usage"); k {
		case -1:
			ok = false
		case 0:
			ok = setString(v, &ch.ID)
		case 1:
			ok = setInt(v, &ch.Created)
		case 2:
			ok = setString(v, &ch.Model)
		case 3:
			ok = decodeChoices(data, m.valStart, v, ch, ar)
		case 4:
			ok = decodeUsage(data, m.valStart, v, ch, ar)
		}
		return ok
	}) != nil {
		return false
	}
	return ok
}

// fastKey returns the index in names of the member's key, -2 for a key
// encoding/json ignores too, or -1 when the fast path must give up (escaped
// key, case-insensitive match, duplicate). seen tracks names already met.
func fastKey(b []byte, m member, seen *uint8, names ...string) int {
	if m.keyEsc {
		return -1
	}
	k := b[m.keyStart+1 : m.keyEnd-1]
	for i, n := range names {
		if string(k) == n {
			if *seen&(1<<i) != 0 {
				return -1
			}
			*seen |= 1 << i
			return i
		}
	}
	for _, c := range k {
		if c >= utf8.RuneSelf {
			return -1 // encoding/json folds some non-ASCII runes onto ASCII
		}
	}
	for _, n := range names {
		if strings.EqualFold(string(k), n) {
			return -1
		}
	}
	return -2
}

var nullRaw = json.RawMessage("null")[:4:4]

func isNullValue(v []byte) bool { return string(v) == "null" }

// cloneRaw copies a retained raw value; null shares one read-only copy.
func cloneRaw(v []byte) json.RawMessage {
	if isNullValue(v) {
		return nullRaw
	}
	return bytes.Clone(v)
}

// fastString decodes a validated JSON string literal.
func fastString(v []byte) (string, bool) {
	if len(v) < 2 || v[0] != '"' {
		return "", false
	}
	in := v[1 : len(v)-1]
	if !utf8.Valid(in) {
		return "", false
	}
	if bytes.IndexByte(in, '\\') < 0 {
		return string(in), true
	}
	if bytes.Contains(in, []byte(`\u`)) {
		return "", false
	}
	s, err := unquoteJSON(v)
	return s, err == nil
}

func setString(v []byte, dst *string) bool {
	if isNullValue(v) {
		return true
	}
	s, ok := fastString(v)
	*dst = s
	return ok
}

func setStringPtr(v []byte, dst **string, ar *asmArena) bool {
	if isNullValue(v) {
		*dst = nil
		return true
	}
	s, ok := fastString(v)
	if !ok {
		return false
	}
	*dst = ar.str(s)
	return true
}

// asmArena holds what decodeChunkFast points into, reused chunk after
// chunk: nothing outlives one Assembler.Add (strings are copied out, the
// usage by value). A slice that grows leaves earlier pointers on its old
// array, which stays valid.
type asmArena struct {
	strs   []string
	deltas []asmDelta
	usage  asmUsage
}

func (ar *asmArena) reset() {
	clear(ar.strs)
	ar.strs = ar.strs[:0]
	ar.deltas = ar.deltas[:0]
}

func (ar *asmArena) str(s string) *string {
	ar.strs = append(ar.strs, s)
	return &ar.strs[len(ar.strs)-1]
}

func (ar *asmArena) delta() *asmDelta {
	ar.deltas = append(ar.deltas, asmDelta{})
	return &ar.deltas[len(ar.deltas)-1]
}

// setInt decodes a JSON integer into dst; null leaves dst as it is, as
// encoding/json does.
func setInt[T int | int64](v []byte, dst *T) bool {
	if isNullValue(v) {
		return true
	}
	n, ok := parseInt(v)
	*dst = T(n)
	return ok
}

func decodeUsage(data []byte, at int, v []byte, ch *asmChunk, ar *asmArena) bool {
	if isNullValue(v) {
		ch.Usage = nil
		return true
	}
	if v[0] != '{' {
		return false
	}
	ar.usage = asmUsage{}
	u := &ar.usage
	var seen uint8
	ok := true
	err := eachMember(data, at, func(m member) bool {
		mv := data[m.valStart:m.valEnd]
		switch fastKey(data, m, &seen, "prompt_tokens", "completion_tokens", "total_tokens", "prompt_tokens_details") {
		case -1:
			ok = false
		case 0:
			ok = setInt(mv, &u.PromptTokens)
		case 1:
			ok = setInt(mv, &u.CompletionTokens)
		case 2:
			ok = setInt(mv, &u.TotalTokens)
		case 3:
			u.PromptTokensDetails = cloneRaw(mv)
		}
		return ok
	})
	ok = ok && err == nil
	ch.Usage = u
	return ok
}

func decodeChoices(data []byte, at int, v []byte, ch *asmChunk, ar *asmArena) bool {
	if isNullValue(v) {
		ch.Choices = nil
		return true
	}
	if v[0] != '[' {
		return false
	}
	ok := true
	err := eachElement(data, at, func(start, _ int) bool {
		if data[start] != '{' {
			ok = false
			return false
		}
		var c asmChoiceIn
		var seen uint8
		if eachMember(data, start, func(m member) bool {
			mv := data[m.valStart:m.valEnd]
			switch fastKey(data, m, &seen, "index", "delta", "text", "logprobs", "finish_reason", "stop_reason") {
			case -1:
				ok = false
			case 0:
				ok = setInt(mv, &c.Index)
			case 1:
				ok = decodeDelta(data, m.valStart, mv, &c, ar)
			case 2:
				ok = setStringPtr(mv, &c.Text, ar)
			case 3:
				c.Logprobs = mv // read at once by addLogprobs, which copies
			case 4:
				c.FinishReason = cloneRaw(mv)
			case 5:
				c.StopReason = cloneRaw(mv)
			}
			return ok
		}) != nil {
			ok = false
		}
		ch.Choices = append(ch.Choices, c)
		return ok
	})
	ok = ok && err == nil
	if ok && ch.Choices == nil {
		ch.Choices = []asmChoiceIn{}
	}
	return ok
}

func decodeDelta(data []byte, at int, v []byte, c *asmChoiceIn, ar *asmArena) bool {
	if isNullValue(v) {
		c.Delta = nil
		return true
	}
	if v[0] != '{' {
		return false
	}
	d := ar.delta()
	var seen uint8
	ok := true
	err := eachMember(data, at, func(m member) bool {
		mv := data[m.valStart:m.valEnd]
		switch fastKey(data, m, &seen, "role", "content", "reasoning_content", "reasoning", "tool_calls") {
		case -1:
			ok = false
		case 0:
			ok = setStringPtr(mv, &d.Role, ar)
		case 1:
			ok = setStringPtr(mv, &d.Content, ar)
		case 2:
			ok = setStringPtr(mv, &d.ReasoningContent, ar)
		case 3:
			ok = setStringPtr(mv, &d.Reasoning, ar)
		case 4:
			ok = decodeToolCalls(data, m.valStart, mv, d, ar)
		}
		return ok
	})
	ok = ok && err == nil
	c.Delta = d
	return ok
}

func decodeToolCalls(data []byte, at int, v []byte, d *asmDelta, ar *asmArena) bool {
	if isNullValue(v) {
		d.ToolCalls = nil
		return true
	}
	if v[0] != '[' {
		return false
	}
	ok := true
	err := eachElement(data, at, func(start, _ int) bool {
		if data[start] != '{' {
			ok = false
			return false
		}
		var tc asmToolCallIn
		var seen uint8
		if eachMember(data, start, func(m member) bool {
			mv := data[m.valStart:m.valEnd]
			switch fastKey(data, m, &seen, "index", "id", "type", "function") {
			case -1:
				ok = false
			case 0:
				ok = setInt(mv, &tc.Index)
			case 1:
				ok = setStringPtr(mv, &tc.ID, ar)
			case 2:
				ok = setStringPtr(mv, &tc.Type, ar)
			case 3:
				ok = decodeFunction(data, m.valStart, mv, &tc, ar)
			}
			return ok
		}) != nil {
			ok = false
		}
		d.ToolCalls = append(d.ToolCalls, tc)
		return ok
	})
	ok = ok && err == nil
	if ok && d.ToolCalls == nil {
		d.ToolCalls = []asmToolCallIn{}
	}
	return ok
}

func decodeFunction(data []byte, at int, v []byte, tc *asmToolCallIn, ar *asmArena) bool {
	if isNullValue(v) {
		tc.Function = nil
		return true
	}
	if v[0] != '{' {
		return false
	}
	f := &asmFunction{}
	var seen uint8
	ok := true
	err := eachMember(data, at, func(m member) bool {
		mv := data[m.valStart:m.valEnd]
		switch fastKey(data, m, &seen, "name", "arguments") {
		case -1:
			ok = false
		case 0:
			ok = setStringPtr(mv, &f.Name, ar)
		case 1:
			ok = setStringPtr(mv, &f.Arguments, ar)
		}
		return ok
	})
	ok = ok && err == nil
	tc.Function = f
	return ok
}
