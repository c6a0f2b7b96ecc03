package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func TestAPIKeyBothForms(t *testing.T) {
	t.Parallel()
	src := `
upstream:
  replicas:
    - {name: r0, url: http://127.0.0.1:8100}
tenants:
  - name: acme
    api_keys:
      - "` + keyA + `"
      - hash: "` + keyB + `"
        name: ci-bot
        concurrency: 2
        budgets:
          - {dimension: tokens, limit: 3000, window: 24h}
`
	f, err := Parse([]byte(src))
	require.NoError(t, err)
	keys := f.Tenants[0].APIKeys
	require.Len(t, keys, 2)
	assert.Equal(t, APIKey{Hash: keyA}, keys[0], "the bare string is a hash-only key")
	assert.Equal(t, "ci-bot", keys[1].Name)
	assert.Equal(t, 2, keys[1].Concurrency)
	require.Len(t, keys[1].Budgets, 1)
	assert.Equal(t, Budget{Dimension: "tokens", Limit: 3000, Window: 24 * time.Hour, Mode: "block", WarnRatio: 0.8}, keys[1].Budgets[0], "budget defaults apply")
	assert.Equal(t, "sha256:2c26b46b", keys[0].Label(), "an unnamed key shows a short hash, never the key")
	assert.Equal(t, "ci-bot", keys[1].Label())

	// The short form round-trips as a string, the long one as a mapping.
	out, err := yaml.Marshal(keys)
	require.NoError(t, err)
	assert.Contains(t, string(out), "- "+keyA+"\n")
	assert.Contains(t, string(out), "name: ci-bot")
}

func TestAPIKeyValidation(t *testing.T) {
	t.Parallel()
	for _, tc := range []struct {
		name, keys, want string
	}{
		{"raw key", `["sk-raw"]`, `tenants[0].api_keys[0] must be "sha256:<64 hex digits>"`},
		{"raw key in mapping", `[{hash: sk-raw, name: a}]`, `tenants[0].api_keys[0].hash must be`},
		{"unknown field", `[{hash: "` + keyA + `", nme: a}]`, `tenants[0].api_keys[0].nme is not a known key`},
		{"bad name", `[{hash: "` + keyA + `", name: "a b"}]`, `tenants[0].api_keys[0].name "a b" must be`},
		{"dup name", `[{hash: "` + keyA + `", name: a}, {hash: "` + keyB + `", name: a}]`, `tenants[0].api_keys[1].name "a" duplicates tenants[0].api_keys[0]`},
		{"dup hash across forms", `["` + keyA + `", {hash: "` + keyA + `", name: a}]`, `tenants[0].api_keys[1] duplicates tenants[0].api_keys[0]`},
		{"negative concurrency", `[{hash: "` + keyA + `", concurrency: -1}]`, `tenants[0].api_keys[0].concurrency must be >= 0`},
		{"bad budget", `[{hash: "` + keyA + `", budgets: [{dimension: tokens, limit: 1, window: 0s}]}]`, `tenants[0].api_keys[0].budgets[0].window must be >= 1s`},
		{"wrong type", `[[1]]`, `tenants[0].api_keys[0] must be a mapping`},
	} {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			src := "upstream:\n  replicas:\n    - {name: r0, url: http://127.0.0.1:8100}\ntenants:\n  - name: acme\n    api_keys: " + tc.keys + "\n"
			_, err := Parse([]byte(src))
			require.Error(t, err)
			assert.Contains(t, err.Error(), tc.want)
		})
	}
}

func TestMinOutputTokensAndStatusToken(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte(minimal))
	require.NoError(t, err)
	assert.Equal(t, int64(16), f.Server.MinOutputTokens)
	_, err = Parse([]byte(minimal + "server: {min_output_tokens: -1}\n"))
	require.ErrorContains(t, err, "server.min_output_tokens must be > 0")
	_, err = Parse([]byte(minimal + "admin: {status_token: plain}\n"))
	require.ErrorContains(t, err, "admin.status_token must be")
	f, err = Parse([]byte(minimal + "admin: {status_token: \"" + keyB + "\"}\n"))
	require.NoError(t, err)
	assert.Equal(t, keyB, f.Admin.StatusToken)
}
