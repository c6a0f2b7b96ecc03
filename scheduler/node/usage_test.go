package node

import (
	"encoding/json"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// TestUsageViews pins the operator's usage views: GET /admin/usage (the
// cumulative usage per tenant, key and model, with filters, a window and
// CSV), budget use in GET /admin/budgets, and GET
// /admin/tenants/{name}/usage listing the limits in force before the
// tenant's first request and right after a reload.
func TestUsageViews(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	cfg := nodeConfig(t, []*simReplica{rep}, "    budgets: [{dimension: tokens, limit: 100000, window: 24h}]\n", "")
	path := filepath.Join(t.TempDir(), "sluice.yaml")
	write := func(c *config.File) {
		b, err := yaml.Marshal(c)
		require.NoError(t, err)
		require.NoError(t, os.WriteFile(path, b, 0o600))
	}
	write(cfg)
	loaded, err := config.Load(path)
	require.NoError(t, err)
	n := startNodeWith(t, loaded, path)
	clearOfHourEdge(t)

	type limitRow struct {
		Dimension string
		Window    string
		Limit     int64
		Committed int64
		Remaining int64
	}
	tenantLimits := func() []limitRow {
		code, _, raw := n.adminDo(t, "GET", "/admin/tenants/acme/usage", "")
		require.Equal(t, 200, code, string(raw))
		var out struct{ Limits []limitRow }
		require.NoError(t, json.Unmarshal(raw, &out))
		return out.Limits
	}
	assert.Equal(t, []limitRow{{Dimension: "tokens", Window: "24h", Limit: 100000, Remaining: 100000}}, tenantLimits(),
		"listed before the tenant's first request")

	var in, out int64
	for range 3 {
		r := n.call(t, "/v1/completions", keyAcme, body20)
		require.Equal(t, 200, r.StatusCode, string(r.Body))
		var u struct {
			Usage struct {
				PromptTokens     int64 `json:"prompt_tokens"`
				CompletionTokens int64 `json:"completion_tokens"`
			}
		}
		require.NoError(t, json.Unmarshal(r.Body, &u))
		in += u.Usage.PromptTokens
		out += u.Usage.CompletionTokens
	}
	require.Equal(t, int64(30), in)
	require.Equal(t, int64(30), out)

	var rep1 struct {
		Since, Until time.Time
		Rows         []struct {
			Tenant, Key, Model string
			Usage              map[string]int64
		}
	}
	code, _, raw := n.adminDo(t, "GET", "/admin/usage", "")
	require.Equal(t, 200, code, string(raw))
	require.NoError(t, json.Unmarshal(raw, &rep1))
	require.Len(t, rep1.Rows, 1, string(raw))
	row := rep1.Rows[0]
	assert.Equal(t, []string{"acme", "_unnamed", "sim-model"}, []string{row.Tenant, row.Key, row.Model})
	assert.Equal(t, int64(3), row.Usage["requests"])
	assert.Equal(t, in, row.Usage["input_tokens"])
	assert.Equal(t, out, row.Usage["output_tokens"])
	assert.Contains(t, row.Usage, "usd_micros")
	assert.False(t, rep1.Since.After(rep1.Until))

	code, _, raw = n.adminDo(t, "GET", "/admin/usage?tenant=acme&dimension=output_tokens&window=1h", "")
	require.Equal(t, 200, code, string(raw))
	assert.Contains(t, string(raw), `"usage":{"output_tokens":30}`, "filtered to one dimension, within the last hour")
	code, _, raw = n.adminDo(t, "GET", "/admin/usage?model=other", "")
	require.Equal(t, 200, code)
	assert.Contains(t, string(raw), `"rows":[]`)
	for q, param := range map[string]string{"window=bogus": "window", "window=800h": "window", "tenant=nope": "tenant",
		"dimension=tokens": "dimension", "format=xml": "format"} {
		code, m, raw := n.adminDo(t, "GET", "/admin/usage?"+q, "")
		assert.Equal(t, 400, code, q)
		assert.Equal(t, param, m["error"].(map[string]any)["param"], "%s: %s", q, raw)
	}

	code, _, raw = n.adminDo(t, "GET", "/admin/usage?format=csv", "")
	require.Equal(t, 200, code, string(raw))
	lines := strings.Split(strings.TrimSpace(string(raw)), "\n")
	require.Len(t, lines, 2, string(raw))
	assert.Equal(t, "since,until,tenant,key,model,requests,input_tokens,output_tokens,gpu_ms,gpu_joules,usd_micros,cached_input_tokens", lines[0])
	assert.Contains(t, lines[1], ",acme,_unnamed,sim-model,3,30,30,")

	var budgets []struct {
		ID                          string
		Limit, Committed, Remaining int64
	}
	code, _, raw = n.adminDo(t, "GET", "/admin/budgets?tenant=acme", "")
	require.Equal(t, 200, code, string(raw))
	require.NoError(t, json.Unmarshal(raw, &budgets))
	require.Len(t, budgets, 1, string(raw))
	assert.Equal(t, int64(60), budgets[0].Committed, "budget list shows the window's use: %s", raw)
	assert.Equal(t, int64(100000-60), budgets[0].Remaining)

	// A reload that lowers the limit shows at once, before any request.
	next := *loaded
	next.Tenants = append([]config.Tenant(nil), loaded.Tenants...)
	next.Tenants[0].Budgets = []config.Budget{{Dimension: "tokens", Limit: 50000, Window: 24 * time.Hour, Mode: "block"}}
	write(&next)
	code, _, raw = n.adminDo(t, "POST", "/admin/reload", "")
	require.Equal(t, 200, code, string(raw))
	assert.Equal(t, []limitRow{{Dimension: "tokens", Window: "24h", Limit: 50000, Committed: 60, Remaining: 50000 - 60}}, tenantLimits(),
		"the reloaded limit, with the window's use")
}
