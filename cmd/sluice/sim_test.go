package main

import (
	"bufio"
	"context"
	"io"
	"net/http"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestRunSimFlagErrors(t *testing.T) {
	tests := []struct {
		name string
		args []string
		want string
	}{
		{"unknown flag", []string{"--nope"}, "unknown flag --nope"},
		{"positional", []string{"extra"}, `unexpected argument "extra"`},
		{"replicas zero", []string{"--replicas", "0"}, "--replicas must be >= 1"},
		{"model len over kv", []string{"--max-model-len", "8192", "--kv-tokens", "4096"}, "exceeds the KV cache"},
		{"bad policy", []string{"--scheduling-policy", "lifo"}, "scheduling_policy"},
		{"bad on-disconnect", []string{"--on-disconnect", "maybe"}, "on_disconnect"},
		{"bad rate", []string{"--fault-drop-rate", "2"}, "faults.drop_rate"},
		{"bad listen", []string{"--listen", "nohost"}, "--listen"},
		{"bad duration", []string{"--decode-step", "fast"}, "invalid value"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			var out, errb strings.Builder
			err := runSim(t.Context(), env{stdout: &out, stderr: &errb}, tt.args)
			var ue usageError
			require.ErrorAs(t, err, &ue, "want a usage error, got %v", err)
			assert.Contains(t, err.Error(), tt.want)
			assert.Equal(t, 2, run(t.Context(), append([]string{"sim"}, tt.args...), nil, io.Discard, io.Discard))
		})
	}
}

func TestRunSimServesReplicas(t *testing.T) {
	ctx, cancel := context.WithCancel(t.Context())
	pr, pw := io.Pipe()
	done := make(chan error, 1)
	go func() {
		done <- runSim(ctx, env{stdout: pw, stderr: io.Discard},
			[]string{"--listen", "127.0.0.1:0", "--replicas", "2", "--model", "m", "--decode-step", "1ms"})
		pw.Close()
	}()
	sc := bufio.NewScanner(pr)
	var urls []string
	for len(urls) < 2 && sc.Scan() {
		f := strings.Fields(sc.Text())
		for _, w := range f {
			if strings.HasPrefix(w, "http://") {
				urls = append(urls, w)
			}
		}
	}
	require.Len(t, urls, 2)
	for _, u := range urls {
		resp, err := http.Post(u+"/v1/completions", "application/json", strings.NewReader(`{"model":"m","prompt":"hi","max_tokens":3}`))
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		assert.Equal(t, http.StatusOK, resp.StatusCode, "%s", b)
	}
	cancel()
	go func() { _, _ = io.Copy(io.Discard, pr) }()
	assert.NoError(t, <-done)
}

// TestRunSimAPIKeyAndNoKVMetrics: --api-key guards /v1 as vLLM's flag (and
// $VLLM_API_KEY is its default); --no-kv-metrics drops cache_config_info.
func TestRunSimAPIKeyAndNoKVMetrics(t *testing.T) {
	t.Setenv("VLLM_API_KEY", "from-env")
	for _, tt := range []struct {
		args []string
		key  string
	}{
		{[]string{"--api-key", "k1", "--no-kv-metrics"}, "k1"},
		{[]string{"--no-kv-metrics"}, "from-env"},
	} {
		ctx, cancel := context.WithCancel(t.Context())
		pr, pw := io.Pipe()
		done := make(chan error, 1)
		go func() {
			done <- runSim(ctx, env{stdout: pw, stderr: io.Discard}, append([]string{"--listen", "127.0.0.1:0", "--decode-step", "1ms"}, tt.args...))
			pw.Close()
		}()
		sc := bufio.NewScanner(pr)
		var url string
		for url == "" && sc.Scan() {
			for _, w := range strings.Fields(sc.Text()) {
				if strings.HasPrefix(w, "http://") {
					url = w
				}
			}
		}
		require.NotEmpty(t, url)
		get := func(path, key string) (int, string) {
			req, err := http.NewRequest(http.MethodGet, url+path, nil)
			require.NoError(t, err)
			if key != "" {
				req.Header.Set("Authorization", "Bearer "+key)
			}
			resp, err := http.DefaultClient.Do(req)
			require.NoError(t, err)
			defer resp.Body.Close()
			b, _ := io.ReadAll(resp.Body)
			return resp.StatusCode, string(b)
		}
		st, _ := get("/v1/models", "")
		assert.Equal(t, http.StatusUnauthorized, st)
		st, _ = get("/v1/models", tt.key)
		assert.Equal(t, http.StatusOK, st)
		st, body := get("/metrics", "")
		assert.Equal(t, http.StatusOK, st)
		assert.NotContains(t, body, "vllm:cache_config_info")
		assert.Contains(t, body, "vllm:num_requests_running")
		cancel()
		go func() { _, _ = io.Copy(io.Discard, pr) }()
		assert.NoError(t, <-done)
	}
}
