package scheduler

import (
	"container/list"
	"context"
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/vllm"
)

// Idempotency-Key. A key maps to ledger ids
// Keyer.IdempotentID(tenant, key) for generation 0 and key‖0‖g for later
// generations, so every instance of a fleet derives the same ids. A retry
// walks the generations with Reserve and the ledger's answer decides:
//
//   - a new record: this attempt runs;
//   - the id held by another attempt (Replayed, RESERVED or DISPATCHED):
//     409 idempotency_conflict, details.state "in_flight" ("unresolved"
//     for an UNRESOLVED record);
//   - a record that ended without running (RELEASED, EXPIRED): the next
//     generation is tried, so a retry after a first attempt that never ran
//     may run (at most maxIdemGenerations attempts per key);
//   - a record that was charged: the original response when this instance
//     or the fleet's response store still has it (a non-streamed 200, kept
//     in idemCache and Deps.Responses before the call settles, so a retry
//     that sees the record charged finds it), else 409 with details.state
//     "completed".
//
// What a key names is the client's request alone (requestDigest: the
// endpoint and the body's bytes; the tenant is in the id): the ledger
// decides replay or conflict on it (ledger.ReserveRequest.RequestDigest),
// not on the holds, which a reload, an admin change or the GPU estimator
// may size differently between two attempts of the same request. Another
// body under a key is 409 details.state "conflict" while its record is
// open, and when it completed (the kept response carries the digest of the
// request it answers); one whose record never ran may run as the next
// generation, since the key has executed nothing yet.
//
// While the ledger cannot answer, a keyed request is 503: it is never
// admitted on an outage allowance (outage.go), since only the ledger knows
// whether the key ran.

// maxIdemGenerations bounds the attempts of one Idempotency-Key that never
// ran.
const maxIdemGenerations = 8

// idemID is the ledger id of generation gen of an Idempotency-Key.
func (s *Server) idemID(tenant ledger.ScopeKey, key string, gen int) ledger.RequestID {
	if gen == 0 {
		return s.keyer.IdempotentID(tenant, key)
	}
	return s.keyer.IdempotentID(tenant, key+"\x00"+strconv.Itoa(gen))
}

// Idempotency states reported in details.state.
const (
	idemInFlight   = "in_flight"
	idemUnresolved = "unresolved"
	idemCompleted  = "completed"
	idemConflict   = "conflict"
	idemExhausted  = "never_ran"
)

// idemError is a 409 idempotency_conflict with its state.
type idemError struct {
	state string
	msg   string
}

func (e *idemError) Error() string { return e.msg }

// Is keeps errors.Is(err, ErrInProgress / ErrAlreadyDone) for callers that
// only need the class.
func (e *idemError) Is(target error) bool {
	if e.state == idemCompleted {
		return target == ErrAlreadyDone
	}
	return target == ErrInProgress
}

func idemStateErr(st ledger.State) error {
	if st == ledger.Unresolved {
		return &idemError{state: idemUnresolved, msg: "the first request with this Idempotency-Key ran and its outcome is not known yet"}
	}
	return &idemError{state: idemInFlight, msg: "a request with this Idempotency-Key is in flight"}
}

var errIdemCompleted = &idemError{state: idemCompleted, msg: "a request with this Idempotency-Key already completed"}

var errIdemConflict = &idemError{state: idemConflict, msg: "Idempotency-Key reused with a different request"}

// requestDigest is the digest of the client's request an Idempotency-Key
// names: the endpoint and the body's bytes (SHA-256, its first 8 bytes;
// never 0, which would mean none).
func requestDigest(ep vllm.Endpoint, body []byte) uint64 {
	h := sha256.New()
	_, _ = h.Write([]byte(ep.Path()))
	_, _ = h.Write([]byte{0})
	_, _ = h.Write(body)
	var sum [sha256.Size]byte
	return max(1, binary.BigEndian.Uint64(h.Sum(sum[:0])))
}

// cachedResponse is the original response of a completed non-streamed
// first attempt, answered to its retry.
type cachedResponse struct { //nolint:errname // a replay carrier returned as an error, not a failure
	body []byte
}

func (c *cachedResponse) Error() string { return "idempotent replay of a completed request" }

// Response retention: per instance, least recently used out first, within
// a byte budget and the ledger's tombstone retention (Server.retention,
// from ledger.tombstone_retention: after it the ledger forgets the id and
// the key may run again anyway); the fleet's store keeps each for as long.
const (
	idemCacheBytes    = 32 << 20
	idemMaxEntryBytes = 1 << 20
)

// idemCache keeps the bodies of completed non-streamed idempotent calls.
type idemCache struct {
	mu    sync.Mutex
	ll    *list.List // front: most recently used
	m     map[ledger.RequestID]*list.Element
	bytes int
}

type idemEntry struct {
	id     ledger.RequestID
	digest uint64 // requestDigest of the request the body answers
	body   []byte
	at     time.Time
}

func (c *idemCache) put(id ledger.RequestID, digest uint64, body []byte, now time.Time) {
	if len(body) > idemMaxEntryBytes {
		return
	}
	c.mu.Lock()
	defer c.mu.Unlock()
	if c.m == nil {
		c.m, c.ll = map[ledger.RequestID]*list.Element{}, list.New()
	}
	if el, ok := c.m[id]; ok {
		c.remove(el)
	}
	c.m[id] = c.ll.PushFront(&idemEntry{id: id, digest: digest, body: body, at: now})
	c.bytes += len(body)
	for c.bytes > idemCacheBytes {
		c.remove(c.ll.Back())
	}
}

func (c *idemCache) get(id ledger.RequestID, now time.Time, ttl time.Duration) ([]byte, uint64, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.m[id]
	if !ok {
		return nil, 0, false
	}
	e := el.Value.(*idemEntry)
	if now.Sub(e.at) > ttl {
		c.remove(el)
		return nil, 0, false
	}
	c.ll.MoveToFront(el)
	return e.body, e.digest, true
}

func (c *idemCache) remove(el *list.Element) {
	e := el.Value.(*idemEntry)
	c.ll.Remove(el)
	delete(c.m, e.id)
	c.bytes -= len(e.body)
}

// ResponseStore keeps response bodies for a fleet, each for a TTL
// (statestore.RedisBlobs).
type ResponseStore interface {
	Put(ctx context.Context, name string, data []byte, ttl time.Duration) error
	Get(ctx context.Context, name string) ([]byte, bool, error)
}

// responseStoreTimeout bounds one round trip to the response store; the
// store is an optimisation over 409 completed, never a reason to fail.
const responseStoreTimeout = time.Second

func responseName(id ledger.RequestID) string { return "idem:" + hex.EncodeToString(id[:]) }

// storedMagic heads a response in the fleet's store, followed by the
// 8-byte requestDigest of the request it answers and the body. A value
// without it (kept by an earlier build) answers nobody: 409 completed.
const storedMagic = "sluice-idem-2\x00"

func storedResponse(digest uint64, body []byte) []byte {
	b := make([]byte, 0, len(storedMagic)+8+len(body))
	b = append(b, storedMagic...)
	b = binary.BigEndian.AppendUint64(b, digest)
	return append(b, body...)
}

func parseStoredResponse(v []byte) (uint64, []byte, bool) {
	if len(v) < len(storedMagic)+8 || string(v[:len(storedMagic)]) != storedMagic {
		return 0, nil, false
	}
	v = v[len(storedMagic):]
	return binary.BigEndian.Uint64(v), v[8:], true
}

// completed answers a retry of a completed id: its original response when
// kept here or in the fleet's store and it answers this very request
// (digest), 409 conflict when it answers another, else 409 completed.
func (s *Server) completed(ctx context.Context, id ledger.RequestID, digest uint64) error {
	if body, d, ok := s.idem.get(id, s.now(), s.retention); ok {
		return replayOf(body, d, digest)
	}
	if s.responses != nil {
		gctx, cancel := context.WithTimeout(ctx, responseStoreTimeout)
		v, ok, err := s.responses.Get(gctx, responseName(id))
		cancel()
		if err != nil {
			s.log.Warn("idempotent response store unreadable; answering 409 completed", "err", err)
		}
		if d, body, parsed := parseStoredResponse(v); ok && parsed {
			s.idem.put(id, d, body, s.now())
			return replayOf(body, d, digest)
		}
	}
	return errIdemCompleted
}

// replayOf is the answer to a retry whose request has digest want, from a
// kept response of the request with digest have.
func replayOf(body []byte, have, want uint64) error {
	if have != want {
		return errIdemConflict
	}
	return &cachedResponse{body: body}
}

// rememberResponse keeps a completed non-streamed idempotent call's body,
// here and in the fleet's store. Callers run it before the call settles.
func (s *Server) rememberResponse(c *call, body []byte) {
	if c.idemKey == "" || len(body) > idemMaxEntryBytes {
		return
	}
	s.idem.put(c.ref.ID, c.idemDigest, body, s.now())
	if s.responses != nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), responseStoreTimeout)
		defer cancel()
		if err := s.responses.Put(pctx, responseName(c.ref.ID), storedResponse(c.idemDigest, body), s.retention); err != nil {
			s.log.Warn("idempotent response not shared with the fleet; a retry elsewhere gets 409 completed", "err", err)
		}
	}
}

func idemExhaustedErr() error {
	return &idemError{state: idemExhausted, msg: fmt.Sprintf("%d attempts with this Idempotency-Key never ran; use a new key", maxIdemGenerations)}
}
