package gpu

import "errors"

// ErrUnavailable reports that GPU telemetry cannot be read on this machine:
// the NVML library is missing, fails to initialise, or the binary was built
// without cgo. Callers fall back to vLLM-derived telemetry (see [OpenSource]).
var ErrUnavailable = errors.New("NVML not available")

// ErrUnknownReplica reports a replica name that is not in [Config.Replicas].
var ErrUnknownReplica = errors.New("unknown replica")
