package queue

import (
	"errors"
	"fmt"
	"time"
)

var (
	// ErrFull means a queue bound refused the request (→ 429 queue_full).
	// Errors from [Queue.Enqueue] wrap it in a [*FullError].
	ErrFull = errors.New("queue full")
	// ErrExpired means a request's queue deadline passed before dispatch
	// (→ 504 deadline_exceeded). The queue reports expiry through
	// [Deps.OnExpire]; callers use ErrExpired as a context cause.
	ErrExpired = errors.New("queue deadline exceeded")
	// ErrUnknownTenant means the tenant is not configured (or was removed).
	ErrUnknownTenant = errors.New("unknown tenant")
	// ErrInvalidRequest means a request field is out of range (negative
	// cost or body size).
	ErrInvalidRequest = errors.New("invalid queue request")
)

// Reason names what set an entry's deadline or, once it left the queue
// unserved, the rule that removed it.
type Reason uint8

const (
	// ReasonServerMaxWait: the server's [Config.MaxWait].
	ReasonServerMaxWait Reason = iota + 1
	// ReasonMaxWait: the tenant's [TenantConfig.MaxWait].
	ReasonMaxWait
	// ReasonClientDeadline: the client's own deadline ([Request.Deadline]).
	ReasonClientDeadline
	// ReasonShed: shed by [Config.ShedAfter] (or the tenant's), before its
	// deadline.
	ReasonShed
)

// String returns the label the scheduler puts in details.reason.
func (r Reason) String() string {
	switch r {
	case ReasonServerMaxWait:
		return "server_max_wait"
	case ReasonMaxWait:
		return "max_wait"
	case ReasonClientDeadline:
		return "client_deadline"
	case ReasonShed:
		return "shed_after"
	default:
		return fmt.Sprintf("reason(%d)", uint8(r))
	}
}

// Bound names the queue bound that refused a request.
type Bound uint8

const (
	// BoundTenantDepth is the tenant's max_depth.
	BoundTenantDepth Bound = iota + 1
	// BoundTenantBytes is the tenant's max_bytes.
	BoundTenantBytes
	// BoundGlobalDepth is the instance's max_depth.
	BoundGlobalDepth
	// BoundGlobalBytes is the instance's max_bytes.
	BoundGlobalBytes
)

// String returns a short label suitable for logs and metrics.
func (b Bound) String() string {
	switch b {
	case BoundTenantDepth:
		return "tenant_depth"
	case BoundTenantBytes:
		return "tenant_bytes"
	case BoundGlobalDepth:
		return "global_depth"
	case BoundGlobalBytes:
		return "global_bytes"
	default:
		return fmt.Sprintf("bound(%d)", uint8(b))
	}
}

// Global reports whether b is an instance-wide bound.
func (b Bound) Global() bool { return b == BoundGlobalDepth || b == BoundGlobalBytes }

// FullError is returned by [Queue.Enqueue] when a bound is reached. It wraps
// [ErrFull].
type FullError struct {
	// Tenant is the tenant whose request was refused.
	Tenant string
	// Bound is the bound that refused it.
	Bound Bound
	// RetryAfter estimates when to retry: the queued cost ahead (the
	// tenant's, or everyone's for a global bound) divided by the recent
	// service rate over the last 10 s (the instance's when the tenant had
	// none), clamped to [1s, 30s]. Without any recent service it is 1s.
	RetryAfter time.Duration
}

// Error names the tenant and the bound.
func (e *FullError) Error() string {
	return fmt.Sprintf("tenant %q: %s bound: %v", e.Tenant, e.Bound, ErrFull)
}

// Unwrap returns [ErrFull].
func (e *FullError) Unwrap() error { return ErrFull }
