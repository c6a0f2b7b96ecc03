package sim

import (
	"encoding/base64"
	"encoding/binary"
	"encoding/json"
	"math"
	"net/http"
	"strconv"
)

// The rest of vLLM's OpenAI surface: pooling endpoints (embeddings,
// pooling, classify, score, rerank), /detokenize and /v1/responses.
// Pooling requests run in the engine as prompt-only sequences (one token
// of compute after the prefill stands for the pooler); their usage reports
// prompt tokens only, as vLLM's pooling responses do.

func (r *Replica) registerEndpoints() {
	r.mux.HandleFunc("POST /v1/embeddings", r.handlePooling(poolEmbed))
	r.mux.HandleFunc("POST /pooling", r.handlePooling(poolPooling))
	r.mux.HandleFunc("POST /classify", r.handlePooling(poolClassify))
	for _, p := range []string{"/score", "/v1/score"} {
		r.mux.HandleFunc("POST "+p, r.handlePooling(poolScore))
	}
	for _, p := range []string{"/rerank", "/v1/rerank", "/v2/rerank"} {
		r.mux.HandleFunc("POST "+p, r.handlePooling(poolRerank))
	}
	r.mux.HandleFunc("POST /detokenize", r.handleDetokenize)
	r.mux.HandleFunc("POST /v1/responses", r.handleResponses)
	r.mux.HandleFunc("POST /v1/messages", r.handleMessages)
	r.mux.HandleFunc("POST /v1/messages/count_tokens", r.handleCountTokens)
}

type poolKind int

const (
	poolEmbed poolKind = iota
	poolPooling
	poolClassify
	poolScore
	poolRerank
)

// poolWire is the union of the pooling bodies' fields the simulator reads
// (vllm/entrypoints/openai/protocol.py: EmbeddingCompletionRequest,
// PoolingRequest, ClassificationRequest, ScoreRequest, RerankRequest).
// Embeddings, pooling and classify also take the chat form, messages
// rendered by the chat template with add_generation_prompt false by
// default (ChatRequestMixin in vllm/entrypoints/pooling/base/protocol.py).
type poolWire struct {
	Model               string          `json:"model"`
	Input               json.RawMessage `json:"input"`
	Messages            json.RawMessage `json:"messages"`
	AddGenerationPrompt bool            `json:"add_generation_prompt"`
	Dimensions          *int            `json:"dimensions"`
	Text1               json.RawMessage `json:"text_1"`
	Text2               json.RawMessage `json:"text_2"`
	Query               json.RawMessage `json:"query"`
	Documents           json.RawMessage `json:"documents"`
	TopN                int             `json:"top_n"`
	// EncodingFormat "base64" packs embeddings as little-endian float32
	// (serving_embedding.py); the openai SDKs ask for it by default.
	EncodingFormat string `json:"encoding_format"`
}

// textsOf decodes a string or a list of strings (or of token id lists,
// counted as given).
func textsOf(raw json.RawMessage, param string) ([]int, []string, *apiError) {
	if isNull(raw) {
		return nil, nil, badRequest(param, "%s is required", param)
	}
	var one string
	if json.Unmarshal(raw, &one) == nil {
		return []int{countText(one)}, []string{one}, nil
	}
	var many []string
	if json.Unmarshal(raw, &many) == nil && len(many) > 0 {
		counts := make([]int, len(many))
		for i, s := range many {
			counts[i] = countText(s)
		}
		return counts, many, nil
	}
	counts, e := completionPrompts(raw, nil)
	if e != nil {
		return nil, nil, badRequest(param, "%s must be a string, a list of strings or token ids", param)
	}
	return counts, make([]string, len(counts)), nil
}

// poolPrompts returns the prompt tokens of each sequence a pooling
// request runs (score and rerank run one per query–document pair).
func poolPrompts(k poolKind, w *poolWire) ([]int, []string, *apiError) {
	switch k {
	case poolScore, poolRerank:
		q, qp := w.Text1, "text_1"
		d, dp := w.Text2, "text_2"
		if k == poolRerank {
			q, qp, d, dp = w.Query, "query", w.Documents, "documents"
		}
		qc, _, e := textsOf(q, qp)
		if e != nil {
			return nil, nil, e
		}
		dc, docs, e := textsOf(d, dp)
		if e != nil {
			return nil, nil, e
		}
		if len(qc) != 1 && len(qc) != len(dc) {
			return nil, nil, badRequest(qp, "%s and %s must have the same length or %s a single input", qp, dp, qp)
		}
		out := make([]int, len(dc))
		for i := range dc {
			out[i] = qc[min(i, len(qc)-1)] + dc[i] + 2 // [CLS] q [SEP] d
		}
		return out, docs, nil
	}
	if isNull(w.Input) && !isNull(w.Messages) {
		// The chat form: one prompt, the rendered conversation. With input
		// present too, the completion form wins (the union's first member
		// validates first), so input is what runs.
		var msgs []chatMessage
		if err := json.Unmarshal(w.Messages, &msgs); err != nil || len(msgs) == 0 {
			return nil, nil, badRequest("messages", "messages must be a non-empty list of messages")
		}
		n, e := chatPromptTokens(msgs, nil, w.AddGenerationPrompt, nil)
		if e != nil {
			return nil, nil, e
		}
		return []int{n}, []string{""}, nil
	}
	return textsOf(w.Input, "input")
}

// runPrompts submits one prompt-only sequence per prompt and waits; it
// answers errors itself and reports false then (or when the client left).
func (r *Replica) runPrompts(w http.ResponseWriter, hr *http.Request, prompts []int, target int, key uint64) (*request, bool) {
	for _, p := range prompts {
		if p+target > r.cfg.MaxModelLen {
			r.st.rejected.Add(1)
			writeError(w, badRequest("input_tokens", "This model's maximum context length is %d tokens. However, your request has %d input tokens.", r.cfg.MaxModelLen, p))
			return nil, false
		}
	}
	req := newRequest(0, r.clk.Now())
	for i, p := range prompts {
		sk := mix(key ^ (uint64(i)+1)*0xD6E8FEB86659FD93)
		req.seqs = append(req.seqs, &seq{req: req, choice: i, prompt: p, target: target, key: sk})
	}
	if e := r.eng.submit(req); e != nil {
		r.st.rejected.Add(1)
		writeError(w, e)
		return nil, false
	}
	r.st.admitted.Add(1)
	for {
		select {
		case <-req.notify:
		case <-hr.Context().Done():
			r.cancel(req)
			return nil, false
		case <-r.done:
			return nil, false
		}
		active := 0
		for _, s := range req.seqs {
			switch s.state.Load() {
			case stActive:
				active++
			case stError:
				r.cancel(req)
				writeError(w, newAPIError(http.StatusInternalServerError, "", "The engine died."))
				return nil, false
			}
		}
		if active == 0 {
			return req, true
		}
	}
}

// unitAt is a deterministic value in [0, 1) for vectors and scores.
func unitAt(k uint64, i int) float64 { return unitFloat(mix(k + uint64(i)*0x9E37)) }

func appendFloat(b []byte, f float64) []byte {
	return strconv.AppendFloat(b, math.Round(f*1e6)/1e6, 'f', -1, 64)
}

// handlePooling serves one pooling endpoint in vLLM's response shape
// (serving_embedding.py, serving_pooling.py, serving_classification.py,
// serving_score.py under vllm/entrypoints/openai/).
func (r *Replica) handlePooling(k poolKind) http.HandlerFunc {
	return func(w http.ResponseWriter, hr *http.Request) {
		r.st.received.Add(1)
		body, e := readBody(w, hr)
		if e != nil {
			r.st.rejected.Add(1)
			writeError(w, e)
			return
		}
		var pw poolWire
		if err := json.Unmarshal(body, &pw); err != nil {
			r.st.rejected.Add(1)
			writeError(w, badRequest("", "invalid JSON body: %v", err))
			return
		}
		if !r.cfg.serves(pw.Model) {
			r.st.rejected.Add(1)
			writeError(w, newAPIError(http.StatusNotFound, "model", "The model `%s` does not exist.", pw.Model))
			return
		}
		prompts, docs, e := poolPrompts(k, &pw)
		if e != nil {
			r.st.rejected.Add(1)
			writeError(w, e)
			return
		}
		rk, id := requestKey(hr.Header.Get("X-Request-Id"), body)
		if _, ok := r.runPrompts(w, hr, prompts, 1, rk); !ok {
			return
		}
		total := 0
		for _, p := range prompts {
			total += p
		}
		model := r.cfg.responseModel(pw.Model)
		prefix := map[poolKind]string{poolEmbed: "embd-", poolPooling: "pool-", poolClassify: "classify-", poolScore: "score-", poolRerank: "rerank-"}[k]
		b := append([]byte(`{"id":`), appendJSONString(nil, prefix+id)...)
		if k != poolRerank {
			b = append(b, `,"object":"list","created":`...)
			b = appendInt(b, int(r.clk.Now().Unix()))
		}
		b = append(b, `,"model":`...)
		b = appendJSONString(b, model)
		if k == poolRerank {
			// RerankUsage (vllm/entrypoints/openai/protocol.py): prompt and
			// total tokens; older versions sent total_tokens only.
			b = append(b, `,"usage":{"prompt_tokens":`...)
			b = appendInt(b, total)
			b = append(b, `,"total_tokens":`...)
			b = appendInt(b, total)
			b = append(b, `},"results":[`...)
		} else {
			b = append(b, `,"data":[`...)
		}
		n := len(prompts)
		if k == poolRerank && pw.TopN > 0 {
			n = min(n, pw.TopN)
		}
		for i := range n {
			if i > 0 {
				b = append(b, ',')
			}
			key := rk + uint64(i)
			switch k {
			case poolEmbed, poolPooling:
				dims := 16
				if pw.Dimensions != nil && *pw.Dimensions > 0 && *pw.Dimensions <= 4096 {
					dims = *pw.Dimensions
				}
				b = append(b, `{"index":`...)
				b = appendInt(b, i)
				if k == poolEmbed {
					b = append(b, `,"object":"embedding","embedding":[`...)
				} else {
					b = append(b, `,"object":"pooling","data":[`...)
				}
				if pw.EncodingFormat == "base64" {
					raw := make([]byte, 4*dims)
					for d := range dims {
						binary.LittleEndian.PutUint32(raw[4*d:], math.Float32bits(float32(unitAt(key, d)*2-1)))
					}
					b = append(b[:len(b)-1], '"')
					b = append(b, base64.StdEncoding.EncodeToString(raw)...)
					b = append(b, `"}`...)
					break
				}
				for d := range dims {
					if d > 0 {
						b = append(b, ',')
					}
					b = appendFloat(b, unitAt(key, d)*2-1)
				}
				b = append(b, "]}"...)
			case poolClassify:
				p := unitAt(key, 0)
				label := "LABEL_0"
				if p < 0.5 {
					label = "LABEL_1"
				}
				b = append(b, `{"index":`...)
				b = appendInt(b, i)
				b = append(b, `,"label":"`+label+`","probs":[`...)
				b = appendFloat(b, p)
				b = append(b, ',')
				b = appendFloat(b, 1-p)
				b = append(b, `],"num_classes":2}`...)
			case poolScore:
				b = append(b, `{"index":`...)
				b = appendInt(b, i)
				b = append(b, `,"object":"score","score":`...)
				b = appendFloat(b, unitAt(key, 0))
				b = append(b, '}')
			case poolRerank:
				b = append(b, `{"index":`...)
				b = appendInt(b, i)
				b = append(b, `,"document":{"text":`...)
				b = appendJSONString(b, docs[i])
				b = append(b, `},"relevance_score":`...)
				b = appendFloat(b, unitAt(key, 0))
				b = append(b, '}')
			}
		}
		b = append(b, ']')
		if k != poolRerank {
			b = append(b, `,"usage":{"prompt_tokens":`...)
			b = appendInt(b, total)
			b = append(b, `,"total_tokens":`...)
			b = appendInt(b, total)
			b = append(b, `,"completion_tokens":0,"prompt_tokens_details":null}`...)
		}
		b = append(b, '}')
		writeJSON(w, http.StatusOK, b)
		r.st.completed.Add(1)
	}
}

// handleDetokenize answers vLLM's /detokenize (serving_tokenization.py):
// {"prompt": text} for a list of token ids.
func (r *Replica) handleDetokenize(w http.ResponseWriter, hr *http.Request) {
	body, e := readBody(w, hr)
	if e != nil {
		writeError(w, e)
		return
	}
	var in struct {
		Model  string `json:"model"`
		Tokens []int  `json:"tokens"`
	}
	if err := json.Unmarshal(body, &in); err != nil || in.Tokens == nil {
		writeError(w, badRequest("tokens", "tokens must be a list of token ids"))
		return
	}
	if !r.cfg.serves(in.Model) {
		writeError(w, newAPIError(http.StatusNotFound, "model", "The model `%s` does not exist.", in.Model))
		return
	}
	b := append([]byte(`{"prompt":"`), appendOutputText(nil, uint64(len(in.Tokens)), 0, len(in.Tokens))...)
	writeJSON(w, http.StatusOK, append(b, `"}`...))
}
