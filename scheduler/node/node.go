// Package node wires one Sluice server from a config: ledger, vLLM client
// and poller, GPU monitor, scheduler, connection watcher and the two
// listeners. `sluice serve`, `sluice demo` and the end-to-end tests run it.
package node

import (
	"context"
	"crypto/sha256"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"maps"
	"net"
	"net/http"
	"os"
	"os/signal"
	"path/filepath"
	"strings"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	sdktrace "go.opentelemetry.io/otel/sdk/trace"
	"golang.org/x/sync/errgroup"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
	"github.com/sluicehq/sluice/scheduler"
	"github.com/sluicehq/sluice/scheduler/adminapi"
	"github.com/sluicehq/sluice/scheduler/audit"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/connwatch"
	"github.com/sluicehq/sluice/scheduler/discovery"
	"github.com/sluicehq/sluice/scheduler/edge"
	"github.com/sluicehq/sluice/vllm"
)

// Options are the process-level inputs of serve.
type Options struct {
	ConfigPath string       // for reloads; "" disables them
	Log        *slog.Logger // nil discards
	AdminToken string
	// Registry, when set, collects the metrics (tests read it).
	Registry *prometheus.Registry
	// apiLn and adminLn, when set, replace listening on the configured
	// addresses (demo and tests use ephemeral ports).
	APIListener, AdminListener net.Listener
	// Ready, when set, is called once both listeners accept.
	Ready func(api, admin string)
	// TraceExporter, when set, receives the spans instead of the OTLP
	// exporter of tracing.endpoint, and turns tracing on (tests).
	TraceExporter sdktrace.SpanExporter
	// Resolver, when set, answers replica discovery's DNS lookups (tests).
	Resolver discovery.Resolver
	// Clock is the time of the scheduler, of the embedded ledger, of the
	// GPU monitor and the replica poller (whose times meet the scheduler's
	// on each replica's GPU-ms clock) and of the audit trail's lines:
	// budget windows, leases, deadlines, queue expiry, clamps, GPU-ms. It
	// must advance like the runtime's clock (an offset is fine; tests start
	// it just past an hour so that no budget window rolls over under them).
	// The Redis ledger keeps Redis's TIME. Optional; nil means time.Now.
	Clock func() time.Time
}

// Run runs a Sluice server until ctx ends, then drains and returns.
func Run(ctx context.Context, cfg *config.File, o Options) (err error) {
	log := o.Log
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	reg := o.Registry
	if reg == nil {
		reg = prometheus.NewRegistry()
	}
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))

	if dir := cfg.Paths().Dir; dir != "" {
		// The packaged layouts name a directory the image or unit may not
		// have created; the files inside it are created as they are written.
		if err := os.MkdirAll(dir, 0o750); err != nil {
			return fmt.Errorf("data_dir: %w", err)
		}
		if ownsDataFiles(cfg) {
			unlock, err := lockDataDir(filepath.Join(dir, config.LockName))
			if err != nil {
				return fmt.Errorf("data_dir: %w", err)
			}
			defer unlock()
		}
	}
	keyer, err := ledger.NewKeyer(idKey(cfg, log))
	if err != nil {
		return err
	}
	led, err := openLedger(cfg, keyer, reg, log, o.Clock)
	if err != nil {
		return err
	}
	defer func() {
		if err := led.Close(); err != nil {
			log.Error("closing the ledger", "err", err)
		}
	}()

	client := vllm.NewClient(vllm.Config{})
	// Replicas are fixed at start; a reload re-reads their credentials
	// (api_key_env / api_key_file) for the URLs they started with.
	urls := map[string]string{}
	for _, r := range cfg.Upstream.Replicas {
		urls[r.Name] = r.URL
	}
	creds, err := readCredentials(cfg, urls)
	if err != nil {
		return err
	}
	if err := client.SetCredentials(creds); err != nil {
		return err
	}
	targets := make([]vllm.Target, 0, len(cfg.Upstream.Replicas))
	gpuReps := make([]gpu.Replica, 0, len(cfg.Upstream.Replicas))
	for _, r := range cfg.Upstream.Replicas {
		targets = append(targets, vllm.Target{Name: r.Name, URL: r.URL})
		gpuReps = append(gpuReps, gpu.Replica{Name: r.Name, GPUs: r.GPUs, CapacityTokens: r.CapacityTokens})
	}
	src, mode, err := gpu.OpenSource(gpu.Mode(cfg.GPU.Telemetry), log, o.Clock)
	if err != nil {
		return err
	}
	gm, err := gpu.NewMetrics(reg)
	if err != nil {
		return err
	}
	attr, err := gpu.NewAttributionMetrics(reg)
	if err != nil {
		return err
	}
	mon, err := gpu.NewMonitor(gpu.Config{
		Telemetry: mode, PollInterval: cfg.GPU.Interval, DownAfter: cfg.Upstream.DownAfter,
		DegradedFactor: cfg.GPU.DegradedFactor, MaxOvercommit: cfg.GPU.MaxOvercommit,
		GPUMsPerInputToken: cfg.GPU.MsPerInputToken, GPUMsPerOutputToken: cfg.GPU.MsPerOutputToken,
		GPUMsMargin: cfg.GPU.Margin,
		StaleAfter:  max(3*time.Second, 3*cfg.Upstream.ScrapeInterval),
		Replicas:    gpuReps,
	}, gpu.Deps{Source: src, Logger: log, Metrics: gm, Attribution: attr, SharedReplicas: cfg.Ledger.Backend == "redis", Now: o.Clock})
	if err != nil {
		return err
	}

	fleet, err := openStateStore(cfg)
	if err != nil {
		return fmt.Errorf("state store: %w", err)
	}
	state := fleet.state
	defer func() {
		if err := fleet.close(); err != nil {
			log.Error("closing the state store", "err", err)
		}
	}()

	var trail *audit.Log
	deps := scheduler.Deps{Ledger: led, Upstream: client, Keyer: keyer, GPU: mon, Attribution: attr, Registerer: reg, Logger: log, Keys: state, Now: o.Clock}
	tracer, err := newTracing(cfg.Tracing, o.TraceExporter)
	if err != nil {
		return err
	}
	defer func() {
		// After the drain: the last requests' spans are batched by now.
		ctx, cancel := context.WithTimeout(context.Background(), cfg.Server.DrainTimeout)
		defer cancel()
		if err := tracer.shutdown(ctx); err != nil {
			log.Error("exporting the last spans", "err", err)
		}
	}()
	deps.Tracer = tracer.tracer()
	if fleet.responses != nil {
		deps.Responses = fleet.responses
	}
	if cfg.Audit.Path != "" {
		if trail, err = audit.Open(audit.Config{Path: cfg.Audit.Path, MaxBytes: cfg.Audit.MaxBytes, Now: o.Clock}); err != nil {
			return fmt.Errorf("audit trail: %w", err)
		}
		defer func() {
			if err := trail.Close(); err != nil {
				log.Error("closing the audit trail", "err", err)
			}
		}()
		deps.Audit = trail
	}
	if cfg.Ledger.Backend == "redis" || cfg.Ledger.Journal != "" {
		// Admin changes share the keys' store: the fleet's in Redis, the
		// node's next to the journal. Without either, admin.state_file.
		deps.State = state
	}
	srv, err := scheduler.New(cfg, deps)
	if err != nil {
		return err
	}
	// A scrape may take longer than the interval on a loaded node; only a
	// replica that stays silent for a second is a failed poll. Each scrape
	// sizes its replica's batch as it answers (ScrapeHook); a replica
	// still learning its batch is scraped faster (ScrapeFast).
	poller, err := vllm.NewPoller(vllm.PollerConfig{Replicas: targets, Interval: cfg.Upstream.ScrapeInterval,
		FastInterval: cfg.Upstream.LearnScrapeInterval, Fast: srv.ScrapeFast,
		Timeout: max(cfg.Upstream.ScrapeInterval, time.Second), DownAfter: cfg.Upstream.DownAfter,
		Scrape: srv.ScrapeHook, Now: o.Clock}, client, reg)
	if err != nil {
		return err
	}
	// Replicas found at run time join and leave through the fleet; the
	// static ones' credentials stay as read above until a reload.
	staticCreds := creds
	fl, discoveryLoops, err := startDiscovery(ctx, cfg, srv, poller, client,
		func() map[string]vllm.Secret { return maps.Clone(staticCreds) }, reg, o.Resolver, log)
	if err != nil {
		return err
	}
	watch, err := connwatch.NewPerConn() // the edge reports closed connections (Edge.HTTPServer)
	if err != nil {
		return err
	}
	defer func() { err = errors.Join(err, watch.Close()) }()

	apiLn, adminLn := o.APIListener, o.AdminListener
	if apiLn == nil {
		if apiLn, err = net.Listen("tcp", cfg.Listen); err != nil {
			return fmt.Errorf("listen %s: %w", cfg.Listen, err)
		}
	}
	if adminLn == nil {
		if adminLn, err = net.Listen("tcp", cfg.AdminListen); err != nil {
			return errors.Join(fmt.Errorf("admin listen %s: %w", cfg.AdminListen, err), apiLn.Close())
		}
	}

	if err := srv.SyncKeys(ctx); err != nil {
		log.Warn("run-time API keys not loaded yet; retrying in the background", "err", err)
	}

	runCtx, stopRun := context.WithCancel(ctx)
	defer stopRun()
	reload := func() error {
		if o.ConfigPath == "" {
			return errors.New("no config file to reload")
		}
		next, err := config.Load(o.ConfigPath)
		if err != nil {
			return err
		}
		creds, err := readCredentials(next, urls)
		if err != nil {
			return err
		}
		if err := srv.Reload(next); err != nil {
			return err
		}
		// With the discovered replicas' keys, read again.
		fl.mu.Lock()
		defer fl.mu.Unlock()
		staticCreds = creds
		return fl.setCredentialsLocked()
	}
	api := edge.New(context.WithoutCancel(ctx), srv, watch).HTTPServer()
	admin := adminapi.New(context.WithoutCancel(ctx), srv, o.AdminToken, reg, adminapi.Hooks{Reload: reload, Drain: stopRun, ConfigPath: o.ConfigPath})
	adminSrv := admin.HTTPServer()

	hup := make(chan os.Signal, 1)
	signal.Notify(hup, syscall.SIGHUP)
	defer signal.Stop(hup)

	// The process's loops run under the server's supervisor (srv.Run):
	// each fails readiness and is logged if it ends early, stops after the
	// drain's last settlements, and its error is returned with the
	// server's.
	srv.Attach("connwatch", watch.Run)
	srv.Attach("poller", poller.Run)
	srv.Attach("gpu", mon.Run)
	srv.Attach("observe", func(ctx context.Context) error {
		return srv.ObserveLoop(ctx, poller, client, cfg.Upstream.ScrapeInterval, poller.Polled())
	})
	srv.Attach("ledger", led.Run)
	if fleet.peers != nil {
		srv.Attach("share", func(ctx context.Context) error { return srv.ShareLoop(ctx, fleet.peers) })
		if cfg.Server.FairShare == "fleet" {
			srv.Attach("fairshare", func(ctx context.Context) error { return srv.FairShareLoop(ctx, fleet.peers) })
		}
	}
	srv.Attach("keys", srv.WatchKeys)
	for _, run := range discoveryLoops {
		srv.Attach("discovery", run)
	}
	if trail != nil {
		srv.Attach("audit", trail.Run)
	}

	// srv.Run drains once runCtx ends (signal, admin drain, or a listener
	// failing); then the listeners close.
	g, gctx := errgroup.WithContext(runCtx)
	drained := make(chan struct{})
	var runErr error // every loop's failure, not only the group's first error
	g.Go(func() error { defer close(drained); runErr = srv.Run(gctx); return nil })
	g.Go(func() error { return api.Serve(apiLn) })
	g.Go(func() error {
		if err := adminSrv.Serve(adminLn); !errors.Is(err, http.ErrServerClosed) {
			return err
		}
		return nil
	})
	g.Go(func() error {
		<-drained
		return stopServing(servedBy{api.Shutdown, apiLn},
			servedBy{func() error { return adminSrv.Shutdown(context.Background()) }, adminLn})
	})
	g.Go(func() error {
		for {
			select {
			case <-gctx.Done():
				return nil
			case <-hup:
				if err := reload(); err != nil {
					log.Error("reload refused; keeping the running config", "err", strings.ReplaceAll(err.Error(), "\n", "; "))
				}
			}
		}
	})
	log.Info("sluice serving", "api", apiLn.Addr().String(), "admin", adminLn.Addr().String(),
		"ledger", cfg.Ledger.Backend, "replicas", len(cfg.Upstream.Replicas), "tenants", len(cfg.Tenants))
	if o.Ready != nil {
		o.Ready(apiLn.Addr().String(), adminLn.Addr().String())
	}
	err = errors.Join(g.Wait(), runErr)
	log.Info("sluice stopped")
	return err
}

// servedBy is a server's Shutdown and the listener its Serve is given.
type servedBy struct {
	shutdown func() error
	ln       net.Listener
}

// stopServing shuts each server down, then closes its listener: fasthttp's
// Shutdown closes only the listeners Serve has registered, so a Serve whose
// goroutine had not run yet (a drain right after start, on a loaded
// machine) would accept forever and Run would never return. On a closed
// listener Serve returns at once (net/http's after its Shutdown, too).
func stopServing(s ...servedBy) error {
	var errs []error
	for _, x := range s {
		errs = append(errs, x.shutdown())
		if err := x.ln.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			errs = append(errs, err)
		}
	}
	return errors.Join(errs...)
}

// idKey returns the secret used to hash ids before they reach the ledger.
func idKey(cfg *config.File, log *slog.Logger) []byte {
	if cfg.Ledger.IDKeyFile != "" {
		if b, err := os.ReadFile(cfg.Ledger.IDKeyFile); err == nil && len(strings.TrimSpace(string(b))) >= 16 {
			return []byte(strings.TrimSpace(string(b)))
		}
		log.Warn("ledger.id_key_file unreadable or shorter than 16 bytes; falling back")
	}
	if k := os.Getenv("SLUICE_LEDGER_KEY"); len(k) >= 16 {
		return []byte(k)
	}
	if cfg.Ledger.Backend == "redis" || cfg.Ledger.Journal != "" {
		log.Warn("ledger ids are hashed with the built-in key; set SLUICE_LEDGER_KEY or ledger.id_key_file")
	}
	sum := sha256.Sum256([]byte("sluice built-in ledger id key v1"))
	return sum[:]
}

// closableLedger is a ledger the process owns.
type closableLedger interface {
	scheduler.Ledger
	Run(ctx context.Context) error
	io.Closer
}

func openLedger(cfg *config.File, keyer *ledger.Keyer, reg prometheus.Registerer, log *slog.Logger, clock func() time.Time) (closableLedger, error) {
	switch cfg.Ledger.Backend {
	case "redis":
		r := cfg.Ledger.Redis
		tenants := make([]ledger.ScopeKey, 0, len(cfg.Tenants))
		for _, t := range cfg.Tenants {
			tenants = append(tenants, keyer.Key(ledger.KindTenant, t.Name))
		}
		rc := redisledger.Config{Addrs: r.Addrs, MasterName: r.MasterName, KeyPrefix: r.KeyPrefix,
			StoreTimeout: r.StoreTimeout, LeaseTTL: cfg.Ledger.LeaseTTL, TombstoneRetention: cfg.Ledger.Retention(),
			Tenants: tenants, Registerer: reg}
		if r.PasswordEnv != "" {
			rc.Password = os.Getenv(r.PasswordEnv)
		}
		l, err := redisledger.Open(rc)
		if err != nil {
			return nil, fmt.Errorf("redis ledger: %w", err)
		}
		return l, nil
	default:
		fsync := ledger.EveryOp
		if cfg.Ledger.Fsync == "group" {
			fsync = ledger.Group(cfg.Ledger.FsyncInterval)
		}
		m, err := ledger.NewMemory(ledger.MemoryConfig{Journal: cfg.Ledger.Journal, Fsync: fsync,
			LeaseTTL: cfg.Ledger.LeaseTTL, TombstoneRetention: cfg.Ledger.Retention(), Logger: log, Registerer: reg, Clock: clock})
		if err != nil {
			return nil, fmt.Errorf("embedded ledger: %w", err)
		}
		return m, nil
	}
}

// readCredentials reads every replica's API key (config.Replica.APIKey),
// by the URL each replica started with. A replica the running server does
// not have is ignored.
func readCredentials(cfg *config.File, urls map[string]string) (map[string]vllm.Secret, error) {
	creds := map[string]vllm.Secret{}
	for _, r := range cfg.Upstream.Replicas {
		u, ok := urls[r.Name]
		if !ok {
			continue
		}
		k, err := r.APIKey()
		if err != nil {
			return nil, fmt.Errorf("upstream.replicas %s: %w", r.Name, err)
		}
		creds[u] = k
	}
	return creds, nil
}

// ownsDataFiles reports whether this process keeps a file of its own in
// data_dir under a fixed name (a path key placing every one elsewhere
// leaves the directory to be shared).
func ownsDataFiles(cfg *config.File) bool {
	p := cfg.Paths()
	fixed := map[string]bool{}
	for _, name := range []string{config.JournalName, config.AdminStateName, config.PendingName, config.OutageName, config.OutboxName} {
		fixed[filepath.Join(p.Dir, name)] = true
	}
	for _, f := range []string{p.Journal, p.AdminState, p.Pending, p.LegacyOutage, p.LegacyOutbox} {
		if f != "" && fixed[filepath.Clean(f)] {
			return true
		}
	}
	return false
}
