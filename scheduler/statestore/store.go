package statestore

import (
	"context"
	"errors"
	"fmt"
	"time"
)

// Doc is one revision of a named document. Rev 0 means the document does
// not exist yet (Data is then nil).
type Doc struct {
	Name string
	Rev  uint64
	Data []byte
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
// a poll every interval finds a different revision, until ctx ends; then
// it returns ctx's error. A failed poll (the backend unreachable) is
// retried at the next tick and reported through onErr when it is non-nil.
// fn runs on the caller's goroutine, one call at a time.
func Watch(ctx context.Context, s Store, name string, every time.Duration, fn func(Doc), onErr func(error)) error {
	if every <= 0 {
		return fmt.Errorf("watch %q: interval must be > 0", name)
	}
	t := time.NewTicker(every)
	defer t.Stop()
	var last uint64
	first := true
	for {
		d, err := s.Get(ctx, name)
		switch {
		case err != nil:
			if ctx.Err() != nil {
				return ctx.Err()
			}
			if onErr != nil {
				onErr(err)
			}
		case first || d.Rev != last:
			first, last = false, d.Rev
			fn(d)
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
