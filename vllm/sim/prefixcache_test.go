package sim

import (
	"encoding/json"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestBlockHashesChain(t *testing.T) {
	t.Parallel()
	a := blockHashes([]int{1, 2, 3, 4, 5, 6, 7, 8, 9}, 4, "")
	require.Len(t, a, 2, "the partial last block is not hashed")
	b := blockHashes([]int{1, 2, 3, 4, 5, 6, 7, 0}, 4, "")
	assert.Equal(t, a[0], b[0])
	assert.NotEqual(t, a[1], b[1])
	c := blockHashes([]int{9, 2, 3, 4, 5, 6, 7, 8}, 4, "")
	assert.NotEqual(t, a[1], c[1], "a block's hash covers its whole prefix")
	s1 := blockHashes([]int{1, 2, 3, 4, 5, 6, 7, 8}, 4, "tenant-a")
	s2 := blockHashes([]int{1, 2, 3, 4, 5, 6, 7, 8}, 4, "tenant-b")
	for i := range s1 {
		assert.NotEqual(t, a[i], s1[i], "a salted block never matches an unsalted one")
		assert.NotEqual(t, s1[i], s2[i], "nor one of another salt")
	}
	assert.Equal(t, s1, blockHashes([]int{1, 2, 3, 4, 5, 6, 7, 8}, 4, "tenant-a"))
}

func TestPrefixCacheLRU(t *testing.T) {
	t.Parallel()
	c := newPrefixCache(3)
	c.insert([]uint64{1, 2})
	c.insert([]uint64{7})
	assert.Equal(t, 2, c.hit([]uint64{1, 2, 3}))
	c.insert([]uint64{8}) // evicts 7, the least recently used
	assert.Equal(t, 0, c.hit([]uint64{7}))
	assert.Equal(t, 2, c.hit([]uint64{1, 2}))
}

// TestPrefixCachingSkipsPrefill: a repeated prompt hits every full block
// but the one holding its last token; the hit is counted in tokens and
// reported as cached_tokens with --enable-prompt-tokens-details.
func TestPrefixCachingSkipsPrefill(t *testing.T) {
	t.Parallel()
	cfg := fastConfig()
	cfg.EnablePromptTokensDetails = true
	r, url := startReplica(t, cfg)
	long := strings.Repeat("word ", 100) // 100 tokens of content
	body := `{"model":"sim-model","messages":[{"role":"user","content":"` + long + `"}],"max_tokens":1}`
	var u struct {
		Usage struct {
			Prompt  int `json:"prompt_tokens"`
			Details *struct {
				Cached int `json:"cached_tokens"`
			} `json:"prompt_tokens_details"`
		} `json:"usage"`
	}
	_, b := post(t, url+"/v1/chat/completions", body)
	require.NoError(t, json.Unmarshal(b, &u))
	prompt := u.Usage.Prompt
	require.Equal(t, 100+msgOverheadTokens+genPromptTokens, prompt)
	require.NotNil(t, u.Usage.Details)
	assert.Zero(t, u.Usage.Details.Cached)
	_, b = post(t, url+"/v1/chat/completions", body)
	require.NoError(t, json.Unmarshal(b, &u))
	want := (prompt - 1) / cfg.BlockSize * cfg.BlockSize // the last token is recomputed
	assert.Equal(t, want, u.Usage.Details.Cached)
	st := r.Stats()
	assert.Equal(t, int64(2*prompt), st.PrefixQueryTokens)
	assert.Equal(t, int64(want), st.PrefixHitTokens)
	assert.Equal(t, int64(2*prompt), st.PromptTokens, "prompt_tokens_total counts cached tokens too")

	off := fastConfig()
	off.DisablePrefixCaching = true
	r2, url2 := startReplica(t, off)
	post(t, url2+"/v1/chat/completions", body)
	_, b = post(t, url2+"/v1/chat/completions", body)
	assert.Contains(t, string(b), `"prompt_tokens_details":null`)
	assert.Zero(t, r2.Stats().PrefixHitTokens)
	assert.Zero(t, r2.Stats().PrefixQueryTokens, "no lookups without caching, as vLLM")
}
