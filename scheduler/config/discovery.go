package config

import (
	"bytes"
	"errors"
	"fmt"
	"net/url"
	"time"

	"go.yaml.in/yaml/v3"
)

// Discovery finds replicas at run time, in addition to upstream.replicas
// (docs/discovery.md). A replica it finds is probed (scraped) before
// anything is routed to it; one that disappears is drained: no new work,
// what runs there finishes and settles, then it is removed.
type Discovery struct {
	// DNS names whose records are the replicas, each re-resolved on its
	// interval (a Kubernetes headless Service resolves to its ready pods).
	DNS []DNSDiscovery `yaml:"dns"`
	// File is a replica list re-read when it changes.
	File FileDiscovery `yaml:"file"`
}

// Enabled reports whether some discovery source is configured.
func (d *Discovery) Enabled() bool { return len(d.DNS) > 0 || d.File.Path != "" }

// DNSDiscovery is one DNS name whose addresses are replicas.
type DNSDiscovery struct {
	// Name is resolved for A/AAAA records (every address, on Port), or
	// with SRV for SRV records (every target on its record's port).
	Name string `yaml:"name"`
	// SRV: Name is an SRV name (_http._tcp.vllm.ns.svc.cluster.local).
	SRV bool `yaml:"srv"`
	// Port every address serves on (A/AAAA). Required without srv.
	Port int `yaml:"port"`
	// Scheme of the replicas' URLs: http (default) or https.
	Scheme string `yaml:"scheme"`
	// Interval between resolutions. Default 10s.
	Interval time.Duration `yaml:"interval"`
	// Replica holds what every replica of this name is configured with
	// (models, max_num_seqs, capacity_tokens, max_model_len,
	// priority_scheduling, api_key_env, api_key_file), as in
	// upstream.replicas; name, url and gpus are not set here.
	Replica Replica `yaml:"replica"`
}

// FileDiscovery is a watched replica list.
type FileDiscovery struct {
	// Path of a YAML file with a replicas: list shaped as
	// upstream.replicas (name optional: the URL's host:port).
	Path string `yaml:"path"`
	// Interval between checks of the file. Default 5s.
	Interval time.Duration `yaml:"interval"`
}

// DefaultDNSInterval and DefaultFileInterval are the discovery intervals'
// defaults.
const (
	DefaultDNSInterval  = 10 * time.Second
	DefaultFileInterval = 5 * time.Second
)

func (d *Discovery) applyDefaults() {
	for i := range d.DNS {
		e := &d.DNS[i]
		def(&e.Scheme, "http")
		def(&e.Interval, DefaultDNSInterval)
		def(&e.Replica.MaxNumSeqs, 256)
	}
	if d.File.Path != "" {
		def(&d.File.Interval, DefaultFileInterval)
	}
}

// validateDiscovery checks upstream.discovery.
func (v *validator) discovery(d *Discovery) {
	for i, e := range d.DNS {
		p := fmt.Sprintf("upstream.discovery.dns[%d]", i)
		v.nonEmpty(p+".name", e.Name)
		switch {
		case e.SRV && e.Port != 0:
			v.add("%s.port must not be set with srv: true (each SRV record names its port)", p)
		case !e.SRV && (e.Port < 1 || e.Port > 65535):
			v.add("%s.port must be a port number (1-65535) for an A/AAAA name", p)
		}
		v.oneOf(p+".scheme", e.Scheme, "http", "https")
		v.positiveDur(p+".interval", e.Interval)
		if e.Replica.Name != "" || e.Replica.URL != "" || len(e.Replica.GPUs) > 0 {
			v.add("%s.replica must not set name, url or gpus: each address is one replica", p)
		}
		r := e.Replica
		r.Name, r.URL = "dns", e.Scheme+"://"+"discovered"
		v.replica(p+".replica", r)
	}
	if d.File.Path != "" {
		v.positiveDur("upstream.discovery.file.interval", d.File.Interval)
	}
}

// replica checks one replica entry (upstream.replicas[i], a discovered one).
func (v *validator) replica(p string, r Replica) {
	v.url(p+".url", r.URL)
	v.nonNeg(p+".capacity_tokens", r.CapacityTokens)
	v.nonNeg(p+".max_model_len", r.MaxModelLen)
	if r.MaxNumSeqs < 1 {
		v.add("%s.max_num_seqs must be >= 1", p)
	}
	v.modelList(p+".models", r.Models)
	if _, err := r.APIKey(); err != nil {
		v.add("%s: %v", p, err)
	}
}

// maxReplicaFileBytes bounds a discovery file.
const maxReplicaFileBytes = 1 << 20

// ParseReplicaFile parses a discovery file: a YAML mapping with a replicas:
// list shaped as upstream.replicas. Entries get upstream.replicas'
// defaults; one without a name is named by its URL's host:port. Every
// problem is reported, naming path and entry.
func ParseReplicaFile(path string, b []byte) ([]Replica, error) {
	if len(b) > maxReplicaFileBytes {
		return nil, fmt.Errorf("%s: larger than %d bytes", path, maxReplicaFileBytes)
	}
	var doc struct {
		Replicas []Replica `yaml:"replicas"`
	}
	dec := yaml.NewDecoder(bytes.NewReader(b))
	dec.KnownFields(true)
	if err := dec.Decode(&doc); err != nil && !errors.Is(err, errEOF(err)) {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	v := &validator{}
	names := map[string]int{}
	for i := range doc.Replicas {
		r := &doc.Replicas[i]
		def(&r.MaxNumSeqs, 256)
		p := fmt.Sprintf("%s: replicas[%d]", path, i)
		if r.Name == "" {
			if u, err := url.Parse(r.URL); err == nil {
				r.Name = u.Host
			}
		}
		if j, dup := names[r.Name]; dup {
			v.add("%s.name %q duplicates replicas[%d]", p, r.Name, j)
		}
		names[r.Name] = i
		if len(r.GPUs) > 0 {
			v.add("%s.gpus: a discovered replica is not mapped to GPUs (its telemetry comes from its metrics)", p)
		}
		v.replica(p, *r)
	}
	return doc.Replicas, v.err()
}
