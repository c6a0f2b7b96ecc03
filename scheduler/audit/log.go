package audit

import (
	"bytes"
	"context"
	"crypto/sha256"
	"encoding/hex"
	"errors"
	"fmt"
	"io"
	"io/fs"
	"os"
	"path/filepath"
	"sort"
	"strconv"
	"strings"
	"sync"
	"time"
)

// Config configures a [Log].
type Config struct {
	// Path of the current JSON-lines file; rotated files are
	// <Path>.1, <Path>.2, … beside it. Required; its directory must exist.
	Path string
	// MaxBytes rotates the file before a line would take it past this
	// size, in bytes. Optional; default 64 MiB; negative is invalid. A
	// single line longer than MaxBytes gets a file of its own.
	MaxBytes int64
	// FlushInterval is the longest an appended line waits in memory before
	// [Log.Run] writes it to the file, and so the most a crash can lose.
	// Optional; default 100ms; negative is invalid.
	FlushInterval time.Duration
	// Sync fsyncs the file after every write (and the directory after a
	// rotation), so a machine crash loses no more than a process crash.
	// Optional; default false (the OS page cache decides).
	Sync bool
	// Now is the clock for each line's ts. Optional; default time.Now.
	Now func() time.Time
}

const (
	defaultMaxBytes      = 64 << 20
	defaultFlushInterval = 100 * time.Millisecond
	// flushBytes: a buffer at least this large is written at once, so
	// memory stays bounded between ticks.
	flushBytes = 64 << 10
	tsLayout   = "2006-01-02T15:04:05.000000000Z07:00"
)

// Validate reports every problem with c, naming the field.
func (c Config) Validate() error {
	var errs []error
	if c.Path == "" {
		errs = append(errs, errors.New("audit.path must be set"))
	}
	if c.MaxBytes < 0 {
		errs = append(errs, fmt.Errorf("audit.max_bytes must be >= 0, got %d", c.MaxBytes))
	}
	if c.FlushInterval < 0 {
		errs = append(errs, fmt.Errorf("audit.flush_interval must be >= 0, got %s", c.FlushInterval))
	}
	return errors.Join(errs...)
}

// Log appends records to a hash-chained JSON-lines file. It is safe for
// concurrent use. Create it with [Open]; run [Log.Run] for periodic
// flushing and call [Log.Close] exactly once when done.
type Log struct {
	cfg Config // immutable after Open

	// mu guards every field below it. Append encodes the record before
	// taking mu; under mu it only stamps seq/ts/prev, hashes and buffers.
	mu      sync.Mutex
	f       *os.File
	lock    *os.File          // holds the flock on <Path>.lock; nil where unsupported
	buf     []byte            // encoded lines not yet written to f
	size    int64             // bytes already written to f
	seq     uint64            // seq of the last appended line; 0 before the first
	prev    [sha256.Size]byte // SHA-256 of the last appended line
	nextRot int               // suffix of the next rotated file
	err     error             // sticky write/rotation error
	closed  bool
}

// Open opens (or creates) the log at cfg.Path and resumes its chain: the
// next line continues from the last line of cfg.Path or, when that file is
// empty or missing, from the newest rotated file. It refuses to open, with
// an error wrapping [ErrCorruptTail] and a [*LineError] naming file and
// line, when that tail is torn or does not chain onto the line before it.
// On Unix it holds an exclusive flock on <Path>.lock until Close, so a
// second Log on the same path fails with [ErrLocked] instead of
// interleaving two chains.
func Open(cfg Config) (*Log, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	if cfg.MaxBytes == 0 {
		cfg.MaxBytes = defaultMaxBytes
	}
	if cfg.FlushInterval == 0 {
		cfg.FlushInterval = defaultFlushInterval
	}
	if cfg.Now == nil {
		cfg.Now = time.Now
	}
	lock, err := lockFile(cfg.Path)
	if err != nil {
		return nil, err
	}
	l, err := open(cfg)
	if err != nil {
		if lock != nil {
			err = errors.Join(err, lock.Close())
		}
		return nil, err
	}
	l.lock = lock
	return l, nil
}

func open(cfg Config) (*Log, error) {
	rot, err := rotated(cfg.Path)
	if err != nil {
		return nil, err
	}
	l := &Log{cfg: cfg, nextRot: 1, buf: make([]byte, 0, flushBytes+4096)}
	if len(rot) > 0 {
		l.nextRot = rot[len(rot)-1].n + 1
	}
	resume := ""
	switch st, err := os.Stat(cfg.Path); {
	case err == nil && !st.Mode().IsRegular():
		return nil, fmt.Errorf("audit: open %s: not a regular file", cfg.Path)
	case err == nil && st.Size() > 0:
		resume = cfg.Path
	case err == nil, errors.Is(err, fs.ErrNotExist):
		if len(rot) > 0 {
			resume = rot[len(rot)-1].path
		}
	default:
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	if resume != "" {
		seq, sum, err := readTail(resume)
		if err != nil {
			return nil, err
		}
		l.seq, l.prev = seq, sum
	}
	f, err := os.OpenFile(cfg.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE, 0o600)
	if err != nil {
		return nil, fmt.Errorf("audit: open: %w", err)
	}
	st, err := f.Stat()
	if err != nil {
		return nil, errors.Join(fmt.Errorf("audit: open: %w", err), f.Close())
	}
	l.f, l.size = f, st.Size()
	return l, nil
}

var bodyPool = sync.Pool{New: func() any { b := make([]byte, 0, 512); return &b }}

// Append adds one line for rec to the chain. It is safe for concurrent
// use; lines appear in the order their Appends took the lock. It returns
// [ErrNoKind] or [ErrForbiddenField] for a bad record (nothing is written,
// the chain is unchanged), [ErrClosed] after Close, and the sticky error
// once a write has failed. A nil error means the line is buffered, not that
// it is on disk; see the package doc on durability.
func (l *Log) Append(rec Record) error {
	bp := bodyPool.Get().(*[]byte)
	body, err := rec.appendBody((*bp)[:0])
	if err == nil {
		l.mu.Lock()
		err = l.appendLocked(body)
		l.mu.Unlock()
	} else {
		err = fmt.Errorf("audit %q record: %w", rec.Kind, err)
	}
	if cap(body) <= 64<<10 {
		*bp = body
		bodyPool.Put(bp)
	}
	return err
}

func (l *Log) appendLocked(body []byte) error {
	if l.closed {
		return ErrClosed
	}
	if l.err != nil {
		return l.err
	}
	start := len(l.buf)
	b := l.buf
	b = append(b, `{"seq":`...)
	b = strconv.AppendUint(b, l.seq+1, 10)
	b = append(b, `,"ts":"`...)
	b = l.cfg.Now().UTC().AppendFormat(b, tsLayout)
	b = append(b, `","prev":"`...)
	b = hex.AppendEncode(b, l.prev[:])
	b = append(b, '"')
	b = append(b, body...)
	sum := sha256.Sum256(b[start:])
	b = append(b, '\n')
	l.buf = b

	if l.size+int64(len(b)) > l.cfg.MaxBytes && l.size+int64(start) > 0 {
		if err := l.writeLocked(b[:start]); err != nil {
			return err
		}
		if err := l.rotateLocked(); err != nil {
			return err
		}
		n := copy(l.buf, l.buf[start:])
		l.buf = l.buf[:n]
	}
	l.seq++
	l.prev = sum
	if len(l.buf) >= flushBytes {
		if err := l.writeLocked(l.buf); err != nil {
			return err
		}
		l.buf = l.buf[:0]
	}
	return nil
}

// writeLocked writes p to the current file (and fsyncs with Sync). Any
// failure becomes the sticky error.
func (l *Log) writeLocked(p []byte) error {
	if len(p) == 0 {
		return nil
	}
	n, err := l.f.Write(p)
	l.size += int64(n)
	if err == nil && l.cfg.Sync {
		err = l.f.Sync()
	}
	if err != nil {
		l.err = fmt.Errorf("audit: write %s: %w", l.cfg.Path, err)
		return l.err
	}
	return nil
}

// rotateLocked renames the (flushed) current file to <path>.<n> and
// creates a fresh one. Any failure becomes the sticky error.
func (l *Log) rotateLocked() error {
	fail := func(err error) error {
		l.err = fmt.Errorf("audit: rotate %s: %w", l.cfg.Path, err)
		return l.err
	}
	if err := l.f.Close(); err != nil {
		return fail(err)
	}
	var name string
	for {
		name = l.cfg.Path + "." + strconv.Itoa(l.nextRot)
		l.nextRot++
		if _, err := os.Lstat(name); errors.Is(err, fs.ErrNotExist) {
			break
		} else if err != nil {
			return fail(err)
		}
	}
	if err := os.Rename(l.cfg.Path, name); err != nil {
		return fail(err)
	}
	f, err := os.OpenFile(l.cfg.Path, os.O_WRONLY|os.O_APPEND|os.O_CREATE|os.O_EXCL, 0o600)
	if err != nil {
		return fail(err)
	}
	l.f, l.size = f, 0
	if l.cfg.Sync {
		if err := syncDir(filepath.Dir(l.cfg.Path)); err != nil {
			return fail(err)
		}
	}
	return nil
}

func syncDir(dir string) error {
	d, err := os.Open(dir)
	if err != nil {
		return err
	}
	err = d.Sync()
	return errors.Join(err, d.Close())
}

// Flush writes buffered lines to the file now (and fsyncs with Sync).
// Safe for concurrent use.
func (l *Log) Flush() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return ErrClosed
	}
	return l.flushLocked()
}

func (l *Log) flushLocked() error {
	if l.err != nil {
		return l.err
	}
	if err := l.writeLocked(l.buf); err != nil {
		return err
	}
	l.buf = l.buf[:0]
	return nil
}

// Run flushes every Config.FlushInterval until ctx is done, then flushes
// once more and returns nil. It returns the sticky error as soon as a write
// fails. Call it at most once, from the owner's errgroup; Close still has
// to be called afterwards.
func (l *Log) Run(ctx context.Context) error {
	t := time.NewTicker(l.cfg.FlushInterval)
	defer t.Stop()
	for {
		select {
		case <-ctx.Done():
			if err := l.Flush(); err != nil && !errors.Is(err, ErrClosed) {
				return err
			}
			return nil
		case <-t.C:
			if err := l.Flush(); err != nil {
				if errors.Is(err, ErrClosed) {
					return nil
				}
				return err
			}
		}
	}
}

// Close flushes buffered lines and closes the file. Later Appends return
// [ErrClosed]; a second Close returns nil.
func (l *Log) Close() error {
	l.mu.Lock()
	defer l.mu.Unlock()
	if l.closed {
		return nil
	}
	l.closed = true
	err := l.flushLocked()
	err = errors.Join(err, l.f.Close())
	if l.lock != nil {
		err = errors.Join(err, l.lock.Close())
	}
	return err
}

// Head returns the seq and hex SHA-256 of the last appended line (0 and
// 64 zeros before the first). Safe for concurrent use.
func (l *Log) Head() (seq uint64, hash string) {
	l.mu.Lock()
	defer l.mu.Unlock()
	return l.seq, hex.EncodeToString(l.prev[:])
}

type rotatedFile struct {
	path string
	n    int
}

// rotated lists <path>.<n> siblings, oldest (lowest n) first.
func rotated(path string) ([]rotatedFile, error) {
	dir, base := filepath.Split(path)
	if dir == "" {
		dir = "."
	}
	ents, err := os.ReadDir(dir)
	if err != nil {
		return nil, fmt.Errorf("audit: list %s: %w", dir, err)
	}
	var out []rotatedFile
	for _, e := range ents {
		suf, ok := strings.CutPrefix(e.Name(), base+".")
		if !ok || suf == "" || strings.TrimLeft(suf, "0123456789") != "" || suf[0] == '0' {
			continue
		}
		n, err := strconv.Atoi(suf)
		if err != nil {
			continue
		}
		out = append(out, rotatedFile{path: filepath.Join(filepath.Dir(path), e.Name()), n: n})
	}
	sort.Slice(out, func(i, j int) bool { return out[i].n < out[j].n })
	return out, nil
}

// Files returns the files of the chain whose current file is path: its
// rotated siblings in order, then path itself if it exists.
func Files(path string) ([]string, error) {
	rot, err := rotated(path)
	if err != nil {
		return nil, err
	}
	out := make([]string, 0, len(rot)+1)
	for _, r := range rot {
		out = append(out, r.path)
	}
	if _, err := os.Stat(path); err == nil {
		out = append(out, path)
	} else if !errors.Is(err, fs.ErrNotExist) {
		return nil, fmt.Errorf("audit: %w", err)
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("audit: %s: %w", path, fs.ErrNotExist)
	}
	return out, nil
}

// readTail checks the last two lines of a non-empty file and returns the
// last line's seq and hash.
func readTail(path string) (uint64, [sha256.Size]byte, error) {
	var zero [sha256.Size]byte
	f, err := os.Open(path)
	if err != nil {
		return 0, zero, fmt.Errorf("audit: resume: %w", err)
	}
	defer func() { _ = f.Close() }() // opened read-only: closing cannot lose data
	st, err := f.Stat()
	if err != nil {
		return 0, zero, fmt.Errorf("audit: resume: %w", err)
	}
	size := st.Size()
	corrupt := func(line int, detail string, sentinel error) error {
		le := &LineError{File: path, Line: line, Detail: detail, Err: sentinel}
		return fmt.Errorf("audit: resume %s: %w: %w (inspect it with 'sluice audit verify'; the chain is not restarted)",
			path, ErrCorruptTail, le)
	}
	window := min(size, 64<<10)
	for {
		buf := make([]byte, window)
		if _, err := f.ReadAt(buf, size-window); err != nil && !errors.Is(err, io.EOF) {
			return 0, zero, fmt.Errorf("audit: resume: %w", err)
		}
		if buf[len(buf)-1] != '\n' {
			n, err := countLines(f)
			if err != nil {
				return 0, zero, err
			}
			return 0, zero, corrupt(n+1, "", ErrTorn)
		}
		body := buf[:len(buf)-1]
		i := bytes.LastIndexByte(body, '\n')
		j := -1
		if i >= 0 {
			j = bytes.LastIndexByte(body[:i], '\n')
		}
		if j < 0 && window < size {
			window = min(size, window*4)
			continue
		}
		last := body[i+1:]
		seq, prevField, err := parseHeader(last)
		if err != nil {
			n, cerr := countLines(f)
			if cerr != nil {
				return 0, zero, cerr
			}
			return 0, zero, corrupt(n, err.Error(), ErrMalformed)
		}
		if i >= 0 {
			prevLine := body[j+1 : i]
			pseq, _, err := parseHeader(prevLine)
			if err != nil {
				n, cerr := countLines(f)
				if cerr != nil {
					return 0, zero, cerr
				}
				return 0, zero, corrupt(n-1, err.Error(), ErrMalformed)
			}
			if seq != pseq+1 {
				n, cerr := countLines(f)
				if cerr != nil {
					return 0, zero, cerr
				}
				return 0, zero, corrupt(n, fmt.Sprintf("seq %d after %d", seq, pseq), ErrSeq)
			}
			if want := sha256.Sum256(prevLine); want != prevField {
				n, cerr := countLines(f)
				if cerr != nil {
					return 0, zero, cerr
				}
				return 0, zero, corrupt(n, fmt.Sprintf("prev %x, want %x (the SHA-256 of line %d)", prevField, want, n-1), ErrHash)
			}
		}
		return seq, sha256.Sum256(last), nil
	}
}

// countLines counts the newlines in f.
func countLines(f *os.File) (int, error) {
	buf := make([]byte, 256<<10)
	n := 0
	var off int64
	for {
		m, err := f.ReadAt(buf, off)
		n += bytes.Count(buf[:m], []byte{'\n'})
		off += int64(m)
		if errors.Is(err, io.EOF) {
			return n, nil
		}
		if err != nil {
			return 0, fmt.Errorf("audit: count lines in %s: %w", f.Name(), err)
		}
	}
}
