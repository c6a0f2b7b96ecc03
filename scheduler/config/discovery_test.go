package config

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

const discoveryTenants = "tenants: [{name: a, api_keys: [\"sha256:0000000000000000000000000000000000000000000000000000000000000000\"]}]\n"

// TestDiscoveryConfig: discovery alone may stand in for upstream.replicas;
// defaults apply; a DNS entry needs a port unless it is an SRV name, and
// its replica template names no single replica.
func TestDiscoveryConfig(t *testing.T) {
	t.Parallel()
	f, err := Parse([]byte("upstream:\n  discovery:\n    dns: [{name: vllm.ns.svc, port: 8000}]\n    file: {path: /r.yaml}\n" + discoveryTenants))
	require.NoError(t, err)
	d := f.Upstream.Discovery
	assert.Equal(t, DefaultDNSInterval, d.DNS[0].Interval)
	assert.Equal(t, "http", d.DNS[0].Scheme)
	assert.Equal(t, 256, d.DNS[0].Replica.MaxNumSeqs)
	assert.Equal(t, 5*time.Second, d.File.Interval)

	_, err = Parse([]byte("upstream:\n  discovery:\n    dns:\n      - {name: a}\n      - {name: b, srv: true, port: 80}\n      - {name: c, port: 1, scheme: ftp, replica: {url: \"http://x:1\"}}\n" + discoveryTenants))
	require.Error(t, err)
	for _, want := range []string{
		"upstream.discovery.dns[0].port must be a port number",
		"upstream.discovery.dns[1].port must not be set with srv: true",
		"upstream.discovery.dns[2].scheme must be one of http, https",
		"upstream.discovery.dns[2].replica must not set name, url or gpus",
	} {
		assert.ErrorContains(t, err, want)
	}

	_, err = Parse([]byte(discoveryTenants))
	assert.ErrorContains(t, err, "upstream.replicas must list at least one replica (or upstream.discovery a source)")
}
