package loadgen

import (
	"errors"
	"net"
	"strconv"
	"syscall"
)

// Outcome is the single fate of one request (BENCH.md §5).
type Outcome string

// Outcomes. Late is a success that finished after the tenant's deadline.
const (
	Success        Outcome = "success"
	Late           Outcome = "late"
	Rejected       Outcome = "rejected"
	Expired        Outcome = "expired"
	ClientTimeout  Outcome = "client_timeout"
	Error          Outcome = "error"
	CancelledAtEnd Outcome = "cancelled_at_end"
)

// Outcomes lists every outcome in report order.
var Outcomes = []Outcome{Success, Late, Rejected, Expired, ClientTimeout, Error, CancelledAtEnd}

// OK reports whether o counts as a success (latency samples, tokens).
func (o Outcome) OK() bool { return o == Success || o == Late }

// Reasons not derived from an error body.
const (
	ReasonRequestTimeout = "request_timeout"
	ReasonPlannedCancel  = "planned_cancel"
	ReasonConnRefused    = "conn_refused"
	ReasonConnReset      = "conn_reset"
	ReasonBadJSON        = "bad_json"
	ReasonStreamCut      = "stream_cut"
	ReasonNoChoices      = "no_choices"
)

// rejectCodes are Sluice's admission refusals (ARCHITECTURE.md §3.3).
var rejectCodes = map[string]bool{
	"queue_full": true, "tenant_budget_exceeded": true, "ledger_unavailable": true,
	"no_healthy_replica": true, "workflow_budget_exceeded": true, "draining": true,
}

// knownErrorCodes are Sluice codes that are errors without a warning.
var knownErrorCodes = map[string]bool{
	"invalid_request": true, "context_length_exceeded": true, "invalid_api_key": true,
	"request_too_large": true, "upstream_error": true, "gpu_ms_exceeded": true,
}

// Classify maps an error response (status and string error.code, "" when
// absent or numeric as in vLLM) to an outcome and reason. unknown is set for
// a code missing from the outcome table, which the report warns about.
func Classify(status int, code string) (o Outcome, reason string, unknown bool) {
	switch {
	case code == "deadline_exceeded", code == "queue_shed":
		// A shed (the tenant's opt-in queue.shed_after) is a request that
		// waited and was not served, like an expiry, by its own reason.
		return Expired, code, false
	case rejectCodes[code]:
		return Rejected, code, false
	case code != "":
		return Error, code, !knownErrorCodes[code]
	case status == 429 || status == 503:
		return Rejected, "http_" + strconv.Itoa(status), false
	case status == 504 || status == 408:
		return Expired, "http_" + strconv.Itoa(status), false
	}
	return Error, "http_" + strconv.Itoa(status), false
}

// transportReason names a connection failure.
func transportReason(err error) string {
	var op *net.OpError
	switch {
	case errors.Is(err, syscall.ECONNREFUSED):
		return ReasonConnRefused
	case errors.Is(err, syscall.ECONNRESET), errors.Is(err, syscall.EPIPE):
		return ReasonConnReset
	case errors.As(err, &op) && op.Op == "dial":
		return ReasonConnRefused
	}
	return ReasonConnReset
}
