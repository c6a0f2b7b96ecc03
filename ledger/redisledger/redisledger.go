package redisledger

import (
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"net"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"

	"github.com/redis/go-redis/v9"
	"github.com/sluicehq/sluice/ledger"
)

// Ledger is the Redis backend of the budget ledger: every operation is one
// Lua script run atomically on the tenant's keys. It has the method set of
// [ledger.Ledger] and is safe for concurrent use by many goroutines and many
// processes sharing one Redis.
type Ledger struct {
	c      redis.UniversalClient
	owned  bool // Close closes c
	cfg    Config
	prefix string
	s      *scripts
	m      *metrics
	b      *batcher // nil when Config.MaxBatch is 1

	leaseMaxArg, tombArg any // MaxLeaseTTL and TombstoneRetention in ms, boxed once

	epochSeed string                   // random per process; candidate epochs are seed-counter
	epochSeq  atomic.Int64             // candidate counter
	epochs    sync.Map                 // ledger.ScopeKey → string: cached epoch per tenant
	parts     sync.Map                 // ledger.ScopeKey → *partitionKeys
	ownerHex  atomic.Pointer[ownerHex] // the last owner's text (a process has one owner, usually)

	mu    sync.Mutex                     // guards specs and holds
	specs map[ledger.RequestID]*specKeys // scope spec of records reserved here
	// holds are the global holds (two steps, global.go) of requests
	// reserved here and not yet dispatched, which MarkDispatched dispatches
	// before the record, and of Reserves whose global or tenant step was
	// ambiguous, which the request's end releases unless its record carries
	// them (endHold).
	holds map[ledger.RequestID]knownHold

	orphans atomic.Int64 // Settles that found no record

	// globals are the global partitions this process reserved in; Run
	// reclaims them with Config.Tenants and the registry.
	globals sync.Map // ledger.ScopeKey → struct{}
	// registered are the partitions this process has added to the registry
	// (see register).
	registered sync.Map // ledger.ScopeKey → struct{}
	pending    sync.Map // ledger.ScopeKey → struct{}: SADD failed, Run retries
	// scanBatch is the most partitions one idle scan call of Run carries
	// (reclaim.go); 1 scans each alone (tests compare both).
	scanBatch int

	// floor, when set (tests only, see export_test.go), pins ledger time:
	// scripts use max(TIME, hwm, floor).
	floor func() int64
}

// ownerHex is an owner and its hex text.
type ownerHex struct {
	o   ledger.Owner
	hex string
}

// ownerText returns o.String(), cached for the last owner seen.
func (l *Ledger) ownerText(o ledger.Owner) string {
	if h := l.ownerHex.Load(); h != nil && h.o == o {
		return h.hex
	}
	h := &ownerHex{o: o, hex: o.String()}
	l.ownerHex.Store(h)
	return h.hex
}

const maxSpecCache = 1 << 16

// New returns a Ledger on an existing client. The client should have
// ContextTimeoutEnabled set and read/write timeouts ≤ StoreTimeout (as Open
// does); New does not close it.
func New(client redis.UniversalClient, cfg Config) (*Ledger, error) {
	if client == nil {
		return nil, errors.New("redisledger: nil client")
	}
	cfg.setDefaults()
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	s, err := loadScripts()
	if err != nil {
		return nil, fmt.Errorf("load ledger scripts: %w", err)
	}
	m, err := newMetrics(cfg.Registerer)
	if err != nil {
		return nil, err
	}
	var seed [8]byte
	_, _ = rand.Read(seed[:])
	l := &Ledger{
		c: client, cfg: cfg, prefix: cfg.KeyPrefix, s: s, m: m,
		epochSeed:   hex.EncodeToString(seed[:]),
		specs:       make(map[ledger.RequestID]*specKeys),
		holds:       make(map[ledger.RequestID]knownHold),
		leaseMaxArg: cfg.MaxLeaseTTL.Milliseconds(), tombArg: cfg.TombstoneRetention.Milliseconds(),
		scanBatch: scanBatch,
	}
	if cfg.MaxBatch > 1 {
		l.b = newBatcher(l)
	}
	return l, nil
}

// Open builds a client from cfg (standalone, Sentinel or Cluster, see
// [Config.Addrs]) with ContextTimeoutEnabled, dial/read/write timeouts of
// StoreTimeout and go-redis' default retries, and returns a Ledger that
// closes it on Close. It does not contact Redis.
func Open(cfg Config) (*Ledger, error) {
	cfg.setDefaults()
	if len(cfg.Addrs) == 0 {
		return nil, errors.New("ledger.redis.addrs must name at least one address")
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	c := redis.NewUniversalClient(&redis.UniversalOptions{
		Addrs:                 cfg.Addrs,
		MasterName:            cfg.MasterName,
		Username:              cfg.Username,
		Password:              cfg.Password,
		DialTimeout:           cfg.StoreTimeout,
		ReadTimeout:           cfg.StoreTimeout,
		WriteTimeout:          cfg.StoreTimeout,
		ContextTimeoutEnabled: true,
	})
	l, err := New(c, cfg)
	if err != nil {
		_ = c.Close()
		return nil, err
	}
	l.owned = true
	return l, nil
}

// Close closes the client if Open created it.
func (l *Ledger) Close() error {
	if l.owned {
		return l.c.Close()
	}
	return nil
}

// LoadScripts loads every script into the server's script cache (on every
// shard of a Cluster), so the first calls need no EVAL fallback. Optional:
// calls fall back to EVAL on NOSCRIPT anyway.
func (l *Ledger) LoadScripts(ctx context.Context) error {
	for _, s := range []*redis.Script{l.s.reserve, l.s.dispatch, l.s.extend, l.s.settle, l.s.release,
		l.s.expire, l.s.resolve, l.s.charge, l.s.grow, l.s.scan, l.s.snapshot, l.s.batch} {
		if err := s.Load(ctx, l.c).Err(); err != nil {
			return fmt.Errorf("load ledger script: %w", l.storeErr(err))
		}
	}
	if l.b != nil && !l.b.noFunc.Load() {
		if err := l.loadLibrary(ctx); funcUnsupported(err) {
			l.b.noFunc.Store(true)
		} else if err != nil {
			return fmt.Errorf("load ledger function library: %w", l.storeErr(err))
		}
	}
	return nil
}

// Ping checks that the store answers within StoreTimeout (for readiness).
func (l *Ledger) Ping(ctx context.Context) error {
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	defer cancel()
	if err := l.c.Ping(ctx).Err(); err != nil {
		return l.storeErr(err)
	}
	return nil
}

// ---- store plumbing --------------------------------------------------------

// reply is a script's array reply; the first element is a status word.
type reply []any

func (r reply) status() string { return r.str(0) }

func (r reply) str(i int) string {
	if i >= len(r) {
		return ""
	}
	switch v := r[i].(type) {
	case string:
		return v
	case int64:
		return strconv.FormatInt(v, 10)
	}
	return ""
}

func (r reply) int(i int) (int64, bool) {
	if i >= len(r) {
		return 0, false
	}
	switch v := r[i].(type) {
	case int64:
		return v, true
	case string:
		n, err := strconv.ParseInt(v, 10, 64)
		return n, err == nil
	}
	return 0, false
}

// run runs a write script (EVALSHA, EVAL on NOSCRIPT; never pipelined) within
// StoreTimeout and classifies failures.
func (l *Ledger) run(ctx context.Context, s *redis.Script, ro bool, keys []string, args ...any) (reply, error) {
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ledger.ErrUnavailable, err)
	}
	if !ro && l.b != nil {
		if name, ok := l.s.names[s]; ok {
			op := getOp()
			op.name, op.keys, op.args = name, keys, args
			return l.b.do(ctx, op)
		}
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	defer cancel()
	var fl int64
	if l.floor != nil {
		fl = l.floor()
	}
	args = append(args, fl)
	var cmd *redis.Cmd
	if fn := l.s.roFn[s]; ro && fn != "" && l.b != nil && !l.b.noFunc.Load() {
		cmd = l.fcallRO(ctx, fn, s, keys, args)
	} else if ro {
		cmd = s.RunRO(ctx, l.c, keys, args...)
	} else {
		cmd = s.Run(ctx, l.c, keys, args...)
	}
	v, err := cmd.Result()
	if err != nil {
		return nil, l.storeErr(err)
	}
	arr, ok := v.([]any)
	if !ok || len(arr) == 0 {
		return nil, l.corrupt("unexpected script reply")
	}
	return reply(arr), nil
}

// fcallRO runs the reader s as the library's read-only function fn, loading
// the library where the server lacks it, and as the script where the server
// has no functions (or the ACL refuses them), as the batcher does.
func (l *Ledger) fcallRO(ctx context.Context, fn string, s *redis.Script, keys []string, args []any) *redis.Cmd {
	cmd := l.c.FCallRO(ctx, fn, keys, args...)
	err := cmd.Err()
	if funcMissing(err) {
		if err = l.loadLibrary(ctx); err == nil {
			cmd = l.c.FCallRO(ctx, fn, keys, args...)
			err = cmd.Err()
		}
	}
	if err != nil && funcUnsupported(err) {
		l.b.noFunc.Store(true)
		return s.RunRO(ctx, l.c, keys, args...)
	}
	return cmd
}

// runOp runs the write script s with op's keys and arguments, as run does,
// and takes op.
func (l *Ledger) runOp(ctx context.Context, s *redis.Script, op *bop) (reply, error) {
	if err := ctx.Err(); err != nil {
		putOp(op)
		return nil, fmt.Errorf("%w: %w", ledger.ErrUnavailable, err)
	}
	if l.b != nil {
		if name, ok := l.s.names[s]; ok {
			op.name = name
			return l.b.do(ctx, op)
		}
	}
	r, err := l.run(ctx, s, false, op.keys, op.args...)
	putOp(op)
	return r, err
}

// storeErr classifies a go-redis error: one raised before the command could
// have reached Redis (dial failure, pool exhaustion, a refusal Redis sends
// before running anything) is ErrUnavailable; anything else (timeouts, broken
// connections after a write) is ErrAmbiguous.
//
// # Design rationale
//
// go-redis reports only the last attempt's error. A call whose first attempt
// timed out after sending and whose retry then failed to dial is reported
// as a dial failure; the StoreTimeout deadline covers the retries, so in
// practice the retry after a timeout ends with the context deadline and is
// classified ambiguous.
func (l *Ledger) storeErr(err error) error {
	class := ledger.ErrAmbiguous
	var opErr *net.OpError
	var rerr redis.Error
	switch {
	case errors.As(err, &opErr) && opErr.Op == "dial",
		errors.Is(err, syscall.ECONNREFUSED),
		strings.Contains(err.Error(), "connection pool timeout"),
		errors.Is(err, redis.ErrClosed):
		class = ledger.ErrUnavailable
	case errors.As(err, &rerr) && strings.HasPrefix(rerr.Error(), "WRONGTYPE "):
		// One of the tenant's keys holds another type: stored damage. Scripts
		// read every key before their first write, so nothing was written.
		return l.corrupt("key of the wrong type: " + rerr.Error())
	case errors.As(err, &rerr):
		msg := rerr.Error()
		for _, p := range []string{"OOM ", "BUSY ", "LOADING ", "READONLY ", "MASTERDOWN ", "CLUSTERDOWN ",
			"TRYAGAIN ", "NOREPLICAS ", "NOSCRIPT ", "CROSSSLOT ", "MOVED ", "ASK ", "NOPERM ", "NOAUTH ", "WRONGPASS "} {
			if strings.HasPrefix(msg, p) {
				class = ledger.ErrUnavailable
				break
			}
		}
	}
	if class == ledger.ErrUnavailable {
		l.m.storeErrors.WithLabelValues("unavailable").Inc()
	} else {
		l.m.storeErrors.WithLabelValues("ambiguous").Inc()
	}
	return fmt.Errorf("redis ledger: %w: %w", class, err)
}

func (l *Ledger) corrupt(what string) error {
	l.m.corrupt.Inc()
	return fmt.Errorf("redis ledger: %s: %w", what, ledger.ErrCorrupt)
}

// epochArgs returns the cached epoch ("" if none) and a fresh candidate.
func (l *Ledger) epochArgs(t ledger.ScopeKey) (cached, cand string) {
	if v, ok := l.epochs.Load(t); ok {
		cached = v.(string)
	}
	var b [48]byte // seed (16 hex) and the counter in base 36: one allocation
	return cached, string(strconv.AppendInt(append(b[:0], l.epochSeed...), l.epochSeq.Add(1), 36))
}

// noteEpoch caches the epoch a script reported.
func (l *Ledger) noteEpoch(t ledger.ScopeKey, cached string, r reply) {
	if e := r.str(1); e != "" && e != cached {
		l.epochs.Store(t, e)
	}
}

// common appends the shared ARGV prefix to op: cached epoch, candidate,
// MaxLeaseTTL ms, id, tombstone retention ms. It returns the cached epoch.
func (l *Ledger) common(op *bop, t ledger.ScopeKey, id string) (cached string) {
	cached, cand := l.epochArgs(t)
	op.str(cached)
	op.str(cand)
	op.args = append(op.args, l.leaseMaxArg)
	op.str(id)
	op.args = append(op.args, l.tombArg)
	return cached
}

// statusErr maps the status words every script shares to errors; it returns
// nil for any other word.
func (l *Ledger) statusErr(r reply) error {
	switch r.status() {
	case "RECOVERING":
		l.m.storeErrors.WithLabelValues("recovering").Inc()
		return fmt.Errorf("redis ledger: tenant epoch changed, fencing old leases: %w", ledger.ErrRecovering)
	case "CORRUPT":
		return l.corrupt("stored state: " + r.str(2))
	case "INVALID":
		return fmt.Errorf("redis ledger: %s: %w", r.str(2), ledger.ErrInvalid)
	case "POLICY":
		return fmt.Errorf("redis ledger: %s: %w", r.str(2), ledger.ErrPolicy)
	case "CONFLICT":
		return ledger.ErrConflict
	case "FINAL":
		return ledger.ErrAlreadyFinal
	case "NOTFOUND":
		return ledger.ErrNotFound
	case "DISPATCHED":
		return ledger.ErrDispatched
	case "LEASELOST":
		return fmt.Errorf("redis ledger: %s: %w", r.str(2), ledger.ErrLeaseLost)
	}
	return nil
}

// ---- spec cache --------------------------------------------------------------

func (l *Ledger) cacheSpec(id ledger.RequestID, sk *specKeys) {
	l.mu.Lock()
	if len(l.specs) < maxSpecCache {
		l.specs[id] = sk
	}
	l.mu.Unlock()
}

// cachedSpec returns the spec of a record reserved here (noSpec if unknown).
func (l *Ledger) cachedSpec(id ledger.RequestID) *specKeys {
	l.mu.Lock()
	sk, ok := l.specs[id]
	l.mu.Unlock()
	if !ok {
		return noSpec
	}
	return sk
}

func (l *Ledger) forgetSpec(id ledger.RequestID) {
	l.mu.Lock()
	delete(l.specs, id)
	l.mu.Unlock()
}

// runRecord runs a script that acts on an existing record. It passes the
// record's scope keys from the local cache; when the script reports that the
// keys differ from the record's ("KEYS" with the stored spec), it retries
// with the stored spec. A record's spec changes at most once, to empty when
// it becomes a tombstone no operation charges again (finalize), so two
// retries always suffice: a record that finalized between the first
// answer and the retry answers KEYS "" once more. It returns the reply and
// the spec used.
func (l *Ledger) runRecord(ctx context.Context, s *redis.Script, ref ledger.Ref, extra ...string) (reply, string, error) {
	rec := l.recordName(ref)
	pk := l.partKeys(ref.Tenant)
	sk := l.cachedSpec(ref.ID)
	for attempt := 0; ; attempt++ {
		spec := sk.spec
		op := getOp()
		op.fixedKeys(pk, rec)
		op.keys = append(op.keys, sk.scopes...)
		cached := l.common(op, ref.Tenant, rec.id)
		for _, x := range extra {
			op.str(x)
		}
		r, err := l.runOp(ctx, s, op)
		if err != nil {
			return nil, spec, err
		}
		l.noteEpoch(ref.Tenant, cached, r)
		if r.status() != "KEYS" {
			return r, spec, nil
		}
		if attempt > 1 {
			return nil, spec, l.corrupt("record keys keep changing")
		}
		var ok bool
		if sk, ok = pk.parsedSpec(r.str(2)); !ok {
			return nil, r.str(2), l.corrupt("record scope spec")
		}
	}
}

// ---- operations ---------------------------------------------------------------
