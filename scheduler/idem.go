package scheduler

import (
	"container/list"
	"context"
	"encoding/hex"
	"fmt"
	"strconv"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// Idempotency-Key (Build item 3 of issue 13). A key maps to ledger ids
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
	id   ledger.RequestID
	body []byte
	at   time.Time
}

func (c *idemCache) put(id ledger.RequestID, body []byte, now time.Time) {
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
	c.m[id] = c.ll.PushFront(&idemEntry{id: id, body: body, at: now})
	c.bytes += len(body)
	for c.bytes > idemCacheBytes {
		c.remove(c.ll.Back())
	}
}

func (c *idemCache) get(id ledger.RequestID, now time.Time, ttl time.Duration) ([]byte, bool) {
	c.mu.Lock()
	defer c.mu.Unlock()
	el, ok := c.m[id]
	if !ok {
		return nil, false
	}
	e := el.Value.(*idemEntry)
	if now.Sub(e.at) > ttl {
		c.remove(el)
		return nil, false
	}
	c.ll.MoveToFront(el)
	return e.body, true
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

// completed answers a retry of a completed id: its original response when
// kept here or in the fleet's store, else 409 completed.
func (s *Server) completed(ctx context.Context, id ledger.RequestID) error {
	if body, ok := s.idem.get(id, s.now(), s.retention); ok {
		return &cachedResponse{body: body}
	}
	if s.responses != nil {
		gctx, cancel := context.WithTimeout(ctx, responseStoreTimeout)
		body, ok, err := s.responses.Get(gctx, responseName(id))
		cancel()
		if err != nil {
			s.log.Warn("idempotent response store unreadable; answering 409 completed", "err", err)
		}
		if ok {
			s.idem.put(id, body, s.now())
			return &cachedResponse{body: body}
		}
	}
	return errIdemCompleted
}

// rememberResponse keeps a completed non-streamed idempotent call's body,
// here and in the fleet's store. Callers run it before the call settles.
func (s *Server) rememberResponse(c *call, body []byte) {
	if c.idemKey == "" || len(body) > idemMaxEntryBytes {
		return
	}
	s.idem.put(c.ref.ID, body, s.now())
	if s.responses != nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(c.ctx), responseStoreTimeout)
		defer cancel()
		if err := s.responses.Put(pctx, responseName(c.ref.ID), body, s.retention); err != nil {
			s.log.Warn("idempotent response not shared with the fleet; a retry elsewhere gets 409 completed", "err", err)
		}
	}
}

func idemExhaustedErr() error {
	return &idemError{state: idemExhausted, msg: fmt.Sprintf("%d attempts with this Idempotency-Key never ran; use a new key", maxIdemGenerations)}
}
