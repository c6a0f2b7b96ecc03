package scheduler

import "github.com/sluicehq/sluice/scheduler/apierr"

// The pipeline's sentinel errors, under the names its code uses; the
// refusal each one gets is apierr.For's.
var (
	ErrUnauthorized   = apierr.ErrUnauthorized
	ErrTooLarge       = apierr.ErrTooLarge
	ErrBadRequest     = apierr.ErrBadRequest
	ErrUnknownModel   = apierr.ErrUnknownModel
	ErrContextLength  = apierr.ErrContextLength
	ErrNoReplica      = apierr.ErrNoReplica
	ErrDraining       = apierr.ErrDraining
	ErrClientGone     = apierr.ErrClientGone
	ErrClientStalled  = apierr.ErrClientStalled
	ErrDeadline       = apierr.ErrDeadline
	ErrNotFound       = apierr.ErrNotFound
	ErrInProgress     = apierr.ErrInProgress
	ErrAlreadyDone    = apierr.ErrAlreadyDone
	ErrUpstreamFailed = apierr.ErrUpstreamFailed
	ErrClamped        = apierr.ErrClamped
)
