package ledger

import (
	"context"
	"crypto/hmac"
	"crypto/rand"
	"crypto/sha256"
	"encoding/base64"
	"encoding/binary"
	"encoding/hex"
	"errors"
	"fmt"
	mrand "math/rand/v2"
	"time"
)

// Dim is a budget dimension. All amounts are int64 integer units.
type Dim uint8

// The dimensions. Every one but Slots is a windowed budget; Slots is a
// concurrency gauge without a window. The numbers are stored (journal,
// Redis fields and specs), so a new dimension is appended, never inserted:
// loop over range NumDims and skip what [Dim.Windowed] excludes rather than
// stopping at Slots.
const (
	Requests     Dim = iota // requests
	InputTokens             // input_tokens
	OutputTokens            // output_tokens
	Tokens                  // tokens = input_tokens + output_tokens
	GPUMs                   // gpu_ms
	USDMicros               // usd_micros (1 USD = 1,000,000)
	Slots                   // slots (concurrency gauge, W = 0)
	GPUJoules               // gpu_joules: GPU energy in integer millijoules
	NumDims                 // number of dimensions
)

var dimNames = [NumDims]string{"requests", "input_tokens", "output_tokens", "tokens", "gpu_ms", "usd_micros", "slots", "gpu_joules"}

// Windowed reports whether d is a windowed budget dimension (every valid
// dimension but Slots).
func (d Dim) Windowed() bool { return d < NumDims && d != Slots }

// String returns the config/metric name of d ("tokens", "gpu_ms", ...).
func (d Dim) String() string {
	if d < NumDims {
		return dimNames[d]
	}
	return fmt.Sprintf("dim(%d)", uint8(d))
}

// ParseDim maps a config name ("tokens", "gpu_ms", ...) to its Dim.
func ParseDim(s string) (Dim, error) {
	for i, n := range dimNames {
		if n == s {
			return Dim(i), nil
		}
	}
	return 0, fmt.Errorf("dimension %q: %w", s, ErrPolicy)
}

// Limits on values (LEDGER.md §1): amounts lie in 0..MaxAmount, counters in
// 0..MaxCounter (exact in Lua doubles).
const (
	MaxAmount  int64 = 1 << 50
	MaxCounter int64 = 1<<53 - 1
	// MaxWindow is the longest window, 31 days.
	MaxWindow = 31 * 24 * time.Hour
	// MaxScopes is the most scopes one request may touch: tenant, api_key,
	// workflow, and the fleet-wide global scope.
	MaxScopes = 4
)

// Amounts is one int64 per dimension, indexed by [Dim]. The Slots entry is
// ignored by Reserve and Settle (a dispatch always takes exactly one slot in
// each scope that has a slots limit) but must still be in range.
type Amounts [NumDims]int64

// Validate reports ErrInvalid unless every entry lies in 0..MaxAmount and
// Tokens == InputTokens + OutputTokens.
func (a *Amounts) Validate() error {
	for d, v := range a {
		if v < 0 || v > MaxAmount {
			return fmt.Errorf("amount %s=%d outside 0..2^50: %w", Dim(d), v, ErrInvalid)
		}
	}
	if a[Tokens] != a[InputTokens]+a[OutputTokens] {
		return fmt.Errorf("tokens %d != input_tokens %d + output_tokens %d: %w",
			a[Tokens], a[InputTokens], a[OutputTokens], ErrInvalid)
	}
	return nil
}

// RequestID identifies one upstream attempt (random per attempt, or a keyed
// hash of tenant and Idempotency-Key, see [Keyer.IdempotentID]).
type RequestID [16]byte

// NewRequestID returns a random RequestID: 128 bits of the runtime's
// ChaCha8 generator (seeded by the OS per thread), as unique as crypto/rand's
// and without its cost on every request.
func NewRequestID() RequestID {
	var id RequestID
	binary.LittleEndian.PutUint64(id[:8], mrand.Uint64())
	binary.LittleEndian.PutUint64(id[8:], mrand.Uint64())
	return id
}

// String returns the id in lowercase hex.
func (id RequestID) String() string { return hex.EncodeToString(id[:]) }

// IsZero reports whether id is the zero value (never a valid id).
func (id RequestID) IsZero() bool { return id == RequestID{} }

// ScopeKey is HMAC-SHA256(IDKey, kind‖0‖id) truncated to 128 bits; the
// ledger never sees a raw id.
type ScopeKey [16]byte

// String returns the key in unpadded base64url (never '{' or '}').
func (k ScopeKey) String() string { return base64.RawURLEncoding.EncodeToString(k[:]) }

// IsZero reports whether k is the zero value (never a valid key).
func (k ScopeKey) IsZero() bool { return k == ScopeKey{} }

// ParseScopeKey parses the String form of a ScopeKey.
func ParseScopeKey(s string) (ScopeKey, error) {
	var k ScopeKey
	b, err := base64.RawURLEncoding.DecodeString(s)
	if err != nil || len(b) != len(k) {
		return k, fmt.Errorf("scope key %q: %w", s, ErrInvalid)
	}
	copy(k[:], b)
	return k, nil
}

// Owner is a front end's instance id, random per process start.
type Owner [16]byte

// NewOwner returns a random Owner.
func NewOwner() Owner {
	var o Owner
	_, _ = rand.Read(o[:])
	return o
}

// String returns the owner in lowercase hex.
func (o Owner) String() string { return hex.EncodeToString(o[:]) }

// Kind is a scope kind. The zero value is invalid.
type Kind uint8

// Scope kinds. KindGlobal is a fleet-wide budget applied on top of the
// tenant, api_key and workflow budgets of every request that names it; its
// key is conventionally Keyer.Key(KindGlobal, "") (see [Keyer.GlobalKey]).
const (
	KindTenant   Kind = 1
	KindAPIKey   Kind = 2
	KindWorkflow Kind = 3
	KindGlobal   Kind = 4
)

// String returns "tenant", "api_key", "workflow" or "global".
func (k Kind) String() string {
	switch k {
	case KindTenant:
		return "tenant"
	case KindAPIKey:
		return "api_key"
	case KindWorkflow:
		return "workflow"
	case KindGlobal:
		return "global"
	}
	return fmt.Sprintf("kind(%d)", uint8(k))
}

// Keyer derives ScopeKeys and idempotent RequestIDs from raw ids with a secret
// IDKey. It is safe for concurrent use. Rotating the IDKey counts as store
// loss. Callers cache keys (each call allocates a MAC).
type Keyer struct {
	idKey []byte
}

// ErrShortKey-like failures are reported as ErrInvalid.
const minIDKeyLen = 16

// NewKeyer returns a Keyer for idKey, which must be at least 16 bytes.
func NewKeyer(idKey []byte) (*Keyer, error) {
	if len(idKey) < minIDKeyLen {
		return nil, fmt.Errorf("id key is %d bytes, need at least %d: %w", len(idKey), minIDKeyLen, ErrInvalid)
	}
	return &Keyer{idKey: append([]byte(nil), idKey...)}, nil
}

// Key returns HMAC-SHA256(IDKey, kind‖0‖id)[:16], where kind is the kind's
// name ("tenant", "api_key", "workflow", "global").
func (k *Keyer) Key(kind Kind, id string) ScopeKey {
	m := hmac.New(sha256.New, k.idKey)
	m.Write([]byte(kind.String()))
	m.Write([]byte{0})
	m.Write([]byte(id))
	var sk ScopeKey
	copy(sk[:], m.Sum(nil))
	return sk
}

// GlobalKey returns the conventional key of the fleet-wide global scope,
// Key(KindGlobal, "").
func (k *Keyer) GlobalKey() ScopeKey { return k.Key(KindGlobal, "") }

// Derive returns HMAC-SHA256(IDKey, label‖0‖id): a value every instance
// of a fleet derives alike and nobody without the key can, for secrets
// that must be stable across instances (a tenant's prefix-cache salt).
func (k *Keyer) Derive(label, id string) [32]byte {
	m := hmac.New(sha256.New, k.idKey)
	m.Write([]byte(label))
	m.Write([]byte{0})
	m.Write([]byte(id))
	var out [32]byte
	copy(out[:], m.Sum(nil))
	return out
}

// IdempotentID returns the RequestID for a client Idempotency-Key within a
// tenant: HMAC-SHA256(IDKey, "idem"‖0‖tenant‖key)[:16], so a retry on any
// instance finds the first attempt.
func (k *Keyer) IdempotentID(tenant ScopeKey, key string) RequestID {
	m := hmac.New(sha256.New, k.idKey)
	m.Write([]byte("idem"))
	m.Write([]byte{0})
	m.Write(tenant[:])
	m.Write([]byte(key))
	var id RequestID
	copy(id[:], m.Sum(nil))
	return id
}

// Mode says what a limit does when exceeded.
type Mode uint8

// Limit modes.
const (
	Block Mode = iota // deny the Reserve (or dispatch, for slots)
	Warn              // never deny; reported in Grant.Warnings
)

// String returns "block" or "warn".
func (m Mode) String() string {
	switch m {
	case Block:
		return "block"
	case Warn:
		return "warn"
	}
	return fmt.Sprintf("mode(%d)", uint8(m))
}

// Limit is one budget: at most Max units of Dim per tumbling Window (aligned
// to multiples of Window since the Unix epoch), or at most Max concurrent
// slots when Dim is Slots (Window must be 0).
type Limit struct {
	Dim    Dim
	Window time.Duration // whole seconds, 1s..31d; 0 for Slots
	Max    int64         // 0..MaxAmount
	Mode   Mode
}

// Validate reports ErrPolicy for an out-of-range max, a bad window or mode.
func (l Limit) Validate() error {
	if l.Dim >= NumDims {
		return fmt.Errorf("limit dimension %d: %w", l.Dim, ErrPolicy)
	}
	if l.Max < 0 || l.Max > MaxAmount {
		return fmt.Errorf("limit %s max %d outside 0..2^50: %w", l.Dim, l.Max, ErrPolicy)
	}
	if l.Mode != Block && l.Mode != Warn {
		return fmt.Errorf("limit %s mode %d: %w", l.Dim, l.Mode, ErrPolicy)
	}
	if l.Dim == Slots {
		if l.Window != 0 {
			return fmt.Errorf("slots limit with window %s: %w", l.Window, ErrPolicy)
		}
		return nil
	}
	if l.Window < time.Second || l.Window > MaxWindow || l.Window%time.Second != 0 {
		return fmt.Errorf("limit %s window %s not whole seconds in 1s..31d: %w", l.Dim, l.Window, ErrPolicy)
	}
	return nil
}

// Scope is one budget scope of a request with its limits (which travel with
// every Reserve). A scope without limits is ErrPolicy.
type Scope struct {
	Kind   Kind
	Key    ScopeKey
	Limits []Limit
}

// ScopeRef names a scope without its limits.
type ScopeRef struct {
	Kind Kind
	Key  ScopeKey
}

// Ref names a request: its tenant (the partition) and its id.
type Ref struct {
	Tenant ScopeKey
	ID     RequestID
}

// ReserveRequest is the input of Reserve.
type ReserveRequest struct {
	Ref   Ref
	Owner Owner
	// Scopes: exactly one KindTenant scope whose Key is Ref.Tenant, plus at
	// most one KindAPIKey, one KindWorkflow and one KindGlobal scope (the
	// fleet-wide budget; no slots limit, ErrPolicy otherwise). The request
	// is admitted only if every block-mode limit of every scope has room.
	// Snapshot(ctx, G, G) reads a global scope G.
	Scopes []Scope
	// Held is what the request may consume (validated like [Amounts.Validate]).
	Held Amounts
	// LeaseTTL is the lease duration. Optional; 0 means the backend's default
	// (60s); more than the backend's MaxLeaseTTL is ErrInvalid.
	LeaseTTL time.Duration
	// Dispatch also takes the slots and creates the record DISPATCHED.
	Dispatch bool
	// Attempt is a per-attempt nonce: the caller draws a fresh random value
	// for every Reserve attempt and repeats it only when retrying that same
	// attempt (an ambiguous outcome, a reply lost after the store applied it,
	// which go-redis retries on its own). A Reserve that finds its id with
	// the same payload and the same non-zero Attempt answers the original
	// grant as a success (Replayed false); a different Attempt (a concurrent
	// duplicate or an Idempotency-Key retry) answers Replayed with the
	// record's State. 0 means none: every repeat is Replayed. Not part of
	// the digest.
	Attempt uint64
	// PolicyVersion of Scopes' limits: recorded for audit (Usage.PolicyVersion),
	// never compared, so any value is accepted (see the package doc, "Policy
	// versions"). At most MaxCounter.
	PolicyVersion uint64
	// RequestDigest, when non-zero, is the caller's digest of what it was
	// asked to do (a client's request under an Idempotency-Key), and the
	// payload digest is derived from it alone: a later attempt whose holds
	// or scopes differ only because limits, prices or estimates changed
	// meanwhile is the same payload (a replay), while another request under
	// the same id is ErrConflict even when its holds happen to be equal.
	// 0 means none: the digest covers scopes and Held.
	RequestDigest uint64
}

// Validate checks the request's shape (not the backend's state): ErrInvalid
// for ids, amounts, TTL and scope structure; ErrPolicy for limits.
// maxLeaseTTL ≤ 0 skips the TTL bound.
func (r *ReserveRequest) Validate(maxLeaseTTL time.Duration) error {
	if r.Ref.ID.IsZero() || r.Ref.Tenant.IsZero() {
		return fmt.Errorf("zero request id or tenant: %w", ErrInvalid)
	}
	if r.Owner == (Owner{}) {
		return fmt.Errorf("zero owner: %w", ErrInvalid)
	}
	if err := r.Held.Validate(); err != nil {
		return err
	}
	if r.LeaseTTL < 0 || (maxLeaseTTL > 0 && r.LeaseTTL > maxLeaseTTL) {
		return fmt.Errorf("lease ttl %s outside 0..%s: %w", r.LeaseTTL, maxLeaseTTL, ErrInvalid)
	}
	if len(r.Scopes) == 0 || len(r.Scopes) > MaxScopes {
		return fmt.Errorf("%d scopes, need 1..%d: %w", len(r.Scopes), MaxScopes, ErrInvalid)
	}
	var seen [KindGlobal + 1]bool
	for i := range r.Scopes {
		s := &r.Scopes[i]
		switch s.Kind {
		case KindTenant:
			if s.Key != r.Ref.Tenant {
				return fmt.Errorf("tenant scope key differs from ref tenant: %w", ErrInvalid)
			}
		case KindAPIKey, KindWorkflow:
		case KindGlobal:
			for _, l := range s.Limits {
				if l.Dim == Slots {
					return fmt.Errorf("global scope with a slots limit: %w", ErrPolicy)
				}
			}
		default:
			return fmt.Errorf("scopes[%d] kind %d: %w", i, s.Kind, ErrInvalid)
		}
		if seen[s.Kind] {
			return fmt.Errorf("two %s scopes: %w", s.Kind, ErrInvalid)
		}
		seen[s.Kind] = true
		if s.Key.IsZero() {
			return fmt.Errorf("%s scope with zero key: %w", s.Kind, ErrInvalid)
		}
		if len(s.Limits) == 0 {
			return fmt.Errorf("%s scope has no policy: %w", s.Kind, ErrPolicy)
		}
		for j, l := range s.Limits {
			if err := l.Validate(); err != nil {
				return fmt.Errorf("%s scope limits[%d]: %w", s.Kind, j, err)
			}
			for _, o := range s.Limits[:j] {
				if o.Dim == l.Dim && o.Window == l.Window {
					return fmt.Errorf("%s scope has two %s limits per %s: %w", s.Kind, l.Dim, FormatWindow(l.Window), ErrPolicy)
				}
			}
		}
	}
	if !seen[KindTenant] {
		return fmt.Errorf("no tenant scope: %w", ErrInvalid)
	}
	return nil
}

// hasGlobal reports whether r carries a KindGlobal scope.
func (r *ReserveRequest) hasGlobal() bool {
	for i := range r.Scopes {
		if r.Scopes[i].Kind == KindGlobal {
			return true
		}
	}
	return false
}

// Digest is the payload digest that decides whether a Reserve with a known id
// is a replay (same digest) or a conflict: FNV-1a over the scopes (kind and
// key, order-independent) and Held (without Slots), or over RequestDigest
// alone when it is set. Limits, LeaseTTL, Owner and Dispatch are never part
// of it.
func (r *ReserveRequest) Digest() uint64 {
	const (
		offset = 14695981039346656037
		prime  = 1099511628211
	)
	if r.RequestDigest != 0 {
		// A leading marker byte (no scope-kind sum starts a digest this
		// way on purpose) keeps the two kinds of digest apart.
		h := uint64(offset)
		h = (h ^ 0xd1) * prime
		for s := 0; s < 64; s += 8 {
			h = (h ^ (r.RequestDigest >> s & 0xff)) * prime
		}
		return h
	}
	var sum uint64
	for i := range r.Scopes {
		h := uint64(offset)
		h = (h ^ uint64(r.Scopes[i].Kind)) * prime
		for _, b := range r.Scopes[i].Key {
			h = (h ^ uint64(b)) * prime
		}
		sum += h
	}
	h := uint64(offset) ^ sum
	for d := Dim(0); d < Slots; d++ {
		v := uint64(r.Held[d])
		for s := 0; s < 64; s += 8 {
			h = (h ^ (v >> s & 0xff)) * prime
		}
	}
	// Dimensions appended after Slots count only when non-zero, with their
	// number, so digests stored before they existed still match.
	for d := Slots + 1; d < NumDims; d++ {
		if v := uint64(r.Held[d]); v != 0 {
			h = (h ^ uint64(d)) * prime
			for s := 0; s < 64; s += 8 {
				h = (h ^ (v >> s & 0xff)) * prime
			}
		}
	}
	return h
}

// Room is the tightest block-mode limit of one dimension after an operation.
type Room struct {
	Tracked   bool          // false: no block-mode limit on this dimension
	Limit     int64         // that limit's max
	Remaining int64         // max − (c + r) (slots: max − n); never negative
	Window    time.Duration // 0 for slots
	ResetsAt  time.Time     // end of its current window; zero for slots
}

// Headroom is the tightest remaining room per dimension across all scopes of
// a request, for the x-ratelimit-* headers.
type Headroom [NumDims]Room

// Warning reports a warn-mode limit that this grant pushed past its max
// (c + r > max), for X-Budget-Warning.
type Warning struct {
	Scope    Kind
	Dim      Dim
	Window   time.Duration
	Limit    int64
	Used     int64 // c + r after the grant
	ResetsAt time.Time
}

// State is a reservation record's state. The zero value is invalid.
type State uint8

// Record states (LEDGER.md §2).
const (
	Reserved    State = iota + 1 // holds taken, not dispatched
	Dispatched                   // slot taken, upstream may run
	Settled                      // charged with the actual (Late if it was UNRESOLVED)
	Released                     // released before dispatch (or tombstone of an unknown id)
	Expired                      // RESERVED lease ran out
	Unresolved                   // DISPATCHED lease ran out; holds kept, slot freed
	Charged                      // UNRESOLVED charged at its held amount
	SettledLate                  // RELEASED/EXPIRED then settled: a protocol violation
)

var stateNames = [...]string{"", "reserved", "dispatched", "settled", "released", "expired", "unresolved", "charged", "settled_late"}

// String returns the state's lowercase name.
func (s State) String() string {
	if s >= Reserved && s <= SettledLate {
		return stateNames[s]
	}
	return fmt.Sprintf("state(%d)", uint8(s))
}

// Open reports whether s still holds budget (RESERVED, DISPATCHED, UNRESOLVED).
func (s State) Open() bool { return s == Reserved || s == Dispatched || s == Unresolved }

// Source says where a Settle's actual came from.
type Source uint8

// Usage sources. The zero value is invalid.
const (
	SourceFinal    Source = iota + 1 // vLLM's final usage
	SourcePartial                    // last cumulative usage chunk of an aborted stream
	SourceHeld                       // no evidence: charged at the held amount
	SourceNotSent                    // never sent upstream (actual is zero)
	SourceResolved                   // admin Resolve or automatic charge of an UNRESOLVED hold
	SourceOutage                     // Charge: usage admitted while the ledger was unreachable
)

var sourceNames = [...]string{"", "final", "partial", "held", "not_sent", "resolved", "outage"}

// String returns the source's lowercase name.
func (s Source) String() string {
	if s >= SourceFinal && s <= SourceOutage {
		return sourceNames[s]
	}
	return fmt.Sprintf("source(%d)", uint8(s))
}

// Valid reports whether s is a source Settle accepts (SourceOutage is
// Charge's alone).
func (s Source) Valid() bool { return s >= SourceFinal && s <= SourceResolved }

// Grant is the result of an admitted (or replayed) Reserve.
type Grant struct {
	Ref         Ref
	Owner       Owner     // the owner of the original Reserve (differs from the caller's on a replay by another instance)
	State       State     // RESERVED or DISPATCHED (UNRESOLVED on a late replay)
	LeaseExpiry time.Time // ledger time
	Replayed    bool      // the id existed with the same payload and another Attempt; nothing changed
	Headroom    Headroom  // tightest remaining per dimension, after this grant
	Warnings    []Warning // warn-mode limits past their max; nil when none
}

// Settlement is the result of Settle and Resolve.
type Settlement struct {
	State    State   // SETTLED, CHARGED or SETTLED_LATE
	Charged  Amounts // what was charged (the actual, or the hold for CHARGED)
	Overrun  Amounts // max(0, actual − held) per dimension
	Late     bool    // the record had been UNRESOLVED, RELEASED or EXPIRED
	Replayed bool    // the same settlement was applied before; nothing changed
	// OverLimit (Charge only, not on a replay): after the charge some limit
	// of its scopes, block or warn, has c + r > max. Reported, never
	// refused; Snapshot shows which.
	OverLimit bool
}

// ChargeRequest is the input of Charge: usage admitted while the ledger was
// unreachable (the outage allowance), settled into the ledger afterwards.
type ChargeRequest struct {
	// Ref names the charge; Ref.ID makes it idempotent (use the original
	// request's id).
	Ref Ref
	// Scopes are the request's scopes with their limits, shaped like a
	// Reserve's (exactly one tenant scope whose Key is Ref.Tenant, at most
	// one api_key, workflow and global scope). A scope the ledger has not
	// seen is created with these limits; the limits never deny.
	Scopes []Scope
	// Amounts is the usage (validated like [Amounts.Validate]; Slots ignored).
	Amounts Amounts
	// At is when the usage happened. The charge lands in the windows
	// containing At that are still current at ledger time; a closed window
	// gets nothing (the usage lives in the record and the usage log only,
	// like any late charge). An At after ledger time counts as ledger time.
	At time.Time
}

// Validate checks the request's shape: ErrInvalid for ids, amounts, At and
// scope structure; ErrPolicy for limits.
func (c *ChargeRequest) Validate() error {
	if c.At.IsZero() || c.At.UnixMilli() <= 0 {
		return fmt.Errorf("charge without a usage time: %w", ErrInvalid)
	}
	r := c.asReserve()
	return r.Validate(0)
}

// Digest is the payload digest deciding replay (same) or ErrConflict: the
// scopes and the amounts, as [ReserveRequest.Digest] (At is not part of it).
func (c *ChargeRequest) Digest() uint64 {
	r := c.asReserve()
	return r.Digest()
}

func (c *ChargeRequest) asReserve() ReserveRequest {
	r := ReserveRequest{Ref: c.Ref, Owner: Owner{1}, Scopes: c.Scopes, Held: c.Amounts}
	r.Held[Slots] = 0
	return r
}

// ReclaimStats counts what one Reclaim call did.
type ReclaimStats struct {
	Expired    int  // RESERVED → EXPIRED
	Unresolved int  // DISPATCHED → UNRESOLVED
	Charged    int  // UNRESOLVED → CHARGED (first admission window closed)
	Purged     int  // tombstones dropped after TombstoneRetention
	More       bool // max was reached; call again
}

// LimitUsage is one limit of a scope with its current-window counters.
type LimitUsage struct {
	Limit     Limit
	Committed int64     // c in the current window (slots: 0)
	Reserved  int64     // r of the limit's dimension (slots: n)
	Remaining int64     // max − (c + r), never negative
	ResetsAt  time.Time // end of the current window; zero for slots
}

// Usage is a Snapshot of one scope. A scope the ledger has never seen has
// zero usage and no limits.
type Usage struct {
	Now           time.Time    // ledger time of the snapshot
	Scope         Kind         // 0 when unknown
	Reserved      Amounts      // r per dimension (in-flight holds); the Slots entry is 0
	SlotsInUse    int64        // n
	Limits        []LimitUsage // the scope's limits as last seen by Reserve
	PolicyVersion uint64       // policy version of the tenant's last admitted Reserve (audit only)
	Unresolved    int          // tenant scope only: UNRESOLVED records of the tenant
}

// UsageEvent is emitted once by every applied Settle and Resolve (and by the
// automatic charge of an UNRESOLVED hold), and for a Settle on a CHARGED
// record (Charged then zero), so the usage log sees every actual.
type UsageEvent struct {
	Ref        Ref
	Scopes     [MaxScopes]ScopeRef // first NScopes entries are valid
	NScopes    int
	Held       Amounts
	Actual     Amounts // what the caller reported (the hold for CHARGED)
	Charged    Amounts // what this transition charged
	Source     Source
	State      State     // resulting state
	Late       bool      // see [Settlement.Late]
	AdmittedAt time.Time // the admission window of any W is floor(AdmittedAt/W)
	At         time.Time // ledger time of the transition
}

// ReservationInfo describes one open reservation record, for the admin API
// (GET /admin/reservations?state=…). Times are ledger time.
type ReservationInfo struct {
	Ref         Ref
	State       State     // RESERVED, DISPATCHED or UNRESOLVED
	Held        Amounts   // the hold (Slots entry 0)
	LeaseExpiry time.Time // the lease (for UNRESOLVED: the lease that ran out)
	AdmittedAt  time.Time // the admission window of any W is floor(AdmittedAt/W)
	Owner       Owner     // the front end that reserved it
}

// DefaultListMax is the max List uses when called with max ≤ 0.
const DefaultListMax = 1000

// Ledger is the full method set both backends implement (LEDGER.md §2). The
// scheduler declares its own smaller interface; ledgertest uses this one.
// Every method is safe for concurrent use and never panics.
type Ledger interface {
	Reserve(ctx context.Context, req ReserveRequest) (Grant, error)
	MarkDispatched(ctx context.Context, ref Ref, owner Owner) error
	Extend(ctx context.Context, ref Ref, owner Owner, ttl time.Duration) (leaseExpiry time.Time, err error)
	// Grow raises the hold of an open RESERVED or DISPATCHED record of
	// owner from from to to (to ≥ from in every dimension), admitted like
	// a Reserve of the difference against every block-mode limit of every
	// scope of the record (a *DeniedError when one has no room; nothing
	// changes then). It is a compare-and-set: a record already holding to
	// answers nil (a retry), one holding neither is ErrConflict. EXPIRED,
	// UNRESOLVED or another owner's record is ErrLeaseLost (grow.go).
	Grow(ctx context.Context, ref Ref, owner Owner, from, to Amounts) error
	Settle(ctx context.Context, ref Ref, actual Amounts, src Source) (Settlement, error)
	Release(ctx context.Context, ref Ref, owner Owner) error
	Reclaim(ctx context.Context, tenant ScopeKey, limit int) (ReclaimStats, error)
	Resolve(ctx context.Context, ref Ref) (Settlement, error)
	Snapshot(ctx context.Context, tenant, scope ScopeKey) (Usage, error)
	// List returns up to max (≤ 0: DefaultListMax) open records of tenant in
	// state (RESERVED, DISPATCHED or UNRESOLVED; anything else is ErrInvalid),
	// ordered by lease expiry (UNRESOLVED: by when they become chargeable),
	// ties by the id's base64url form. It never writes.
	List(ctx context.Context, tenant ScopeKey, state State, limit int) ([]ReservationInfo, error)
	// Charge commits usage that happened without a reservation (admitted
	// while the ledger was unreachable), exactly once by Ref.ID: never
	// denied, charged to the still-current windows containing At, emitted as
	// a usage event (SourceOutage). A replay with the same scopes and
	// amounts returns Replayed; a different payload, or an id that names a
	// reservation, is ErrConflict. Like every record it answers replays
	// for TombstoneRetention.
	Charge(ctx context.Context, req ChargeRequest) (Settlement, error)
}

// WindowIndex returns floor(t / w) in milliseconds since the Unix epoch.
func WindowIndex(t time.Time, w time.Duration) int64 {
	return floorDiv(t.UnixMilli(), w.Milliseconds())
}

// WindowResetsAt returns the end of window idx of width w: (idx+1)·w.
func WindowResetsAt(idx int64, w time.Duration) time.Time {
	return time.UnixMilli((idx + 1) * w.Milliseconds()).UTC()
}

func floorDiv(a, b int64) int64 {
	q := a / b
	if (a%b != 0) && ((a < 0) != (b < 0)) {
		q--
	}
	return q
}

// IsStoreError reports whether err means the store could not decide
// (ErrUnavailable, ErrAmbiguous, ErrRecovering): answer 503, never dispatch.
func IsStoreError(err error) bool {
	return errors.Is(err, ErrUnavailable) || errors.Is(err, ErrAmbiguous) || errors.Is(err, ErrRecovering)
}
