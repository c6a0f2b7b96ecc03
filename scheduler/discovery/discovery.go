// Package discovery finds vLLM replicas at run time: the addresses a DNS
// name resolves to (a Kubernetes headless Service, re-resolved on an
// interval) and a watched replica file. It reports the replicas every
// source last listed; the node adds the new ones to the fleet and drains
// the ones that left (scheduler.Server.AddReplica, RemoveReplica).
//
// A source that fails (DNS error, unreadable or invalid file) keeps the
// replicas it last listed: a resolver outage must not empty the fleet. The
// failure is logged once per streak and shown by
// sluice_discovery_source_up{source}=0.
package discovery

import (
	"bytes"
	"cmp"
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/scheduler/config"
)

// Resolver is the DNS lookups discovery makes; *net.Resolver is one.
// Tests inject a fake: they never reach a real DNS server.
type Resolver interface {
	LookupIPAddr(ctx context.Context, host string) ([]net.IPAddr, error)
	LookupSRV(ctx context.Context, service, proto, name string) (string, []*net.SRV, error)
}

// Deps are the discoverer's collaborators.
type Deps struct {
	// Apply receives every source's last listed replicas, merged (the
	// first source to list a name or URL keeps it), each time that list
	// changes. Required. Calls do not overlap.
	Apply func([]config.Replica)
	// Resolver. Optional; nil means net.DefaultResolver.
	Resolver Resolver
	// ReadFile reads the replica file. Optional; nil means os.ReadFile.
	ReadFile func(string) ([]byte, error)
	// Logger. Optional; nil discards.
	Logger *slog.Logger
	// Registerer receives the discovery series. Optional.
	Registerer prometheus.Registerer
}

// Discoverer runs the configured sources.
type Discoverer struct {
	deps    Deps
	sources []*source

	mu      sync.Mutex // orders merging and Apply; guards last
	last    []config.Replica
	applied bool

	up       *prometheus.GaugeVec
	replicas *prometheus.GaugeVec
	errs     *prometheus.CounterVec
}

// source is one DNS name or the file, and what it last listed.
type source struct {
	label    string // metrics label and log field: dns:NAME or file:PATH
	interval time.Duration
	list     func(ctx context.Context) ([]config.Replica, error)

	// Guarded by Discoverer.mu.
	known   []config.Replica // last good list; nil before one
	failing bool
}

// New builds a Discoverer for cfg (already defaulted and validated).
func New(cfg config.Discovery, deps Deps) (*Discoverer, error) {
	if deps.Apply == nil {
		return nil, errors.New("discovery: Apply is required")
	}
	if deps.Resolver == nil {
		deps.Resolver = net.DefaultResolver
	}
	if deps.ReadFile == nil {
		deps.ReadFile = os.ReadFile
	}
	if deps.Logger == nil {
		deps.Logger = slog.New(slog.DiscardHandler)
	}
	d := &Discoverer{deps: deps,
		up: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_discovery_source_up",
			Help: "1 while the discovery source's last lookup succeeded; 0 while it fails and its last known replicas are kept."}, []string{"source"}),
		replicas: prometheus.NewGaugeVec(prometheus.GaugeOpts{Name: "sluice_discovery_replicas",
			Help: "Replicas the discovery source last listed (kept while it fails)."}, []string{"source"}),
		errs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sluice_discovery_errors_total",
			Help: "Failed lookups of the discovery source (DNS errors, unreadable or invalid file)."}, []string{"source"}),
	}
	if deps.Registerer != nil {
		for _, c := range []prometheus.Collector{d.up, d.replicas, d.errs} {
			if err := deps.Registerer.Register(c); err != nil {
				return nil, fmt.Errorf("discovery metrics: %w", err)
			}
		}
	}
	for _, e := range cfg.DNS {
		d.sources = append(d.sources, &source{label: "dns:" + e.Name, interval: e.Interval,
			list: func(ctx context.Context) ([]config.Replica, error) { return resolve(ctx, deps.Resolver, e) }})
	}
	if f := cfg.File; f.Path != "" {
		var prev []byte
		var parsed []config.Replica
		d.sources = append(d.sources, &source{label: "file:" + f.Path, interval: f.Interval,
			list: func(context.Context) ([]config.Replica, error) {
				b, err := deps.ReadFile(f.Path)
				if err != nil {
					return nil, err
				}
				if parsed != nil && bytes.Equal(b, prev) {
					return parsed, nil // unchanged: its api_key_file etc. were checked
				}
				rs, err := config.ParseReplicaFile(f.Path, b)
				if err != nil {
					return nil, err
				}
				prev, parsed = b, rs
				if parsed == nil {
					parsed = []config.Replica{}
				}
				return parsed, nil
			}})
	}
	for _, s := range d.sources {
		d.up.WithLabelValues(s.label).Set(0)
		d.replicas.WithLabelValues(s.label).Set(0)
	}
	return d, nil
}

// Refresh looks every source up once and applies the result. The node
// calls it before serving, so that the first requests find the replicas.
func (d *Discoverer) Refresh(ctx context.Context) {
	for _, s := range d.sources {
		d.lookup(ctx, s)
	}
	d.apply()
}

// Run looks each source up on its interval until ctx ends.
func (d *Discoverer) Run(ctx context.Context) error {
	var g errgroup.Group
	for _, s := range d.sources {
		g.Go(func() error {
			t := time.NewTicker(s.interval)
			defer t.Stop()
			for {
				select {
				case <-ctx.Done():
					return nil
				case <-t.C:
				}
				d.lookup(ctx, s)
				d.apply()
			}
		})
	}
	return g.Wait()
}

// lookupTimeout bounds one lookup.
const lookupTimeout = 5 * time.Second

// lookup asks s once and records its list, or its failure (keeping the
// last list).
func (d *Discoverer) lookup(ctx context.Context, s *source) {
	lctx, cancel := context.WithTimeout(ctx, min(lookupTimeout, max(s.interval, time.Second)))
	rs, err := s.list(lctx)
	cancel()
	if ctx.Err() != nil {
		return
	}
	d.mu.Lock()
	defer d.mu.Unlock()
	if err != nil {
		d.errs.WithLabelValues(s.label).Inc()
		d.up.WithLabelValues(s.label).Set(0)
		if !s.failing {
			s.failing = true
			d.deps.Logger.Warn("replica discovery lookup failed: keeping the replicas it last listed",
				"source", s.label, "kept", len(s.known), "err", err)
		}
		return
	}
	if s.failing {
		s.failing = false
		d.deps.Logger.Info("replica discovery lookup answers again", "source", s.label, "replicas", len(rs))
	}
	s.known = rs
	d.up.WithLabelValues(s.label).Set(1)
	d.replicas.WithLabelValues(s.label).Set(float64(len(rs)))
}

// apply merges the sources' lists and hands them to Apply when they
// changed.
func (d *Discoverer) apply() {
	d.mu.Lock()
	defer d.mu.Unlock()
	var all []config.Replica
	names, urls := map[string]string{}, map[string]bool{}
	for _, s := range d.sources {
		for _, r := range s.known {
			if by, dup := names[r.Name]; dup || urls[r.URL] {
				if dup && by != s.label {
					d.deps.Logger.Warn("replica listed by two discovery sources: the first keeps it", "replica", r.Name, "url", r.URL, "kept_by", by, "source", s.label)
				}
				continue
			}
			names[r.Name], urls[r.URL] = s.label, true
			all = append(all, r)
		}
	}
	if d.applied && slices.EqualFunc(all, d.last, sameReplica) {
		return
	}
	d.last, d.applied = all, true
	d.deps.Apply(slices.Clone(all))
}

func sameReplica(a, b config.Replica) bool {
	return a.Name == b.Name && a.URL == b.URL && a.CapacityTokens == b.CapacityTokens && a.MaxNumSeqs == b.MaxNumSeqs &&
		a.MaxModelLen == b.MaxModelLen && slices.Equal(a.Models, b.Models) && a.PriorityScheduling == b.PriorityScheduling &&
		a.APIKeyEnv == b.APIKeyEnv && a.APIKeyFile == b.APIKeyFile
}

// resolve lists the replicas e's records name, sorted by name: every
// A/AAAA address on e.Port, or every SRV target on its port.
func resolve(ctx context.Context, r Resolver, e config.DNSDiscovery) ([]config.Replica, error) {
	type hostPort struct {
		host string
		port int
	}
	var hps []hostPort
	if e.SRV {
		_, srvs, err := r.LookupSRV(ctx, "", "", e.Name)
		if err != nil {
			return nil, err
		}
		for _, s := range srvs {
			hps = append(hps, hostPort{strings.TrimSuffix(s.Target, "."), int(s.Port)})
		}
	} else {
		addrs, err := r.LookupIPAddr(ctx, e.Name)
		if err != nil {
			return nil, err
		}
		for _, a := range addrs {
			hps = append(hps, hostPort{a.String(), e.Port})
		}
	}
	out := make([]config.Replica, 0, len(hps))
	seen := map[string]bool{}
	for _, hp := range hps {
		if hp.host == "" || hp.port <= 0 {
			continue
		}
		hostport := net.JoinHostPort(hp.host, fmt.Sprint(hp.port))
		if seen[hostport] {
			continue
		}
		seen[hostport] = true
		rc := e.Replica
		rc.Models = slices.Clone(rc.Models)
		rc.Name, rc.URL = hostport, e.Scheme+"://"+hostport
		out = append(out, rc)
	}
	slices.SortFunc(out, func(a, b config.Replica) int { return cmp.Compare(a.Name, b.Name) })
	return out, nil
}
