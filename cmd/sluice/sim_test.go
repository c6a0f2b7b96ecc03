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
