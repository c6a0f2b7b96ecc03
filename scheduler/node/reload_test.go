package node

import (
	"os"
	"path/filepath"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// TestReloadUnderLoad: reloading the config (re-weighting a tenant, adding
// one, changing a budget) while requests flow fails none of them.
func TestReloadUnderLoad(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	cfg := nodeConfig(t, []*simReplica{rep}, "    concurrency: 4\n", "")
	dir := t.TempDir()
	path := filepath.Join(dir, "sluice.yaml")
	write := func(c *config.File) {
		b, err := yaml.Marshal(c)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, b, 0o600))
	}
	write(cfg)
	loaded, err := config.Load(path)
	require.NoError(t, err, "a marshalled config must load back")
	n := startNodeWith(t, loaded, path)

	var ok, failed atomic.Int64
	var bad sync.Map
	stop := make(chan struct{})
	var wg sync.WaitGroup
	for _, key := range []string{keyAcme, keyAcme, keyBeta} {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				select {
				case <-stop:
					return
				default:
				}
				resp := n.call(t, "/v1/chat/completions", key, chatBody)
				b := resp.Body
				if resp.StatusCode == 200 {
					ok.Add(1)
				} else {
					failed.Add(1)
					bad.Store(resp.StatusCode, string(b))
				}
			}
		}()
	}
	for i := range 10 {
		next := *loaded
		next.Tenants = append([]config.Tenant(nil), loaded.Tenants...)
		next.Tenants[0].Weight = 1 + i%3
		next.Tenants[1].Budgets = []config.Budget{{Dimension: "tokens", Limit: int64(1_000_000 + i), Window: time.Hour, Mode: "block", WarnRatio: 0.8}}
		if i%2 == 1 {
			next.Tenants = append(next.Tenants, config.Tenant{Name: "gamma", APIKeys: config.Keys(config.HashKey("k-gamma")),
				Weight: 1, Concurrency: 2, MaxInputTokens: 100, MaxOutputTokens: 10,
				Queue: config.TenantQueue{MaxDepth: 4, MaxBytes: 1 << 20, MaxWait: time.Second, Order: "fifo"}})
		}
		write(&next)
		code, _, raw := n.adminDo(t, "POST", "/admin/reload", "")
		require.Equal(t, 200, code, string(raw))
		assert.Contains(t, string(raw), `"status":"reloaded"`)
	}
	// A broken config is refused and the running one kept.
	require.NoError(t, os.WriteFile(path, []byte("tenants: [{name: x, weight: -1}]\n"), 0o600))
	code, _, raw := n.adminDo(t, "POST", "/admin/reload", "")
	assert.Equal(t, 400, code)
	assert.Contains(t, string(raw), "tenants[0].weight must be >= 1")
	close(stop)
	wg.Wait()
	assert.Positive(t, ok.Load())
	bad.Range(func(k, v any) bool { t.Errorf("status %v: %s", k, v); return true })
	assert.Equal(t, int64(0), failed.Load(), "no request may fail because of a reload")
}

// TestClampExpiresOnTime: a clamp ends by itself at its expiry.
func TestClampExpiresOnTime(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	code, _, raw := n.adminDo(t, "POST", "/admin/tenants/acme/clamp", `{"models":["other-model"],"reason":"short","expires_in":"1500ms"}`)
	require.Equal(t, 200, code, string(raw))
	clamped := time.Now()
	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	body := readAll(t, resp)
	require.Equal(t, 403, resp.StatusCode, string(body))
	code2, _ := errorCode(t, body)
	assert.Equal(t, "tenant_clamped", code2)
	eventually(t, "clamp expired", func() bool {
		_, _, raw := n.adminDo(t, "GET", "/admin/tenants", "")
		return !strings.Contains(string(raw), `"reason":"short"`)
	})
	assert.GreaterOrEqual(t, time.Since(clamped), 1400*time.Millisecond, "not before its expiry")
	resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	readAll(t, resp)
	assert.Equal(t, 200, resp.StatusCode)
}
