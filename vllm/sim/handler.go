package sim

import (
	"encoding/json"
	"errors"
	"io"
	"net/http"
)

// maxBodyBytes bounds request bodies.
const maxBodyBytes = 16 << 20

// reqFaults are one request's fault draws.
type reqFaults struct {
	err       bool
	drop      bool
	streamErr bool
	atChunk   int // the drop or stream error happens after this many chunks
}

func (r *Replica) drawFaults(key uint64) reqFaults {
	f := r.cfg.Faults
	return reqFaults{
		err:       f.ErrorRate > 0 && unitFloat(mix(key+1)) < f.ErrorRate,
		drop:      f.DropRate > 0 && unitFloat(mix(key+2)) < f.DropRate,
		streamErr: f.StreamErrorRate > 0 && unitFloat(mix(key+3)) < f.StreamErrorRate,
		atChunk:   1 + int(mix(key+4)%8),
	}
}

func writeJSON(w http.ResponseWriter, status int, body []byte) {
	w.Header().Set("Content-Type", "application/json")
	w.WriteHeader(status)
	_, _ = w.Write(body)
}

func writeError(w http.ResponseWriter, e *apiError) {
	writeJSON(w, e.status, appendErrorJSON(nil, e))
}

func readBody(w http.ResponseWriter, hr *http.Request) ([]byte, *apiError) {
	body, err := io.ReadAll(http.MaxBytesReader(w, hr.Body, maxBodyBytes))
	if err != nil {
		var mbe *http.MaxBytesError
		if errors.As(err, &mbe) {
			return nil, badRequest("", "request body too large")
		}
		return nil, badRequest("", "reading the request body: %v", err)
	}
	return body, nil
}

// outputLen draws a sequence's output length from its key.
func outputLen(g *genRequest, key uint64, minNatural, maxNatural int) int {
	if g.ignoreEOS {
		return g.cap
	}
	lo := min(max(g.minTokens, minNatural, 1), max(g.cap, g.minTokens, 1))
	hi := max(min(g.cap, maxNatural), lo)
	return lo + int(mix(key)%uint64(hi-lo+1))
}

// prepare parses and validates a generation request and builds its
// sequences; it answers errors itself and returns nil then.
func (r *Replica) prepare(k kind, w http.ResponseWriter, hr *http.Request) (*genRequest, *request, string, reqFaults) {
	r.st.received.Add(1)
	fail := func(e *apiError) (*genRequest, *request, string, reqFaults) {
		r.st.rejected.Add(1)
		writeError(w, e)
		return nil, nil, "", reqFaults{}
	}
	body, e := readBody(w, hr)
	if e != nil {
		return fail(e)
	}
	if r.eng.dead.Load() {
		return fail(newAPIError(http.StatusInternalServerError, "", "The engine is dead."))
	}
	wire, e := decodeWire(body)
	if e != nil {
		return fail(e)
	}
	g, e := parseGeneration(k, wire, &r.cfg)
	if e != nil {
		return fail(e)
	}
	g.model = r.cfg.responseModel(wire.Model)
	rk, id := requestKey(hr.Header.Get("X-Request-Id"), body)
	key := mix(mix(uint64(r.cfg.Seed)) ^ mix(uint64(r.cfg.ReplicaIndex)+0x9e37) ^ rk)
	f := r.drawFaults(key)
	if f.err {
		st := r.cfg.Faults.ErrorStatus
		return fail(newAPIError(st, "", "Injected fault: %s.", http.StatusText(st)))
	}
	if g.late != nil && !g.stream {
		return fail(g.late)
	}
	req := newRequest(g.priority, r.clk.Now())
	req.lora = r.cfg.loraOf(wire.Model)
	req.seqs = make([]*seq, 0, len(g.prompts)*g.n)
	var hashes []uint64
	if len(g.prompts) == 1 {
		hashes = r.promptHashes(k, wire)
	}
	for p, pt := range g.prompts {
		for c := range g.n {
			idx := p*g.n + c
			sk := mix(key ^ (uint64(idx)+1)*0xD6E8FEB86659FD93)
			t := outputLen(g, sk, r.cfg.OutputLenMin, r.cfg.OutputLenMax)
			req.seqs = append(req.seqs, &seq{req: req, choice: idx, prompt: pt, target: t, key: sk, atCap: t == g.cap, hashes: hashes})
		}
	}
	if g.late != nil {
		// Streamed: the engine refuses it after the headers (handleGeneration).
		r.st.rejected.Add(1)
		return g, req, id, f
	}
	if e := r.eng.submit(req); e != nil {
		if !g.stream {
			return fail(e)
		}
		g.late = e
		r.st.rejected.Add(1)
		return g, req, id, f
	}
	r.st.admitted.Add(1)
	return g, req, id, f
}

// lateError answers a streamed request the engine refused: vLLM has sent
// its 200 headers already, so the error is an SSE event, then [DONE]
// (completion/serving.py completion_stream_generator's except clauses).
func (r *Replica) lateError(w http.ResponseWriter, e *apiError) {
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	var b []byte
	b = append(b, "data: "...)
	b = appendErrorJSON(b, e)
	b = append(b, "\n\ndata: [DONE]\n\n"...)
	_, _ = w.Write(b)
}

func (r *Replica) cancel(req *request) {
	req.cancel.Store(true)
	r.eng.signal()
}

func finishReason(s *seq) string {
	if s.atCap {
		return reasonLength
	}
	return reasonStop
}

func (r *Replica) handleGeneration(k kind) http.HandlerFunc {
	return func(w http.ResponseWriter, hr *http.Request) {
		g, req, id, f := r.prepare(k, w, hr)
		if g == nil {
			return
		}
		if g.late != nil {
			r.lateError(w, g.late)
			return
		}
		if g.stream {
			r.stream(w, hr, g, req, id, f)
		} else {
			r.complete(w, hr, g, req, id)
		}
	}
}

// stream writes a streamed response as vLLM shapes it.
func (r *Replica) stream(w http.ResponseWriter, hr *http.Request, g *genRequest, req *request, id string, f reqFaults) {
	rc := http.NewResponseController(w)
	w.Header().Set("Content-Type", "text/event-stream; charset=utf-8")
	w.WriteHeader(http.StatusOK)
	enc := newChunkEncoder(g.kind, id, r.clk.Now().Unix(), g.model)
	enc.logprobs = g.logprobs
	enc.fp, enc.fpOnLast = r.fingerprint(), !g.includeUsage
	// The chat role chunks go out with the first output, not before
	// queueing and prefill: chat_completion/serving.py sends them on the
	// generator's first iteration.
	rolesSent := g.kind != kindChat
	var ctxDone <-chan struct{}
	if r.cfg.OnDisconnect == OnDisconnectAbort {
		ctxDone = hr.Context().Done()
	}
	broken := false
	// flush writes enc.buf; it reports false when the handler must stop.
	flush := func() bool {
		if broken || len(enc.buf) == 0 {
			return true
		}
		_, err := w.Write(enc.buf)
		if err == nil {
			err = rc.Flush()
		}
		enc.buf = enc.buf[:0]
		if err == nil {
			return true
		}
		if r.cfg.OnDisconnect == OnDisconnectIgnore {
			broken = true
			return true
		}
		r.cancel(req)
		return false
	}
	if len(enc.buf) == 0 {
		// vLLM sends the 200 headers right after validation, before prefill.
		if err := rc.Flush(); err != nil && r.cfg.OnDisconnect != OnDisconnectIgnore {
			r.cancel(req)
			return
		}
	}
	if !flush() {
		return
	}
	interval := g.streamInterval
	n := len(req.seqs)
	sent := make([]int, n)
	finished := make([]bool, n)
	remaining, chunks, completion := n, 0, 0
	for remaining > 0 {
		select {
		case <-req.notify:
		case <-ctxDone:
			r.cancel(req)
			return
		case <-r.done:
			return
		}
		for i, s := range req.seqs {
			if finished[i] {
				continue
			}
			st := s.state.Load()
			out := int(s.out.Load())
			switch st {
			case stError:
				enc.errorEvent(newAPIError(http.StatusInternalServerError, "", "The engine died."))
				enc.done()
				r.cancel(req)
				flush()
				return
			case stAborted:
				finished[i] = true
				remaining--
				continue
			}
			done := st == stFinished
			if !rolesSent && (out > 0 || done) {
				rolesSent = true
				for _, s := range req.seqs {
					enc.roleChunk(s.choice, g.continuousUsage, s.prompt)
				}
			}
			if (out > sent[i] && (done || sent[i] == 0 || out-sent[i] >= interval)) || (done && out == sent[i]) {
				finish := ""
				if done {
					finish = finishReason(s)
				}
				enc.tokenChunk(s.choice, s.key, sent[i], out, finish, g.continuousUsage, s.prompt)
				completion += out - sent[i]
				sent[i] = out
				chunks++
			}
			if done {
				finished[i] = true
				remaining--
			}
		}
		if remaining > 0 && (f.drop || f.streamErr) && chunks >= f.atChunk {
			r.cancel(req)
			if f.streamErr {
				enc.errorEvent(newAPIError(http.StatusInternalServerError, "", "Injected fault: error mid-stream."))
				enc.done()
				flush()
				return
			}
			flush()
			// Cut the connection: no usage, no [DONE], no chunk terminator.
			panic(http.ErrAbortHandler)
		}
		if remaining == 0 {
			if g.includeUsage {
				enc.cached = r.cachedTokens(req)
				enc.usageChunk(g.promptTotal, completion)
			}
			enc.done()
		}
		if !flush() {
			return
		}
	}
	if !broken {
		r.st.completed.Add(1)
	}
}

// complete waits for every sequence, then writes a non-streamed response.
func (r *Replica) complete(w http.ResponseWriter, hr *http.Request, g *genRequest, req *request, id string) {
	var ctxDone <-chan struct{}
	if r.cfg.OnDisconnect != OnDisconnectIgnore {
		// vLLM's with_cancellation aborts non-streamed requests on disconnect.
		ctxDone = hr.Context().Done()
	}
	remaining := len(req.seqs)
	for remaining > 0 {
		select {
		case <-req.notify:
		case <-ctxDone:
			r.cancel(req)
			return
		case <-r.done:
			return
		}
		remaining = 0
		for _, s := range req.seqs {
			switch s.state.Load() {
			case stActive:
				remaining++
			case stError:
				r.cancel(req)
				writeError(w, newAPIError(http.StatusInternalServerError, "", "The engine died."))
				return
			}
		}
	}
	completion := 0
	var b []byte
	b = append(b, `{"id":`...)
	if g.kind == kindChat {
		b = appendJSONString(b, "chatcmpl-"+id)
		b = append(b, `,"object":"chat.completion"`...)
	} else {
		b = appendJSONString(b, "cmpl-"+id)
		b = append(b, `,"object":"text_completion"`...)
	}
	b = append(b, `,"created":`...)
	b = appendInt(b, int(r.clk.Now().Unix()))
	b = append(b, `,"model":`...)
	b = appendJSONString(b, g.model)
	b = append(b, `,"choices":[`...)
	for i, s := range req.seqs {
		out := int(s.out.Load())
		completion += out
		if i > 0 {
			b = append(b, ',')
		}
		b = append(b, `{"index":`...)
		b = appendInt(b, s.choice)
		// chat_completion/protocol.py ChatMessage: reasoning (not
		// reasoning_content) and tool_calls are omitted when empty in
		// current vLLM's response (exclude_none on optional fields).
		if g.kind == kindChat {
			b = append(b, `,"message":{"role":"assistant","content":"`...)
			b = appendOutputText(b, s.key, 0, out)
			b = append(b, `"}`...)
		} else {
			b = append(b, `,"text":"`...)
			b = appendOutputText(b, s.key, 0, out)
			b = append(b, '"')
		}
		b = append(b, `,"logprobs":`...)
		if g.logprobs {
			b = appendLogprobs(b, g.kind, s.key, 0, out)
		} else {
			b = append(b, "null"...)
		}
		b = append(b, `,"finish_reason":"`...)
		b = append(b, finishReason(s)...)
		b = append(b, `","stop_reason":null`...)
		if g.kind == kindCompletion {
			// completion/serving.py puts prompt_logprobs on each choice.
			b = append(b, `,"prompt_logprobs":`...)
			b = appendPromptLogprobs(b, g.promptLogprobs, s.prompt)
		}
		b = append(b, '}')
	}
	b = append(b, `]`...)
	if fp := r.fingerprint(); fp != "" {
		b = append(b, `,"system_fingerprint":`...)
		b = appendJSONString(b, fp)
	}
	b = append(b, `,"usage":`...)
	b = appendUsage(b, g.promptTotal, completion, r.cachedTokens(req))
	if g.kind == kindChat {
		b = append(b, `,"prompt_logprobs":`...)
		b = appendPromptLogprobs(b, g.promptLogprobs, g.promptTotal)
	}
	b = append(b, '}')
	writeJSON(w, http.StatusOK, b)
	r.st.completed.Add(1)
}

type tokenizeResponse struct {
	Count       int       `json:"count"`
	MaxModelLen int       `json:"max_model_len"`
	Tokens      []int     `json:"tokens"`
	TokenStrs   *[]string `json:"token_strs"`
}

// handleTokenize answers vLLM's /tokenize, completion or chat form, with
// the tokenizer that generation uses.
func (r *Replica) handleTokenize(w http.ResponseWriter, hr *http.Request) {
	body, e := readBody(w, hr)
	if e != nil {
		writeError(w, e)
		return
	}
	wire, e := decodeWire(body)
	if e != nil {
		writeError(w, e)
		return
	}
	if !r.cfg.serves(wire.Model) {
		writeError(w, newAPIError(http.StatusNotFound, "model", "The model `%s` does not exist.", wire.Model))
		return
	}
	sink := &tokenSink{ids: []int{}}
	var strs []string
	if wire.ReturnTokenStrs {
		strs = []string{}
		sink.strs = &strs
	}
	var count int
	if wire.Messages != nil {
		addGen := true
		if wire.AddGenerationPrompt != nil {
			addGen = *wire.AddGenerationPrompt
		}
		if addGen && wire.ContinueFinalMessage {
			writeError(w, badRequest("", "Cannot set both `continue_final_message` and `add_generation_prompt` to True."))
			return
		}
		count, e = chatPromptTokens(wire.Messages, wire.Tools, addGen, sink)
	} else {
		var counts []int
		counts, e = completionPrompts(wire.Prompt, sink)
		if e == nil && len(counts) != 1 {
			e = badRequest("prompt", "prompt must be a single string or a list of token ids")
		}
		if e == nil {
			count = counts[0]
		}
	}
	if e != nil {
		writeError(w, e)
		return
	}
	resp := tokenizeResponse{Count: count, MaxModelLen: r.cfg.MaxModelLen, Tokens: sink.ids}
	if wire.ReturnTokenStrs {
		resp.TokenStrs = &strs
	}
	b, err := json.Marshal(resp)
	if err != nil {
		writeError(w, newAPIError(http.StatusInternalServerError, "", "encoding the response: %v", err))
		return
	}
	writeJSON(w, http.StatusOK, b)
}

func (r *Replica) handleModels(w http.ResponseWriter, _ *http.Request) {
	writeJSON(w, http.StatusOK, r.appendModelList(nil))
}

func (r *Replica) handleHealth(w http.ResponseWriter, _ *http.Request) {
	if r.eng.dead.Load() {
		w.WriteHeader(http.StatusServiceUnavailable)
		return
	}
	w.WriteHeader(http.StatusOK)
}

// fingerprint is the configured system_fingerprint, "" for none.
func (r *Replica) fingerprint() string {
	if r.cfg.SystemFingerprint == "none" {
		return ""
	}
	return r.cfg.SystemFingerprint
}
