package statestore

import (
	"context"
	"fmt"
	"sync"
)

// Memory is a [Store] in process memory, for a server whose ledger keeps
// nothing across restarts either. Safe for concurrent use. Delete and
// Restore simulate a backend that forgets writes, for tests.
type Memory struct {
	mu   sync.Mutex // guards docs
	docs map[string]Doc
}

// NewMemory returns an empty in-memory store.
func NewMemory() *Memory { return &Memory{docs: map[string]Doc{}} }

// Get returns the current revision of name.
func (m *Memory) Get(_ context.Context, name string) (Doc, error) {
	if err := checkName(name); err != nil {
		return Doc{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	d, ok := m.docs[name]
	if !ok {
		return Doc{Name: name}, nil
	}
	d.Data = append([]byte(nil), d.Data...)
	return d, nil
}

// CompareAndSet writes data as revision rev+1 if name is at rev.
func (m *Memory) CompareAndSet(_ context.Context, name string, rev uint64, data []byte) (Doc, error) {
	if err := checkName(name); err != nil {
		return Doc{}, err
	}
	m.mu.Lock()
	defer m.mu.Unlock()
	cur := m.docs[name]
	if cur.Rev != rev {
		return Doc{}, fmt.Errorf("%s at revision %d, not %d: %w", name, cur.Rev, rev, ErrConflict)
	}
	if cur.Epoch == "" {
		cur.Epoch = newEpoch()
	}
	d := Doc{Name: name, Rev: rev + 1, Epoch: cur.Epoch, Data: append([]byte(nil), data...)}
	m.docs[name] = d
	return d, nil
}

// Delete forgets name, as a backend restarted without persistence would:
// the next write creates it again under a new epoch.
func (m *Memory) Delete(name string) {
	m.mu.Lock()
	defer m.mu.Unlock()
	delete(m.docs, name)
}

// Restore puts d back as the current document, as a failover to a replica
// that missed the later writes would.
func (m *Memory) Restore(d Doc) {
	m.mu.Lock()
	defer m.mu.Unlock()
	d.Data = append([]byte(nil), d.Data...)
	m.docs[d.Name] = d
}
