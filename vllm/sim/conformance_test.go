package sim

import (
	"encoding/json"
	"net/http"
	"os"
	"strconv"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// target is a server under the conformance suite: the simulator, or a real
// vLLM when VLLM_CONFORMANCE_URL is set (with VLLM_CONFORMANCE_MODEL and
// VLLM_CONFORMANCE_MAX_MODEL_LEN), e.g. on a GPU machine with the pinned
// vLLM version.
type target struct {
	url, model  string
	maxModelLen int
}

func conformanceTargets(t *testing.T) map[string]target {
	cfg := fastConfig()
	cfg.Model = "conf-model"
	cfg.MaxModelLen = 512
	cfg.KVTokens = 8192
	_, url := startReplica(t, cfg)
	out := map[string]target{"sim": {url: url, model: cfg.Model, maxModelLen: cfg.MaxModelLen}}
	if u := os.Getenv("VLLM_CONFORMANCE_URL"); u != "" {
		n, err := strconv.Atoi(os.Getenv("VLLM_CONFORMANCE_MAX_MODEL_LEN"))
		require.NoError(t, err, "VLLM_CONFORMANCE_MAX_MODEL_LEN")
		out["vllm"] = target{url: u, model: os.Getenv("VLLM_CONFORMANCE_MODEL"), maxModelLen: n}
	}
	return out
}

// TestConformance checks what Sluice relies on (VLLM.md part 1) without
// looking inside the server, so it runs unchanged against a real vLLM.
func TestConformance(t *testing.T) {
	for name, tg := range conformanceTargets(t) {
		t.Run(name, func(t *testing.T) {
			m := strconv.Quote(tg.model)
			chat := func(extra string) string {
				return `{"model":` + m + `,"messages":[{"role":"user","content":"Count from one to twenty."}]` + extra + `}`
			}
			t.Run("models", func(t *testing.T) {
				resp, err := http.Get(tg.url + "/v1/models")
				require.NoError(t, err)
				defer resp.Body.Close()
				var ml struct {
					Data []struct {
						ID          string `json:"id"`
						MaxModelLen int    `json:"max_model_len"`
					} `json:"data"`
				}
				require.NoError(t, json.NewDecoder(resp.Body).Decode(&ml))
				require.NotEmpty(t, ml.Data)
				assert.Equal(t, tg.model, ml.Data[0].ID)
				assert.Equal(t, tg.maxModelLen, ml.Data[0].MaxModelLen)
			})
			t.Run("tokenize count is usage.prompt_tokens", func(t *testing.T) {
				count := tokenizeCount(t, tg.url, chat(""))
				_, b := post(t, tg.url+"/v1/chat/completions", chat(`,"max_tokens":2`))
				var fr fullResponse
				require.NoError(t, json.Unmarshal(b, &fr))
				assert.Equal(t, count, fr.Usage.PromptTokens)
			})
			t.Run("non-stream usage", func(t *testing.T) {
				_, b := post(t, tg.url+"/v1/chat/completions", chat(`,"max_tokens":8,"ignore_eos":true,"n":2`))
				var fr fullResponse
				require.NoError(t, json.Unmarshal(b, &fr), "%s", b)
				assert.Len(t, fr.Choices, 2)
				assert.Equal(t, 16, fr.Usage.CompletionTokens, "n × max_tokens with ignore_eos")
				assert.Equal(t, fr.Usage.PromptTokens+16, fr.Usage.TotalTokens)
			})
			t.Run("stream usage", func(t *testing.T) {
				_, b := post(t, tg.url+"/v1/chat/completions",
					chat(`,"max_tokens":8,"ignore_eos":true,"n":2,"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`))
				ev := sseEvents(t, b)
				require.GreaterOrEqual(t, len(ev), 3)
				assert.Equal(t, "[DONE]", ev[len(ev)-1])
				final := decodeChunk(t, ev[len(ev)-2])
				assert.Empty(t, final.Choices)
				require.NotNil(t, final.Usage)
				last := map[int]int{}
				for _, e := range ev[:len(ev)-2] {
					c := decodeChunk(t, e)
					require.NotNil(t, c.Usage, "continuous usage on every chunk")
					for _, ch := range c.Choices {
						last[ch.Index] = c.Usage.CompletionTokens
					}
				}
				assert.Equal(t, map[int]int{0: 8, 1: 8}, last, "cumulative per choice")
				assert.Equal(t, 16, final.Usage.CompletionTokens)
			})
			t.Run("errors", func(t *testing.T) {
				tests := []struct {
					name, body string
					status     int
					param      string
				}{
					{"unknown model", `{"model":"no-such-model","messages":[{"role":"user","content":"x"}]}`, 404, ""},
					{"over max_model_len", chat(`,"max_tokens":` + strconv.Itoa(tg.maxModelLen)), 400, "input_tokens"},
				}
				for _, tt := range tests {
					t.Run(tt.name, func(t *testing.T) {
						resp, b := post(t, tg.url+"/v1/chat/completions", tt.body)
						assert.Equal(t, tt.status, resp.StatusCode)
						var eb struct {
							Error errorBodyJSON `json:"error"`
						}
						require.NoError(t, json.Unmarshal(b, &eb), "%s", b)
						assert.Equal(t, tt.status, eb.Error.Code)
						if tt.param != "" && assert.NotNil(t, eb.Error.Param) {
							assert.Equal(t, tt.param, *eb.Error.Param)
						}
					})
				}
			})
			t.Run("metrics", func(t *testing.T) {
				mf := scrapeHTTP(t, tg.url)
				for _, name := range []string{"vllm:num_requests_running", "vllm:num_requests_waiting",
					"vllm:generation_tokens_total", "vllm:prompt_tokens_total", "vllm:cache_config_info"} {
					assert.Contains(t, mf, name)
				}
			})
		})
	}
}
