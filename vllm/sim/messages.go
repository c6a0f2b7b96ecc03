package sim

import (
	"encoding/json"
	"net/http"
	"strings"
)

// Anthropic's Messages API as vLLM serves it (vllm/entrypoints/anthropic/
// api_router.py, protocol.py and serving.py): the request is converted to
// one chat sequence (the system text first, then the messages' text), the
// non-streamed answer is a "message" object with usage {input_tokens,
// output_tokens}, a streamed one the event sequence message_start (with
// the prompt's input_tokens), content_block_start, one text_delta per
// chunk, content_block_stop, message_delta (stop_reason and the usage) and
// message_stop. Errors take Anthropic's shape, with vLLM's error type as
// its type (translate_error_response).

type messagesWire struct {
	Model     string          `json:"model"`
	Messages  []chatMessage   `json:"messages"`
	System    json.RawMessage `json:"system"`
	MaxTokens *int            `json:"max_tokens"`
	Stream    bool            `json:"stream"`
}

func writeAnthropicError(w http.ResponseWriter, e *apiError) {
	b := append([]byte(`{"type":"error","error":{"type":`), appendJSONString(nil, e.typ)...)
	b = append(b, `,"message":`...)
	b = appendJSONString(b, e.msg)
	writeJSON(w, e.status, append(b, "}}"...))
}

// anthropicMessages converts the system field and the messages to chat
// messages of their text, as _convert_system_message and _convert_messages
// do (tool blocks and images are not simulated).
func anthropicMessages(w *messagesWire) ([]chatMessage, *apiError) {
	text := func(s string) json.RawMessage { b, _ := json.Marshal(s); return b }
	blocksText := func(raw json.RawMessage) (string, bool) {
		var s string
		if json.Unmarshal(raw, &s) == nil {
			return s, true
		}
		var parts []contentPart
		if json.Unmarshal(raw, &parts) != nil {
			return "", false
		}
		var sb strings.Builder
		for _, p := range parts {
			sb.WriteString(p.Text)
		}
		return sb.String(), true
	}
	var msgs []chatMessage
	if len(w.System) > 0 && string(w.System) != "null" {
		s, ok := blocksText(w.System)
		if !ok {
			return nil, badRequest("system", "system must be a string or a list of content blocks")
		}
		msgs = append(msgs, chatMessage{Role: "system", Content: text(s)})
	}
	for i, m := range w.Messages {
		s, ok := blocksText(m.Content)
		if !ok || m.Role == "" {
			return nil, badRequest("messages", "messages[%d] must have a role and string or block content", i)
		}
		msgs = append(msgs, chatMessage{Role: m.Role, Content: text(s)})
	}
	if len(w.Messages) == 0 {
		return nil, badRequest("messages", "messages is required")
	}
	return msgs, nil
}

func (r *Replica) handleCountTokens(w http.ResponseWriter, hr *http.Request) {
	body, e := readBody(w, hr)
	if e != nil {
		writeAnthropicError(w, e)
		return
	}
	var mw messagesWire
	if err := json.Unmarshal(body, &mw); err != nil {
		writeAnthropicError(w, badRequest("", "invalid JSON body: %v", err))
		return
	}
	if mw.Model == "" || !r.cfg.serves(mw.Model) {
		writeAnthropicError(w, newAPIError(http.StatusNotFound, "model", "The model `%s` does not exist.", mw.Model))
		return
	}
	msgs, e := anthropicMessages(&mw)
	if e != nil {
		writeAnthropicError(w, e)
		return
	}
	prompt, e := chatPromptTokens(msgs, nil, true, nil)
	if e != nil {
		writeAnthropicError(w, e)
		return
	}
	writeJSON(w, http.StatusOK, append(appendInt([]byte(`{"input_tokens":`), prompt), '}'))
}

func (r *Replica) handleMessages(w http.ResponseWriter, hr *http.Request) {
	r.st.received.Add(1)
	fail := func(e *apiError) {
		r.st.rejected.Add(1)
		writeAnthropicError(w, e)
	}
	body, e := readBody(w, hr)
	if e != nil {
		fail(e)
		return
	}
	var mw messagesWire
	if err := json.Unmarshal(body, &mw); err != nil {
		fail(badRequest("", "invalid JSON body: %v", err))
		return
	}
	if mw.Model == "" || !r.cfg.serves(mw.Model) {
		fail(newAPIError(http.StatusNotFound, "model", "The model `%s` does not exist.", mw.Model))
		return
	}
	if mw.MaxTokens == nil || *mw.MaxTokens <= 0 {
		fail(badRequest("max_tokens", "max_tokens must be positive"))
		return
	}
	msgs, e := anthropicMessages(&mw)
	if e != nil {
		fail(e)
		return
	}
	prompt, e := chatPromptTokens(msgs, nil, true, nil)
	if e != nil {
		fail(e)
		return
	}
	if prompt+*mw.MaxTokens > r.cfg.MaxModelLen {
		fail(badRequest("max_tokens", "This model's maximum context length is %d tokens. However, you requested %d tokens (%d in the messages, %d in the completion).",
			r.cfg.MaxModelLen, prompt+*mw.MaxTokens, prompt, *mw.MaxTokens))
		return
	}
	capv := *mw.MaxTokens
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
	enc := &msgEncoder{id: "chatcmpl-" + id, model: r.cfg.responseModel(mw.Model), prompt: prompt, s: req.seqs[0]}
	if mw.Stream {
		r.streamMessages(w, hr, req, enc)
		return
	}
	if done, answer := r.awaitOne(hr, req); !done {
		if answer {
			writeAnthropicError(w, newAPIError(http.StatusInternalServerError, "", "The engine died."))
		}
		return
	}
	writeJSON(w, http.StatusOK, enc.message(nil, true))
	r.st.completed.Add(1)
}

// msgEncoder renders the Messages API objects of one request.
type msgEncoder struct {
	id, model string
	prompt    int
	s         *seq
}

func (e *msgEncoder) stopReason() string {
	if e.s.atCap {
		return "max_tokens"
	}
	return "end_turn"
}

// message appends the message object; done adds the text, stop reason and
// output usage (message_start carries output_tokens 0).
func (e *msgEncoder) message(b []byte, done bool) []byte {
	out := int(e.s.out.Load())
	b = append(b, `{"id":`...)
	b = appendJSONString(b, e.id)
	b = append(b, `,"type":"message","role":"assistant","content":[`...)
	if done {
		b = append(b, `{"type":"text","text":"`...)
		b = appendOutputText(b, e.s.key, 0, out)
		b = append(b, `"}`...)
	}
	b = append(b, `],"model":`...)
	b = appendJSONString(b, e.model)
	if done {
		b = append(b, `,"stop_reason":"`+e.stopReason()+`"`...)
	} else {
		out = 0
	}
	b = append(b, `,"usage":{"input_tokens":`...)
	b = appendInt(b, e.prompt)
	b = append(b, `,"output_tokens":`...)
	b = appendInt(b, out)
	return append(b, "}}"...)
}

func anthropicEvent(b []byte, typ string, fill func([]byte) []byte) []byte {
	b = append(b, "event: "+typ+"\ndata: {\"type\":\""+typ+"\""...)
	b = fill(b)
	return append(b, "}\n\n"...)
}

// streamMessages writes a streamed answer's events, one text_delta per
// stream interval of tokens.
func (r *Replica) streamMessages(w http.ResponseWriter, hr *http.Request, req *request, e *msgEncoder) {
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
	b = anthropicEvent(b, "message_start", func(b []byte) []byte { return e.message(append(b, `,"message":`...), false) })
	if !flush() {
		return
	}
	var ctxDone <-chan struct{}
	if r.cfg.OnDisconnect == OnDisconnectAbort {
		ctxDone = hr.Context().Done()
	}
	s, sent, started := req.seqs[0], 0, false
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
			if !started {
				started = true
				b = anthropicEvent(b, "content_block_start", func(b []byte) []byte {
					return append(b, `,"index":0,"content_block":{"type":"text","text":""}`...)
				})
			}
			from := sent
			b = anthropicEvent(b, "content_block_delta", func(b []byte) []byte {
				b = append(b, `,"index":0,"delta":{"type":"text_delta","text":"`...)
				b = appendOutputText(b, s.key, from, out)
				return append(b, `"}`...)
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
	if started {
		b = anthropicEvent(b, "content_block_stop", func(b []byte) []byte { return append(b, `,"index":0`...) })
	}
	b = anthropicEvent(b, "message_delta", func(b []byte) []byte {
		b = append(b, `,"delta":{"stop_reason":"`+e.stopReason()+`"},"usage":{"input_tokens":`...)
		b = appendInt(b, e.prompt)
		b = append(b, `,"output_tokens":`...)
		b = appendInt(b, sent)
		return append(b, '}')
	})
	b = anthropicEvent(b, "message_stop", func(b []byte) []byte { return b })
	if flush() {
		r.st.completed.Add(1)
	}
}
