package node

import (
	"bufio"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"os"
	"os/exec"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

const statusToken = "status-read-only-token"

func statusNode(t *testing.T) (*node, *simReplica) {
	t.Helper()
	rep := startSim(t, sim.DefaultConfig())
	n := startNode(t, nodeConfig(t, []*simReplica{rep}, "    budgets: [{dimension: tokens, limit: 100000, window: 1h}]\n",
		fmt.Sprintf("admin: {status_token: %q}\n", config.HashKey(statusToken))))
	return n, rep
}

func TestStatusAuth(t *testing.T) {
	n, _ := statusNode(t)
	noRedirect := &http.Client{CheckRedirect: func(*http.Request, []*http.Request) error { return http.ErrUseLastResponse }}
	do := func(method, path, bearer, cookie, form string) (int, http.Header, string) {
		var body io.Reader
		if form != "" {
			body = strings.NewReader(form)
		}
		req, err := http.NewRequest(method, n.adminURL+path, body)
		require.NoError(t, err)
		if form != "" {
			req.Header.Set("Content-Type", "application/x-www-form-urlencoded")
		}
		if bearer != "" {
			req.Header.Set("Authorization", "Bearer "+bearer)
		}
		if cookie != "" {
			req.Header.Set("Cookie", "sluice_status="+cookie)
		}
		resp, err := noRedirect.Do(req)
		require.NoError(t, err)
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		return resp.StatusCode, resp.Header, string(b)
	}
	get := func(path, bearer, cookie string) int {
		code, _, _ := do("GET", path, bearer, cookie, "")
		return code
	}

	// Logging in with the token in a form body, or in the header, sets a
	// session cookie that holds no token.
	var sessions []string
	for _, login := range []struct{ bearer, form string }{{"", "token=" + statusToken}, {keyAdmin, ""}} {
		code, h, _ := do("POST", "/status/login", login.bearer, "", login.form)
		require.Equal(t, 303, code)
		assert.True(t, strings.HasSuffix(h.Get("Location"), "/status"), h.Get("Location"))
		var c *http.Cookie
		for _, k := range (&http.Response{Header: h}).Cookies() {
			if k.Name == "sluice_status" {
				c = k
			}
		}
		require.NotNil(t, c, "a session cookie: %v", h)
		assert.True(t, c.HttpOnly)
		assert.Equal(t, http.SameSiteStrictMode, c.SameSite)
		assert.Equal(t, "/status", c.Path, "scoped to the status page")
		assert.Equal(t, 12*3600, c.MaxAge)
		for _, tok := range []string{statusToken, keyAdmin, config.HashKey(statusToken)} {
			assert.NotContains(t, c.Value, tok, "the cookie never holds the token or its hash")
		}
		sessions = append(sessions, c.Value)
	}

	for _, tc := range []struct {
		name, path, bearer, cookie string
		want                       int
	}{
		{"no token", "/status", "", "", 401},
		{"wrong token", "/status.json", "nope", "", 401},
		{"a tenant key is not a status token", "/status.json", keyAcme, "", 401},
		{"admin token", "/status.json", keyAdmin, "", 200},
		{"status token", "/status/report.json", statusToken, "", 200},
		{"status session", "/status", "", sessions[0], 200},
		{"status session, report", "/status/report.json", "", sessions[0], 200},
		{"admin session", "/status/report.json", "", sessions[1], 200},
		{"the raw token is not a session", "/status", "", statusToken, 401},
		{"a forged session", "/status", "", "99999999999.00ff", 401},
		{"a token in the URL is refused", "/status?token=" + statusToken, "", "", 400},
		{"even with a session", "/status/report.json?token=" + statusToken, "", sessions[0], 400},
	} {
		assert.Equal(t, tc.want, get(tc.path, tc.bearer, tc.cookie), tc.name)
	}
	code, _, body := do("GET", "/status", "", "", "")
	assert.Equal(t, 401, code)
	assert.Contains(t, body, `<form method="post" action="/status/login">`, "the page asks for the token with a form")
	code, h, _ := do("POST", "/status/login", "", "", "token=nope")
	assert.Equal(t, 401, code)
	assert.Empty(t, h.Get("Set-Cookie"))
	code, _, _ = do("POST", "/status/login?token="+statusToken, "", "", "")
	assert.Equal(t, 400, code, "not in the URL of a POST either")
	code, _, _ = do("GET", "/status/login", "", "", "")
	assert.Equal(t, 405, code)

	// The status token opens nothing else.
	code, _, _ = n.adminDo(t, "GET", "/admin/tenants", "", statusToken)
	assert.Equal(t, 401, code)
}

func TestStatusJSON(t *testing.T) {
	n, _ := statusNode(t)
	for range 2 {
		require.Equal(t, 200, n.call(t, "/v1/chat/completions", keyAcme, chatBody).StatusCode)
	}
	code, m, raw := n.adminDo(t, "POST", "/admin/keys", `{"tenant":"beta","name":"nightly","budgets":[{"dimension":"tokens","limit":5000,"window":"24h"}]}`)
	require.Equal(t, 200, code, string(raw))
	key := m["key"].(string)
	require.Equal(t, 200, n.call(t, "/v1/completions", key, body20).StatusCode)
	require.Equal(t, 401, n.call(t, "/v1/chat/completions", "sk-wrong", chatBody).StatusCode)
	req, _ := http.NewRequest(http.MethodGet, n.adminURL+"/status.json", nil)
	req.Header.Set("Authorization", "Bearer "+statusToken)
	resp, err := http.DefaultClient.Do(req)
	require.NoError(t, err)
	var st struct {
		Ready   bool `json:"ready"`
		Tenants []struct {
			Name     string           `json:"name"`
			Requests map[string]int64 `json:"requests"`
			Budgets  []struct {
				Dimension string `json:"dimension"`
				Limit     int64  `json:"limit"`
				Committed int64  `json:"committed"`
			} `json:"budgets"`
		} `json:"tenants"`
		Keys []struct {
			Tenant  string `json:"tenant"`
			Label   string `json:"label"`
			Source  string `json:"source"`
			Budgets []struct {
				Limit     int64 `json:"limit"`
				Committed int64 `json:"committed"`
			} `json:"budgets"`
		} `json:"keys"`
		Replicas []struct {
			Name           string `json:"name"`
			State          string `json:"state"`
			CapacityTokens int64  `json:"capacity_tokens"`
		} `json:"replicas"`
	}
	require.NoError(t, json.NewDecoder(resp.Body).Decode(&st))
	resp.Body.Close()
	assert.True(t, st.Ready)
	require.Len(t, st.Tenants, 2)
	assert.Equal(t, "acme", st.Tenants[0].Name)
	assert.Equal(t, int64(2), st.Tenants[0].Requests["ok"])
	require.Len(t, st.Tenants[0].Budgets, 1)
	assert.Equal(t, int64(100000), st.Tenants[0].Budgets[0].Limit)
	assert.Positive(t, st.Tenants[0].Budgets[0].Committed)
	require.Len(t, st.Keys, 1, "only keys with limits of their own")
	assert.Equal(t, "beta", st.Keys[0].Tenant)
	assert.Equal(t, "nightly", st.Keys[0].Label)
	assert.Equal(t, "admin", st.Keys[0].Source)
	require.Len(t, st.Keys[0].Budgets, 1)
	assert.Equal(t, int64(5000), st.Keys[0].Budgets[0].Limit)
	assert.Equal(t, int64(20), st.Keys[0].Budgets[0].Committed, "the key's one 20-token call")
	require.Len(t, st.Replicas, 1)
	assert.Equal(t, "healthy", st.Replicas[0].State)
	assert.Positive(t, st.Replicas[0].CapacityTokens)
}

// TestStatusPageInBrowser loads /status in a real headless Chromium,
// driven over the DevTools protocol on a pipe: the page shows the
// server's tenants and replica, then updates itself after traffic.
func TestStatusPageInBrowser(t *testing.T) {
	bin := ""
	for _, name := range []string{"chromium", "chromium-browser", "google-chrome"} {
		if p, err := exec.LookPath(name); err == nil {
			bin = p
			break
		}
	}
	if bin == "" {
		t.Fatalf("chromium not found: the status page test needs a headless browser (run `make test`, which installs it via scripts/ensure-deps.sh, or `apt-get install chromium`)")
	}
	n, rep := statusNode(t)
	b := startBrowser(t, bin)
	b.navigate(t, n.adminURL+"/status")
	eventually(t, "the login form", func() bool {
		v, _ := b.eval(t, `document.querySelector('input[name="token"]') !== null`).(bool)
		return v
	})
	b.eval(t, fmt.Sprintf(`(function(){document.querySelector('input[name="token"]').value=%q;document.querySelector("form").submit();return true;})()`, statusToken))

	text := func(sel string) string {
		v := b.eval(t, fmt.Sprintf(`(function(){var e=document.querySelector(%q);return e?e.textContent:"";})()`, sel))
		s, _ := v.(string)
		return s
	}
	eventually(t, "the page lists the tenants", func() bool {
		return text(`tr[data-tenant="acme"] td.n`) == "acme" && text(`tr[data-tenant="beta"] td.n`) == "beta"
	})
	assert.Equal(t, "0", text(`#tenants tr[data-tenant="acme"] td.ok`))
	assert.Equal(t, "r0", text(`tr[data-replica="r0"] td.n`))
	assert.Contains(t, text(`tr[data-replica="r0"] td.healthy`), "healthy")
	assert.Equal(t, "-", text(`tr[data-replica="r0"] td.scrape-error`), "no scrape error yet")
	assert.Equal(t, "100,000", text(`#budgets tr[data-tenant="acme"] td:nth-child(5)`))
	assert.Empty(t, text("#err"))

	for range 3 {
		require.Equal(t, 200, n.call(t, "/v1/chat/completions", keyAcme, chatBody).StatusCode)
	}
	require.Equal(t, 200, n.call(t, "/v1/chat/completions", keyBeta, chatBody).StatusCode)
	eventually(t, "the page refreshes itself with the new counts", func() bool {
		return text(`#tenants tr[data-tenant="acme"] td.ok`) == "3" && text(`#tenants tr[data-tenant="beta"] td.ok`) == "1"
	})
	assert.NotEqual(t, "0", text(`#budgets tr[data-tenant="acme"] td.committed`), "budget use updated")

	// The operator's columns: queue bounds, rates, percentiles, refusals,
	// version and uptime, replica state age; no horizontal overflow.
	assert.Equal(t, "256", text(`#tenants tr[data-tenant="acme"] td.max-depth`))
	assert.Equal(t, "no cap", text(`#tenants tr[data-tenant="acme"] td.conc`), "concurrency 0 is no cap, not zero")
	require.Equal(t, 404, n.call(t, "/v1/chat/completions", keyAcme, `{"model":"nope","messages":[{"role":"user","content":"x"}]}`).StatusCode)
	eventually(t, "the refusal, rates and percentiles on the page", func() bool {
		return text(`#refusals tr[data-refusal-tenant="acme"] td.code`) == "model_not_found" &&
			text(`#tenants tr[data-tenant="acme"] td.ttft50`) != "-" && text(`#tenants tr[data-tenant="acme"] td.rps`) != "0.00"
	})
	assert.Contains(t, text("#meta"), "sluice ")
	assert.Contains(t, text("#meta"), " · up ")
	assert.NotEqual(t, "-", text(`tr[data-replica="r0"] td.state-for`))
	overflow, _ := b.eval(t, `document.documentElement.scrollWidth <= window.innerWidth`).(bool)
	assert.True(t, overflow, "wide tables scroll inside their box; the page itself does not overflow")

	// SLUICE_STATUS_SCREENSHOT=FILE keeps a picture of the page
	// (docs/status-page.png is one).
	if out := os.Getenv("SLUICE_STATUS_SCREENSHOT"); out != "" {
		b.send(t, b.session, "Emulation.setDeviceMetricsOverride", map[string]any{"width": 1400, "height": 900, "deviceScaleFactor": 1, "mobile": false}, nil)
		var shot struct {
			Data []byte `json:"data"`
		}
		b.send(t, b.session, "Page.captureScreenshot", map[string]any{"format": "png", "captureBeyondViewport": true}, &shot)
		require.NoError(t, os.WriteFile(out, shot.Data, 0o644))
	}
	assert.Equal(t, int64(4), rep.Stats().Received)
}

// browser is a headless Chromium driven over --remote-debugging-pipe: the
// DevTools protocol as NUL-terminated JSON on fds 3 (in) and 4 (out).
type browser struct {
	cmd     *exec.Cmd
	in      io.WriteCloser
	mu      sync.Mutex // guards nextID, waiters
	nextID  int
	waiters map[int]chan cdpReply
	session string
}

type cdpReply struct {
	Result json.RawMessage `json:"result"`
	Error  *struct {
		Message string `json:"message"`
	} `json:"error"`
}

func startBrowser(t *testing.T, bin string) *browser {
	t.Helper()
	cmdR, cmdW, err := os.Pipe()
	require.NoError(t, err)
	outR, outW, err := os.Pipe()
	require.NoError(t, err)
	cmd := exec.Command(bin, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
		"--no-first-run", "--no-default-browser-check", "--disable-extensions", "--disable-background-networking",
		"--user-data-dir="+t.TempDir(), "--remote-debugging-pipe", "about:blank")
	cmd.ExtraFiles = []*os.File{cmdR, outW}
	var stderr strings.Builder
	cmd.Stderr = &stderr
	require.NoError(t, cmd.Start())
	cmdR.Close()
	outW.Close()
	b := &browser{cmd: cmd, in: cmdW, waiters: map[int]chan cdpReply{}}
	readerDone := make(chan struct{})
	go func() {
		defer close(readerDone)
		rd := bufio.NewReader(outR)
		for {
			msg, err := rd.ReadBytes(0)
			if err != nil {
				return
			}
			var m struct {
				ID int `json:"id"`
				cdpReply
			}
			if json.Unmarshal(msg[:len(msg)-1], &m) != nil || m.ID == 0 {
				continue // an event
			}
			b.mu.Lock()
			ch := b.waiters[m.ID]
			delete(b.waiters, m.ID)
			b.mu.Unlock()
			if ch != nil {
				ch <- m.cdpReply
			}
		}
	}()
	t.Cleanup(func() {
		cmdW.Close()
		_ = cmd.Process.Kill()
		_ = cmd.Wait()
		outR.Close()
		<-readerDone
		if t.Failed() {
			t.Logf("chromium stderr: %s", stderr.String())
		}
	})
	var target struct {
		TargetID string `json:"targetId"`
	}
	b.send(t, "", "Target.createTarget", map[string]any{"url": "about:blank"}, &target)
	var att struct {
		SessionID string `json:"sessionId"`
	}
	b.send(t, "", "Target.attachToTarget", map[string]any{"targetId": target.TargetID, "flatten": true}, &att)
	b.session = att.SessionID
	return b
}

// send makes one DevTools call and decodes its result into out.
func (b *browser) send(t *testing.T, session, method string, params map[string]any, out any) {
	t.Helper()
	if msg := b.call(t, session, method, params, out); msg != "" {
		t.Fatalf("%s: %s", method, msg)
	}
}

// call is send that returns the protocol's error message instead of
// failing the test ("" when the call succeeded).
func (b *browser) call(t *testing.T, session, method string, params map[string]any, out any) string {
	t.Helper()
	b.mu.Lock()
	b.nextID++
	id := b.nextID
	ch := make(chan cdpReply, 1)
	b.waiters[id] = ch
	b.mu.Unlock()
	msg := map[string]any{"id": id, "method": method, "params": params}
	if session != "" {
		msg["sessionId"] = session
	}
	raw, err := json.Marshal(msg)
	require.NoError(t, err)
	_, err = b.in.Write(append(raw, 0))
	require.NoError(t, err, "write to chromium")
	select {
	case r := <-ch:
		if r.Error != nil {
			return r.Error.Message
		}
		if out != nil {
			require.NoError(t, json.Unmarshal(r.Result, out), "%s result", method)
		}
	case <-time.After(30 * time.Second):
		t.Fatalf("%s: no answer from chromium within 30s", method)
	}
	return ""
}

func (b *browser) navigate(t *testing.T, url string) {
	t.Helper()
	b.send(t, b.session, "Page.navigate", map[string]any{"url": url}, nil)
}

// eval evaluates a JavaScript expression in the page and returns its
// value. An evaluation the page's navigation cut off (the login form's
// submit loads the status page) is evaluated again in the new document,
// for up to 10 s: the old document's answer no longer exists.
func (b *browser) eval(t *testing.T, expr string) any {
	t.Helper()
	deadline := time.Now().Add(10 * time.Second)
	for {
		var r struct {
			Result struct {
				Value any `json:"value"`
			} `json:"result"`
		}
		msg := b.call(t, b.session, "Runtime.evaluate", map[string]any{"expression": expr, "returnByValue": true}, &r)
		if msg == "" {
			return r.Result.Value
		}
		navigated := strings.Contains(msg, "navigated or closed") || strings.Contains(msg, "context was destroyed") ||
			strings.Contains(msg, "Cannot find context")
		if !navigated || time.Now().After(deadline) {
			t.Fatalf("Runtime.evaluate: %s", msg)
		}
		time.Sleep(10 * time.Millisecond)
	}
}
