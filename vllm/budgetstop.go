package vllm

import (
	"encoding/json"
	"strconv"
)

// A generation Sluice stopped at a budget (docs/LEDGER.md §12): the client
// gets what was generated, every unfinished choice ending with
// finish_reason "length", as vLLM ends a choice that reached max_tokens.

var finishLength = json.RawMessage(`"length"`)

// EndAtLimit ends an assembly cut short by Sluice: every choice of
// 0..choices-1 that has no finish_reason gets "length", and the body is
// assembled from what arrived (Body then succeeds without [DONE]).
func (a *Assembler) EndAtLimit(choices int) {
	for i := range choices {
		a.choice(i)
	}
	for _, c := range a.choices {
		if len(c.finishReason) == 0 || string(c.finishReason) == "null" {
			c.finishReason = finishLength
		}
	}
	a.done = true
}

// Unfinished returns the indices in 0..choices-1 of the choices that have
// not reported a finish_reason.
func (s *Stream) Unfinished(choices int) []int {
	var out []int
	for i := range choices {
		if i >= len(s.finished) || !s.finished[i] {
			out = append(out, i)
		}
	}
	return out
}

// AppendLimitChunk appends the SSE chunk that ends the unfinished choices
// of a stream Sluice stopped, with finish_reason "length", in the shape of
// endpoint e's chunks, and the extra member "sluice" (a JSON object, raw)
// saying why; then "data: [DONE]". id, created and model repeat the
// stream's.
func AppendLimitChunk(b []byte, e Endpoint, id string, created int64, model string, unfinished []int, sluice []byte) []byte {
	obj := "chat.completion.chunk"
	if e == EndpointCompletions {
		obj = "text_completion"
	}
	b = append(b, `data: {"id":`...)
	b = strconv.AppendQuote(b, id)
	b = append(b, `,"object":"`+obj+`","created":`...)
	b = strconv.AppendInt(b, created, 10)
	b = append(b, `,"model":`...)
	b = strconv.AppendQuote(b, model)
	b = append(b, `,"choices":[`...)
	for k, i := range unfinished {
		if k > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = strconv.AppendInt(b, int64(i), 10)
		if e == EndpointCompletions {
			b = append(b, `,"text":""`...)
		} else {
			b = append(b, `,"delta":{}`...)
		}
		b = append(b, `,"logprobs":null,"finish_reason":"length"}`...)
	}
	b = append(b, `],"sluice":`...)
	b = append(b, sluice...)
	b = append(b, "}\n\ndata: [DONE]\n\n"...)
	return b
}

// ChunkMeta reads a chunk's id, created and model (for a chunk Sluice
// writes into the same stream); ok is false when data is not such a chunk.
func ChunkMeta(data []byte) (id string, created int64, model string, ok bool) {
	var m struct {
		ID      string `json:"id"`
		Created int64  `json:"created"`
		Model   string `json:"model"`
	}
	if json.Unmarshal(data, &m) != nil || m.ID == "" {
		return "", 0, "", false
	}
	return m.ID, m.Created, m.Model, true
}
