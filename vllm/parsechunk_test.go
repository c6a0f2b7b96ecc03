package vllm

import (
	"bytes"
	"reflect"
	"testing"
)

// parseChunkRef is parseChunk before its one-pass choices scan: the
// reference FuzzParseChunk compares it with.
func parseChunkRef(data []byte, ev *Event, replica string) {
	ev.Choice = -1
	emptyChoices := false
	usage := -1
	isErr := false
	at := usageAt{ok: true, prevEnd: -1, nextStart: -1}
	_ = eachMember(data, 0, func(m member) bool {
		switch {
		case at.found:
			if at.nextStart < 0 {
				at.nextStart = m.keyStart
			}
		case m.keyIs(data, "usage"):
			at.found, at.keyStart, at.valStart, at.valEnd = true, m.keyStart, m.valStart, m.valEnd
		default:
			at.prevEnd = m.valEnd
		}
		switch {
		case m.keyIs(data, "choices"):
			if data[m.valStart] != '[' {
				return true
			}
			first := true
			_ = eachElement(data, m.valStart, func(start, _ int) bool {
				first = false
				if data[start] == '{' {
					_ = eachMember(data, start, func(cm member) bool {
						switch {
						case cm.keyIs(data, "index"):
							if n, ok := parseInt(data[cm.valStart:cm.valEnd]); ok && n >= 0 && n < maxCount {
								ev.Choice = int(n)
							}
						case cm.keyIs(data, "finish_reason"):
							ev.Finished = data[cm.valStart] == '"'
						}
						return true
					})
				}
				return false
			})
			emptyChoices = first
		case m.keyIs(data, "usage"):
			if data[m.valStart] == '{' {
				usage = m.valStart
			}
		case m.keyIs(data, "error"):
			if data[m.valStart] == '{' {
				isErr = true
			}
		case m.keyIs(data, "object"):
			if string(data[m.valStart:m.valEnd]) == `"error"` {
				isErr = true
			}
		}
		return true
	})
	if isErr {
		e := &UpstreamError{Replica: replica, InStream: true, Body: bytes.Clone(data)}
		parseErrorBody(data, e)
		e.Status = codeStatus(e.Code, 500)
		ev.Err = e
		return
	}
	if usage >= 0 {
		ev.HasUsage = parseUsage(data, usage, &ev.Usage)
	}
	ev.Final = emptyChoices && ev.HasUsage
	ev.at = at
}

// FuzzParseChunk: the one-pass choices scan reads exactly what the
// three-walk version read, on well-formed and malformed chunks alike.
func FuzzParseChunk(f *testing.F) {
	for _, s := range []string{
		`{"id":"x","choices":[{"index":1,"delta":{"content":"a"},"finish_reason":null}],"usage":{"prompt_tokens":3,"completion_tokens":1}}`,
		`{"choices":[{"index":0,"text":"}","finish_reason":"stop"},{"index":1}],"usage":null}`,
		`{"choices":[],"usage":{"prompt_tokens":3,"completion_tokens":4,"total_tokens":7}}`,
		`{"choices":[7,{"index":2}]}`,
		`{"choices":[{"index":2,"index":-1,"finish_reason":"length","finish_reason":null}]}`,
		`{"choices":[{"index":3}],"choices":[{"finish_reason":"stop"}]}`,
		`{"choices":[{"index":3}],"choices":{}}`,
		`{"choices":[{"index":3},`,
		`{"choices":[{"index":3}] "x":1}`,
		`{"choices":`,
		`{"\u0063hoices":[{"index":4}]}`,
		`{"object":"error","message":"bad","code":400}`,
		`{"error":{"message":"x","code":500}}`,
		`{"choices":[{"index":1,"logprobs":{"content":[{"token":"a","bytes":[97],"top_logprobs":[[[[]]]]}]}}]}`,
	} {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, data string) {
		var got, want Event
		parseChunk([]byte(data), &got, "r")
		parseChunkRef([]byte(data), &want, "r")
		if (got.Err == nil) != (want.Err == nil) {
			t.Fatalf("%q: error events differ: %v vs %v", data, got.Err, want.Err)
		}
		got.Err, want.Err = nil, nil
		if !reflect.DeepEqual(got, want) {
			t.Fatalf("%q:\n one pass %+v\nreference %+v", data, got, want)
		}
	})
}
