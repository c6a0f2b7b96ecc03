package settle

import (
	"container/list"
	"context"
	"encoding/binary"
	"encoding/hex"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// The responses of completed idempotent calls: a retry of an
// Idempotency-Key whose record the ledger reports charged gets the
// original response when this instance or the fleet's response store
// still has it (the scheduler's idempotency.go says how a key maps to
// ledger ids and when a retry runs).

// Response retention: per instance, least recently used out first, within
// a byte budget and the ledger's tombstone retention (Deps.Retention,
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
	digest uint64 // the digest of the request the body answers (the scheduler's requestDigest)
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

// Response is the kept response of the completed idempotent call id, here
// or in the fleet's store, with the digest of the request it answers.
func (s *Settler) Response(ctx context.Context, id ledger.RequestID) (body []byte, digest uint64, ok bool) {
	if body, d, ok := s.idem.get(id, s.now(), s.retention); ok {
		return body, d, true
	}
	if s.responses == nil {
		return nil, 0, false
	}
	gctx, cancel := context.WithTimeout(ctx, responseStoreTimeout)
	v, ok, err := s.responses.Get(gctx, responseName(id))
	cancel()
	if err != nil {
		s.log.Warn("idempotent response store unreadable; answering 409 completed", "err", err)
	}
	d, body, parsed := parseStoredResponse(v)
	if !ok || !parsed {
		return nil, 0, false
	}
	s.idem.put(id, d, body, s.now())
	return body, d, true
}

// KeepResponse keeps body, the response of the completed idempotent call
// id to the request with digest, here and in the fleet's store (past
// ctx's cancellation: the client may be gone, its retry is not). Callers
// run it before the call settles, so a retry that finds the record
// charged finds the response too.
func (s *Settler) KeepResponse(ctx context.Context, id ledger.RequestID, digest uint64, body []byte) {
	if len(body) > idemMaxEntryBytes {
		return
	}
	s.idem.put(id, digest, body, s.now())
	if s.responses != nil {
		pctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), responseStoreTimeout)
		defer cancel()
		if err := s.responses.Put(pctx, responseName(id), storedResponse(digest, body), s.retention); err != nil {
			s.log.Warn("idempotent response not shared with the fleet; a retry elsewhere gets 409 completed", "err", err)
		}
	}
}
