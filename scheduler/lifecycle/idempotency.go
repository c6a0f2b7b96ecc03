package lifecycle

import (
	"context"
	"crypto/sha256"
	"encoding/binary"
	"fmt"
	"strconv"

	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/apierr"
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
//     by the settlement room, settle.Settler.KeepResponse, before the call
//     settles, so a retry that sees the record charged finds it), else 409
//     with details.state "completed".
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
// admitted on an outage allowance (settle/outage.go), since only the ledger knows
// whether the key ran.

// maxIdemGenerations bounds the attempts of one Idempotency-Key that never
// ran.
const maxIdemGenerations = 8

// idemID is the ledger id of generation gen of an Idempotency-Key.
func (e *Engine) idemID(tenant ledger.ScopeKey, key string, gen int) ledger.RequestID {
	if gen == 0 {
		return e.keyer.IdempotentID(tenant, key)
	}
	return e.keyer.IdempotentID(tenant, key+"\x00"+strconv.Itoa(gen))
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

func (e *idemError) APIError() *apierr.Error {
	return &apierr.Error{Status: 409, Code: "idempotency_conflict", Type: "invalid_request_error", Message: e.msg, NoRetry: true,
		Details: map[string]any{"state": e.state}}
}

// Is keeps errors.Is(err, apierr.ErrInProgress / apierr.ErrAlreadyDone) for callers that
// only need the class.
func (e *idemError) Is(target error) bool {
	if e.state == idemCompleted {
		return target == apierr.ErrAlreadyDone
	}
	return target == apierr.ErrInProgress
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

// completed answers a retry of a completed id: its original response when
// kept here or in the fleet's store and it answers this very request
// (digest), 409 conflict when it answers another, else 409 completed.
func (e *Engine) completed(ctx context.Context, id ledger.RequestID, digest uint64) error {
	if body, d, ok := e.settler.Response(ctx, id); ok {
		return replayOf(body, d, digest)
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
func (e *Engine) rememberResponse(c *call, body []byte) {
	if c.idemKey == "" {
		return
	}
	e.settler.KeepResponse(c.ctx, c.ref.ID, c.idemDigest, body)
}

func idemExhaustedErr() error {
	return &idemError{state: idemExhausted, msg: fmt.Sprintf("%d attempts with this Idempotency-Key never ran; use a new key", maxIdemGenerations)}
}
