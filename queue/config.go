package queue

import (
	"errors"
	"fmt"
	"math"
	"time"
)

// NumBands is the number of priority bands. Band 0 is the highest; a
// request's band is clamped to [tenant default, NumBands-1].
const NumBands = 8

// Defaults applied by [Config.withDefaults].
const (
	DefaultMaxWait     = 5 * time.Minute
	DefaultIdleTTL     = 5 * time.Minute
	DefaultParkBackoff = 100 * time.Millisecond
	// MinRetryAfter and MaxRetryAfter clamp the Retry-After estimate of a
	// [FullError].
	MinRetryAfter = time.Second
	MaxRetryAfter = 30 * time.Second
	// rateWindow is the sliding window over which recent service rates are
	// measured for Retry-After, in whole seconds.
	rateWindowSeconds = 10
	// rebaseAt is the band minimum counter above which a band's counters are
	// shifted down, so float64 counters keep sub-unit precision.
	rebaseAt = 1 << 40
)

// Order is the order of requests within one tenant's flow.
type Order uint8

const (
	// OrderFIFO serves a tenant's requests in arrival order (the default).
	OrderFIFO Order = iota
	// OrderEDF serves the earliest deadline first; ties by arrival.
	OrderEDF
)

// String returns "fifo" or "edf".
func (o Order) String() string {
	switch o {
	case OrderFIFO:
		return "fifo"
	case OrderEDF:
		return "edf"
	default:
		return fmt.Sprintf("order(%d)", uint8(o))
	}
}

// ParseOrder parses "fifo" (or "") and "edf".
func ParseOrder(s string) (Order, error) {
	switch s {
	case "", "fifo":
		return OrderFIFO, nil
	case "edf":
		return OrderEDF, nil
	default:
		return 0, fmt.Errorf("order %q: want fifo or edf", s)
	}
}

// TenantConfig is one tenant's queueing configuration.
type TenantConfig struct {
	// Name identifies the tenant. Required; unique.
	Name string
	// Weight is the tenant's fair-share weight. Optional; default 1; must be
	// finite and > 0 when set.
	Weight float64
	// Band is the tenant's default (and highest allowed) priority band, 0 is
	// highest. Optional; default 0; must be < NumBands.
	Band int
	// MaxDepth bounds the tenant's queued requests. Optional; 0 means no
	// tenant bound (the global bound still applies).
	MaxDepth int
	// MaxBytes bounds the summed body bytes of the tenant's queued requests.
	// Optional; 0 means no tenant bound.
	MaxBytes int64
	// MaxWait bounds the time a request may wait queued. Optional; 0 means
	// only the server's [Config.MaxWait] applies.
	MaxWait time.Duration
	// Order is the order within the tenant: FIFO (default) or EDF.
	Order Order
	// LIFOAfter and ShedAfter opt the tenant into the standing-queue
	// policies of [Config.LIFOAfter] and [Config.ShedAfter] with its own
	// thresholds. Optional; 0 takes the Config's, negative turns the
	// policy off for this tenant. They apply to FIFO order only.
	LIFOAfter time.Duration
	ShedAfter time.Duration
}

// Config is the reloadable configuration of a [Queue]. Apply a new one at
// runtime with [Queue.Prepare] or [Queue.Reconfigure].
type Config struct {
	// Tenants lists the tenants that may enqueue. Removing a tenant refuses
	// its new requests but keeps serving the ones already queued.
	Tenants []TenantConfig
	// MaxDepth bounds the queued requests of all tenants together. Optional;
	// 0 means no global bound.
	MaxDepth int
	// MaxBytes bounds the summed body bytes of all queued requests. Optional;
	// 0 means no global bound.
	MaxBytes int64
	// MaxWait is the server's maximum queue wait; every entry's deadline is
	// at most Arrival+MaxWait. Optional; default 5m.
	MaxWait time.Duration
	// IdleTTL: a flow that had no queued request for this long re-enters at
	// the band minimum, losing any deficit. Optional; default 5m; negative
	// keeps deficits forever.
	IdleTTL time.Duration
	// ParkBackoff is how long a parked tenant (at its in-flight cap, or after
	// [Queue.Requeue]) stays parked when no [Queue.Unpark] comes. Optional;
	// default 100ms; negative means only Unpark rejoins.
	ParkBackoff time.Duration
	// LIFOAfter: once a FIFO flow's oldest entry has waited this long (a
	// standing queue), the flow serves its newest entry first (adaptive
	// LIFO, as in Facebook's "Fail at scale"): under overload what is
	// served starts in time and the oldest expire at their deadlines,
	// instead of every request waiting the whole queue. EDF flows are left
	// alone. An opt-in: it reorders what the operator's deadlines would
	// otherwise serve in arrival order. Optional; 0 or negative (the
	// default) keeps strict FIFO; a tenant's own [TenantConfig.LIFOAfter]
	// overrides it.
	LIFOAfter time.Duration
	// ShedAfter: when dispatch reaches a FIFO flow whose oldest entry has
	// waited this long, that entry is shed (reported to Deps.OnExpire with
	// [ReasonShed]) instead of being served late: the batch stays as full
	// and the queue stops adding delay (CoDel's "bad queue"). An opt-in
	// rule of its own, earlier than the entry's deadline when shorter than
	// its max_wait. Optional; 0 or negative (the default) keeps every entry
	// until its deadline; a tenant's own [TenantConfig.ShedAfter]
	// overrides it. EDF flows are never shed.
	ShedAfter time.Duration
	// ExpirySpin makes [Queue.Run] wake this long before each due time and
	// poll, yielding the processor, until it arrives. Go's runtime timers on
	// Linux sleep in whole milliseconds, so with the timer alone expiry is
	// up to about 1 ms late (plus scheduling delay); 1ms keeps it well under
	// that, at the cost of up to 1 ms of one CPU per due time. Optional;
	// default 0 (timer only). Leave it 0 under testing/synctest, where
	// polling never lets the fake clock advance.
	ExpirySpin time.Duration
}

func (c Config) withDefaults() Config {
	if c.MaxWait == 0 {
		c.MaxWait = DefaultMaxWait
	}
	if c.IdleTTL == 0 {
		c.IdleTTL = DefaultIdleTTL
	}
	if c.ParkBackoff == 0 {
		c.ParkBackoff = DefaultParkBackoff
	}
	ts := make([]TenantConfig, len(c.Tenants))
	for i, t := range c.Tenants {
		if t.Weight == 0 {
			t.Weight = 1
		}
		// Resolved per tenant: > 0 is on with that threshold, else off.
		t.LIFOAfter = inherit(t.LIFOAfter, c.LIFOAfter)
		t.ShedAfter = inherit(t.ShedAfter, c.ShedAfter)
		ts[i] = t
	}
	c.Tenants = ts
	return c
}

func inherit(own, base time.Duration) time.Duration {
	if own == 0 {
		own = base
	}
	return max(own, 0)
}

// Validate reports every problem of c, naming the field path.
func (c Config) Validate() error {
	var errs []error
	if c.MaxDepth < 0 {
		errs = append(errs, errors.New("max_depth must be >= 0"))
	}
	if c.MaxBytes < 0 {
		errs = append(errs, errors.New("max_bytes must be >= 0"))
	}
	if c.MaxWait < 0 {
		errs = append(errs, errors.New("max_wait must be >= 0"))
	}
	if c.ExpirySpin < 0 || c.ExpirySpin > 10*time.Millisecond {
		errs = append(errs, errors.New("expiry_spin must be in [0, 10ms]"))
	}
	seen := make(map[string]int, len(c.Tenants))
	for i, t := range c.Tenants {
		p := fmt.Sprintf("tenants[%d]", i)
		if t.Name == "" {
			errs = append(errs, fmt.Errorf("%s.name is required", p))
		} else if j, dup := seen[t.Name]; dup {
			errs = append(errs, fmt.Errorf("%s.name %q duplicates tenants[%d]", p, t.Name, j))
		} else {
			seen[t.Name] = i
		}
		if math.IsNaN(t.Weight) || math.IsInf(t.Weight, 0) || t.Weight < 0 {
			errs = append(errs, fmt.Errorf("%s.weight must be finite and > 0", p))
		}
		if t.Band < 0 || t.Band >= NumBands {
			errs = append(errs, fmt.Errorf("%s.priority must be in [0, %d]", p, NumBands-1))
		}
		if t.MaxDepth < 0 {
			errs = append(errs, fmt.Errorf("%s.queue.max_depth must be >= 0", p))
		}
		if t.MaxBytes < 0 {
			errs = append(errs, fmt.Errorf("%s.queue.max_bytes must be >= 0", p))
		}
		if t.MaxWait < 0 {
			errs = append(errs, fmt.Errorf("%s.queue.max_wait must be >= 0", p))
		}
		if t.Order > OrderEDF {
			errs = append(errs, fmt.Errorf("%s.queue.order must be fifo or edf", p))
		}
	}
	return errors.Join(errs...)
}
