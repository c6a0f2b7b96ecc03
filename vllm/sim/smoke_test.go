package sim

import (
	"testing"

	"github.com/stretchr/testify/require"
)

func TestSmoke(t *testing.T) {
	_, url := startReplica(t, fastConfig())
	resp, body := post(t, url+"/v1/chat/completions", `{"model":"sim-model","messages":[{"role":"user","content":"hello there"}],"max_tokens":5,"stream":true,"stream_options":{"continuous_usage_stats":true}}`)
	require.Equal(t, 200, resp.StatusCode)
	t.Logf("%s", body)
	resp, body = post(t, url+"/v1/completions", `{"model":"sim-model","prompt":"hello there","n":2}`)
	t.Logf("%d %s", resp.StatusCode, body)
}
