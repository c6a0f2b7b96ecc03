package node

import (
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// The differential transparency test: every request shape goes
// to a simulator replica directly and through a real Sluice server in front
// of the same replica, with the same X-Request-Id (the simulator keys its
// output on it, so both answers are the same generation), and the answers
// must match: status, error type, code and param, and the body modulo
// "created". Shapes whose difference is documented (docs/api.md, "Transparency
// to vLLM's clients") compare status and param only. Each simulated
// behaviour cites the vLLM file it follows (vllm/sim).

type shape struct {
	name, path, body string
	// sluiceOwned marks a documented difference: Sluice answers itself in
	// its pinned error shape (same status and param as vLLM).
	sluiceOwned bool
	// contextOwned marks the documented context-length difference: with an
	// exact count Sluice answers 400 context_length_exceeded itself (param
	// "messages"), where vLLM names param "input_tokens".
	contextOwned bool
	// modelOwned marks the documented unknown-model difference: vLLM 404,
	// Sluice 400 invalid_request with param "model".
	modelOwned bool
}

const (
	chatPath = "/v1/chat/completions"
	cmplPath = "/v1/completions"
	diffMML  = 8192
)

func diffWords(n int) string {
	w := []string{"the", "quick", "brown", "fox", "jumps", "over", "a", "lazy", "dog", "while", "scheduling", "tokens"}
	var b strings.Builder
	for i := range n {
		if i > 0 {
			b.WriteByte(' ')
		}
		b.WriteString(w[i%len(w)])
	}
	return b.String()
}

func diffChat(extra string) string {
	return `{"model":"sim-model","messages":[{"role":"system","content":"Be brief."},{"role":"user","content":"Tell me about queues"}]` + extra + `}`
}

func diffCmpl(extra string) string {
	return `{"model":"sim-model","prompt":"Once upon a time"` + extra + `}`
}

func transparencyCorpus() []shape {
	tools := `,"tools":[{"type":"function","function":{"name":"get_weather","description":"Weather","parameters":{"type":"object","properties":{"city":{"type":"string"}}}}}]`
	schema := `,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"object","properties":{"a":{"type":"string"}}}}}`
	image := `{"model":"sim-model","messages":[{"role":"user","content":[{"type":"text","text":"what is this"},{"type":"image_url","image_url":{"url":"data:image/png;base64,AAAA"}}]}]%s}`
	long := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}]%%s}`, diffWords(2000))
	var c []shape
	add := func(name, path, body string) { c = append(c, shape{name: name, path: path, body: body}) }
	own := func(name, path, body string) {
		c = append(c, shape{name: name, path: path, body: body, sluiceOwned: true})
	}
	ctxOwn := func(name, path, body string) {
		c = append(c, shape{name: name, path: path, body: body, contextOwned: true})
	}
	for _, st := range []struct{ tag, extra string }{{"", ""}, {" streamed", `,"stream":true`}} {
		s := st.extra
		add("chat"+st.tag, chatPath, diffChat(s))
		add("chat max_tokens"+st.tag, chatPath, diffChat(`,"max_tokens":12`+s))
		add("chat max_completion_tokens"+st.tag, chatPath, diffChat(`,"max_completion_tokens":9`+s))
		add("chat n=3"+st.tag, chatPath, diffChat(`,"n":3,"max_tokens":8`+s))
		add("chat ignore_eos"+st.tag, chatPath, diffChat(`,"max_tokens":20,"ignore_eos":true`+s))
		add("chat min_tokens"+st.tag, chatPath, diffChat(`,"max_tokens":30,"min_tokens":25`+s))
		add("chat stop"+st.tag, chatPath, diffChat(`,"stop":["\n"],"max_tokens":10`+s))
		add("chat tools"+st.tag, chatPath, diffChat(tools+s))
		add("chat tool_choice"+st.tag, chatPath, diffChat(tools+`,"tool_choice":"auto"`+s))
		add("chat json schema"+st.tag, chatPath, diffChat(schema+s))
		add("chat logprobs"+st.tag, chatPath, diffChat(`,"logprobs":true,"top_logprobs":2,"max_tokens":5`+s))
		add("chat image part"+st.tag, chatPath, fmt.Sprintf(image, s))
		add("chat 2000 words on 8k"+st.tag, chatPath, fmt.Sprintf(long, s))
		add("chat 2000 words on 8k max_tokens"+st.tag, chatPath, fmt.Sprintf(long, `,"max_tokens":4000,"ignore_eos":true`+s))
		add("chat priority under fcfs"+st.tag, chatPath, diffChat(`,"priority":3`+s))
		add("completions"+st.tag, cmplPath, diffCmpl(s))
		add("completions n=2"+st.tag, cmplPath, diffCmpl(`,"n":2`+s))
		add("completions prompt list"+st.tag, cmplPath, `{"model":"sim-model","prompt":["one two","three four five"],"max_tokens":6`+s+`}`)
		add("completions token ids"+st.tag, cmplPath, `{"model":"sim-model","prompt":[1,2,3,4,5],"max_tokens":6`+s+`}`)
		add("completions token id lists n=2"+st.tag, cmplPath, `{"model":"sim-model","prompt":[[1,2],[3,4,5]],"n":2,"max_tokens":4`+s+`}`)
		add("completions logprobs"+st.tag, cmplPath, diffCmpl(`,"logprobs":3,"max_tokens":4`+s))
		add("completions stream_interval"+st.tag, cmplPath, diffCmpl(`,"stream_interval":4,"max_tokens":14,"ignore_eos":true`+s))
		// Errors vLLM raises when the engine adds the request: after a
		// stream's 200 headers (vllm/v1/engine/input_processor.py).
		add("logprobs above max_logprobs"+st.tag, cmplPath, diffCmpl(`,"logprobs":21`+s))
		add("chat top_logprobs above max_logprobs"+st.tag, chatPath, diffChat(`,"logprobs":true,"top_logprobs":25`+s))
		add("out-of-vocabulary token id"+st.tag, cmplPath, `{"model":"sim-model","prompt":[1,99999]`+s+`}`)
		add("invalid json schema"+st.tag, chatPath, diffChat(`,"response_format":{"type":"json_schema","json_schema":{"name":"x","schema":{"type":"nope"}}}`+s))
		add("prompt of exactly max_model_len"+st.tag, chatPath, fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}]%s}`, strings.Repeat("w ", diffMML-7), s))
		// Errors vLLM raises before its headers (protocol.py validators).
		add("top_logprobs without logprobs"+st.tag, chatPath, diffChat(`,"top_logprobs":2`+s))
		add("json_schema without schema"+st.tag, chatPath, diffChat(`,"response_format":{"type":"json_schema"}`+s))
		ctxOwn("prompt plus max_tokens over the context"+st.tag, cmplPath, `{"model":"sim-model","prompt":[1,2,3],"max_tokens":8190`+s+`}`)
		own("n zero"+st.tag, cmplPath, diffCmpl(`,"n":0`+s))
		own("max_tokens zero"+st.tag, cmplPath, diffCmpl(`,"max_tokens":0`+s))
		own("negative min_tokens"+st.tag, chatPath, diffChat(`,"min_tokens":-1`+s))
		own("stream_interval zero"+st.tag, cmplPath, diffCmpl(`,"stream_interval":0`+s))
		ctxOwn("prompt alone over the context"+st.tag, chatPath, fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}]%s}`, strings.Repeat("w ", diffMML), s))
	}
	// Non-streamed only.
	add("chat prompt_logprobs", chatPath, diffChat(`,"prompt_logprobs":1,"max_tokens":3`))
	add("completions prompt_logprobs", cmplPath, diffCmpl(`,"prompt_logprobs":2,"max_tokens":3`))
	add("completions beam search", cmplPath, diffCmpl(`,"use_beam_search":true,"n":2,"max_tokens":5`))
	add("prompt_logprobs above max_logprobs", cmplPath, diffCmpl(`,"prompt_logprobs":21`))
	add("stream_options without stream", cmplPath, diffCmpl(`,"stream_options":{"include_usage":true}`))
	// Streamed only: the stream_options variants.
	add("stream include_usage", chatPath, diffChat(`,"stream":true,"stream_options":{"include_usage":true}`))
	add("stream include_usage false", chatPath, diffChat(`,"stream":true,"stream_options":{"include_usage":false}`))
	add("stream continuous usage", chatPath, diffChat(`,"stream":true,"n":2,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`))
	add("stream empty stream_options", cmplPath, diffCmpl(`,"stream":true,"stream_options":{}`))
	add("completions stream continuous usage", cmplPath, diffCmpl(`,"stream":true,"stream_options":{"continuous_usage_stats":true}`))
	add("prompt_logprobs with stream", cmplPath, diffCmpl(`,"prompt_logprobs":1,"stream":true`))
	add("beam search with stream", cmplPath, diffCmpl(`,"use_beam_search":true,"stream":true`))
	// Sluice parses the body before anything else.
	own("malformed JSON", chatPath, `{"model":`)
	own("wrong type for n", cmplPath, diffCmpl(`,"n":"two"`))
	own("wrong type for max_tokens", chatPath, diffChat(`,"max_tokens":"many"`))
	c = append(c, shape{name: "unknown model", path: chatPath, body: `{"model":"nope","messages":[{"role":"user","content":"x"}]}`, modelOwned: true})
	return c
}

// normalized strips what may differ between two answers to the same
// generation: "created" timestamps.
func normalized(t *testing.T, body []byte, stream bool) any {
	t.Helper()
	decode := func(b []byte) any {
		var v any
		if err := json.Unmarshal(b, &v); err != nil {
			return string(b)
		}
		if m, ok := v.(map[string]any); ok {
			delete(m, "created")
		}
		return v
	}
	if !stream {
		// A non-streamed request with a large cap goes upstream as a
		// stream and its body is re-assembled in vLLM's layout, whose
		// null members (refusal, audio, service_tier, …) the simulator
		// omits: null and absent mean the same to clients.
		return dropNulls(decode(body))
	}
	return streamView(sseEvents(body), decode)
}

// streamView is what a streaming client can rely on, independent of how
// tokens were packed into chunks (timing decides that, in vLLM as in the
// simulator): per choice its role, text, finish and stop reasons and
// logprob tokens; whether chunks carried usage and its last value; the
// final usage chunk; error events; [DONE]; the ids.
func streamView(events []string, decode func([]byte) any) map[string]any {
	type choiceView struct {
		Role, Text, Finish string
		Stop               any
		Logprobs           []any
		LastUsage          any
		Fingerprint        any
	}
	choices := map[int]*choiceView{}
	view := map[string]any{}
	ids := map[string]bool{}
	var finals, errs []any
	chunkUsage := false
	for _, ev := range events {
		if ev == "[DONE]" {
			view["done"] = true
			continue
		}
		m, ok := decode([]byte(ev)).(map[string]any)
		if !ok {
			errs = append(errs, ev)
			continue
		}
		if e, ok := m["error"]; ok {
			errs = append(errs, e)
			continue
		}
		if id, ok := m["id"].(string); ok {
			ids[id] = true
		}
		cs, _ := m["choices"].([]any)
		if len(cs) == 0 {
			finals = append(finals, m["usage"], m["system_fingerprint"])
			continue
		}
		for _, c := range cs {
			cm := c.(map[string]any)
			i := int(cm["index"].(float64))
			cv := choices[i]
			if cv == nil {
				cv = &choiceView{}
				choices[i] = cv
			}
			if d, ok := cm["delta"].(map[string]any); ok {
				if r, ok := d["role"].(string); ok {
					cv.Role = r
				}
				if t, ok := d["content"].(string); ok {
					cv.Text += t
				}
			}
			if t, ok := cm["text"].(string); ok {
				cv.Text += t
			}
			if f, ok := cm["finish_reason"].(string); ok {
				cv.Finish = f
			}
			if r, ok := cm["stop_reason"]; ok && r != nil {
				cv.Stop = r
			}
			if lp, ok := cm["logprobs"].(map[string]any); ok {
				if content, ok := lp["content"].([]any); ok {
					cv.Logprobs = append(cv.Logprobs, content...)
				}
				if toks, ok := lp["tokens"].([]any); ok {
					cv.Logprobs = append(cv.Logprobs, toks...)
				}
			}
			if u, ok := m["usage"]; ok && u != nil {
				chunkUsage = true
				cv.LastUsage = u
			}
			if fp, ok := m["system_fingerprint"]; ok {
				cv.Fingerprint = fp
			}
		}
	}
	view["choices"] = choices
	view["ids"] = ids
	view["final"] = finals
	view["errors"] = errs
	view["chunk_usage"] = chunkUsage
	return view
}

type errView struct {
	Type  string
	Param any
	Code  any
}

func errorOf(body []byte) (errView, bool) {
	var e struct {
		Error *struct {
			Type  string `json:"type"`
			Param any    `json:"param"`
			Code  any    `json:"code"`
		} `json:"error"`
	}
	if json.Unmarshal(body, &e) != nil || e.Error == nil {
		return errView{}, false
	}
	return errView{Type: e.Error.Type, Param: e.Error.Param, Code: e.Error.Code}, true
}

func TestTransparencyDifferential(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxModelLen = diffMML
	sc.KVTokens = 1 << 18
	sc.DecodeStep = 100 * time.Microsecond
	sc.PrefillTPS = 1e9
	sc.OutputLenMax = 24
	rep := startSim(t, sc)
	cfg := nodeConfig(t, []*simReplica{rep}, "    concurrency: 64\n    max_output_tokens: 8192\n    max_input_tokens: 16384\n", "")
	n := startNode(t, cfg)

	corpus := transparencyCorpus()
	require.GreaterOrEqual(t, len(corpus), 60)
	owned := 0
	for i, sh := range corpus {
		t.Run(sh.name, func(t *testing.T) {
			id := fmt.Sprintf("diff-%03d", i)
			direct := postDirect(t, rep.url+sh.path, sh.body, id)
			via := n.call(t, sh.path, keyAcme, sh.body, "X-Request-Id", id)
			if sh.modelOwned {
				owned++
				de, _ := errorOf(direct.Body)
				ve, _ := errorOf(via.Body)
				assert.Equal(t, http.StatusNotFound, direct.StatusCode)
				assert.Equal(t, errView{Type: "NotFoundError", Param: "model", Code: float64(404)}, de)
				assert.Equal(t, http.StatusNotFound, via.StatusCode)
				assert.Equal(t, errView{Type: "invalid_request_error", Code: "model_not_found"}, ve)
				return
			}
			require.Equal(t, direct.StatusCode, via.StatusCode, "status\ndirect: %s\nsluice: %s", direct.Body, via.Body)
			de, dIsErr := errorOf(direct.Body)
			ve, vIsErr := errorOf(via.Body)
			if sh.sluiceOwned || sh.contextOwned {
				owned++
				require.True(t, dIsErr && vIsErr, "both refuse\ndirect: %s\nsluice: %s", direct.Body, via.Body)
				if sh.contextOwned {
					assert.Equal(t, "input_tokens", de.Param)
					assert.Equal(t, "messages", ve.Param)
					assert.Equal(t, "context_length_exceeded", ve.Code)
				} else if de.Param != nil {
					// The simulator's JSON decoder names no field for a
					// type error; Sluice's parser does.
					assert.Equal(t, de.Param, ve.Param, "param\ndirect: %s\nsluice: %s", direct.Body, via.Body)
				}
				assert.Equal(t, "invalid_request_error", ve.Type)
				return
			}
			stream := strings.HasPrefix(direct.Header.Get("Content-Type"), "text/event-stream")
			if dIsErr || vIsErr {
				assert.Equal(t, de, ve, "error\ndirect: %s\nsluice: %s", direct.Body, via.Body)
			}
			assert.Equal(t, normalized(t, direct.Body, stream), normalized(t, via.Body, stream),
				"body\ndirect: %s\nsluice: %s", direct.Body, via.Body)
		})
	}
	t.Logf("%d shapes, %d documented differences", len(corpus), owned)
}

func postDirect(t *testing.T, url, body, id string) reply {
	t.Helper()
	req, err := http.NewRequest(http.MethodPost, url, strings.NewReader(body))
	require.NoError(t, err)
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("X-Request-Id", id)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	require.NoError(t, err)
	return reply{StatusCode: resp.StatusCode, Header: resp.Header, Body: b}
}

// TestTwoThousandWordsOn8k: in the default bytes mode
// and with the tenant's default max_input_tokens of 8192, a 2,000-word chat
// message on an 8k-context model (its byte bound is over 10,000) is served
// like direct vLLM, with and without max_tokens: the bound is never the
// reason for a refusal or a cut; /tokenize decides.
func TestTwoThousandWordsOn8k(t *testing.T) {
	sc := sim.DefaultConfig()
	sc.MaxModelLen = diffMML
	sc.KVTokens = 1 << 17
	sc.DecodeStep = 50 * time.Microsecond
	sc.PrefillTPS = 1e9
	rep := startSim(t, sc)
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    max_output_tokens: 8192\n", ""))
	msg := diffWords(2000)
	require.Greater(t, len(msg), 10000, "the byte bound exceeds the context")
	for i, extra := range []string{`,"ignore_eos":true`, `,"max_tokens":5000,"ignore_eos":true`} {
		id := fmt.Sprintf("words-%d", i)
		body := fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":%q}]%s}`, msg, extra)
		direct := postDirect(t, rep.url+chatPath, body, id)
		via := n.call(t, chatPath, keyAcme, body, "X-Request-Id", id)
		require.Equal(t, http.StatusOK, direct.StatusCode, "%s", direct.Body)
		require.Equal(t, http.StatusOK, via.StatusCode, "%s", via.Body)
		type usage struct {
			PromptTokens     int `json:"prompt_tokens"`
			CompletionTokens int `json:"completion_tokens"`
		}
		var du, vu struct {
			Usage usage `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(direct.Body, &du))
		require.NoError(t, json.Unmarshal(via.Body, &vu))
		assert.Less(t, du.Usage.PromptTokens, 8192/2, "the replica's own count is far below the bound")
		require.Equal(t, du.Usage, vu.Usage, "served exactly like direct, output not truncated")
		assert.True(t, assert.ObjectsAreEqual(normalized(t, direct.Body, false), normalized(t, via.Body, false)), "same body")
	}
}

// TestRefusedAfterHeadersIsUncharged: a request vLLM's
// engine refuses (logprobs over --max-logprobs) is answered as vLLM answers
// it — a streamed one 200 with the error event then [DONE], counted as an
// error; a non-streamed one vLLM's 400 — and neither is charged: vLLM never
// ran it. The one request that ran is charged, exactly once.
func TestRefusedAfterHeadersIsUncharged(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep},
		"    budgets: [{dimension: requests, limit: 100, window: 1h}, {dimension: tokens, limit: 100000, window: 1h}]\n", ""))
	streamed := n.call(t, cmplPath, keyAcme, `{"model":"sim-model","prompt":"a","logprobs":21,"stream":true}`)
	require.Equal(t, http.StatusOK, streamed.StatusCode)
	ev := sseEvents(streamed.Body)
	require.Len(t, ev, 2, "%s", streamed.Body)
	assert.Contains(t, ev[0], `"Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)"`)
	assert.Equal(t, "[DONE]", ev[1])
	plain := n.call(t, cmplPath, keyAcme, `{"model":"sim-model","prompt":"a","logprobs":21}`)
	require.Equal(t, http.StatusBadRequest, plain.StatusCode)
	assert.JSONEq(t, `{"error":{"message":"Requested sample logprobs of 21, which is greater than max allowed: 20 (parameter=logprobs, value=21)","type":"BadRequestError","param":"logprobs","code":400}}`, string(plain.Body))
	assert.InDelta(t, 2.0, n.metric(t, "sluice_requests_total", map[string]string{"tenant": "acme", "outcome": "upstream_error"}), 1e-9)
	ok := n.call(t, cmplPath, keyAcme, `{"model":"sim-model","prompt":[1,2,3],"max_tokens":2,"ignore_eos":true}`)
	require.Equal(t, http.StatusOK, ok.StatusCode)
	assert.InDelta(t, 1.0, n.metric(t, "sluice_requests_total", map[string]string{"tenant": "acme", "outcome": "ok"}), 1e-9)
	eventually(t, "holds released and the served request committed", func() bool {
		return n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0 &&
			n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "requests"}) >= 1
	})
	assert.InDelta(t, 1.0, n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "requests"}), 1e-9, "only the request that ran")
	assert.InDelta(t, float64(3+2), n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "tokens"}), 1e-9, "only its 3 + 2 tokens")
}
