package node

import (
	"context"
	"log/slog"
	"maps"
	"slices"
	"sync"
	"time"

	"github.com/prometheus/client_golang/prometheus"

	"github.com/sluicehq/sluice/scheduler"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/discovery"
	"github.com/sluicehq/sluice/vllm"
)

// fleet applies what replica discovery lists to the running server: one
// mechanism for every replica that joins or leaves after start. Static
// replicas (upstream.replicas) are never touched by it.
type fleet struct {
	srv    *scheduler.Server
	poller *vllm.Poller
	client *vllm.Client
	log    *slog.Logger

	mu     sync.Mutex
	static map[string]string         // static replicas: name → URL
	found  []config.Replica          // the discoverer's last list
	joined map[string]config.Replica // discovered replicas in the server, by name (leaving ones included)
	creds  func() map[string]vllm.Secret
}

// apply makes the server's discovered replicas found: new ones join,
// missing ones leave (drained, then reaped). A name whose URL changed
// leaves first and joins again once the old one is reaped.
func (f *fleet) apply(found []config.Replica) {
	f.mu.Lock()
	defer f.mu.Unlock()
	f.found = found
	f.applyLocked()
}

func (f *fleet) applyLocked() {
	staticURLs := map[string]bool{}
	for _, u := range f.static {
		staticURLs[u] = true
	}
	want := map[string]config.Replica{}
	for _, rc := range f.found {
		if _, clash := f.static[rc.Name]; clash || staticURLs[rc.URL] {
			continue // upstream.replicas lists it: configured, not discovered
		}
		want[rc.Name] = rc
	}
	for _, name := range slices.Sorted(maps.Keys(f.joined)) {
		if rc, ok := want[name]; !ok || rc.URL != f.joined[name].URL {
			if err := f.srv.RemoveReplica(name, "no longer listed by replica discovery"); err != nil {
				f.log.Error("draining a replica that left discovery", "replica", name, "err", err)
			}
		}
	}
	var added []config.Replica
	for _, rc := range f.found {
		cur, in := f.joined[rc.Name]
		if w, ok := want[rc.Name]; !ok || w.URL != rc.URL || (in && cur.URL != rc.URL) {
			continue
		}
		added = append(added, rc)
	}
	// Credentials before the replica is scraped or routed to.
	for _, rc := range added {
		f.joined[rc.Name] = rc
	}
	if err := f.setCredentialsLocked(); err != nil {
		f.log.Error("setting upstream credentials", "err", err)
	}
	for _, rc := range added {
		if err := f.srv.AddReplica(rc); err != nil {
			f.log.Error("adding a discovered replica", "replica", rc.Name, "url", rc.URL, "err", err)
			delete(f.joined, rc.Name)
		}
	}
	if err := f.poller.SetTargets(f.srv.ReplicaTargets()); err != nil {
		f.log.Error("updating the replicas scraped", "err", err)
	}
}

// reap removes the replicas that left once nothing runs on them, and
// lets a replica whose URL changed join again.
func (f *fleet) reap() {
	f.mu.Lock()
	defer f.mu.Unlock()
	gone := f.srv.ReapReplicas()
	if len(gone) == 0 {
		return
	}
	for _, name := range gone {
		delete(f.joined, name)
	}
	f.applyLocked()
}

// setCredentialsLocked installs the static replicas' and the discovered
// ones' API keys (a discovered key that cannot be read is logged; the
// replica is then called without one and says so with 401s).
func (f *fleet) setCredentialsLocked() error {
	creds := f.creds()
	for _, rc := range f.joined {
		k, err := rc.APIKey()
		if err != nil {
			f.log.Error("discovered replica's API key", "replica", rc.Name, "err", err)
			continue
		}
		creds[rc.URL] = k
	}
	return f.client.SetCredentials(creds)
}

// startDiscovery builds the fleet and its discoverer, looks the sources
// up once (so that the first requests find the replicas), and returns the
// loops to run: the discoverer's and the reaper's (every scrape interval).
func startDiscovery(ctx context.Context, cfg *config.File, srv *scheduler.Server, poller *vllm.Poller, client *vllm.Client,
	creds func() map[string]vllm.Secret, reg prometheus.Registerer, resolver discovery.Resolver, log *slog.Logger) (*fleet, []func(context.Context) error, error) {
	f := &fleet{srv: srv, poller: poller, client: client, log: log, static: map[string]string{},
		joined: map[string]config.Replica{}, creds: creds}
	for _, r := range cfg.Upstream.Replicas {
		f.static[r.Name] = r.URL
	}
	if !cfg.Upstream.Discovery.Enabled() {
		return f, nil, nil
	}
	d, err := discovery.New(cfg.Upstream.Discovery, discovery.Deps{Apply: f.apply, Resolver: resolver, Logger: log, Registerer: reg})
	if err != nil {
		return nil, nil, err
	}
	d.Refresh(ctx)
	reaper := func(ctx context.Context) error {
		t := time.NewTicker(cfg.Upstream.ScrapeInterval)
		defer t.Stop()
		for {
			select {
			case <-ctx.Done():
				return nil
			case <-t.C:
				f.reap()
			}
		}
	}
	return f, []func(context.Context) error{d.Run, reaper}, nil
}
