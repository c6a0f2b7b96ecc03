package statestore

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io/fs"
	"os"
	"path/filepath"
	"sync"

	"github.com/sluicehq/sluice/internal/atomicfile"
)

// File is a [Store] on a local directory. Each document is
// <dir>/<name>.json holding {"rev": N, "epoch": E, "data": <the document>}; data must
// therefore be JSON, which keeps the files readable by an operator. A
// write goes to a temporary file that is fsynced, renamed over the
// document and followed by an fsync of the directory, so a crash leaves
// either the old or the new revision. Writers take an exclusive flock on
// <dir>/<name>.lock, so File values in one or several processes sharing
// the directory never lose an update. File is safe for concurrent use.
type File struct {
	dir string
	mu  sync.Mutex // serialises this process's writers before the flock
}

// OpenFile returns a File store in dir, creating the directory (0700) when
// it is missing.
func OpenFile(dir string) (*File, error) {
	if dir == "" {
		return nil, errors.New("statestore: file store needs a directory")
	}
	if err := os.MkdirAll(dir, 0o700); err != nil {
		return nil, fmt.Errorf("statestore: %w", err)
	}
	return &File{dir: dir}, nil
}

// Dir returns the directory the store writes to.
func (f *File) Dir() string { return f.dir }

type fileDoc struct {
	Rev   uint64          `json:"rev"`
	Epoch string          `json:"epoch,omitempty"`
	Data  json.RawMessage `json:"data"`
}

func (f *File) path(name string) string { return filepath.Join(f.dir, name+".json") }

// Get reads the current revision of name.
func (f *File) Get(_ context.Context, name string) (Doc, error) {
	if err := checkName(name); err != nil {
		return Doc{}, err
	}
	return f.read(name)
}

func (f *File) read(name string) (Doc, error) {
	b, err := os.ReadFile(f.path(name))
	if errors.Is(err, fs.ErrNotExist) {
		return Doc{Name: name}, nil
	}
	if err != nil {
		return Doc{}, fmt.Errorf("statestore: read %s: %w", name, err)
	}
	var fd fileDoc
	if err := json.Unmarshal(b, &fd); err != nil {
		return Doc{}, fmt.Errorf("statestore: %s: corrupt document: %w", f.path(name), err)
	}
	return Doc{Name: name, Rev: fd.Rev, Epoch: fd.Epoch, Data: []byte(fd.Data)}, nil
}

// CompareAndSet writes data as revision rev+1 if name is at rev.
func (f *File) CompareAndSet(_ context.Context, name string, rev uint64, data []byte) (Doc, error) {
	if err := checkName(name); err != nil {
		return Doc{}, err
	}
	if !json.Valid(data) {
		return Doc{}, fmt.Errorf("statestore: %s: the file store keeps JSON documents only", name)
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	unlock, err := lock(filepath.Join(f.dir, name+".lock"))
	if err != nil {
		return Doc{}, fmt.Errorf("statestore: lock %s: %w", name, err)
	}
	defer unlock()
	cur, err := f.read(name)
	if err != nil {
		return Doc{}, err
	}
	if cur.Rev != rev {
		return Doc{}, fmt.Errorf("%s at revision %d, not %d: %w", name, cur.Rev, rev, ErrConflict)
	}
	if cur.Epoch == "" {
		cur.Epoch = newEpoch()
	}
	next := Doc{Name: name, Rev: rev + 1, Epoch: cur.Epoch, Data: append([]byte(nil), data...)}
	b, err := json.Marshal(fileDoc{Rev: next.Rev, Epoch: next.Epoch, Data: next.Data})
	if err != nil {
		return Doc{}, fmt.Errorf("statestore: %s: %w", name, err)
	}
	if err := atomicfile.Replace(f.path(name), b, true); err != nil {
		return Doc{}, fmt.Errorf("statestore: write %s: %w", name, err)
	}
	return next, nil
}
