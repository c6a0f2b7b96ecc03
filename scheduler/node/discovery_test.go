package node

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"net"
	"net/url"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"sync"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

// fakeResolver answers SRV lookups with the replicas it is set to, or an
// error; no test reaches a real DNS server.
type fakeResolver struct {
	mu   sync.Mutex
	srvs []*net.SRV
	err  error
}

func (f *fakeResolver) set(reps ...*simReplica) {
	var srvs []*net.SRV
	for _, r := range reps {
		u, _ := url.Parse(r.url)
		host, port, _ := net.SplitHostPort(u.Host)
		p, _ := strconv.Atoi(port)
		srvs = append(srvs, &net.SRV{Target: host + ".", Port: uint16(p)})
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	f.srvs, f.err = srvs, nil
}

func (f *fakeResolver) fail(err error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.err = err
}

func (f *fakeResolver) LookupSRV(_ context.Context, _, _, name string) (string, []*net.SRV, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return "", nil, f.err
	}
	return name, append([]*net.SRV(nil), f.srvs...), nil
}

func (f *fakeResolver) LookupIPAddr(context.Context, string) ([]net.IPAddr, error) {
	return nil, errors.New("the test resolver answers SRV only")
}

// discoveredName is the replica name discovery gives a sim: host:port.
func discoveredName(r *simReplica) string { return strings.TrimPrefix(r.url, "http://") }

// replicaStates is /admin/replicas as name → state.
func (n *node) replicaStates(t *testing.T) map[string]string {
	t.Helper()
	var rows []struct{ Name, State string }
	require.NoError(t, json.Unmarshal([]byte(n.adminGet(t, "/admin/replicas")), &rows))
	out := map[string]string{}
	for _, r := range rows {
		out[r.Name] = r.State
	}
	return out
}

func (n *node) capacityOf(t *testing.T, r *simReplica) float64 {
	t.Helper()
	return n.metric(t, "sluice_replica_capacity_tokens", map[string]string{"replica": discoveredName(r)})
}

const discoveryTenant = "    concurrency: 64\n" + budgets + "      - {dimension: requests, limit: 100000000, window: 1h}\n"

// TestDiscoveryDNSScalesTwoThreeTwo: the replicas are a DNS name's SRV
// records (a headless Service). Scaled from two to three, the third is
// scraped and then takes requests; scaled back, the replica that left gets
// no new request while its running streams finish, every request is
// charged once from its usage, and it is removed once idle. A lookup that
// fails keeps the replicas (logged once, sluice_discovery_source_up 0).
func TestDiscoveryDNSScalesTwoThreeTwo(t *testing.T) {
	a, b, c := startSim(t, slowSim()), startSim(t, slowSim()), startSim(t, slowSim())
	res := &fakeResolver{}
	res.set(a, b)
	cfg, err := config.Parse([]byte(fmt.Sprintf(`upstream:
  scrape_interval: 50ms
  discovery:
    dns:
      - {name: _http._tcp.vllm.test, srv: true, interval: 50ms}
gpu: {telemetry: off}
server: {drain_timeout: 10s}
tenants:
  - name: acme
    api_keys: [%q]
%s`, config.HashKey(keyAcme), discoveryTenant)))
	require.NoError(t, err)
	var logs logBuffer
	n := startNodeOpts(t, cfg, Options{Resolver: res, Log: logs.logger()})
	eventually(t, "both replicas scraped and sized", func() bool { return n.capacityOf(t, a) > 0 && n.capacityOf(t, b) > 0 })
	assert.Equal(t, map[string]string{discoveredName(a): "healthy", discoveredName(b): "healthy"}, n.replicaStates(t))
	sent := 0
	short := func(i int) {
		r := n.call(t, "/v1/chat/completions", keyAcme, fmt.Sprintf(`{"model":"sim-model","messages":[{"role":"user","content":"short %d"}],"max_tokens":3}`, i))
		require.Equal(t, 200, r.StatusCode, string(r.Body))
		sent++
	}

	// Two to three: the new replica is probed, then routed to.
	res.set(a, b, c)
	eventually(t, "the third replica scraped and sized", func() bool { return n.capacityOf(t, c) > 0 })
	eventually(t, "the third replica takes requests", func() bool {
		short(sent)
		return c.Stats().Completed > 0
	})

	// Streams running on all three; then one replica leaves.
	const streams = 6
	var wg sync.WaitGroup
	bodies := make([]string, streams)
	codes := make([]int, streams)
	for i := range streams {
		wg.Go(func() {
			r := n.call(t, "/v1/completions", keyAcme, fmt.Sprintf(`{"model":"sim-model","prompt":"story %d","max_tokens":150,"ignore_eos":true,"stream":true,"stream_options":{"include_usage":true}}`, i))
			codes[i], bodies[i] = r.StatusCode, string(r.Body)
		})
	}
	sent += streams
	eventually(t, "every stream running", func() bool {
		return a.Stats().Running+b.Stats().Running+c.Stats().Running == streams
	})
	leaving, stay := a, []*simReplica{b, c}
	for _, r := range []*simReplica{b, c} {
		if r.Stats().Running > leaving.Stats().Running {
			leaving = r
		}
	}
	if leaving != a {
		stay = []*simReplica{a, b, c}
		for i, r := range stay {
			if r == leaving {
				stay = append(stay[:i], stay[i+1:]...)
				break
			}
		}
	}
	running := leaving.Stats().Running
	require.Positive(t, running)
	received := leaving.Stats().Received
	res.set(stay...)
	eventually(t, "the leaving replica drained", func() bool { return n.replicaStates(t)[discoveredName(leaving)] == "draining" })
	for range 6 {
		short(sent)
	}
	assert.Equal(t, received, leaving.Stats().Received, "a replica that left gets no new request")
	wg.Wait()
	for i := range streams {
		require.Equal(t, 200, codes[i], bodies[i])
		assert.Contains(t, bodies[i], "data: [DONE]", "stream %d finished", i)
	}
	assert.Equal(t, received, leaving.Stats().Completed, "its running streams finished there")
	eventually(t, "the replica that left removed once idle", func() bool {
		_, listed := n.replicaStates(t)[discoveredName(leaving)]
		return !listed
	})
	assert.Len(t, n.replicaStates(t), 2)

	// Charged once each, from the usage the replicas reported.
	var generated int64
	for _, r := range []*simReplica{a, b, c} {
		generated += r.Stats().GenerationTokens
	}
	eventually(t, "every request settled", func() bool {
		return n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "requests"}) == float64(sent) &&
			n.metric(t, "sluice_ledger_reserved", map[string]string{"tenant": "acme", "dimension": "tokens"}) == 0
	})
	assert.Equal(t, float64(generated), n.metric(t, "sluice_ledger_committed", map[string]string{"tenant": "acme", "dimension": "output_tokens"}))

	// A failing lookup keeps the last known replicas.
	src := map[string]string{"source": "dns:_http._tcp.vllm.test"}
	require.Equal(t, 1.0, n.metric(t, "sluice_discovery_source_up", src))
	res.fail(&net.DNSError{Err: "server misbehaving", Name: "_http._tcp.vllm.test", IsTemporary: true})
	eventually(t, "lookups failing", func() bool { return n.metric(t, "sluice_discovery_errors_total", src) >= 3 })
	assert.Equal(t, 0.0, n.metric(t, "sluice_discovery_source_up", src))
	assert.Equal(t, 2.0, n.metric(t, "sluice_discovery_replicas", src), "the last known replicas are kept")
	assert.Len(t, n.replicaStates(t), 2)
	for range 4 {
		short(sent)
	}
	assert.Equal(t, 1, strings.Count(logs.String(), "keeping the replicas it last listed"), "logged once per failing streak")
	res.set(stay...)
	eventually(t, "lookups answer again", func() bool { return n.metric(t, "sluice_discovery_source_up", src) == 1 })
}

// TestDiscoveryFile: a watched replica file adds a replica next to a
// static one, and its removal from the file drains and removes it; an
// unreadable file keeps the replicas it last listed.
func TestDiscoveryFile(t *testing.T) {
	static, found := startSim(t, sim.DefaultConfig()), startSim(t, sim.DefaultConfig())
	file := filepath.Join(t.TempDir(), "replicas.yaml")
	write := func(text string) { require.NoError(t, os.WriteFile(file, []byte(text), 0o600)) }
	write(fmt.Sprintf("replicas:\n  - {name: found, url: %q, max_num_seqs: 8}\n", found.url))
	cfg, err := config.Parse([]byte(fmt.Sprintf(`upstream:
  scrape_interval: 50ms
  replicas: [{name: r0, url: %q}]
  discovery: {file: {path: %q, interval: 50ms}}
gpu: {telemetry: off}
server: {drain_timeout: 5s}
tenants:
  - name: acme
    api_keys: [%q]
`, static.url, file, config.HashKey(keyAcme))))
	require.NoError(t, err)
	n := startNode(t, cfg)
	eventually(t, "the listed replica sized", func() bool {
		return n.metric(t, "sluice_replica_capacity_tokens", map[string]string{"replica": "found"}) > 0
	})
	eventually(t, "the listed replica takes requests", func() bool {
		r := n.call(t, "/v1/chat/completions", keyAcme, chatBody)
		require.Equal(t, 200, r.StatusCode, string(r.Body))
		return found.Stats().Completed > 0
	})

	src := map[string]string{"source": "file:" + file}
	require.NoError(t, os.Remove(file))
	eventually(t, "the missing file noticed", func() bool { return n.metric(t, "sluice_discovery_source_up", src) == 0 })
	assert.Contains(t, n.replicaStates(t), "found", "an unreadable file keeps its replicas")

	write("replicas: []\n")
	eventually(t, "the replica left and removed", func() bool {
		_, listed := n.replicaStates(t)["found"]
		return !listed
	})
	before := found.Stats().Received
	for range 4 {
		r := n.call(t, "/v1/chat/completions", keyAcme, chatBody)
		require.Equal(t, 200, r.StatusCode, string(r.Body))
	}
	assert.Equal(t, before, found.Stats().Received)
	assert.Equal(t, map[string]string{"r0": "healthy"}, n.replicaStates(t))
}
