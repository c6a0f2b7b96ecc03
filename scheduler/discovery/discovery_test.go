package discovery

import (
	"bytes"
	"context"
	"errors"
	"io/fs"
	"log/slog"
	"net"
	"strings"
	"sync"
	"testing"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"

	"github.com/sluicehq/sluice/internal/promsum"
	"github.com/sluicehq/sluice/scheduler/config"
)

type fakeResolver struct {
	mu    sync.Mutex
	addrs []string
	err   error
}

func (f *fakeResolver) LookupIPAddr(_ context.Context, host string) ([]net.IPAddr, error) {
	f.mu.Lock()
	defer f.mu.Unlock()
	if f.err != nil {
		return nil, f.err
	}
	var out []net.IPAddr
	for _, a := range f.addrs {
		out = append(out, net.IPAddr{IP: net.ParseIP(a)})
	}
	return out, nil
}

func (f *fakeResolver) LookupSRV(context.Context, string, string, string) (string, []*net.SRV, error) {
	return "", nil, errors.New("A records only here")
}

type applied struct {
	mu    sync.Mutex
	lists [][]config.Replica
}

func (a *applied) apply(rs []config.Replica) {
	a.mu.Lock()
	defer a.mu.Unlock()
	a.lists = append(a.lists, rs)
}

func (a *applied) last() []string {
	a.mu.Lock()
	defer a.mu.Unlock()
	var names []string
	for _, r := range a.lists[len(a.lists)-1] {
		names = append(names, r.Name+"="+r.URL)
	}
	return names
}

func parseDiscovery(t *testing.T, y string) config.Discovery {
	t.Helper()
	cfg, err := config.Parse([]byte("upstream:\n  discovery:\n" + y + "tenants: [{name: a, api_keys: [\"" + config.HashKey("k") + "\"]}]\n"))
	require.NoError(t, err)
	return cfg.Upstream.Discovery
}

// TestDNSKeepsLastSetOnError: every A/AAAA address is a replica on the
// configured port, carrying the entry's replica settings; a failed lookup
// keeps the last list (no Apply), logs once per streak and sets the gauge.
func TestDNSKeepsLastSetOnError(t *testing.T) {
	t.Parallel()
	res := &fakeResolver{addrs: []string{"10.0.0.2", "fd00::1", "10.0.0.2"}}
	var got applied
	var logs bytes.Buffer
	reg := prometheus.NewRegistry()
	d, err := New(parseDiscovery(t, "    dns: [{name: vllm.ns.svc, port: 8000, replica: {models: [m], max_num_seqs: 16}}]\n"),
		Deps{Apply: got.apply, Resolver: res, Logger: slog.New(slog.NewTextHandler(&logs, nil)), Registerer: reg})
	require.NoError(t, err)
	d.Refresh(t.Context())
	assert.Equal(t, []string{"10.0.0.2:8000=http://10.0.0.2:8000", "[fd00::1]:8000=http://[fd00::1]:8000"}, got.last())
	first := got.lists[0][0]
	assert.Equal(t, []string{"m"}, first.Models)
	assert.Equal(t, 16, first.MaxNumSeqs)

	src := map[string]string{"source": "dns:vllm.ns.svc"}
	res.err = &net.DNSError{Err: "i/o timeout", Name: "vllm.ns.svc", IsTimeout: true}
	d.Refresh(t.Context())
	d.Refresh(t.Context())
	assert.Len(t, got.lists, 1, "a failed lookup changes nothing")
	up, _ := promsum.Sum(reg, "sluice_discovery_source_up", src)
	n, _ := promsum.Sum(reg, "sluice_discovery_replicas", src)
	errs, _ := promsum.Sum(reg, "sluice_discovery_errors_total", src)
	assert.Equal(t, []float64{0, 2, 2}, []float64{up, n, errs})
	assert.Equal(t, 1, strings.Count(logs.String(), "keeping the replicas it last listed"))

	res.err, res.addrs = nil, []string{"10.0.0.3"}
	d.Refresh(t.Context())
	assert.Equal(t, []string{"10.0.0.3:8000=http://10.0.0.3:8000"}, got.last())
	up, _ = promsum.Sum(reg, "sluice_discovery_source_up", src)
	assert.Equal(t, 1.0, up)
}

// TestFileSource: the file's replicas (named by host:port without a name)
// are applied when it changes; an unreadable or invalid file keeps them.
func TestFileSource(t *testing.T) {
	t.Parallel()
	var mu sync.Mutex
	content, readErr := "replicas:\n  - {url: \"http://10.1.0.1:8000\"}\n  - {name: big, url: \"http://10.1.0.2:8000\", capacity_tokens: 100000}\n", error(nil)
	read := func(string) ([]byte, error) {
		mu.Lock()
		defer mu.Unlock()
		return []byte(content), readErr
	}
	var got applied
	d, err := New(parseDiscovery(t, "    file: {path: /etc/sluice/replicas.yaml}\n"), Deps{Apply: got.apply, ReadFile: read})
	require.NoError(t, err)
	d.Refresh(t.Context())
	d.Refresh(t.Context())
	require.Len(t, got.lists, 1, "an unchanged file applies nothing")
	assert.Equal(t, []string{"10.1.0.1:8000=http://10.1.0.1:8000", "big=http://10.1.0.2:8000"}, got.last())
	assert.Equal(t, 256, got.lists[0][0].MaxNumSeqs, "upstream.replicas' defaults")

	for _, bad := range []struct {
		text string
		err  error
	}{{"", fs.ErrNotExist}, {"replicas:\n  - {url: \"ftp://x\"}\n", nil}, {"replicas:\n  - {url: \"http://a:1\", bogus: 1}\n", nil}} {
		mu.Lock()
		content, readErr = bad.text, bad.err
		mu.Unlock()
		d.Refresh(t.Context())
		assert.Len(t, got.lists, 1, "%q keeps the last list", bad.text)
	}
	mu.Lock()
	content, readErr = "replicas: []\n", nil
	mu.Unlock()
	d.Refresh(t.Context())
	require.Len(t, got.lists, 2)
	assert.Empty(t, got.lists[1], "an empty list is a list: every replica leaves")
}
