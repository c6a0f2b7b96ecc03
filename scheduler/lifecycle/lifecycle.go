package lifecycle

import (
	"fmt"
	"testing"
)

// phase is a call's place in its lifecycle:
//
//	new ─reserve─▶ reserved ─enqueue─▶ queued ─slot─▶ dispatched ─first─▶ streaming
//	                  │                   │  ◀─slot denied─┘ │  ▲             │
//	                  │                   │     taken back ▼ │  │ slot        │
//	                  │                   │               taken_back          │
//	                  └──────┬────────────┘                  └──────┬─────────┘
//	                         ▼                                      ▼
//	                  released | unresolved                settled | unresolved
//
// A call goes from dispatched to streaming with its answer's first event
// (a stream) or its 200 headers (the other endpoints). taken_back: the
// replica kept it waiting and it was taken back (takeback.go); it waits in
// the queue again with its ledger record DISPATCHED, so it is dispatched
// again without a second MarkDispatched, or ends settled at zero as not
// sent (a queued call, by contrast, is released, never settled).
//
// released: never dispatched, the hold is gone. settled: the usage is
// charged. unresolved: the ending was handed to the outbox (the store did
// not acknowledge it) or to an owed outage charge; this instance no longer
// owns the call, the outbox or the lease backstop ends the record. Only
// the transitions below exist, and [call.to] is the only way to make one:
// release and finish take a call to its terminal phase before touching the
// ledger, the queue's slot or the replica's room, so none of them can run
// twice for one call.
type phase uint8

const (
	phaseNew phase = iota
	phaseReserved
	phaseQueued
	phaseDispatched
	phaseStreaming
	phaseTakenBack
	phaseReleased
	phaseSettled
	phaseUnresolved
	numPhases
)

var phaseNames = [numPhases]string{"new", "reserved", "queued", "dispatched", "streaming", "taken_back", "released", "settled", "unresolved"}

func (p phase) String() string {
	if p < numPhases {
		return phaseNames[p]
	}
	return fmt.Sprintf("phase(%d)", uint8(p))
}

// terminal reports whether the call has ended.
func (p phase) terminal() bool { return p >= phaseReleased }

// transitions are the lifecycle's edges.
var transitions = func() (t [numPhases][numPhases]bool) {
	for _, e := range [][2]phase{
		{phaseNew, phaseReserved},
		{phaseReserved, phaseQueued},
		{phaseReserved, phaseReleased}, {phaseReserved, phaseUnresolved},
		{phaseQueued, phaseDispatched},
		{phaseQueued, phaseReleased}, {phaseQueued, phaseUnresolved},
		{phaseDispatched, phaseStreaming},
		{phaseDispatched, phaseTakenBack}, // takeback.go
		{phaseTakenBack, phaseDispatched},
		{phaseTakenBack, phaseSettled}, {phaseTakenBack, phaseUnresolved},
		{phaseDispatched, phaseSettled}, {phaseDispatched, phaseUnresolved},
		{phaseStreaming, phaseSettled}, {phaseStreaming, phaseUnresolved},
	} {
		t[e[0]][e[1]] = true
	}
	return t
}()

// transitionError reports a transition the lifecycle does not have: a bug,
// counted and logged (Engine.illegal), and the operation it guards is
// skipped (never run twice).
type transitionError struct{ from, to phase }

func (e transitionError) Error() string {
	return "call lifecycle: no transition " + e.from.String() + " → " + e.to.String()
}

// to moves c to next if the lifecycle has that edge. The phase is owned by
// the call's request goroutine (the edge handler, then its stream writer):
// the dispatch loop hands it a replica by channel and the heartbeat only
// cancels its context, so no lock is needed.
func (c *call) to(next phase) error {
	if !transitions[c.phase][next] {
		return transitionError{c.phase, next}
	}
	c.phase = next
	return nil
}

// to moves c to next (call.to), or reports the move it refused as a bug.
func (e *Engine) to(c *call, next phase) bool {
	err := c.to(next)
	if err != nil {
		e.illegal(c, err)
	}
	return err == nil
}

// illegal reports a lifecycle move the lifecycle does not have: counted in
// sluice_lifecycle_illegal_transitions_total, logged, and handed to
// e.onIllegal, which in a test binary fails the test (panics unless the
// test set its own).
func (e *Engine) illegal(c *call, err error) {
	e.m.IllegalMoves.Inc()
	e.log.Error("call lifecycle: illegal transition refused", "request_id", c.reqID, "err", err)
	if f := e.onIllegal; f != nil {
		f(err)
	}
}

// panicInTests is the default onIllegal: nothing in production, a panic in
// any test binary, so that no test passes over an illegal move.
func panicInTests() func(error) {
	if !testing.Testing() {
		return nil
	}
	return func(err error) { panic(err) }
}
