package lifecycle

import (
	"errors"
	"fmt"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/scheduler/apierr"
)

// ErrShed is the cause of a request shed from its tenant's queue by the
// operator's opt-in queue.shed_after, before its deadline (→ 503
// queue_shed).
var ErrShed = errors.New("shed from a standing queue")

// queueExitError is a queued request that left the queue unserved: its
// deadline passed (the bound that set it in reason) or it was shed. It
// wraps queue.ErrExpired or ErrShed, and tells the client which rule
// applied and when to retry.
type queueExitError struct {
	reason     queue.Reason
	waited     time.Duration
	limit      time.Duration // the rule's setting: shed_after or the deadline's span
	retryAfter time.Duration
}

func (e *queueExitError) Error() string {
	if e.reason == queue.ReasonShed {
		return fmt.Sprintf("shed after waiting %s in the queue (queue.shed_after %s)", e.waited.Round(time.Millisecond), e.limit)
	}
	return fmt.Sprintf("queue deadline (%s) passed after %s", e.reason, e.waited.Round(time.Millisecond))
}

func (e *queueExitError) Unwrap() error {
	if e.reason == queue.ReasonShed {
		return ErrShed
	}
	return queue.ErrExpired
}

func (e *queueExitError) APIError() *apierr.Error {
	det := map[string]any{"reason": e.reason.String(), "waited_ms": e.waited.Milliseconds()}
	if e.reason == queue.ReasonShed {
		det["shed_after_ms"] = e.limit.Milliseconds()
		return &apierr.Error{Status: 503, Code: "queue_shed", Type: "service_unavailable", Details: det,
			RetryAfter: max(e.retryAfter, queue.MinRetryAfter),
			Message:    "the request waited past its tenant's queue.shed_after and was shed before its deadline"}
	}
	if e.limit > 0 {
		det["limit_ms"] = e.limit.Milliseconds()
	}
	return &apierr.Error{Status: 504, Code: "deadline_exceeded", Type: "timeout_error", Details: det,
		RetryAfter: max(e.retryAfter, queue.MinRetryAfter),
		Message:    "the request's deadline passed before it could be served"}
}

// queueExit is the error for c leaving the queue unserved at now, by the
// reason the queue reported (c.exitReason), or by the bound of its
// deadline when the deadline is re-checked after dispatch.
func (c *call) queueExit(now time.Time) error {
	r := c.exitReason
	if r == 0 {
		r = c.deadlineReason()
	}
	e := &queueExitError{reason: r, waited: now.Sub(c.arrival), retryAfter: c.exitRetry}
	switch r {
	case queue.ReasonShed:
		e.limit = c.t.Cfg.Queue.ShedAfter
	case queue.ReasonMaxWait:
		e.limit = c.t.Cfg.Queue.MaxWait
	case queue.ReasonServerMaxWait:
		e.limit = c.pol.MaxWait
	case queue.ReasonClientDeadline:
		e.limit = c.deadline.Sub(c.arrival)
	}
	return e
}

// deadlineReason names the bound that sets queueDeadline.
func (c *call) deadlineReason() queue.Reason {
	d, r := c.arrival.Add(c.pol.MaxWait), queue.ReasonServerMaxWait
	if w := c.t.Cfg.Queue.MaxWait; w > 0 && !c.arrival.Add(w).After(d) {
		d, r = c.arrival.Add(w), queue.ReasonMaxWait
	}
	if !c.deadline.IsZero() && c.deadline.Before(d) {
		r = queue.ReasonClientDeadline
	}
	return r
}
