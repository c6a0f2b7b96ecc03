package audit

import (
	"bufio"
	"crypto/sha256"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"os"
	"time"
)

// Report summarises a verified chain.
type Report struct {
	Files    []string // the files checked, in order
	Lines    int      // lines checked across all files
	FirstSeq uint64   // seq of the first line (0 when there were none)
	LastSeq  uint64   // seq of the last line (0 when there were none)
	// LastHash is the hex SHA-256 of the last line: the chain's head.
	// Record it elsewhere to detect later truncation of whole lines.
	LastHash string
}

// VerifyOptions tunes [VerifyOptions.Verify]. The zero value is strict.
type VerifyOptions struct {
	// Partial accepts a first line that does not start a chain (seq 1,
	// prev all zeros), for when retention has deleted the oldest rotated
	// files. Everything after that line is checked as usual.
	Partial bool
}

// Verify checks one chain strictly; see [VerifyOptions.Verify].
func Verify(paths ...string) (Report, error) { return VerifyOptions{}.Verify(paths...) }

// Verify checks that the lines of paths, read in the order given, form one
// hash chain: every line is a JSON object with seq, ts and prev; seq starts
// at 1 and rises by exactly 1; prev is the SHA-256 of the previous line
// (64 zeros for the first). Given a single path, its rotated siblings
// (<path>.1, <path>.2, …) are discovered and checked first, in numeric
// order.
//
// The first problem is returned as a [*LineError] naming the file and
// line: for an altered line the line itself (judged by whether the line
// after it still chains onto it), for a deleted or reordered line the first
// line out of sequence. On error, Report's Lines and LastSeq cover the good
// lines before that line, and LastHash is empty.
func (o VerifyOptions) Verify(paths ...string) (Report, error) {
	if len(paths) == 0 {
		return Report{}, ErrNoFiles
	}
	if len(paths) == 1 {
		fs, err := Files(paths[0])
		if err != nil {
			return Report{}, err
		}
		paths = fs
	}
	rep := Report{Files: paths}
	src := &lineSrc{files: paths}
	defer src.close()

	var (
		have    bool
		prevSeq uint64
		prevSum [sha256.Size]byte
		prevLn  srcLine
	)
	for {
		cur, ok, err := src.next()
		if err != nil {
			return rep, err
		}
		if !ok {
			break
		}
		if cur.torn {
			return rep, &LineError{File: cur.file, Line: cur.n, Err: ErrTorn}
		}
		seq, prevField, err := parseHeader(cur.b)
		if err != nil {
			return rep, &LineError{File: cur.file, Line: cur.n, Detail: err.Error(), Err: ErrMalformed}
		}
		sum := sha256.Sum256(cur.b)
		if !have {
			if !o.Partial && (seq != 1 || prevField != [sha256.Size]byte{}) {
				return rep, &LineError{File: cur.file, Line: cur.n, Err: ErrChainStart,
					Detail: fmt.Sprintf("first line has seq %d and prev %.12x…; want seq 1 and prev 000000000000… (earlier files missing? verify with -partial)", seq, prevField)}
			}
			rep.FirstSeq = seq
		} else {
			if seq != prevSeq+1 {
				return rep, seqError(cur, prevLn, seq, prevSeq)
			}
			if prevField != prevSum {
				le := hashError(src, cur, prevLn, prevField, prevSum, sum)
				if le.File == prevLn.file && le.Line == prevLn.n { // the previous line is the culprit
					rep.Lines--
					rep.LastSeq = prevSeq - 1
				}
				return rep, le
			}
		}
		have, prevSeq, prevSum, prevLn = true, seq, sum, cur
		rep.Lines++
		rep.LastSeq = seq
	}
	if have {
		rep.LastHash = hex.EncodeToString(prevSum[:])
	}
	return rep, nil
}

func seqError(cur, prev srcLine, seq, prevSeq uint64) error {
	var d string
	switch {
	case seq <= prevSeq:
		d = fmt.Sprintf("seq %d after seq %d (%s:%d), want %d: line duplicated or out of order",
			seq, prevSeq, prev.file, prev.n, prevSeq+1)
	default:
		d = fmt.Sprintf("seq %d after seq %d (%s:%d), want %d: %d line(s) missing or out of order",
			seq, prevSeq, prev.file, prev.n, prevSeq+1, seq-prevSeq-1)
	}
	if cur.file != prev.file {
		d += fmt.Sprintf(" (a file missing between %s and %s?)", prev.file, cur.file)
	}
	return &LineError{File: cur.file, Line: cur.n, Detail: d, Err: ErrSeq}
}

// hashError blames the previous line when the next line still chains onto
// cur (so cur is intact and its prev records what the previous line used to
// be), and cur otherwise.
func hashError(src *lineSrc, cur, prev srcLine, prevField, prevSum, sum [sha256.Size]byte) *LineError {
	if nxt, ok, err := src.peek(); err == nil && ok && !nxt.torn {
		if _, np, err := parseHeader(nxt.b); err == nil && np == sum {
			return &LineError{File: prev.file, Line: prev.n, Err: ErrHash,
				Detail: fmt.Sprintf("line altered: its SHA-256 is %x but the next line (%s:%d) records prev %x",
					prevSum, cur.file, cur.n, prevField)}
		}
	}
	return &LineError{File: cur.file, Line: cur.n, Err: ErrHash,
		Detail: fmt.Sprintf("line altered: prev is %x, want %x (the SHA-256 of %s:%d)",
			prevField, prevSum, prev.file, prev.n)}
}

// header is the part of a line Verify checks; unmarshalling it also checks
// that the whole line is valid JSON.
type header struct {
	Seq  *uint64 `json:"seq"`
	TS   *string `json:"ts"`
	Prev *string `json:"prev"`
	Kind *string `json:"kind"`
}

// parseHeader parses one line (without its newline).
func parseHeader(line []byte) (uint64, [sha256.Size]byte, error) {
	var (
		h   header
		sum [sha256.Size]byte
	)
	if len(line) == 0 || line[0] != '{' {
		return 0, sum, errors.New("not a JSON object")
	}
	if err := json.Unmarshal(line, &h); err != nil {
		return 0, sum, fmt.Errorf("invalid JSON: %w", err)
	}
	switch {
	case h.Seq == nil || *h.Seq == 0:
		return 0, sum, errors.New("seq missing or 0")
	case h.TS == nil:
		return 0, sum, errors.New("ts missing")
	case h.Prev == nil:
		return 0, sum, errors.New("prev missing")
	case h.Kind == nil || *h.Kind == "":
		return 0, sum, errors.New("kind missing")
	}
	if _, err := time.Parse(time.RFC3339Nano, *h.TS); err != nil {
		return 0, sum, fmt.Errorf("ts %q is not RFC 3339", *h.TS)
	}
	if len(*h.Prev) != 2*sha256.Size || !isLowerHex(*h.Prev) {
		return 0, sum, fmt.Errorf("prev %q is not 64 lowercase hex digits", *h.Prev)
	}
	if _, err := hex.Decode(sum[:], []byte(*h.Prev)); err != nil {
		return 0, sum, fmt.Errorf("prev: %w", err)
	}
	return *h.Seq, sum, nil
}

func isLowerHex(s string) bool {
	for i := 0; i < len(s); i++ {
		c := s[i]
		if (c < '0' || c > '9') && (c < 'a' || c > 'f') {
			return false
		}
	}
	return true
}

// srcLine is one line of one file.
type srcLine struct {
	file string
	n    int    // 1-based line number in file
	b    []byte // without the newline
	torn bool   // the file ended before a newline
}

// lineSrc reads the lines of several files in order, with one line of
// lookahead.
type lineSrc struct {
	files  []string
	fi     int
	f      *os.File
	r      *bufio.Reader
	n      int
	peeked *srcLine
	done   bool
}

func (s *lineSrc) peek() (srcLine, bool, error) {
	if s.peeked != nil {
		return *s.peeked, true, nil
	}
	l, ok, err := s.read()
	if err != nil || !ok {
		return l, ok, err
	}
	s.peeked = &l
	return l, true, nil
}

func (s *lineSrc) next() (srcLine, bool, error) {
	if s.peeked != nil {
		l := *s.peeked
		s.peeked = nil
		return l, true, nil
	}
	return s.read()
}

func (s *lineSrc) read() (srcLine, bool, error) {
	for !s.done {
		if s.f == nil {
			if s.fi >= len(s.files) {
				s.done = true
				break
			}
			f, err := os.Open(s.files[s.fi])
			if err != nil {
				return srcLine{}, false, fmt.Errorf("audit: %w", err)
			}
			s.f, s.n = f, 0
			if s.r == nil {
				s.r = bufio.NewReaderSize(f, 256<<10)
			} else {
				s.r.Reset(f)
			}
		}
		b, err := s.r.ReadBytes('\n')
		if len(b) > 0 {
			s.n++
			l := srcLine{file: s.files[s.fi], n: s.n}
			if b[len(b)-1] == '\n' {
				l.b = b[:len(b)-1]
			} else {
				l.b, l.torn = b, true
			}
			return l, true, nil
		}
		if err != nil && !errors.Is(err, io.EOF) {
			return srcLine{}, false, fmt.Errorf("audit: read %s: %w", s.files[s.fi], err)
		}
		cerr := s.f.Close()
		s.f = nil
		if cerr != nil {
			return srcLine{}, false, fmt.Errorf("audit: close %s: %w", s.files[s.fi], cerr)
		}
		s.fi++
	}
	return srcLine{}, false, nil
}

func (s *lineSrc) close() {
	if s.f != nil {
		_ = s.f.Close() // opened read-only: closing cannot lose data
		s.f = nil
	}
}
