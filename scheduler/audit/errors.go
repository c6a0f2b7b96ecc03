package audit

import (
	"errors"
	"fmt"
)

// Sentinel errors.
var (
	// ErrClosed is returned by Append and Flush after Close.
	ErrClosed = errors.New("audit log closed")
	// ErrNoKind is returned by Append for a Record without a Kind.
	ErrNoKind = errors.New("audit record has no kind")
	// ErrForbiddenField is returned by Append when a Fields key looks like
	// a credential (api_key, authorization, …).
	ErrForbiddenField = errors.New("audit field name looks like a credential")
	// ErrLocked is returned by Open when another Log (in this or another
	// process) holds the same path.
	ErrLocked = errors.New("audit file is in use by another log")
	// ErrCorruptTail is returned by Open when the existing file's last
	// lines are torn or corrupt; the chain is not silently restarted.
	ErrCorruptTail = errors.New("audit file tail is corrupt")

	// ErrTorn: a line without its trailing newline.
	ErrTorn = errors.New("torn line (no trailing newline)")
	// ErrMalformed: a line that is not a JSON object with seq, ts and prev.
	ErrMalformed = errors.New("malformed line")
	// ErrSeq: a line whose seq is not the previous seq + 1 (a line is
	// missing, duplicated or out of order).
	ErrSeq = errors.New("sequence broken")
	// ErrHash: a line whose bytes do not hash to the next line's prev (a
	// line was altered).
	ErrHash = errors.New("hash chain broken")
	// ErrChainStart: the first line checked is not the start of a chain
	// (seq 1, prev all zeros), so earlier files are missing.
	ErrChainStart = errors.New("chain does not start at seq 1")
	// ErrNoFiles: nothing to verify.
	ErrNoFiles = errors.New("no audit files")
)

// LineError locates the first problem [Verify] (or [Open]) found. It
// unwraps to one of ErrTorn, ErrMalformed, ErrSeq, ErrHash, ErrChainStart.
type LineError struct {
	File   string // path as given or discovered
	Line   int    // 1-based line number within File
	Detail string // what was expected and what was found
	Err    error  // the sentinel
}

func (e *LineError) Error() string {
	if e.Detail == "" {
		return fmt.Sprintf("%s:%d: %v", e.File, e.Line, e.Err)
	}
	return fmt.Sprintf("%s:%d: %v: %s", e.File, e.Line, e.Err, e.Detail)
}

func (e *LineError) Unwrap() error { return e.Err }
