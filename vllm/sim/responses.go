package sim

import (
	"encoding/json"
	"net/http"
)

// /v1/responses as vLLM serves it (vllm/entrypoints/openai/responses/
// serving.py and protocol.py; the SSE framing "event: <type>\ndata: <json>"
// with no [DONE] is api_router.py's _convert_stream_to_sse_events). The
// request runs as one chat sequence: instructions become a system message,
// input a user message (or the given messages).

type responsesWire struct {
	Model           string          `json:"model"`
	Input           json.RawMessage `json:"input"`
	Instructions    *string         `json:"instructions"`
	MaxOutputTokens *int            `json:"max_output_tokens"`
	Stream          bool            `json:"stream"`
}

// responsesMessages turns input (a string, or a list of messages whose
// content is a string or input_text/output_text parts) into chat messages,
// and counts its media parts (input_image, input_file, …).
func responsesMessages(w *responsesWire) ([]chatMessage, int, *apiError) {
	var msgs []chatMessage
	text := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	if w.Instructions != nil {
		msgs = append(msgs, chatMessage{Role: "system", Content: text(*w.Instructions)})
	}
	var one string
	if json.Unmarshal(w.Input, &one) == nil {
		return append(msgs, chatMessage{Role: "user", Content: text(one)}), 0, nil
	}
	media := 0
	var items []struct {
		Role    string          `json:"role"`
		Content json.RawMessage `json:"content"`
	}
	if err := json.Unmarshal(w.Input, &items); err != nil || len(items) == 0 {
		return nil, 0, badRequest("input", "input must be a string or a non-empty list of messages")
	}
	for i, it := range items {
		if it.Role == "" {
			return nil, 0, badRequest("input", "input[%d].role is required", i)
		}
		var s string
		if json.Unmarshal(it.Content, &s) != nil {
			var parts []contentPart
			if err := json.Unmarshal(it.Content, &parts); err != nil {
				return nil, 0, badRequest("input", "input[%d].content must be a string or a list of parts", i)
			}
			for _, p := range parts {
				s += p.Text
			}
			media += mediaParts([]chatMessage{{Content: it.Content}})
		}
		msgs = append(msgs, chatMessage{Role: it.Role, Content: text(s)})
	}
	return msgs, media, nil
}

func (r *Replica) handleResponses(w http.ResponseWriter, hr *http.Request) {
	r.st.received.Add(1)
	fail := func(e *apiError) {
		r.st.rejected.Add(1)
		writeError(w, e)
	}
	body, e := readBody(w, hr)
	if e != nil {
		fail(e)
		return
	}
	var rw responsesWire
	if err := json.Unmarshal(body, &rw); err != nil {
		fail(badRequest("", "invalid JSON body: %v", err))
		return
	}
	if !r.cfg.serves(rw.Model) {
		fail(newAPIError(http.StatusNotFound, "model", "The model `%s` does not exist.", rw.Model))
		return
	}
	msgs, media, e := responsesMessages(&rw)
	if e != nil {
		fail(e)
		return
	}
	prompt, e := chatPromptTokens(msgs, nil, true, nil)
	if e != nil {
		fail(e)
		return
	}
	prompt += r.cfg.MediaTokens * media
	if prompt >= r.cfg.MaxModelLen {
		fail(badRequest("input_tokens", "This model's maximum context length is %d tokens. However, your request has %d input tokens.", r.cfg.MaxModelLen, prompt))
		return
	}
	capv := r.cfg.MaxModelLen - prompt
	if rw.MaxOutputTokens != nil {
		if *rw.MaxOutputTokens < 1 || prompt+*rw.MaxOutputTokens > r.cfg.MaxModelLen {
			fail(badRequest("max_output_tokens", "max_output_tokens must be between 1 and %d, got %d.", r.cfg.MaxModelLen-prompt, *rw.MaxOutputTokens))
			return
		}
		capv = *rw.MaxOutputTokens
	}
	rk, id := requestKey(hr.Header.Get("X-Request-Id"), body)
	key := mix(mix(uint64(r.cfg.Seed)) ^ mix(uint64(r.cfg.ReplicaIndex)+0x9e37) ^ rk)
	g := &genRequest{kind: kindChat, cap: capv, n: 1}
	sk := mix(key ^ 0xD6E8FEB86659FD93)
	t := outputLen(g, sk, r.cfg.OutputLenMin, r.cfg.OutputLenMax)
	req := newRequest(0, r.clk.Now())
	req.seqs = []*seq{{req: req, prompt: prompt, target: t, key: sk, atCap: t == capv, hashes: r.messagesHashes(msgs)}}
	if e := r.eng.submit(req); e != nil {
		fail(e)
		return
	}
	r.st.admitted.Add(1)
	model := r.cfg.responseModel(rw.Model)
	enc := &respEncoder{id: "resp_" + id, msgID: "msg_" + id, model: model, created: int(r.clk.Now().Unix()), prompt: prompt, s: req.seqs[0]}
	if rw.Stream {
		r.streamResponse(w, hr, req, enc)
		return
	}
	if done, answer := r.awaitOne(hr, req); !done {
		if answer {
			writeError(w, newAPIError(http.StatusInternalServerError, "", "The engine died."))
		}
		return
	}
	writeJSON(w, http.StatusOK, enc.response(nil, true))
	r.st.completed.Add(1)
}

// respEncoder renders the Responses API objects of one request.
type respEncoder struct {
	id, msgID, model string
	created, prompt  int
	s                *seq
	seqNo            int
}

// response appends the response object; done adds the output and usage.
func (e *respEncoder) response(b []byte, done bool) []byte {
	out := int(e.s.out.Load())
	status := "in_progress"
	if done {
		status = "completed"
		if e.s.atCap {
			status = "incomplete"
		}
	}
	b = append(b, `{"id":`...)
	b = appendJSONString(b, e.id)
	b = append(b, `,"object":"response","created_at":`...)
	b = appendInt(b, e.created)
	b = append(b, `,"model":`...)
	b = appendJSONString(b, e.model)
	b = append(b, `,"status":"`+status+`","incomplete_details":`...)
	if done && e.s.atCap {
		b = append(b, `{"reason":"max_output_tokens"}`...)
	} else {
		b = append(b, "null"...)
	}
	b = append(b, `,"parallel_tool_calls":true,"tool_choice":"auto","tools":[],"output":[`...)
	if done {
		b = e.item(b, true, out)
	}
	b = append(b, `],"usage":`...)
	if done {
		b = append(b, `{"input_tokens":`...)
		b = appendInt(b, e.prompt)
		b = append(b, `,"input_tokens_details":{"cached_tokens":`...)
		b = appendInt(b, e.s.cached)
		b = append(b, `},"output_tokens":`...)
		b = appendInt(b, out)
		b = append(b, `,"output_tokens_details":{"reasoning_tokens":0},"total_tokens":`...)
		b = appendInt(b, e.prompt+out)
		b = append(b, '}')
	} else {
		b = append(b, "null"...)
	}
	return append(b, '}')
}

// item appends the assistant message with its text (empty until done).
func (e *respEncoder) item(b []byte, done bool, out int) []byte {
	status := "in_progress"
	if done {
		status = "completed"
	}
	b = append(b, `{"id":`...)
	b = appendJSONString(b, e.msgID)
	b = append(b, `,"type":"message","role":"assistant","status":"`+status+`","content":[`...)
	if done {
		b = e.part(b, out)
	}
	return append(b, "]}"...)
}

func (e *respEncoder) part(b []byte, out int) []byte {
	b = append(b, `{"type":"output_text","text":"`...)
	b = appendOutputText(b, e.s.key, 0, out)
	return append(b, `","annotations":[],"logprobs":[]}`...)
}

// event appends one SSE event; fill writes the fields after "type".
func (e *respEncoder) event(b []byte, typ string, fill func([]byte) []byte) []byte {
	b = append(b, "event: "+typ+"\ndata: {\"type\":\""+typ+"\",\"sequence_number\":"...)
	b = appendInt(b, e.seqNo)
	e.seqNo++
	b = fill(b)
	return append(b, "}\n\n"...)
}

func (e *respEncoder) at(b []byte, content bool) []byte {
	b = append(b, `,"item_id":`...)
	b = appendJSONString(b, e.msgID)
	b = append(b, `,"output_index":0`...)
	if content {
		b = append(b, `,"content_index":0`...)
	}
	return b
}

// streamResponse writes the event sequence of a streamed response: created,
// in_progress, output_item.added, content_part.added, one
// output_text.delta per chunk, then the .done events and
// response.completed with the usage.
func (r *Replica) streamResponse(w http.ResponseWriter, hr *http.Request, req *request, e *respEncoder) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	var b []byte
	flush := func() bool {
		_, err := w.Write(b)
		if err == nil {
			err = rc.Flush()
		}
		b = b[:0]
		if err != nil && r.cfg.OnDisconnect != OnDisconnectIgnore {
			r.cancel(req)
			return false
		}
		return true
	}
	b = e.event(b, "response.created", func(b []byte) []byte { return e.response(append(b, `,"response":`...), false) })
	b = e.event(b, "response.in_progress", func(b []byte) []byte { return e.response(append(b, `,"response":`...), false) })
	b = e.event(b, "response.output_item.added", func(b []byte) []byte {
		return e.item(append(b, `,"output_index":0,"item":`...), false, 0)
	})
	b = e.event(b, "response.content_part.added", func(b []byte) []byte {
		return append(e.at(b, true), `,"part":{"type":"output_text","text":"","annotations":[],"logprobs":[]}`...)
	})
	if !flush() {
		return
	}
	var ctxDone <-chan struct{}
	if r.cfg.OnDisconnect == OnDisconnectAbort {
		ctxDone = hr.Context().Done()
	}
	s, sent := req.seqs[0], 0
	for {
		select {
		case <-req.notify:
		case <-ctxDone:
			r.cancel(req)
			return
		case <-r.done:
			return
		}
		st := s.state.Load()
		if st == stError || st == stAborted {
			r.cancel(req)
			return
		}
		out := int(s.out.Load())
		if out > sent && (st == stFinished || sent == 0 || out-sent >= r.cfg.StreamInterval) {
			from := sent
			b = e.event(b, "response.output_text.delta", func(b []byte) []byte {
				b = append(e.at(b, true), `,"delta":"`...)
				b = appendOutputText(b, s.key, from, out) // leading space after the first word
				return append(b, `","logprobs":[]`...)
			})
			sent = out
		}
		if st == stFinished {
			break
		}
		if !flush() {
			return
		}
	}
	b = e.event(b, "response.output_text.done", func(b []byte) []byte {
		b = append(e.at(b, true), `,"text":"`...)
		b = appendOutputText(b, s.key, 0, sent)
		return append(b, `","logprobs":[]`...)
	})
	b = e.event(b, "response.content_part.done", func(b []byte) []byte { return e.part(append(e.at(b, true), `,"part":`...), sent) })
	b = e.event(b, "response.output_item.done", func(b []byte) []byte {
		return e.item(append(b, `,"output_index":0,"item":`...), true, sent)
	})
	b = e.event(b, "response.completed", func(b []byte) []byte { return e.response(append(b, `,"response":`...), true) })
	if flush() {
		r.st.completed.Add(1)
	}
}

// awaitOne waits for a one-sequence request answered whole (Responses and
// Messages): done when it finished; otherwise the request was cancelled,
// and answer says whether the client still waits for an error (the engine
// ended it) rather than having left or the replica stopping.
func (r *Replica) awaitOne(hr *http.Request, req *request) (done, answer bool) {
	var ctxDone <-chan struct{}
	if r.cfg.OnDisconnect != OnDisconnectIgnore {
		ctxDone = hr.Context().Done()
	}
	for req.seqs[0].state.Load() == stActive {
		select {
		case <-req.notify:
		case <-ctxDone:
			r.cancel(req)
			return false, false
		case <-r.done:
			return false, false
		}
	}
	if req.seqs[0].state.Load() != stFinished {
		r.cancel(req)
		return false, true
	}
	return true, false
}
