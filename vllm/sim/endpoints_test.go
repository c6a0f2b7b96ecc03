package sim

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestPoolingEndpoints(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.LoRAModules = []LoRAModule{{Name: "ad", Path: "/x"}}
	_, url := startReplica(t, cfg)
	var usage struct {
		Usage struct {
			Prompt int `json:"prompt_tokens"`
			Total  int `json:"total_tokens"`
		} `json:"usage"`
		Data []json.RawMessage `json:"data"`
	}
	rep, b := post(t, url+"/v1/embeddings", `{"model":"sim-model","input":["one two three","four"],"dimensions":4}`)
	require.Equal(t, 200, rep.StatusCode, string(b))
	require.NoError(t, json.Unmarshal(b, &usage))
	assert.Equal(t, 5, usage.Usage.Prompt, "the simulator's tokenizer: one, two, thr, ee, four")
	assert.Equal(t, 5, usage.Usage.Total, "no output tokens")
	assert.Len(t, usage.Data, 2)

	rep, b = post(t, url+"/v1/score", `{"model":"ad","text_1":"q","text_2":["a","b c"]}`)
	require.Equal(t, 200, rep.StatusCode, string(b))
	require.NoError(t, json.Unmarshal(b, &usage))
	assert.Equal(t, (1+1+2)+(1+2+2), usage.Usage.Prompt, "the query is scored with each document")

	rep, b = post(t, url+"/v1/rerank", `{"query":"q","documents":["a","b"],"top_n":1}`)
	require.Equal(t, 200, rep.StatusCode, string(b))
	assert.Contains(t, string(b), `"usage":{"prompt_tokens":8,"total_tokens":8}`)
	assert.Equal(t, 1, strings.Count(string(b), "relevance_score"))

	for _, p := range []string{"/pooling", "/classify"} {
		rep, b = post(t, url+p, `{"model":"sim-model","input":"x y"}`)
		assert.Equal(t, 200, rep.StatusCode, p+string(b))
	}
	rep, b = post(t, url+"/detokenize", `{"model":"sim-model","tokens":[1,2,3]}`)
	assert.Equal(t, 200, rep.StatusCode, string(b))
	assert.Contains(t, string(b), `"prompt":`)
	rep, _ = post(t, url+"/v1/embeddings", `{"model":"nope","input":"x"}`)
	assert.Equal(t, 404, rep.StatusCode)
}

func TestResponsesEndpoint(t *testing.T) {
	t.Parallel()
	_, url := startReplica(t, fastConfig())
	rep, b := post(t, url+"/v1/responses", `{"model":"sim-model","input":"hello there","instructions":"be brief","max_output_tokens":5}`)
	require.Equal(t, 200, rep.StatusCode, string(b))
	var out struct {
		Object string `json:"object"`
		Output []struct {
			Content []struct {
				Text string `json:"text"`
			} `json:"content"`
		} `json:"output"`
		Usage struct {
			In  int `json:"input_tokens"`
			Out int `json:"output_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(b, &out), string(b))
	assert.Equal(t, "response", out.Object)
	require.Len(t, out.Output, 1)
	assert.Len(t, strings.Fields(out.Output[0].Content[0].Text), out.Usage.Out)
	assert.LessOrEqual(t, out.Usage.Out, 5)
	// The same prompt through chat counts the same input tokens.
	_, cb := post(t, url+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"system","content":"be brief"},{"role":"user","content":"hello there"}],"max_tokens":1}`)
	assert.Contains(t, string(cb), `"prompt_tokens":`+itoa(out.Usage.In)+`,`)

	rep, b = post(t, url+"/v1/responses", `{"model":"sim-model","input":[{"role":"user","content":[{"type":"input_text","text":"hi"}]}],"stream":true,"max_output_tokens":6}`)
	require.Equal(t, 200, rep.StatusCode)
	var evs []string
	for _, l := range strings.Split(string(b), "\n") {
		if d, ok := strings.CutPrefix(l, "data: "); ok {
			evs = append(evs, d)
		} else {
			assert.True(t, l == "" || strings.HasPrefix(l, "event: response."), l)
		}
	}
	require.NotEmpty(t, evs)
	assert.NotContains(t, string(b), "[DONE]", "vLLM's responses stream has no [DONE]")
	var last struct {
		Type     string `json:"type"`
		Response struct {
			Usage struct {
				Out int `json:"output_tokens"`
			} `json:"usage"`
		} `json:"response"`
	}
	require.NoError(t, json.Unmarshal([]byte(evs[len(evs)-1]), &last))
	assert.Equal(t, "response.completed", last.Type)
	deltas := ""
	for _, e := range evs {
		var d struct {
			Type  string `json:"type"`
			Delta string `json:"delta"`
		}
		require.NoError(t, json.Unmarshal([]byte(e), &d), e)
		if d.Type == "response.output_text.delta" {
			deltas += d.Delta
		}
	}
	assert.Len(t, strings.Fields(deltas), last.Response.Usage.Out)
}

func itoa(n int) string { b, _ := json.Marshal(n); return string(b) }

// TestPoolingChatForm: embeddings, pooling and classify take messages
// (vLLM's chat form of the pooling requests) and report the rendered
// prompt's tokens, without the generation prompt unless asked.
func TestPoolingChatForm(t *testing.T) {
	t.Parallel()
	_, url := startReplica(t, fastConfig())
	var out struct {
		Usage struct {
			Prompt int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	for _, p := range []string{"/v1/embeddings", "/pooling", "/classify"} {
		rep, b := post(t, url+p, `{"model":"sim-model","messages":[{"role":"user","content":"one two"}]}`)
		require.Equal(t, 200, rep.StatusCode, p+string(b))
		require.NoError(t, json.Unmarshal(b, &out))
		assert.Equal(t, msgOverheadTokens+2, out.Usage.Prompt, p)
	}
	rep, b := post(t, url+"/v1/embeddings", `{"messages":[{"role":"user","content":"one two"}],"add_generation_prompt":true}`)
	require.Equal(t, 200, rep.StatusCode, string(b))
	require.NoError(t, json.Unmarshal(b, &out))
	assert.Equal(t, msgOverheadTokens+2+genPromptTokens, out.Usage.Prompt)
	rep, b = post(t, url+"/v1/embeddings", `{"input":"a","messages":[{"role":"user","content":"one two three"}]}`)
	require.Equal(t, 200, rep.StatusCode, string(b))
	require.NoError(t, json.Unmarshal(b, &out))
	assert.Equal(t, 1, out.Usage.Prompt, "with both, input runs")
}

// TestChatDocuments: a chat request's documents are rendered into its
// prompt, as a RAG chat template does with what vLLM passes it.
func TestChatDocuments(t *testing.T) {
	t.Parallel()
	_, url := startReplica(t, fastConfig())
	var out struct {
		Usage struct {
			Prompt int `json:"prompt_tokens"`
		} `json:"usage"`
	}
	prompt := func(extra string) int {
		rep, b := post(t, url+"/v1/chat/completions", `{"messages":[{"role":"user","content":"hi"}],"max_tokens":1`+extra+`}`)
		require.Equal(t, 200, rep.StatusCode, string(b))
		require.NoError(t, json.Unmarshal(b, &out))
		return out.Usage.Prompt
	}
	plain := prompt("")
	docs := `[{"title":"a","text":"one two three four"}]`
	assert.Equal(t, plain+countText(docs), prompt(`,"documents":`+docs))
	assert.Greater(t, countText(docs), 4)
}

// TestMediaTokens: each media part adds MediaTokens to a chat or
// Responses prompt, as a multimodal processor expands it; text parts and
// a text-only template (MediaTokens 0) add nothing.
func TestMediaTokens(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.MediaTokens = 100
	_, url := startReplica(t, cfg)
	_, text := startReplica(t, fastConfig())
	chat := func(base, content string) int {
		rep, b := post(t, base+"/v1/chat/completions", `{"messages":[{"role":"user","content":`+content+`}],"max_tokens":1}`)
		require.Equal(t, 200, rep.StatusCode, string(b))
		var out struct {
			Usage struct {
				Prompt int `json:"prompt_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(b, &out))
		return out.Usage.Prompt
	}
	img := `{"type":"image_url","image_url":{"url":"data:image/png;base64,AA=="}}`
	plain := chat(url, `[{"type":"text","text":"hi"}]`)
	assert.Equal(t, plain+200, chat(url, `[{"type":"text","text":"hi"},`+img+`,`+img+`]`))
	assert.Equal(t, plain, chat(text, `[{"type":"text","text":"hi"},`+img+`]`))

	resp := func(input string) int {
		rep, b := post(t, url+"/v1/responses", `{"input":`+input+`,"max_output_tokens":1}`)
		require.Equal(t, 200, rep.StatusCode, string(b))
		var out struct {
			Usage struct {
				In int `json:"input_tokens"`
			} `json:"usage"`
		}
		require.NoError(t, json.Unmarshal(b, &out))
		return out.Usage.In
	}
	rplain := resp(`[{"role":"user","content":[{"type":"input_text","text":"hi"}]}]`)
	assert.Equal(t, rplain+100, resp(`[{"role":"user","content":[{"type":"input_text","text":"hi"},{"type":"input_image","image_url":"data:image/png;base64,AA=="}]}]`))
}
