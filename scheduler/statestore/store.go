package statestore

import (
	"bytes"
	"context"
	"crypto/rand"
	"encoding/hex"
	"errors"
	"fmt"
	"time"
)

// Doc is one revision of a named document. Rev 0 means the document does
// not exist yet (Data is then nil).
//
// Epoch names the document's history: a random id given when the document
// is created and kept by every later write. A backend that forgets writes
// (a Redis failover that loses acknowledged writes, a restart without
// persistence, a deleted key or file) makes the revision go back; when it
// forgot the document altogether, the next write creates it under a new
// epoch. A reader that remembers the (Epoch, Rev, Data) it applied can
// therefore tell "a newer revision" from "a different history" (see
// [Doc.After]). A document written before epochs existed has Epoch "" until
// its next write gives it one.
type Doc struct {
	Name  string
	Rev   uint64
	Epoch string
	Data  []byte
}

// Same reports whether d and o are the same revision of the same history
// with the same bytes.
func (d Doc) Same(o Doc) bool {
	return d.Rev == o.Rev && d.Epoch == o.Epoch && bytes.Equal(d.Data, o.Data)
}

// After reports whether d continues the history that applied belongs to:
// same epoch (or applied had none yet) and a higher revision. A Doc that is
// neither Same as applied nor After it is older, or from another history:
// the backend went back, or the read raced a newer write of this process.
func (d Doc) After(applied Doc) bool {
	return d.Rev > applied.Rev && (d.Epoch == applied.Epoch || applied.Epoch == "" || applied.Rev == 0)
}

// newEpoch returns a random epoch id.
func newEpoch() string {
	var b [8]byte
	_, _ = rand.Read(b[:]) // crypto/rand.Read does not fail (Go 1.24+)
	return hex.EncodeToString(b[:])
}

// Store is a shared store of named documents. Implementations are safe for
// concurrent use, by goroutines and by processes sharing the backend.
type Store interface {
	// Get returns the current revision of name; a missing document is
	// Doc{Name: name} and no error.
	Get(ctx context.Context, name string) (Doc, error)
	// CompareAndSet writes data as the next revision of name if its current
	// revision is rev (0: it must not exist yet) and returns the new Doc;
	// when another writer came first it writes nothing and returns an error
	// wrapping ErrConflict.
	CompareAndSet(ctx context.Context, name string, rev uint64, data []byte) (Doc, error)
}

// ErrConflict reports a compare-and-set that lost to another writer.
var ErrConflict = errors.New("statestore: revision conflict")

// ErrUnchanged may be returned by an [Update] function to leave the
// document as it is; Update then returns the current Doc and no error.
var ErrUnchanged = errors.New("statestore: unchanged")

// ErrName rejects a document name that is not 1–64 of [a-z0-9._-] starting
// with a letter or digit (names become file names and Redis keys).
var ErrName = errors.New("statestore: invalid document name")

// maxAttempts bounds the retries of Update under contention; a writer that
// loses this many times in a row reports ErrConflict rather than spin.
const maxAttempts = 100

// Update applies fn to the current bytes of name (nil when missing) and
// writes the result with compare-and-set, re-reading and re-applying fn
// when another writer came first. fn may run several times and must be a
// pure function of its input. An error from fn aborts the update and is
// returned as is, except [ErrUnchanged], which returns the current Doc.
func Update(ctx context.Context, s Store, name string, fn func(old []byte) ([]byte, error)) (Doc, error) {
	for range maxAttempts {
		cur, err := s.Get(ctx, name)
		if err != nil {
			return Doc{}, err
		}
		next, err := fn(cur.Data)
		if errors.Is(err, ErrUnchanged) {
			return cur, nil
		}
		if err != nil {
			return Doc{}, err
		}
		d, err := s.CompareAndSet(ctx, name, cur.Rev, next)
		if errors.Is(err, ErrConflict) {
			continue
		}
		return d, err
	}
	return Doc{}, fmt.Errorf("update %q: %d attempts: %w", name, maxAttempts, ErrConflict)
}

// Watch calls fn with the current revision of name, then again each time
// a poll every interval reads a document that is not [Doc.Same] as the
// previous read (another revision, epoch or content: a backend that went
// back is reported too, not only one that moved on), until ctx ends; then
// it returns ctx's error. A failed poll (the backend unreachable) is
// retried at the next tick and reported through onErr when it is non-nil.
// fn runs on the caller's goroutine, one call at a time.
func Watch(ctx context.Context, s Store, name string, every time.Duration, fn func(Doc), onErr func(error)) error {
	return Watcher{Every: every, OnChange: fn, OnError: onErr}.Run(ctx, s, name)
}

// Watcher polls one document; see [Watch].
type Watcher struct {
	Every    time.Duration
	OnChange func(Doc)   // a read that differs from the previous one
	OnError  func(error) // a failed read; may be nil
	OnRead   func(Doc)   // every successful read, before OnChange; may be nil
}

// Run polls name until ctx ends and returns ctx's error.
func (w Watcher) Run(ctx context.Context, s Store, name string) error {
	if w.Every <= 0 {
		return fmt.Errorf("watch %q: interval must be > 0", name)
	}
	t := time.NewTicker(w.Every)
	defer t.Stop()
	var last Doc
	first := true
	for {
		d, err := s.Get(ctx, name)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if w.OnError != nil {
				w.OnError(err)
			}
		default:
			if w.OnRead != nil {
				w.OnRead(d)
			}
			if first || !d.Same(last) {
				first, last = false, d
				w.OnChange(d)
			}
		}
		select {
		case <-ctx.Done():
			return ctx.Err()
		case <-t.C:
		}
	}
}

func checkName(name string) error {
	if len(name) == 0 || len(name) > 64 {
		return fmt.Errorf("%w %q", ErrName, name)
	}
	for i := 0; i < len(name); i++ {
		c := name[i]
		switch {
		case c >= 'a' && c <= 'z', c >= '0' && c <= '9':
		case (c == '.' || c == '_' || c == '-') && i > 0:
		default:
			return fmt.Errorf("%w %q", ErrName, name)
		}
	}
	return nil
}
