package scheduler

import (
	"bytes"
	"encoding/json"

	"github.com/sluicehq/sluice/scheduler/apierr"
)

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

// marshal encodes v as JSON without HTML escaping, so messages such as
// "weight must be >= 1" read as written.
func marshal(v any) ([]byte, error) {
	var b bytes.Buffer
	enc := json.NewEncoder(&b)
	enc.SetEscapeHTML(false)
	if err := enc.Encode(v); err != nil {
		return nil, err
	}
	return bytes.TrimSuffix(b.Bytes(), []byte("\n")), nil
}
