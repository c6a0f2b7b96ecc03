package statestore

import (
	"context"
	"fmt"
	"sync"
)

// Memory is a [Store] in process memory, for a server whose ledger keeps
// nothing across restarts either. Safe for concurrent use.
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
	if cur := m.docs[name].Rev; cur != rev {
		return Doc{}, fmt.Errorf("%s at revision %d, not %d: %w", name, cur, rev, ErrConflict)
	}
	d := Doc{Name: name, Rev: rev + 1, Data: append([]byte(nil), data...)}
	m.docs[name] = d
	return d, nil
}
