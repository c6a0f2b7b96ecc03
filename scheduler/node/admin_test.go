package node

import (
	"encoding/json"
	"io"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/vllm/sim"
)

// adminDo calls the admin API with the admin token unless token is given.
func (n *node) adminDo(t *testing.T, method, path, body string, token ...string) (int, map[string]any, []byte) {
	t.Helper()
	req, _ := http.NewRequest(method, n.adminURL+path, strings.NewReader(body))
	tok := keyAdmin
	if len(token) > 0 {
		tok = token[0]
	}
	if tok != "" {
		req.Header.Set("Authorization", "Bearer "+tok)
	}
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	defer resp.Body.Close()
	raw, _ := io.ReadAll(resp.Body)
	var m map[string]any
	_ = json.Unmarshal(raw, &m)
	return resp.StatusCode, m, raw
}

func TestAdminAuth(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	for _, ep := range []struct{ method, path string }{
		{"GET", "/admin/tenants"}, {"GET", "/admin/budgets"}, {"PUT", "/admin/budgets"}, {"DELETE", "/admin/budgets/x"},
		{"GET", "/admin/tenants/acme/usage"}, {"POST", "/admin/tenants/acme/clamp"}, {"DELETE", "/admin/tenants/acme/clamp"},
		{"POST", "/admin/reservations/00/resolve"}, {"GET", "/admin/reservations"}, {"POST", "/admin/drain"},
		{"POST", "/admin/reload"}, {"GET", "/admin/replicas"},
	} {
		for _, tok := range []string{"", "wrong-token"} {
			code, m, _ := n.adminDo(t, ep.method, ep.path, "{}", tok)
			assert.Equal(t, 401, code, "%s %s token %q", ep.method, ep.path, tok)
			assert.Equal(t, "invalid_admin_token", m["error"].(map[string]any)["code"])
		}
	}
}

func TestAdminBudgetsAndUsage(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	state := filepath.Join(t.TempDir(), "admin.json")
	cfg := nodeConfig(t, []*simReplica{rep}, "    budgets: [{dimension: tokens, limit: 100000, window: 1h}]\n", "")
	cfg.Admin.StateFile = state
	n := startNode(t, cfg)

	code, _, raw := n.adminDo(t, "GET", "/admin/budgets?tenant=acme", "")
	require.Equal(t, 200, code)
	assert.Contains(t, string(raw), `"id":"acme:tokens:1h0m0s"`)
	assert.Contains(t, string(raw), `"source":"config"`)

	// Bad input names the field.
	for _, tc := range []struct{ body, param string }{
		{`{"tenant":"acme","dimension":"tokens","limit":-1,"window":"1h"}`, "budget"},
		{`{"tenant":"acme","dimension":"tokens","limit":5,"window":"soon"}`, "window"},
		{`{"tenant":"nobody","dimension":"tokens","limit":5,"window":"1h"}`, "tenant"},
		{`{"tenant":"acme","dimension":"tokens","window":"1h"}`, "limit"},
		{`{"tenant":"acme","bogus":1}`, "body"},
	} {
		code, m, raw := n.adminDo(t, "PUT", "/admin/budgets", tc.body)
		assert.Equal(t, 400, code, string(raw))
		assert.Equal(t, tc.param, m["error"].(map[string]any)["param"], string(raw))
	}

	// A budget of 1 request per hour: one request passes, the next is 429.
	code, m, raw := n.adminDo(t, "PUT", "/admin/budgets", `{"tenant":"acme","dimension":"requests","limit":1,"window":"1h"}`)
	require.Equal(t, 200, code, string(raw))
	assert.Equal(t, "acme:requests:1h0m0s", m["id"])
	resp := n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	readAll(t, resp)
	require.Equal(t, 200, resp.StatusCode)
	resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	body := readAll(t, resp)
	require.Equal(t, 429, resp.StatusCode)
	_, det := errorCode(t, body)
	assert.Equal(t, "requests", det["dimension"])

	// Usage shows it; the state file persists it.
	code, _, raw = n.adminDo(t, "GET", "/admin/tenants/acme/usage", "")
	require.Equal(t, 200, code, string(raw))
	assert.Contains(t, string(raw), `"dimension":"requests","window":"1h","limit":1,"mode":"block","committed":1`)
	persisted, err := os.ReadFile(state)
	require.NoError(t, err)
	assert.Contains(t, string(persisted), "acme:requests:1h0m0s")

	// Removing it admits again.
	code, _, raw = n.adminDo(t, "DELETE", "/admin/budgets/acme:requests:1h0m0s", "")
	require.Equal(t, 200, code, string(raw))
	resp = n.post(t, "/v1/chat/completions", keyAcme, chatBody)
	readAll(t, resp)
	assert.Equal(t, 200, resp.StatusCode)
	code, _, _ = n.adminDo(t, "DELETE", "/admin/budgets/acme:requests:1h0m0s", "")
	assert.Equal(t, 404, code)
}

func TestAdminClamp(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	code, m, raw := n.adminDo(t, "POST", "/admin/tenants/acme/clamp", `{"max_output_tokens":3,"models":["sim-model"],"reason":"suspicious","expires_in":"1h"}`)
	require.Equal(t, 200, code, string(raw))
	assert.Equal(t, "admin", m["source"])

	// The output cap applies from the next request.
	resp := n.post(t, "/v1/completions", keyAcme, `{"model":"sim-model","prompt":"x","max_tokens":50,"ignore_eos":true}`)
	body := readAll(t, resp)
	require.Equal(t, 200, resp.StatusCode, string(body))
	var out struct {
		Usage struct {
			CompletionTokens int `json:"completion_tokens"`
		} `json:"usage"`
	}
	require.NoError(t, json.Unmarshal(body, &out))
	assert.Equal(t, 3, out.Usage.CompletionTokens, "clamped output cap written upstream")

	code, _, raw = n.adminDo(t, "GET", "/admin/tenants", "")
	require.Equal(t, 200, code)
	assert.Contains(t, string(raw), `"reason":"suspicious"`)

	for _, tc := range []struct{ body, param string }{
		{`{"max_output_tokens":3,"expires_in":"1h"}`, "reason"},
		{`{"max_output_tokens":3,"reason":"x","expires_in":"-1m"}`, "expires_in"},
		{`{"reason":"x","expires_in":"1h"}`, "concurrency"},
	} {
		code, m, raw := n.adminDo(t, "POST", "/admin/tenants/acme/clamp", tc.body)
		assert.Equal(t, 400, code, string(raw))
		assert.Equal(t, tc.param, m["error"].(map[string]any)["param"], string(raw))
	}

	code, _, _ = n.adminDo(t, "DELETE", "/admin/tenants/acme/clamp", "")
	require.Equal(t, 200, code)
	unclamped := n.call(t, "/v1/completions", keyAcme, `{"model":"sim-model","prompt":"x","max_tokens":50,"ignore_eos":true}`)
	require.NoError(t, json.Unmarshal(unclamped.Body, &out))
	assert.Equal(t, 50, out.Usage.CompletionTokens, "unclamped")
	code, _, _ = n.adminDo(t, "DELETE", "/admin/tenants/acme/clamp", "")
	assert.Equal(t, 404, code)
}

func TestAdminResolveBadInput(t *testing.T) {
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "", ""))
	id := strings.Repeat("ab", 16)
	for _, tc := range []struct{ path, body, param string }{
		{"/admin/reservations/xyz/resolve", `{}`, "id"},
		{"/admin/reservations/" + id + "/resolve", `{"tenant":"nobody","charge":"held","reason":"r"}`, "tenant"},
		{"/admin/reservations/" + id + "/resolve", `{"tenant":"acme","charge":"some","reason":"r"}`, "charge"},
		{"/admin/reservations/" + id + "/resolve", `{"tenant":"acme","charge":"held"}`, "reason"},
	} {
		code, m, raw := n.adminDo(t, "POST", tc.path, tc.body)
		assert.Equal(t, 400, code, string(raw))
		assert.Equal(t, tc.param, m["error"].(map[string]any)["param"], string(raw))
	}
	code, _, raw := n.adminDo(t, "POST", "/admin/reservations/"+id+"/resolve", `{"tenant":"acme","charge":"held","reason":"cleanup"}`)
	assert.Equal(t, 404, code, "an unknown reservation: %s", raw)
}
