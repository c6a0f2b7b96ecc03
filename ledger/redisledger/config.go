package redisledger

import (
	"errors"
	"fmt"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/sluicehq/sluice/ledger"
)

// Config configures the Redis ledger. The zero value of every optional field
// selects its default.
type Config struct {
	// Addrs are the Redis addresses (host:port) for Open. One address without
	// MasterName is a standalone server; several are a Cluster; with
	// MasterName they are Sentinels. Required for Open, ignored by New.
	Addrs []string
	// MasterName is the Sentinel master name. Optional; "" means no Sentinel.
	MasterName string
	// Username and Password authenticate to Redis. Optional.
	Username, Password string
	// KeyPrefix starts every key. Optional; default "sluice". Must not contain
	// '{' or '}'.
	KeyPrefix string
	// StoreTimeout bounds every store call, retries included. Optional;
	// default 250ms. Open also uses it as the dial, read and write timeout.
	StoreTimeout time.Duration
	// LeaseTTL is the lease of a Reserve with LeaseTTL 0. Optional; default 60s.
	LeaseTTL time.Duration
	// MaxLeaseTTL bounds Reserve and Extend TTLs and is the store-loss fence.
	// Optional; default 2·LeaseTTL.
	MaxLeaseTTL time.Duration
	// TombstoneRetention is how long terminal records answer replays.
	// Optional; default 1h; must be ≥ 2·MaxLeaseTTL.
	TombstoneRetention time.Duration
	// Tenants are reclaimed by Run, on top of every partition registered in
	// the store by a Reserve of any instance (see [Ledger.Run]). Optional.
	Tenants []ledger.ScopeKey
	// ReclaimInterval is Run's period. Optional; default 1s.
	ReclaimInterval time.Duration
	// ReclaimBatch is the most ids one Reclaim call handles in Run. Optional;
	// default 256.
	ReclaimBatch int
	// OnUsage receives one event per applied Settle and Resolve (and per
	// automatic charge of an UNRESOLVED hold, and per Settle on a CHARGED
	// record), synchronously, before the call returns. Optional; it must not
	// block and must be safe for concurrent use.
	OnUsage func(ledger.UsageEvent)
	// MaxBatch is the most write operations one script call carries when
	// concurrent operations of one partition group queue (batch.go).
	// Optional; default 64; 1 runs every operation as its own script.
	MaxBatch int
	// Registerer receives the ledger's metrics. Optional; nil registers none.
	Registerer prometheus.Registerer
}

func (c *Config) setDefaults() {
	if c.KeyPrefix == "" {
		c.KeyPrefix = "sluice"
	}
	if c.StoreTimeout == 0 {
		c.StoreTimeout = 250 * time.Millisecond
	}
	if c.LeaseTTL == 0 {
		c.LeaseTTL = 60 * time.Second
	}
	if c.MaxLeaseTTL == 0 {
		c.MaxLeaseTTL = 2 * c.LeaseTTL
	}
	if c.TombstoneRetention == 0 {
		c.TombstoneRetention = time.Hour
		if m := 2 * c.MaxLeaseTTL; m > c.TombstoneRetention {
			c.TombstoneRetention = m
		}
	}
	if c.ReclaimInterval == 0 {
		c.ReclaimInterval = time.Second
	}
	if c.ReclaimBatch == 0 {
		c.ReclaimBatch = 256
	}
	if c.MaxBatch == 0 {
		c.MaxBatch = 64
	}
}

// Validate reports every problem of a defaulted Config, naming the field.
func (c *Config) Validate() error {
	var errs []error
	for i := range len(c.KeyPrefix) {
		if b := c.KeyPrefix[i]; b == '{' || b == '}' {
			errs = append(errs, errors.New("ledger.redis.key_prefix must not contain '{' or '}'"))
			break
		}
	}
	if c.StoreTimeout < 0 {
		errs = append(errs, fmt.Errorf("ledger.redis.store_timeout %s must be > 0", c.StoreTimeout))
	}
	if c.LeaseTTL < time.Millisecond {
		errs = append(errs, fmt.Errorf("ledger.lease_ttl %s must be ≥ 1ms", c.LeaseTTL))
	}
	if c.MaxLeaseTTL < c.LeaseTTL {
		errs = append(errs, fmt.Errorf("ledger.max_lease_ttl %s must be ≥ lease_ttl %s", c.MaxLeaseTTL, c.LeaseTTL))
	}
	if c.TombstoneRetention < 2*c.MaxLeaseTTL {
		errs = append(errs, fmt.Errorf("ledger.tombstone_retention %s must be ≥ 2·max_lease_ttl", c.TombstoneRetention))
	}
	if c.ReclaimInterval < 0 {
		errs = append(errs, fmt.Errorf("ledger.reclaim_interval %s must be ≥ 0", c.ReclaimInterval))
	}
	if c.ReclaimBatch < 0 {
		errs = append(errs, fmt.Errorf("ledger.reclaim_batch %d must be ≥ 0", c.ReclaimBatch))
	}
	if c.MaxBatch < 1 {
		errs = append(errs, fmt.Errorf("redis ledger MaxBatch %d must be ≥ 1", c.MaxBatch))
	}
	for i, t := range c.Tenants {
		if t.IsZero() {
			errs = append(errs, fmt.Errorf("ledger.tenants[%d] is the zero key", i))
		}
	}
	return errors.Join(errs...)
}

// metrics of the Redis ledger.
type metrics struct {
	storeErrors *prometheus.CounterVec // by class: unavailable, ambiguous, recovering
	corrupt     prometheus.Counter
	orphans     prometheus.Counter
	batchOps    prometheus.Histogram
	// reclaimed counts Reclaim's outcomes by record (outcome: expired,
	// unresolved, charged, followed: a global hold ended as its request).
	reclaimed   *prometheus.CounterVec
	reclaimPass prometheus.Histogram // one Run tick over every partition
}

func newMetrics(reg prometheus.Registerer) (*metrics, error) {
	m := &metrics{
		storeErrors: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ledger_redis_store_errors_total",
			Help: "Redis ledger calls that failed with a store error, by class.",
		}, []string{"class"}),
		corrupt: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_ledger_corrupt_total",
			Help: "Ledger operations refused because stored state violates an invariant (alert).",
		}),
		orphans: prometheus.NewCounter(prometheus.CounterOpts{
			Name: "sluice_ledger_orphan_settles_total",
			Help: "Settles that found no record (never reserved, or its tombstone aged out).",
		}),
		batchOps: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_ledger_redis_batch_ops",
			Help:    "Write operations carried by one Redis ledger script call (batching of concurrent operations).",
			Buckets: []float64{1, 2, 4, 8, 16, 32, 64},
		}),
		reclaimed: prometheus.NewCounterVec(prometheus.CounterOpts{
			Name: "sluice_ledger_redis_reclaimed_total",
			Help: "Records Reclaim ended, by outcome: expired (a lease that never dispatched), unresolved (a dispatched lease that ran out), charged (an unresolved record charged its hold), followed (a global hold ended as its request did).",
		}, []string{"outcome"}),
		reclaimPass: prometheus.NewHistogram(prometheus.HistogramOpts{
			Name:    "sluice_ledger_redis_reclaim_pass_seconds",
			Help:    "Duration of one Reclaim pass over every partition (each second, from every instance); near 1 s, leases of crashed instances are reclaimed late.",
			Buckets: []float64{0.001, 0.005, 0.01, 0.05, 0.1, 0.25, 0.5, 1, 2.5},
		}),
	}
	for _, o := range []string{"expired", "unresolved", "charged", "followed"} {
		m.reclaimed.WithLabelValues(o) // every outcome exported from the start
	}
	if reg != nil {
		for _, c := range []prometheus.Collector{m.storeErrors, m.corrupt, m.orphans, m.batchOps, m.reclaimed, m.reclaimPass} {
			if err := reg.Register(c); err != nil {
				return nil, fmt.Errorf("register redis ledger metrics: %w", err)
			}
		}
	}
	return m, nil
}
