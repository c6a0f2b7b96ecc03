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
	"time"

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

// Reserve admits req all-or-nothing on every block-mode limit of its scopes,
// or returns a [*ledger.DeniedError]; it is idempotent by req.Ref.ID.
func (l *Ledger) Reserve(ctx context.Context, req ledger.ReserveRequest) (ledger.Grant, error) {
	if err := req.Validate(l.cfg.MaxLeaseTTL); err != nil {
		return ledger.Grant{}, err
	}
	if req.PolicyVersion > uint64(ledger.MaxCounter) {
		return ledger.Grant{}, fmt.Errorf("policy version %d too large: %w", req.PolicyVersion, ledger.ErrPolicy)
	}
	ttl := req.LeaseTTL
	if ttl == 0 {
		ttl = l.cfg.LeaseTTL
	}
	l.register(ctx, req.Ref.Tenant)
	rec := l.recordName(req.Ref)
	digest := strconv.FormatUint(req.Digest(), 16)
	// A global scope kept inline is one more scope of the tenant record
	// (global.go). Otherwise, step 1: the global hold, in its own partition.
	var gh *globalHold
	treq := req // the tenant partition's part of the request
	if gi := globalIndex(req.Scopes); gi >= 0 && !l.inlineGlobal(req.Scopes) {
		treq.Scopes = append(append(make([]ledger.Scope, 0, len(req.Scopes)-1), req.Scopes[:gi]...), req.Scopes[gi+1:]...)
		// Step 0: check the tenant side without writing, so a request the
		// tenant would refuse (or a replay) never takes a global hold.
		if g, err := l.reserveTenant(ctx, &treq, rec, digest, ttl, nil, modeCheck); !errors.Is(err, errChecked) {
			return g, err
		}
		var err error
		if gh, err = l.reserveGlobal(ctx, &req, gi, ttl, digest); err != nil {
			if !errors.Is(err, ledger.ErrDenied) {
				l.ambiguousHold(req.Ref.ID, gh, err)
				return ledger.Grant{}, err
			}
			// The id decides first (as in Memory): a replay, a conflict or
			// a final record answers even when the global budget is full.
			g, terr := l.reserveTenant(ctx, &treq, rec, digest, ttl, nil, modeReplayOnly)
			if !errors.Is(terr, errNoRecord) {
				return g, terr
			}
			// A denial that only in-flight holds cause may be one of the
			// short-lived holds of requests their tenant step refuses (see
			// global.go); that consult took a round trip, so try once more.
			var d *ledger.DeniedError
			if !errors.As(err, &d) || d.Committed+d.Requested > d.Limit {
				return ledger.Grant{}, err
			}
			if gh, err = l.reserveGlobal(ctx, &req, gi, ttl, digest); err != nil {
				l.ambiguousHold(req.Ref.ID, gh, err)
				return ledger.Grant{}, err
			}
		}
	}
	// Step 2: the tenant holds. Any definite failure drops the global hold.
	g, err := l.reserveTenant(ctx, &treq, rec, digest, ttl, gh, modeReserve)
	if gh != nil && l.settleHold(ctx, gh, &g, err) && (!req.Dispatch || err != nil) {
		l.rememberHold(req.Ref.ID, gh)
	}
	return g, err
}

// knownHold is a global hold this process reserved (or may have: an
// ambiguous global step) for a request, and its owner.
type knownHold struct {
	ref   ledger.Ref
	owner ledger.Owner
}

func (l *Ledger) rememberHold(id ledger.RequestID, gh *globalHold) {
	l.mu.Lock()
	if len(l.holds) < maxSpecCache {
		l.holds[id] = knownHold{ref: gh.ref, owner: gh.owner}
	}
	l.mu.Unlock()
}

// ambiguousHold remembers the hold of a global step that failed err, if
// the hold may exist (an ambiguous store error): the request's end
// releases it (endHold). A hold that never applied is released as an
// unknown id, whose tombstone refuses a late arrival of the step.
func (l *Ledger) ambiguousHold(id ledger.RequestID, gh *globalHold, err error) {
	if gh != nil && errors.Is(err, ledger.ErrAmbiguous) {
		l.rememberHold(id, gh)
	}
}

// endHold forgets the global hold remembered for request id and releases it
// unless the request's record carries it (g, as the record's operation
// answered): a hold of a Reserve whose global or tenant step was ambiguous
// may belong to no record, and would otherwise wait for its lease and,
// dispatched, be charged then.
//
// A release that fails keeps the hold remembered and returns the error, so
// that the caller's retry of the request's end (the outbox's) releases it;
// the hold's lease is the backstop.
func (l *Ledger) endHold(ctx context.Context, id ledger.RequestID, g string) error {
	l.mu.Lock()
	h, ok := l.holds[id]
	delete(l.holds, id)
	l.mu.Unlock()
	if !ok || encodeHold(h.ref) == g {
		return nil
	}
	// Released: a dispatched one is settled at zero, and an unknown id
	// leaves a tombstone that refuses the step if it arrives late.
	if err := l.globalRelease(ctx, h.ref, h.owner); err != nil {
		l.m.storeErrors.WithLabelValues("global_release").Inc()
		l.mu.Lock()
		l.holds[id] = h
		l.mu.Unlock()
		return fmt.Errorf("global hold: %w", err)
	}
	return nil
}

// holdOf returns the global hold of record id reserved here and not yet
// dispatched, if it is known.
func (l *Ledger) holdOf(id ledger.RequestID) (ledger.Ref, bool) {
	l.mu.Lock()
	defer l.mu.Unlock()
	h, ok := l.holds[id]
	return h.ref, ok
}

// settleHold decides the fate of the global hold gh after the tenant step
// answered g, err: kept (true; on success its headroom merged into g) or
// dropped.
func (l *Ledger) settleHold(ctx context.Context, gh *globalHold, g *ledger.Grant, err error) bool {
	switch {
	case err == nil && (!g.Replayed || gh.stored == gh.enc):
		mergeHeadroom(g, &gh.grant)
		return true
	case err == nil || !errors.Is(err, ledger.ErrAmbiguous):
		// A replay carries its own (earlier) global hold, and a refusal
		// wrote nothing: ours must go.
		l.dropGlobal(ctx, gh)
		return false
	}
	// An ambiguous outcome keeps it: the tenant record may carry it. The
	// request's end drops it if not (endHold); its lease is the backstop.
	return true
}

// Modes of the reserve script (ARGV 14).
const (
	modeReserve    = "0"
	modeReplayOnly = "1" // answer from an existing record, else errNoRecord; no writes
	modeCheck      = "2" // answer like a reserve but errChecked instead of admitting; no writes
)

var (
	errNoRecord = errors.New("redis ledger: no record")
	errChecked  = errors.New("redis ledger: would admit")
)

// reserveTenant runs the reserve script on one partition in mode; gh, when
// not nil, is the global hold the record will carry.
func (l *Ledger) reserveTenant(ctx context.Context, req *ledger.ReserveRequest, rec recName, digest string, ttl time.Duration, gh *globalHold, mode string) (ledger.Grant, error) {
	op := getOp()
	call := l.reserveOp(op, req, rec, digest, ttl, gh, mode)
	r, err := l.runOp(ctx, l.s.reserve, op)
	if err != nil {
		return ledger.Grant{}, err
	}
	return l.reserveReply(req, call, gh, r)
}

// reserveCall is what a reserve call's reply is decoded against.
type reserveCall struct {
	sk     *specKeys
	cached string
}

// reserveOp appends one reserve script call's keys and arguments to op.
func (l *Ledger) reserveOp(op *bop, req *ledger.ReserveRequest, rec recName, digest string, ttl time.Duration, gh *globalHold, mode string) reserveCall {
	pk := l.partKeys(req.Ref.Tenant)
	sk := pk.specFor(req.Scopes, l.inlineGlobal(req.Scopes))
	op.fixedKeys(pk, rec)
	op.keys = append(op.keys, sk.scopes...)
	dispatch := "0"
	if req.Dispatch {
		dispatch = "1"
	}
	hold := ""
	if gh != nil {
		hold = gh.enc
	}
	cached := l.common(op, req.Ref.Tenant, rec.id)
	op.str(strconv.FormatUint(req.PolicyVersion, 10))
	op.str(l.ownerText(req.Owner))
	op.str(digest)
	op.int(ttl.Milliseconds())
	op.str(dispatch)
	op.str(amountsCSV(&req.Held))
	op.str(sk.spec)
	op.str(hold)
	op.str(mode)
	op.str(strconv.FormatUint(req.Attempt, 10))
	return reserveCall{sk: sk, cached: cached}
}

// reserveReply decodes the reply r of the reserve call op.
func (l *Ledger) reserveReply(req *ledger.ReserveRequest, op reserveCall, gh *globalHold, r reply) (ledger.Grant, error) {
	sk, cached := op.sk, op.cached
	l.noteEpoch(req.Ref.Tenant, cached, r)
	switch r.status() {
	case "OK":
		g, err := l.grantFrom(*req, r)
		if err == nil {
			l.cacheSpec(req.Ref.ID, sk)
		}
		return g, err
	case "REPLAY":
		owner, ok1 := parseOwner(r.str(2))
		le, ok2 := r.int(3)
		st, ok3 := r.int(4)
		if !ok1 || !ok2 || !ok3 {
			return ledger.Grant{}, l.corrupt("replay reply")
		}
		if gh != nil {
			gh.stored = r.str(6)
		}
		l.cacheSpec(req.Ref.ID, sk)
		// The same attempt is the caller's own retry after a lost reply
		// (go-redis retries EVALSHA on a broken connection): a success.
		same := r.str(7) == "1"
		g := ledger.Grant{Ref: req.Ref, Owner: owner, State: ledger.State(st),
			LeaseExpiry: time.UnixMilli(le).UTC(), Replayed: !same}
		decodeRoom(&g, req.Scopes, r, 8)
		return g, nil
	case "FINAL":
		st, _ := r.int(2)
		return ledger.Grant{}, &ledger.FinalError{State: ledger.State(st)}
	case "DENIED":
		return ledger.Grant{}, l.denied(r, kindsOf(req.Scopes))
	case "NOREC":
		return ledger.Grant{}, errNoRecord
	case "CHECKED":
		return ledger.Grant{}, errChecked
	}
	if err := l.statusErr(r); err != nil {
		return ledger.Grant{}, err
	}
	return ledger.Grant{}, l.corrupt("unknown reserve reply " + r.status())
}

func kindsOf(scopes []ledger.Scope) []ledger.Kind {
	k := make([]ledger.Kind, len(scopes))
	for i := range scopes {
		k[i] = scopes[i].Kind
	}
	return k
}

func parseOwner(s string) (ledger.Owner, bool) {
	var o ledger.Owner
	b, err := hex.DecodeString(s)
	if err != nil || len(b) != len(o) {
		return o, false
	}
	copy(o[:], b)
	return o, true
}

// grantFrom decodes an OK reserve reply.
func (l *Ledger) grantFrom(req ledger.ReserveRequest, r reply) (ledger.Grant, error) {
	le, ok := r.int(2)
	if !ok {
		return ledger.Grant{}, l.corrupt("reserve reply")
	}
	g := ledger.Grant{Ref: req.Ref, Owner: req.Owner, State: ledger.Reserved, LeaseExpiry: time.UnixMilli(le).UTC()}
	if req.Dispatch {
		g.State = ledger.Dispatched
	}
	decodeRoom(&g, req.Scopes, r, 4)
	return g, nil
}

// decodeRoom decodes append_room's layout starting at r[i]: the number of
// tracked dimensions, then (dimension, max, remaining, W, resetsAt) for each.
func decodeRoom(g *ledger.Grant, scopes []ledger.Scope, r reply, i int) {
	k, _ := r.int(i)
	i++
	for range k {
		d, _ := r.int(i)
		mx, _ := r.int(i + 1)
		rem, _ := r.int(i + 2)
		w, _ := r.int(i + 3)
		rs, _ := r.int(i + 4)
		if d >= 0 && d < int64(ledger.NumDims) {
			room := ledger.Room{Tracked: true, Limit: mx, Remaining: rem, Window: time.Duration(w) * time.Second}
			if w > 0 {
				room.ResetsAt = time.UnixMilli(rs).UTC()
			}
			g.Headroom[d] = room
		}
		i += 5
	}
	nw, _ := r.int(i)
	i++
	for range nw {
		si, _ := r.int(i)
		d, _ := r.int(i + 1)
		w, _ := r.int(i + 2)
		mx, _ := r.int(i + 3)
		used, _ := r.int(i + 4)
		rs, _ := r.int(i + 5)
		i += 6
		wr := ledger.Warning{Dim: ledger.Dim(d), Window: time.Duration(w) * time.Second, Limit: mx, Used: used}
		if si >= 1 && int(si) <= len(scopes) {
			wr.Scope = scopes[si-1].Kind
		}
		if w > 0 {
			wr.ResetsAt = time.UnixMilli(rs).UTC()
		}
		g.Warnings = append(g.Warnings, wr)
	}
}

// denied decodes a DENIED reply: scope index, dim, W, max, committed,
// reserved, requested, resets at, now.
func (l *Ledger) denied(r reply, kinds []ledger.Kind) error {
	var v [9]int64
	for i := range v {
		x, ok := r.int(2 + i)
		if !ok {
			return l.corrupt("denied reply")
		}
		v[i] = x
	}
	e := &ledger.DeniedError{Dim: ledger.Dim(v[1]), Window: time.Duration(v[2]) * time.Second,
		Limit: v[3], Committed: v[4], Reserved: v[5], Requested: v[6]}
	if si := int(v[0]); si >= 1 && si <= len(kinds) {
		e.Scope = kinds[si-1]
	}
	if v[2] > 0 {
		e.ResetsAt = time.UnixMilli(v[7]).UTC()
		e.RetryAfter = time.Duration(v[7]-v[8]) * time.Millisecond
	}
	return e
}

// MarkDispatched takes the request's slots (RESERVED → DISPATCHED). A full
// slot limit returns a [*ledger.DeniedError] on Slots and leaves the record
// RESERVED. Repeating it for a DISPATCHED record of the same owner succeeds.
func (l *Ledger) MarkDispatched(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	// A global hold reserved here is dispatched first (two steps,
	// global.go): a process that dies between the steps leaves a dispatched
	// hold on a record still RESERVED, which Reclaim frees when the record
	// expires. The other order left a dispatched record, charged its hold
	// once UNRESOLVED, whose global hold expired uncharged.
	h, first := l.holdOf(ref.ID)
	if first {
		if err := l.globalDispatch(ctx, h, owner); err != nil {
			return fmt.Errorf("global hold: %w", err)
		}
	}
	r, spec, err := l.runRecord(ctx, l.s.dispatch, ref, l.ownerText(owner))
	if err != nil {
		return err
	}
	switch r.status() {
	case "OK":
		if first && r.str(4) == encodeHold(h) {
			return l.endHold(ctx, ref.ID, r.str(4)) // (the record names it: only forgotten)
		}
		return l.followGlobal(ctx, r.str(4), func(g ledger.Ref) error { return l.globalDispatch(ctx, g, owner) })
	case "DENIED":
		sc, _ := parseSpec(spec)
		kinds := make([]ledger.Kind, len(sc))
		for i := range sc {
			kinds[i] = sc[i].kind
		}
		return l.denied(r, kinds)
	}
	if err := l.statusErr(r); err != nil {
		return err
	}
	return l.corrupt("unknown dispatch reply " + r.status())
}

// Extend sets the lease of a RESERVED or DISPATCHED record of owner to
// now + ttl (never shortening it) and returns the new expiry, or
// ErrLeaseLost when the lease ran out, the record is UNRESOLVED or terminal,
// another owner holds it, or the tenant's epoch changed (store loss).
func (l *Ledger) Extend(ctx context.Context, ref ledger.Ref, owner ledger.Owner, ttl time.Duration) (time.Time, error) {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return time.Time{}, fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	if ttl <= 0 || ttl > l.cfg.MaxLeaseTTL {
		return time.Time{}, fmt.Errorf("lease ttl %s outside (0, %s]: %w", ttl, l.cfg.MaxLeaseTTL, ledger.ErrInvalid)
	}
	r, err := l.extend(ctx, ref, owner, ttl)
	if err != nil {
		return time.Time{}, err
	}
	if r.status() == "OK" {
		le, ok := r.int(2)
		if !ok {
			return time.Time{}, l.corrupt("extend reply")
		}
		err := l.followGlobal(ctx, r.str(3), func(g ledger.Ref) error {
			_, err := l.extend(ctx, g, owner, ttl)
			return err
		})
		if err != nil {
			return time.Time{}, err
		}
		return time.UnixMilli(le).UTC(), nil
	}
	if err := l.statusErr(r); err != nil {
		return time.Time{}, err
	}
	return time.Time{}, l.corrupt("unknown extend reply " + r.status())
}

// extend runs the extend script and returns its reply (errors: store only).
func (l *Ledger) extend(ctx context.Context, ref ledger.Ref, owner ledger.Owner, ttl time.Duration) (reply, error) {
	rec := l.recordName(ref)
	op := getOp()
	op.fixedKeys(l.partKeys(ref.Tenant), rec)
	cached := l.common(op, ref.Tenant, rec.id)
	op.str(l.ownerText(owner))
	op.int(ttl.Milliseconds())
	r, err := l.runOp(ctx, l.s.extend, op)
	if err != nil {
		return nil, err
	}
	l.noteEpoch(ref.Tenant, cached, r)
	return r, nil
}

// Settle charges actual once (the first Settle wins; the same actual again is
// Replayed, another is ErrConflict) and frees the record's holds and slot.
func (l *Ledger) Settle(ctx context.Context, ref ledger.Ref, actual ledger.Amounts, src ledger.Source) (ledger.Settlement, error) {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return ledger.Settlement{}, fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	if err := actual.Validate(); err != nil {
		return ledger.Settlement{}, err
	}
	if !src.Valid() {
		return ledger.Settlement{}, fmt.Errorf("source %d: %w", src, ledger.ErrInvalid)
	}
	csv := amountsCSV(&actual)
	r, spec, err := l.runRecord(ctx, l.s.settle, ref, csv, src.String())
	if err != nil {
		return ledger.Settlement{}, err
	}
	// The record's global hold, if it has one, settles with the same actual.
	globalStep := func(g ledger.Ref) error { return l.globalSettle(ctx, g, actual, src) }
	switch r.status() {
	case "OK":
		// {'OK', epoch, st, prev, held, at, now}
		st, ok1 := r.int(2)
		prev, ok2 := r.int(3)
		held, ok3 := parseAmountsCSV(r.str(4))
		at, _ := r.int(5)
		now, _ := r.int(6)
		if !ok1 || !ok2 || !ok3 {
			return ledger.Settlement{}, l.corrupt("settle reply")
		}
		l.forgetSpec(ref.ID)
		s := settlementOf(ledger.State(st), ledger.State(prev), held, actual, false)
		l.emit(ref, specWithHold(spec, r.str(7)), held, actual, s.Charged, s.State, s.Late, src, at, now)
		if err := l.followGlobal(ctx, r.str(7), globalStep); err != nil {
			return ledger.Settlement{}, err
		}
		if err := l.endHold(ctx, ref.ID, r.str(7)); err != nil {
			return ledger.Settlement{}, err
		}
		return s, nil
	case "REPLAY":
		// {'REPLAY', epoch, st, prev, held, src}
		st, _ := r.int(2)
		prev, _ := r.int(3)
		held, ok := parseAmountsCSV(r.str(4))
		if !ok {
			return ledger.Settlement{}, l.corrupt("settle replay reply")
		}
		if err := l.followGlobal(ctx, r.str(6), globalStep); err != nil {
			return ledger.Settlement{}, err
		}
		if err := l.endHold(ctx, ref.ID, r.str(6)); err != nil {
			return ledger.Settlement{}, err
		}
		return settlementOf(ledger.State(st), ledger.State(prev), held, actual, true), nil
	case "FINAL":
		l.forgetSpec(ref.ID)
		if err := l.endHold(ctx, ref.ID, ""); err != nil {
			return ledger.Settlement{}, err
		}
		// The actual still goes to the usage log.
		l.emit(ref, spec, ledger.Amounts{}, actual, ledger.Amounts{}, ledger.Charged, true, src, 0, 0)
		return ledger.Settlement{}, ledger.ErrAlreadyFinal
	case "NOTFOUND":
		l.forgetSpec(ref.ID)
		if err := l.endHold(ctx, ref.ID, ""); err != nil {
			return ledger.Settlement{}, err
		}
		l.orphans.Add(1)
		l.m.orphans.Inc()
	}
	if err := l.statusErr(r); err != nil {
		return ledger.Settlement{}, err
	}
	return ledger.Settlement{}, l.corrupt("unknown settle reply " + r.status())
}

func settlementOf(st, prev ledger.State, held, actual ledger.Amounts, replayed bool) ledger.Settlement {
	s := ledger.Settlement{State: st, Charged: actual, Replayed: replayed}
	s.Late = prev == ledger.Unresolved || prev == ledger.Released || prev == ledger.Expired
	if st == ledger.Settled || st == ledger.SettledLate {
		for d := range actual {
			if x := actual[d] - held[d]; x > 0 && ledger.Dim(d) != ledger.Slots {
				s.Overrun[d] = x
			}
		}
	}
	return s
}

// emit sends a usage event to Config.OnUsage.
func (l *Ledger) emit(ref ledger.Ref, spec string, held, actual, charged ledger.Amounts, st ledger.State, late bool, src ledger.Source, at, now int64) {
	if l.cfg.OnUsage == nil {
		return
	}
	ev := ledger.UsageEvent{Ref: ref, Held: held, Actual: actual, Charged: charged, Source: src, State: st, Late: late}
	if sc, ok := parseSpec(spec); ok {
		for i := range sc {
			if i < ledger.MaxScopes {
				ev.Scopes[i] = ledger.ScopeRef{Kind: sc[i].kind, Key: sc[i].key}
				ev.NScopes++
			}
		}
	}
	if at > 0 {
		ev.AdmittedAt = time.UnixMilli(at).UTC()
	}
	if now > 0 {
		ev.At = time.UnixMilli(now).UTC()
	}
	l.cfg.OnUsage(ev)
}

// Release frees a RESERVED record's holds (RELEASED). After dispatch it is
// ErrDispatched; on an unknown id it writes a RELEASED tombstone so that a
// late Reserve gets ErrAlreadyFinal; releasing a RELEASED record succeeds.
func (l *Ledger) Release(ctx context.Context, ref ledger.Ref, owner ledger.Owner) error {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	r, _, err := l.runRecord(ctx, l.s.release, ref, l.ownerText(owner))
	if err != nil {
		return err
	}
	if r.status() == "OK" {
		l.forgetSpec(ref.ID)
		if err := l.endHold(ctx, ref.ID, r.str(3)); err != nil {
			return err
		}
		return l.followGlobal(ctx, r.str(3), func(g ledger.Ref) error { return l.globalRelease(ctx, g, owner) })
	}
	if err := l.statusErr(r); err != nil {
		return err
	}
	return l.corrupt("unknown release reply " + r.status())
}

// Resolve (admin) charges an UNRESOLVED record at its held amount (CHARGED).
// Resolving a CHARGED record again is Replayed.
func (l *Ledger) Resolve(ctx context.Context, ref ledger.Ref) (ledger.Settlement, error) {
	return l.resolve(ctx, ref, true)
}

func (l *Ledger) resolve(ctx context.Context, ref ledger.Ref, admin bool) (ledger.Settlement, error) {
	if ref.ID.IsZero() || ref.Tenant.IsZero() {
		return ledger.Settlement{}, fmt.Errorf("zero request id or tenant: %w", ledger.ErrInvalid)
	}
	force := "0"
	if admin {
		force = "1"
	}
	r, spec, err := l.runRecord(ctx, l.s.resolve, ref, force)
	if err != nil {
		return ledger.Settlement{}, err
	}
	switch r.status() {
	case "OK":
		held, ok := parseAmountsCSV(r.str(2))
		if !ok {
			return ledger.Settlement{}, l.corrupt("resolve reply")
		}
		at, _ := r.int(3)
		now, _ := r.int(4)
		l.forgetSpec(ref.ID)
		s := ledger.Settlement{State: ledger.Charged, Charged: held, Late: true}
		l.emit(ref, specWithHold(spec, r.str(5)), held, held, held, ledger.Charged, true, ledger.SourceResolved, at, now)
		if err := l.followGlobal(ctx, r.str(5), func(g ledger.Ref) error {
			return l.globalSettle(ctx, g, held, ledger.SourceResolved)
		}); err != nil {
			return ledger.Settlement{}, err
		}
		return s, nil
	case "REPLAY":
		held, _ := parseAmountsCSV(r.str(2))
		if err := l.followGlobal(ctx, r.str(3), func(g ledger.Ref) error {
			return l.globalSettle(ctx, g, held, ledger.SourceResolved)
		}); err != nil {
			return ledger.Settlement{}, err
		}
		return ledger.Settlement{State: ledger.Charged, Charged: held, Late: true, Replayed: true}, nil
	case "NOTDUE":
		st, _ := r.int(2)
		return ledger.Settlement{}, fmt.Errorf("resolve a %s record: %w", ledger.State(st), errNotDue)
	}
	if err := l.statusErr(r); err != nil {
		return ledger.Settlement{}, err
	}
	return ledger.Settlement{}, l.corrupt("unknown resolve reply " + r.status())
}

// errNotDue is returned by resolve for a record that is not UNRESOLVED (or,
// for Reclaim, whose admission window is still open).
var errNotDue = fmt.Errorf("record is not unresolved: %w", ledger.ErrConflict)

func refOf(tenant ledger.ScopeKey, x any) (ledger.Ref, bool) {
	s, ok := x.(string)
	if !ok {
		return ledger.Ref{}, false
	}
	k, err := ledger.ParseScopeKey(s) // same encoding as ids
	if err != nil {
		return ledger.Ref{}, false
	}
	return ledger.Ref{Tenant: tenant, ID: ledger.RequestID(k)}, true
}

// Snapshot reads one scope's counters in the current windows (read-only).
func (l *Ledger) Snapshot(ctx context.Context, tenant, scope ledger.ScopeKey) (ledger.Usage, error) {
	if tenant.IsZero() || scope.IsZero() {
		return ledger.Usage{}, fmt.Errorf("zero tenant or scope: %w", ledger.ErrInvalid)
	}
	base := l.tenantBase(tenant)
	r, err := l.run(ctx, l.s.snapshot, true, []string{base + "m", base + "U", base + "s:" + scope.String()})
	if err != nil {
		return ledger.Usage{}, err
	}
	if r.status() != "OK" || len(r) < 5 {
		return ledger.Usage{}, l.corrupt("snapshot reply")
	}
	now, ok1 := r.int(1)
	pv, ok2 := r.int(2)
	nU, ok3 := r.int(3)
	flat, ok4 := r[4].([]any)
	if !ok1 || !ok2 || !ok3 || !ok4 || len(flat)%2 != 0 {
		return ledger.Usage{}, l.corrupt("snapshot reply")
	}
	u, err := l.usageOf(now, pv, flat)
	if err == nil && scope == tenant {
		u.Unresolved = int(nU)
	}
	return u, err
}

// Orphans returns how many Settles found no record (never reserved, or its
// tombstone aged out) since this Ledger was created.
func (l *Ledger) Orphans() int64 { return l.orphans.Load() }

func (l *Ledger) usageOf(now, pv int64, flat []any) (ledger.Usage, error) {
	u := ledger.Usage{Now: time.UnixMilli(now).UTC(), PolicyVersion: uint64(pv)}
	fields := make(map[string]int64, len(flat)/2)
	var lim string
	for i := 0; i < len(flat); i += 2 {
		k, _ := flat[i].(string)
		v, _ := flat[i+1].(string)
		if k == "lim" {
			lim = v
			continue
		}
		n, err := strconv.ParseInt(v, 10, 64)
		if err != nil || n < 0 || n > ledger.MaxCounter {
			return ledger.Usage{}, l.corrupt("scope field " + k)
		}
		fields[k] = n
	}
	for d := range ledger.NumDims {
		u.Reserved[d] = fields["r:"+strconv.Itoa(int(d))]
	}
	u.SlotsInUse = fields["n"]
	if lim == "" {
		return u, nil
	}
	sc, ok := parseSpec(lim)
	if !ok || len(sc) != 1 {
		return ledger.Usage{}, l.corrupt("scope limits")
	}
	u.Scope = sc[0].kind
	for _, lm := range sc[0].limits {
		lu := ledger.LimitUsage{Limit: lm}
		if lm.Dim == ledger.Slots || lm.Window == 0 {
			lu.Reserved = u.SlotsInUse
		} else {
			dw := strconv.Itoa(int(lm.Dim)) + ":" + strconv.FormatInt(int64(lm.Window/time.Second), 10)
			idx := ledger.WindowIndex(u.Now, lm.Window)
			if fields["w:"+dw] == idx {
				lu.Committed = fields["c:"+dw]
			}
			lu.Reserved = u.Reserved[lm.Dim]
			lu.ResetsAt = ledger.WindowResetsAt(idx, lm.Window)
		}
		lu.Remaining = max(lm.Max-lu.Committed-lu.Reserved, 0)
		u.Limits = append(u.Limits, lu)
	}
	return u, nil
}

// registryKey is the SET of every partition (tenant or global scope key, in
// base64url) that may hold records: "<prefix>:partitions". It has no hash
// tag of a tenant, so on a Cluster it lives in its own slot and is written
// with a plain SADD, never from a script.
func (l *Ledger) registryKey() string { return l.prefix + ":partitions" }

// register adds a partition to the registry before this process first
// writes a record in it, so that every instance's Run reclaims it (tenants
// added by a reload, and tenants only another, crashed instance knew). One SADD per partition per process, before its first
// Reserve there. A failed SADD does not fail the Reserve (the store is the
// same, so the script usually fails too); the partition stays pending and
// Run retries it every tick, and every later Reserve there tries again. The
// one gap: a SADD that fails, a Reserve that succeeds, and a crash before
// any retry succeeds; Config.Tenants still covers configured tenants.
func (l *Ledger) register(ctx context.Context, key ledger.ScopeKey) {
	if _, ok := l.registered.Load(key); ok {
		return
	}
	l.pending.Store(key, struct{}{})
	if err := l.sadd(ctx, key); err == nil {
		l.registered.Store(key, struct{}{})
		l.pending.Delete(key)
	}
}

func (l *Ledger) sadd(ctx context.Context, key ledger.ScopeKey) error {
	if err := ctx.Err(); err != nil {
		return err
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	defer cancel()
	if err := l.c.SAdd(ctx, l.registryKey(), key.String()).Err(); err != nil {
		return l.storeErr(err)
	}
	return nil
}

// registerPending retries the registrations that failed (Run, every tick).
func (l *Ledger) registerPending(ctx context.Context) {
	l.pending.Range(func(k, _ any) bool {
		key := k.(ledger.ScopeKey)
		if l.sadd(ctx, key) == nil {
			l.registered.Store(key, struct{}{})
			l.pending.Delete(key)
		}
		return ctx.Err() == nil
	})
}

// partitions returns every partition Run reclaims: Config.Tenants, the
// registry and the global partitions this process reserved in, without
// duplicates. A registry read error leaves the partitions known locally.
func (l *Ledger) partitions(ctx context.Context) []ledger.ScopeKey {
	seen := make(map[ledger.ScopeKey]struct{}, len(l.cfg.Tenants))
	var out []ledger.ScopeKey
	add := func(k ledger.ScopeKey) {
		if _, ok := seen[k]; !ok && !k.IsZero() {
			seen[k] = struct{}{}
			out = append(out, k)
		}
	}
	for _, k := range l.cfg.Tenants {
		add(k)
	}
	l.globals.Range(func(k, _ any) bool {
		add(k.(ledger.ScopeKey))
		return true
	})
	sctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	defer cancel()
	it := l.c.SScan(sctx, l.registryKey(), 0, "", 1024).Iterator()
	for it.Next(sctx) {
		if k, err := ledger.ParseScopeKey(it.Val()); err == nil {
			add(k)
		}
	}
	if err := it.Err(); err != nil {
		_ = l.storeErr(err) // counted; the next tick retries
	}
	return out
}

// List returns up to max (≤ 0: ledger.DefaultListMax) open records of tenant
// in state, ordered like the ZSET that indexes them: RESERVED and DISPATCHED
// by lease expiry (L), UNRESOLVED by chargeable-at (U), ties by id. It never
// writes: ZRANGE pages of the index, each followed by one read-only script
// (FCALL_RO, or EVALSHA_RO without functions) that decodes the page's records (packed, or the older hash
// layout) and returns the fields List reports.
//
// # Design rationale
//
// One script could read the index and the records atomically, but only by
// building key names inside Lua, which the key rules forbid (every key in
// KEYS). The price of reading the index first is that the answer is not one
// atomic cut: a record that changes state between the ZRANGE and the read of
// its record is judged by the state read last (and skipped if it no longer
// matches), and an id whose record is gone (purged or damaged) is skipped.
// Reclaim, not List, reports corruption.
func (l *Ledger) List(ctx context.Context, tenant ledger.ScopeKey, state ledger.State, limit int) ([]ledger.ReservationInfo, error) {
	if tenant.IsZero() {
		return nil, fmt.Errorf("zero tenant: %w", ledger.ErrInvalid)
	}
	if !state.Open() {
		return nil, fmt.Errorf("list state %s: only reserved, dispatched or unresolved: %w", state, ledger.ErrInvalid)
	}
	if err := ctx.Err(); err != nil {
		return nil, fmt.Errorf("%w: %w", ledger.ErrUnavailable, err)
	}
	if limit <= 0 {
		limit = ledger.DefaultListMax
	}
	ctx, cancel := context.WithTimeout(ctx, l.cfg.StoreTimeout)
	defer cancel()
	base := l.tenantBase(tenant)
	index := base + "L"
	if state == ledger.Unresolved {
		index = base + "U"
	}
	const page = 256
	want := strconv.Itoa(int(state))
	var out []ledger.ReservationInfo
	for start := int64(0); len(out) < limit; start += page {
		ids, err := l.c.ZRange(ctx, index, start, start+page-1).Result()
		if err != nil {
			return nil, l.storeErr(err)
		}
		if len(ids) == 0 {
			break
		}
		keys := make([]string, len(ids))
		for i, id := range ids {
			keys[i] = base + "q:" + id
		}
		recs, err := l.run(ctx, l.s.records, true, keys)
		if err != nil {
			return nil, err
		}
		for i, x := range recs {
			v, _ := x.([]any)
			if len(v) < 5 || i >= len(ids) {
				continue
			}
			r := reply(v)
			if r.str(0) != want {
				continue
			}
			ref, ok := refOf(tenant, ids[i])
			owner, ok2 := parseOwner(r.str(1))
			le, ok3 := r.int(2)
			held, ok4 := parseAmountsCSV(r.str(3))
			at, ok5 := r.int(4)
			if !ok || !ok2 || !ok3 || !ok4 || !ok5 {
				return nil, l.corrupt("record of list entry " + ids[i])
			}
			held[ledger.Slots] = 0
			out = append(out, ledger.ReservationInfo{Ref: ref, State: state, Held: held,
				LeaseExpiry: time.UnixMilli(le).UTC(), AdmittedAt: time.UnixMilli(at).UTC(), Owner: owner})
			if len(out) == limit {
				break
			}
		}
		if len(ids) < page {
			break
		}
	}
	return out, nil
}
