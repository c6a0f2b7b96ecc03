package main

import (
	"context"
	"io"
	"net"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/node"
)

// The admin-client tests set $SLUICE_ADMIN_TOKEN with t.Setenv, so they run
// sequentially (before the package's parallel tests resume).

const testAdminToken = "adm-secret-0123456789"

// seenRequest is what the fake admin API received.
type seenRequest struct {
	Method, URI, Auth, ContentType, Body string
}

// fakeAdmin is an httptest admin API that records each request and answers
// with one canned reply.
type fakeAdmin struct {
	srv    *httptest.Server
	status int
	reply  string

	mu   sync.Mutex
	seen []seenRequest
}

func newFakeAdmin(t *testing.T, status int, reply string) *fakeAdmin {
	t.Helper()
	f := &fakeAdmin{status: status, reply: reply}
	f.srv = httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		b, _ := io.ReadAll(r.Body)
		f.mu.Lock()
		f.seen = append(f.seen, seenRequest{r.Method, r.RequestURI, r.Header.Get("Authorization"), r.Header.Get("Content-Type"), string(b)})
		f.mu.Unlock()
		w.Header().Set("Content-Type", "application/json")
		w.WriteHeader(f.status)
		io.WriteString(w, f.reply)
	}))
	t.Cleanup(f.srv.Close)
	return f
}

func (f *fakeAdmin) requests() []seenRequest {
	f.mu.Lock()
	defer f.mu.Unlock()
	return append([]seenRequest(nil), f.seen...)
}

func setAdminEnv(t *testing.T, token string) {
	t.Helper()
	t.Setenv(adminTokenEnv, token)
	t.Setenv(adminURLEnv, "")
}

// assertNoToken checks that no output carries the admin token.
func assertNoToken(t *testing.T, outs ...string) {
	t.Helper()
	for _, s := range outs {
		assert.NotContains(t, s, testAdminToken)
	}
}

func TestAdminCLICalls(t *testing.T) {
	setAdminEnv(t, testAdminToken)
	const budgetsJSON = `[{"id":"acme:tokens:1h0m0s","tenant":"acme","dimension":"tokens","limit":1000000,"window":"1h0m0s","mode":"block","source":"config"},` +
		`{"id":"acme:usd_micros:720h0m0s","tenant":"acme","dimension":"usd_micros","limit":5000000,"window":"720h0m0s","mode":"warn","source":"admin"}]`
	const reservationsJSON = `[{"id":"r-1","tenant":"acme","state":"unresolved","held":{"tokens":4096,"requests":1,"gpu_ms":900},"lease_expiry":"2026-11-29T19:00:00Z","admitted_at":"2026-11-29T18:59:30Z"}]`
	const clampJSON = `{"tenant":"acme","concurrency":2,"weight":null,"max_output_tokens":512,"models":["llama-8b","qwen-7b"],"reason":"runaway agent","expires_at":"2026-11-29T20:00:00Z","source":"admin"}`
	tests := []struct {
		name     string
		args     []string
		reply    string
		method   string
		uri      string
		body     string // JSON; "" means no body
		stdout   string
		noAdminF bool // rely on $SLUICE_ADMIN_URL instead of --admin
	}{
		{
			name:   "budget set",
			args:   []string{"budget", "set", "--tenant", "acme", "--dimension", "tokens", "--limit", "1000000", "--window", "1h"},
			reply:  `{"id":"acme:tokens:1h0m0s","tenant":"acme","dimension":"tokens","limit":1000000,"window":"1h0m0s","mode":"block","source":"admin"}`,
			method: "PUT", uri: "/admin/budgets",
			body: `{"tenant":"acme","dimension":"tokens","limit":1000000,"window":"1h","mode":"block"}`,
			stdout: "ID                  TENANT  DIMENSION  LIMIT    WINDOW  MODE   SOURCE\n" +
				"acme:tokens:1h0m0s  acme    tokens     1000000  1h0m0s  block  admin\n",
		},
		{
			name:   "budget set warn zero limit",
			args:   []string{"budget", "set", "--tenant", "acme", "--dimension", "usd_micros", "--limit", "0", "--window", "720h", "--mode", "warn"},
			reply:  `{"id":"acme:usd_micros:720h0m0s","tenant":"acme","dimension":"usd_micros","limit":0,"window":"720h0m0s","mode":"warn","source":"admin"}`,
			method: "PUT", uri: "/admin/budgets",
			body: `{"tenant":"acme","dimension":"usd_micros","limit":0,"window":"720h","mode":"warn"}`,
			stdout: "ID                        TENANT  DIMENSION   LIMIT  WINDOW    MODE  SOURCE\n" +
				"acme:usd_micros:720h0m0s  acme    usd_micros  0      720h0m0s  warn  admin\n",
		},
		{
			name:   "budget list",
			args:   []string{"budget", "list"},
			reply:  budgetsJSON,
			method: "GET", uri: "/admin/budgets",
			stdout: "ID                        TENANT  DIMENSION   LIMIT    WINDOW    MODE   SOURCE\n" +
				"acme:tokens:1h0m0s        acme    tokens      1000000  1h0m0s    block  config\n" +
				"acme:usd_micros:720h0m0s  acme    usd_micros  5000000  720h0m0s  warn   admin\n",
		},
		{
			name: "budget list with use",
			args: []string{"budget", "list"},
			reply: `[{"id":"acme:tokens:24h0m0s","tenant":"acme","dimension":"tokens","limit":200000,"window":"24h0m0s","mode":"block","source":"config","committed":49000,"reserved":1000,"remaining":150000},` +
				`{"id":"beta:tokens:24h0m0s","tenant":"beta","dimension":"tokens","limit":100,"window":"24h0m0s","mode":"block","source":"config","usage_error":"ledger unreachable"}]`,
			method: "GET", uri: "/admin/budgets",
			stdout: "ID                   TENANT  DIMENSION  LIMIT   WINDOW   MODE   SOURCE  USED         REMAINING\n" +
				"acme:tokens:24h0m0s  acme    tokens     200000  24h0m0s  block  config  50000 (25%)  150000\n" +
				"beta:tokens:24h0m0s  beta    tokens     100     24h0m0s  block  config  ?            ?\n" +
				"use of beta:tokens:24h0m0s unknown: ledger unreachable\n",
		},
		{
			name: "usage",
			args: []string{"usage", "--tenant", "acme", "--window", "720h"},
			reply: `{"since":"2026-11-05T12:00:00Z","until":"2026-12-05T12:30:00Z","window":"720h0m0s","rows":[` +
				`{"tenant":"acme","key":"ci-bot","model":"llama-8b","usage":{"requests":3,"input_tokens":30,"cached_input_tokens":8,"output_tokens":45,"gpu_ms":120,"gpu_joules":5000,"usd_micros":77}}]}`,
			method: "GET", uri: "/admin/usage?tenant=acme&window=720h",
			stdout: "usage over the last 720h0m0s, from 2026-11-05T12:00:00Z (this instance; sum a fleet's instances)\n" +
				"TENANT  KEY     MODEL     REQUESTS  INPUT  CACHED  OUTPUT  GPU_MS  GPU_MJ  USD_MICROS\n" +
				"acme    ci-bot  llama-8b  3         30     8       45      120     5000    77\n",
		},
		{
			name:   "usage csv",
			args:   []string{"usage", "--csv", "--dimension", "output_tokens"},
			reply:  "since,until,tenant,key,model,output_tokens\n",
			method: "GET", uri: "/admin/usage?dimension=output_tokens&format=csv",
			stdout: "since,until,tenant,key,model,output_tokens\n",
		},
		{
			name:   "budget list tenant",
			args:   []string{"budget", "list", "--tenant", "a&b"},
			reply:  `[]`,
			method: "GET", uri: "/admin/budgets?tenant=a%26b",
			stdout: "no budgets\n",
		},
		{
			name:   "budget list json",
			args:   []string{"budget", "list", "--json"},
			reply:  `[{"id":"acme:tokens:1h0m0s","limit":1000000}]` + "\n",
			method: "GET", uri: "/admin/budgets",
			stdout: "[\n  {\n    \"id\": \"acme:tokens:1h0m0s\",\n    \"limit\": 1000000\n  }\n]\n",
		},
		{
			name:   "budget list from SLUICE_ADMIN_URL",
			args:   []string{"budget", "list"},
			reply:  `[]`,
			method: "GET", uri: "/admin/budgets",
			stdout:   "no budgets\n",
			noAdminF: true,
		},
		{
			name:   "budget rm",
			args:   []string{"budget", "rm", "acme:tokens:1h0m0s"},
			reply:  `{"deleted":"acme:tokens:1h0m0s"}`,
			method: "DELETE", uri: "/admin/budgets/acme:tokens:1h0m0s",
			stdout: "deleted the override acme:tokens:1h0m0s; the config sets no budget with this id\n",
		},
		{
			name:   "budget rm restores the config's budget",
			args:   []string{"budget", "rm", "acme:tokens:24h"},
			reply:  `{"deleted":"acme:tokens:24h0m0s","restored":{"id":"acme:tokens:24h0m0s","tenant":"acme","dimension":"tokens","limit":200000,"window":"24h0m0s","mode":"block","source":"config"}}`,
			method: "DELETE", uri: "/admin/budgets/acme:tokens:24h",
			stdout: "deleted the override acme:tokens:24h0m0s; the config's budget applies again: 200000 per 24h0m0s (block)\n",
		},
		{
			name:   "budget rm flags after id",
			args:   []string{"budget", "rm", "a/b:tokens:1h0m0s", "--json"},
			reply:  `{"deleted":"a/b:tokens:1h0m0s"}`,
			method: "DELETE", uri: "/admin/budgets/a%2Fb:tokens:1h0m0s",
			stdout: "{\n  \"deleted\": \"a/b:tokens:1h0m0s\"\n}\n",
		},
		{
			name:   "reservations list",
			args:   []string{"reservations", "list", "--state", "unresolved", "--tenant", "acme"},
			reply:  reservationsJSON,
			method: "GET", uri: "/admin/reservations?state=unresolved&tenant=acme",
			stdout: "ID   TENANT  STATE       HELD                               LEASE EXPIRY          ADMITTED AT\n" +
				"r-1  acme    unresolved  requests=1,tokens=4096,gpu_ms=900  2026-11-29T19:00:00Z  2026-11-29T18:59:30Z\n",
		},
		{
			name:   "reservations list empty",
			args:   []string{"reservations", "list"},
			reply:  `[]`,
			method: "GET", uri: "/admin/reservations",
			stdout: "no reservations\n",
		},
		{
			name:   "reservations resolve held",
			args:   []string{"reservations", "resolve", "r-1", "--tenant", "acme", "--charge", "held", "--reason", "replica crashed"},
			reply:  `{"id":"r-1","state":"charged","charged":{"tokens":4096,"requests":1}}`,
			method: "POST", uri: "/admin/reservations/r-1/resolve",
			body: `{"tenant":"acme","charge":"held","reason":"replica crashed"}`,
			stdout: "ID   STATE    CHARGED\n" +
				"r-1  charged  requests=1,tokens=4096\n",
		},
		{
			name:   "reservations resolve actual",
			args:   []string{"reservations", "resolve", "--tenant", "acme", "r-2", "--charge", "actual", "--actual", "tokens=1200, gpu_ms=350", "--reason", "from vLLM logs"},
			reply:  `{"id":"r-2","state":"settled","charged":{"tokens":1200,"gpu_ms":350}}`,
			method: "POST", uri: "/admin/reservations/r-2/resolve",
			body: `{"tenant":"acme","charge":"actual","actual":{"tokens":1200,"gpu_ms":350},"reason":"from vLLM logs"}`,
			stdout: "ID   STATE    CHARGED\n" +
				"r-2  settled  tokens=1200,gpu_ms=350\n",
		},
		{
			name:   "reservations resolve zero",
			args:   []string{"reservations", "resolve", "r-3", "--tenant", "acme", "--charge", "zero", "--reason", "never ran"},
			reply:  `{"id":"r-3","state":"settled","charged":{"requests":0,"tokens":0}}`,
			method: "POST", uri: "/admin/reservations/r-3/resolve",
			body: `{"tenant":"acme","charge":"zero","reason":"never ran"}`,
			stdout: "ID   STATE    CHARGED\n" +
				"r-3  settled  -\n",
		},
		{
			name: "tenant clamp",
			args: []string{"tenant", "clamp", "acme", "--concurrency", "2", "--max-output-tokens", "512",
				"--models", "llama-8b, qwen-7b", "--reason", "runaway agent", "--for", "30m"},
			reply:  clampJSON,
			method: "POST", uri: "/admin/tenants/acme/clamp",
			body: `{"concurrency":2,"max_output_tokens":512,"models":["llama-8b","qwen-7b"],"reason":"runaway agent","expires_in":"30m"}`,
			stdout: "TENANT  CONCURRENCY  WEIGHT  MAX OUTPUT TOKENS  MODELS            EXPIRES AT            SOURCE  REASON\n" +
				"acme    2            -       512                llama-8b,qwen-7b  2026-11-29T20:00:00Z  admin   runaway agent\n",
		},
		{
			name:   "tenant clamp weight only, flags first",
			args:   []string{"tenant", "clamp", "--weight", "1", "--reason", "pause", "--for", "1h", "a b"},
			reply:  `{"tenant":"a b","weight":1,"reason":"pause","expires_at":"2026-11-29T21:00:00Z","source":"admin"}`,
			method: "POST", uri: "/admin/tenants/a%20b/clamp",
			body: `{"weight":1,"reason":"pause","expires_in":"1h"}`,
			stdout: "TENANT  CONCURRENCY  WEIGHT  MAX OUTPUT TOKENS  MODELS  EXPIRES AT            SOURCE  REASON\n" +
				"a b     -            1       -                  -       2026-11-29T21:00:00Z  admin   pause\n",
		},
		{
			name:   "tenant unclamp",
			args:   []string{"tenant", "unclamp", "acme"},
			reply:  `{"tenant":"acme","unclamped":true}`,
			method: "DELETE", uri: "/admin/tenants/acme/clamp",
			stdout: "unclamped acme\n",
		},
		{
			name:   "tenant unclamp not clamped",
			args:   []string{"tenant", "unclamp", "acme"},
			reply:  `{"tenant":"acme","unclamped":false}`,
			method: "DELETE", uri: "/admin/tenants/acme/clamp",
			stdout: "acme was not clamped\n",
		},
		{
			name:   "drain",
			args:   []string{"drain"},
			reply:  `{"status":"draining"}`,
			method: "POST", uri: "/admin/drain",
			stdout: "draining\n",
		},
		{
			name:   "reload",
			args:   []string{"reload"},
			reply:  `{"status":"reloaded","version":7}`,
			method: "POST", uri: "/admin/reload",
			stdout: "reloaded (config version 7)\n",
		},
		{
			name:   "reload names the fields that need a restart",
			args:   []string{"reload"},
			reply:  `{"status":"reloaded","version":8,"restart_needed":["listen (127.0.0.1:8080 → 0.0.0.0:8080)"]}`,
			method: "POST", uri: "/admin/reload",
			stdout: "reloaded (config version 8)\nnot applied: these fields take effect only at a restart (the server still runs with its start-up values):\n  listen (127.0.0.1:8080 → 0.0.0.0:8080)\n",
		},
		{
			name:   "reload json",
			args:   []string{"reload", "--json"},
			reply:  `{"status":"reloaded","version":7}`,
			method: "POST", uri: "/admin/reload",
			stdout: "{\n  \"status\": \"reloaded\",\n  \"version\": 7\n}\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAdmin(t, http.StatusOK, tc.reply)
			args := tc.args
			if tc.noAdminF {
				t.Setenv(adminURLEnv, f.srv.URL)
			} else {
				// Last, after any positional argument: parseInterleaved takes it.
				args = append(append([]string(nil), args...), "--admin", f.srv.URL+"/")
			}
			code, out, errOut := runCLI(t, "", args...)
			assert.Equal(t, 0, code, "stderr: %s", errOut)
			assert.Equal(t, tc.stdout, out)
			assert.Empty(t, errOut)
			reqs := f.requests()
			require.Len(t, reqs, 1)
			r := reqs[0]
			assert.Equal(t, tc.method, r.Method)
			assert.Equal(t, tc.uri, r.URI)
			assert.Equal(t, "Bearer "+testAdminToken, r.Auth)
			if tc.body == "" {
				assert.Empty(t, r.Body)
				assert.Empty(t, r.ContentType)
			} else {
				assert.JSONEq(t, tc.body, r.Body)
				assert.Equal(t, "application/json", r.ContentType)
			}
			assertNoToken(t, out, errOut)
		})
	}
}

func TestAdminCLIFlagValidation(t *testing.T) {
	setAdminEnv(t, testAdminToken)
	f := newFakeAdmin(t, http.StatusOK, `{}`)
	set := []string{"budget", "set", "--admin", f.srv.URL, "--tenant", "acme"}
	resolve := []string{"reservations", "resolve", "r-1", "--admin", f.srv.URL, "--tenant", "acme"}
	clamp := []string{"tenant", "clamp", "acme", "--admin", f.srv.URL}
	with := func(base []string, more ...string) []string { return append(append([]string(nil), base...), more...) }
	dims := strings.Join(config.Dimensions, "|")
	tests := []struct {
		name   string
		args   []string
		errOut string // the first line
		usage  bool   // a flag error: the usage follows
	}{
		{name: "set no tenant", args: []string{"budget", "set", "--admin", f.srv.URL, "--dimension", "tokens", "--limit", "1", "--window", "1h"}, errOut: "sluice budget set: --tenant is required\n"},
		{name: "set no dimension", args: with(set, "--limit", "1", "--window", "1h"), errOut: "sluice budget set: --dimension is required (" + dims + ")\n"},
		{name: "set bad dimension", args: with(set, "--dimension", "cpu", "--limit", "1", "--window", "1h"), errOut: `sluice budget set: --dimension must be one of ` + dims + `, got "cpu"` + "\n"},
		{name: "set no limit", args: with(set, "--dimension", "tokens", "--window", "1h"), errOut: "sluice budget set: --limit is required\n"},
		{name: "set negative limit", args: with(set, "--dimension", "tokens", "--limit", "-1", "--window", "1h"), errOut: "sluice budget set: --limit must be >= 0, got -1\n"},
		{name: "set non-integer limit", args: with(set, "--dimension", "tokens", "--limit", "1.5", "--window", "1h"), errOut: `sluice budget set: invalid value "1.5" for flag --limit: parse error` + "\n", usage: true},
		{name: "set no window", args: with(set, "--dimension", "tokens", "--limit", "1"), errOut: "sluice budget set: --window is required (a duration like 30m or 1h)\n"},
		{name: "set zero window", args: with(set, "--dimension", "tokens", "--limit", "1", "--window", "0s"), errOut: `sluice budget set: --window must be a positive duration like 30m or 1h, got "0s"` + "\n"},
		{name: "set bad window", args: with(set, "--dimension", "tokens", "--limit", "1", "--window", "1d"), errOut: `sluice budget set: --window must be a positive duration like 30m or 1h, got "1d"` + "\n"},
		{name: "set bad mode", args: with(set, "--dimension", "tokens", "--limit", "1", "--window", "1h", "--mode", "soft"), errOut: `sluice budget set: --mode must be one of block|warn, got "soft"` + "\n"},
		{name: "set stray arg", args: with(set, "--dimension", "tokens", "--limit", "1", "--window", "1h", "extra"), errOut: `sluice budget set: unexpected argument "extra"` + "\n", usage: true},
		{name: "rm no id", args: []string{"budget", "rm", "--admin", f.srv.URL}, errOut: "sluice budget rm: usage: sluice budget rm ID (an id from 'sluice budget list', like tenant:tokens:24h)\n"},
		{name: "rm two ids", args: []string{"budget", "rm", "a", "b"}, errOut: `sluice budget rm: unexpected argument "b"` + "\n", usage: true},
		{name: "list bad state", args: []string{"reservations", "list", "--state", "settled"}, errOut: `sluice reservations list: --state must be one of unresolved|dispatched|reserved, got "settled"` + "\n"},
		{name: "resolve no id", args: []string{"reservations", "resolve", "--tenant", "acme", "--charge", "held", "--reason", "x"}, errOut: "sluice reservations resolve: usage: sluice reservations resolve ID --tenant T --charge held|actual|zero [--actual dim=N,...] --reason TEXT\n"},
		{name: "resolve no tenant", args: []string{"reservations", "resolve", "r-1", "--charge", "held", "--reason", "x"}, errOut: "sluice reservations resolve: --tenant is required\n"},
		{name: "resolve no charge", args: with(resolve, "--reason", "x"), errOut: "sluice reservations resolve: --charge is required (held|actual|zero)\n"},
		{name: "resolve bad charge", args: with(resolve, "--charge", "half", "--reason", "x"), errOut: `sluice reservations resolve: --charge must be one of held|actual|zero, got "half"` + "\n"},
		{name: "resolve actual missing", args: with(resolve, "--charge", "actual", "--reason", "x"), errOut: "sluice reservations resolve: --charge actual needs --actual dim=N,...\n"},
		{name: "resolve actual with held", args: with(resolve, "--charge", "held", "--actual", "tokens=1", "--reason", "x"), errOut: "sluice reservations resolve: --actual is only allowed with --charge actual\n"},
		{name: "resolve actual bad pair", args: with(resolve, "--charge", "actual", "--actual", "tokens", "--reason", "x"), errOut: `sluice reservations resolve: --actual: "tokens" is not dim=N` + "\n"},
		{name: "resolve actual bad dim", args: with(resolve, "--charge", "actual", "--actual", "watts=3", "--reason", "x"), errOut: `sluice reservations resolve: --actual must be one of ` + dims + `, got "watts"` + "\n"},
		{name: "resolve actual negative", args: with(resolve, "--charge", "actual", "--actual", "tokens=-5", "--reason", "x"), errOut: `sluice reservations resolve: --actual: tokens must be an integer >= 0, got "-5"` + "\n"},
		{name: "resolve actual twice", args: with(resolve, "--charge", "actual", "--actual", "tokens=1,tokens=2", "--reason", "x"), errOut: "sluice reservations resolve: --actual: tokens given twice\n"},
		{name: "resolve no reason", args: with(resolve, "--charge", "zero"), errOut: "sluice reservations resolve: --reason is required\n"},
		{name: "resolve blank reason", args: with(resolve, "--charge", "zero", "--reason", "  "), errOut: "sluice reservations resolve: --reason is required\n"},
		{name: "clamp no name", args: []string{"tenant", "clamp", "--weight", "1", "--reason", "x", "--for", "1m"}, errOut: "sluice tenant clamp: usage: sluice tenant clamp NAME [--concurrency N] [--weight N] [--max-output-tokens N] [--models a,b] --reason TEXT --for 30m\n"},
		{name: "clamp nothing", args: with(clamp, "--reason", "x", "--for", "1m"), errOut: "sluice tenant clamp: nothing to clamp: give --concurrency, --weight, --max-output-tokens or --models\n"},
		{name: "clamp zero concurrency", args: with(clamp, "--concurrency", "0", "--reason", "x", "--for", "1m"), errOut: "sluice tenant clamp: --concurrency must be >= 1, got 0\n"},
		{name: "clamp zero weight", args: with(clamp, "--weight", "0", "--reason", "x", "--for", "1m"), errOut: "sluice tenant clamp: --weight must be >= 1, got 0\n"},
		{name: "clamp zero max output", args: with(clamp, "--max-output-tokens", "0", "--reason", "x", "--for", "1m"), errOut: "sluice tenant clamp: --max-output-tokens must be >= 1, got 0\n"},
		{name: "clamp empty models", args: with(clamp, "--models", " , ", "--reason", "x", "--for", "1m"), errOut: "sluice tenant clamp: --models must name at least one model\n"},
		{name: "clamp no reason", args: with(clamp, "--weight", "1", "--for", "1m"), errOut: "sluice tenant clamp: --reason is required\n"},
		{name: "clamp no for", args: with(clamp, "--weight", "1", "--reason", "x"), errOut: "sluice tenant clamp: --for is required (a duration like 30m or 1h)\n"},
		{name: "clamp negative for", args: with(clamp, "--weight", "1", "--reason", "x", "--for", "-5m"), errOut: `sluice tenant clamp: --for must be a positive duration like 30m or 1h, got "-5m"` + "\n"},
		{name: "unclamp no name", args: []string{"tenant", "unclamp"}, errOut: "sluice tenant unclamp: usage: sluice tenant unclamp NAME\n"},
		{name: "drain stray arg", args: []string{"drain", "now"}, errOut: `sluice drain: unexpected argument "now"` + "\n", usage: true},
		{name: "reload unknown flag", args: []string{"reload", "--force"}, errOut: "sluice reload: unknown flag --force\n", usage: true},
		{name: "bad admin url", args: []string{"drain", "--admin", "127.0.0.1:8081"}, errOut: `sluice drain: --admin must be an http(s) URL like http://127.0.0.1:8081, got "127.0.0.1:8081"` + "\n"},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", tc.args...)
			assert.Equal(t, 2, code)
			assert.Empty(t, out)
			first, rest, _ := strings.Cut(errOut, "\n")
			assert.Equal(t, tc.errOut, first+"\n")
			if tc.usage {
				cmd, _, _ := strings.Cut(first, ":")
				assert.True(t, strings.HasPrefix(rest, "usage: "+cmd+" "), "usage after the error: %q", errOut)
			} else {
				assert.Empty(t, rest, "one line")
			}
		})
	}
	assert.Empty(t, f.requests(), "no call for a usage error")
}

func TestAdminCLIHelp(t *testing.T) {
	setAdminEnv(t, testAdminToken)
	for _, args := range [][]string{{"budget", "help"}, {"budget", "-h"}, {"help", "budget"}} {
		code, out, errOut := runCLI(t, "", args...)
		assert.Equal(t, 0, code, "%v", args)
		assert.Empty(t, errOut, "%v", args)
		assert.True(t, strings.HasPrefix(out, "usage: sluice budget list|rm|set [flags]\n"), "%v: %s", args, out)
		for _, sub := range []string{"\n  budget set ", "\n  budget list ", "\n  budget rm "} {
			assert.Contains(t, out, sub, "%v", args)
		}
	}
	code, out, errOut := runCLI(t, "", "budget")
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	assert.True(t, strings.HasPrefix(errOut, "sluice budget: missing command\nusage: sluice budget list|rm|set [flags]\n"), errOut)
	code, out, errOut = runCLI(t, "", "budget", "add")
	assert.Equal(t, 2, code)
	assert.Empty(t, out)
	assert.True(t, strings.HasPrefix(errOut, "sluice: unknown command \"budget add\"\nusage: sluice budget list|rm|set [flags]\n"), errOut)

	for _, args := range [][]string{{"tenant", "clamp", "-h"}, {"tenant", "clamp", "acme", "--help"}, {"help", "tenant", "clamp"}} {
		code, out, errOut = runCLI(t, "", args...)
		assert.Equal(t, 0, code, "%v", args)
		assert.Empty(t, errOut, "%v", args)
		assert.True(t, strings.HasPrefix(out, "usage: sluice tenant clamp NAME "), "%v: %s", args, out)
		assert.Contains(t, out, "-for string")
		assert.NotContains(t, out, "\n  --token", "the token is never a flag")
		assert.NotContains(t, out, "-admin-token", "the token is never a flag")
	}
}

func TestAdminCLIMissingToken(t *testing.T) {
	setAdminEnv(t, "")
	f := newFakeAdmin(t, http.StatusOK, `{"status":"draining"}`)
	for cmd, args := range map[string][]string{
		"drain":          {"drain", "--admin", f.srv.URL},
		"budget list":    {"budget", "list", "--admin", f.srv.URL},
		"tenant unclamp": {"tenant", "unclamp", "acme", "--admin", f.srv.URL},
	} {
		t.Run(cmd, func(t *testing.T) {
			code, out, errOut := runCLI(t, "", args...)
			assert.Equal(t, 2, code)
			assert.Empty(t, out)
			assert.Equal(t, "sluice "+cmd+": SLUICE_ADMIN_TOKEN is not set: export the server's admin token to use the admin API\n", errOut)
		})
	}
	assert.Empty(t, f.requests())
}

func TestAdminCLIServerErrors(t *testing.T) {
	setAdminEnv(t, testAdminToken)
	tests := []struct {
		name   string
		args   []string
		status int
		reply  string
		errOut string
	}{
		{
			name:   "invalid request with param",
			args:   []string{"budget", "set", "--tenant", "acme", "--dimension", "tokens", "--limit", "5", "--window", "1h"},
			status: 400,
			reply:  `{"error":{"message":"window must be a multiple of 1m","type":"admin_error","code":"invalid_request","param":"window","details":null}}`,
			errOut: "sluice budget set: window must be a multiple of 1m (param: window)\n",
		},
		{
			name:   "wrong token",
			args:   []string{"drain"},
			status: 401,
			reply:  `{"error":{"message":"missing or wrong admin token","type":"admin_error","code":"invalid_admin_token","param":null}}`,
			errOut: "sluice drain: missing or wrong admin token\n",
		},
		{
			name:   "not found",
			args:   []string{"budget", "rm", "acme:tokens:1h0m0s"},
			status: 404,
			reply:  `{"error":{"message":"no budget acme:tokens:1h0m0s","type":"admin_error","code":"not_found"}}`,
			errOut: "sluice budget rm: no budget acme:tokens:1h0m0s\n",
		},
		{
			name:   "invalid config on several lines",
			args:   []string{"reload"},
			status: 400,
			reply:  `{"error":{"message":"tenants[0].weight must be >= 1\nupstream.replicas must list at least one replica","type":"admin_error","code":"invalid_config","param":null}}`,
			errOut: "sluice reload: tenants[0].weight must be >= 1; upstream.replicas must list at least one replica\n",
		},
		{
			name:   "not the error shape",
			args:   []string{"reservations", "list", "--json"},
			status: 502,
			reply:  "<html>bad gateway</html>\n",
			errOut: "sluice reservations list: HTTP 502 from the admin API: <html>bad gateway</html>\n",
		},
		{
			name:   "200 but not JSON",
			args:   []string{"budget", "list"},
			status: 200,
			reply:  "ok",
			errOut: "sluice budget list: admin API sent an unexpected reply: invalid character 'o' looking for beginning of value\n",
		},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			f := newFakeAdmin(t, tc.status, tc.reply)
			t.Setenv(adminURLEnv, f.srv.URL)
			code, out, errOut := runCLI(t, "", tc.args...)
			assert.Equal(t, 1, code)
			assert.Empty(t, out)
			assert.Equal(t, tc.errOut, errOut)
			assert.Len(t, f.requests(), 1)
			assertNoToken(t, out, errOut)
		})
	}
}

func TestAdminCLIUnreachable(t *testing.T) {
	setAdminEnv(t, testAdminToken)
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	addr := ln.Addr().String()
	require.NoError(t, ln.Close())

	code, out, errOut := runCLI(t, "", "drain", "--admin", "http://"+addr)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Equal(t, "sluice drain: cannot reach the admin API at http://"+addr+": connection refused (is sluice serve running? set --admin or $SLUICE_ADMIN_URL)\n", errOut)
}

func TestAdminCLITimeout(t *testing.T) {
	setAdminEnv(t, testAdminToken)
	old := adminTimeout
	adminTimeout = 50 * time.Millisecond
	t.Cleanup(func() { adminTimeout = old })
	srv := httptest.NewServer(http.HandlerFunc(func(_ http.ResponseWriter, r *http.Request) {
		<-r.Context().Done() // never answers; returns once the client gives up
	}))
	t.Cleanup(srv.Close)

	code, out, errOut := runCLI(t, "", "reload", "--admin", srv.URL)
	assert.Equal(t, 1, code)
	assert.Empty(t, out)
	assert.Equal(t, "sluice reload: no answer from the admin API at "+srv.URL+" within 50ms\n", errOut)
}

func TestAdminCLIBasePath(t *testing.T) {
	setAdminEnv(t, testAdminToken)
	f := newFakeAdmin(t, http.StatusOK, `{"status":"draining"}`)
	code, out, errOut := runCLI(t, "", "drain", "--admin", f.srv.URL+"/sluice/")
	assert.Equal(t, 0, code, errOut)
	assert.Equal(t, "draining\n", out)
	reqs := f.requests()
	require.Len(t, reqs, 1)
	assert.Equal(t, "/sluice/admin/drain", reqs[0].URI)
}

func TestParseInterleaved(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		args []string
		pos  []string
		x    string
		b    bool
	}{
		{name: "flags first", args: []string{"-x", "1", "a"}, pos: []string{"a"}, x: "1"},
		{name: "flags after", args: []string{"a", "-x", "1", "--b"}, pos: []string{"a"}, x: "1", b: true},
		{name: "mixed", args: []string{"--b", "a", "-x=2", "c"}, pos: []string{"a", "c"}, x: "2", b: true},
		{name: "double dash", args: []string{"a", "--", "-x", "1"}, pos: []string{"a", "-x", "1"}},
		{name: "none", args: nil, pos: nil},
	}
	for _, tc := range tests {
		t.Run(tc.name, func(t *testing.T) {
			t.Parallel()
			fs := newFlags("t")
			x := fs.String("x", "", "")
			b := fs.Bool("b", false, "")
			pos, err := parseInterleaved(fs, tc.args, -1)
			require.NoError(t, err)
			assert.Equal(t, tc.pos, pos)
			assert.Equal(t, tc.x, *x)
			assert.Equal(t, tc.b, *b)
		})
	}
}

// TestAdminCLIAgainstServer drives the clients against a real Sluice node
// (embedded ledger, one replica that never answers: the admin API does not
// need it).
func TestAdminCLIAgainstServer(t *testing.T) {
	setAdminEnv(t, testAdminToken)
	cfg, err := config.Parse([]byte("upstream:\n  replicas:\n    - {name: r0, url: \"http://127.0.0.1:1\"}\n" +
		"gpu: {telemetry: off}\nserver: {drain_timeout: 1s}\ntenants:\n" +
		"  - {name: acme, api_keys: [\"" + config.HashKey("sk-acme-test") + "\"]}\n"))
	require.NoError(t, err)
	apiLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	adminLn, err := net.Listen("tcp", "127.0.0.1:0")
	require.NoError(t, err)
	admin := "http://" + adminLn.Addr().String()
	ctx, cancel := context.WithCancel(context.Background())
	ready := make(chan struct{})
	done := make(chan error, 1)
	go func() {
		done <- node.Run(ctx, cfg, node.Options{APIListener: apiLn, AdminListener: adminLn, AdminToken: testAdminToken,
			Ready: func(string, string) { close(ready) }})
	}()
	t.Cleanup(func() {
		cancel()
		assert.NoError(t, <-done)
	})
	select {
	case <-ready:
	case err := <-done:
		t.Fatalf("node stopped: %v", err)
	}
	t.Setenv(adminURLEnv, admin)

	t.Setenv(adminTokenEnv, "wrong-token")
	code, _, errOut := runCLI(t, "", "reload")
	assert.Equal(t, 1, code)
	assert.Equal(t, "sluice reload: missing or wrong admin token\n", errOut)
	t.Setenv(adminTokenEnv, testAdminToken)

	const budgetTable = "ID                  TENANT  DIMENSION  LIMIT  WINDOW  MODE   SOURCE\n" +
		"acme:tokens:1h0m0s  acme    tokens     5000   1h0m0s  block  admin\n"
	steps := []struct {
		name   string
		args   []string
		code   int
		stdout string // a regexp for "clamp", whose expiry moves
		stderr string
	}{
		{name: "set", args: []string{"budget", "set", "--tenant", "acme", "--dimension", "tokens", "--limit", "5000", "--window", "1h"}, stdout: budgetTable},
		{name: "list", args: []string{"budget", "list", "--tenant", "acme"},
			stdout: "ID                  TENANT  DIMENSION  LIMIT  WINDOW  MODE   SOURCE  USED    REMAINING\n" +
				"acme:tokens:1h0m0s  acme    tokens     5000   1h0m0s  block  admin   0 (0%)  5000\n"},
		{name: "rm", args: []string{"budget", "rm", "acme:tokens:60m"}, stdout: "deleted the override acme:tokens:1h0m0s; the config sets no budget with this id\n"},
		{name: "list after rm", args: []string{"budget", "list", "--tenant", "acme"}, stdout: "no budgets\n"},
		{name: "rm again", args: []string{"budget", "rm", "acme:tokens:1h0m0s"}, code: 1,
			stderr: `sluice budget rm: budget "acme:tokens:1h0m0s": not found` + "\n"},
		{name: "set unknown tenant", args: []string{"budget", "set", "--tenant", "nobody", "--dimension", "tokens", "--limit", "1", "--window", "1h"}, code: 1,
			stderr: `sluice budget set: unknown tenant "nobody" (param: tenant)` + "\n"},
		{name: "clamp", args: []string{"tenant", "clamp", "acme", "--max-output-tokens", "3", "--models", "m1", "--reason", "suspicious", "--for", "1h"},
			stdout: `^TENANT  CONCURRENCY  WEIGHT  MAX OUTPUT TOKENS  MODELS  EXPIRES AT            SOURCE  REASON\n` +
				`acme    -            -       3                  m1      \d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ  admin   suspicious\n$`},
		{name: "unclamp", args: []string{"tenant", "unclamp", "acme"}, stdout: "unclamped acme\n"},
		{name: "unclamp again", args: []string{"tenant", "unclamp", "acme"}, code: 1, stderr: "sluice tenant unclamp: tenant acme has no clamp\n"},
		{name: "resolve bad id", args: []string{"reservations", "resolve", "r-1", "--tenant", "acme", "--charge", "held", "--reason", "x"}, code: 1,
			stderr: "sluice reservations resolve: must be a 32-hex-digit ledger request id (param: id)\n"},
		{name: "drain", args: []string{"drain"}, stdout: "draining\n"},
	}
	for _, st := range steps {
		code, out, errOut := runCLI(t, "", st.args...)
		assert.Equal(t, st.code, code, "%s: %s", st.name, errOut)
		if st.name == "clamp" {
			assert.Regexp(t, st.stdout, out, st.name)
		} else {
			assert.Equal(t, st.stdout, out, st.name)
		}
		assert.Equal(t, st.stderr, errOut, st.name)
	}
}
