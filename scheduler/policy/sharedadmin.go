package policy

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"log/slog"
	"sync"
	"time"

	"github.com/sluicehq/sluice/internal/atomicfile"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/statestore"
)

// SharedAdminDeps is what SharedAdmin needs from the server.
type SharedAdminDeps struct {
	// Store holds the shared admin document (AdminDoc); nil: the admin
	// state is this instance's own.
	Store statestore.Store
	// Lock is the server's policy lock: it guards the admin state, and
	// Rebuild runs under it.
	Lock sync.Locker
	// File is the config file in force (admin.state_file, and what a
	// change is checked against).
	File  func() *config.File
	Keyer *ledger.Keyer
	// Rebuild builds and commits a policy from the config in force and st
	// (Lock held); an error leaves the policy and the admin state as they
	// were.
	Rebuild func(st *AdminState) error
	// Clamped and Lifted tell the server of clamps another instance set
	// (other than automatic ones) or lifted.
	Clamped func(tenant string, until time.Time)
	Lifted  func(tenant string)
	Log     *slog.Logger
	Now     func() time.Time
}

// SharedAdmin is one instance's admin state: the state applied to its
// policy, persisted in admin.state_file and, with a shared store, followed
// from and written to the shared admin document by compare-and-set, so
// changes on two instances never lose one. Safe for concurrent use; every
// method takes Lock.
type SharedAdmin struct {
	d       SharedAdminDeps
	st      AdminState
	applied statestore.Doc // the shared document st came from (Rev 0: none yet)
}

// NewSharedAdmin starts from st (admin.state_file's content). Nothing is
// read from the store until Load.
func NewSharedAdmin(st AdminState, d SharedAdminDeps) *SharedAdmin {
	return &SharedAdmin{d: d, st: st}
}

// State is a copy of the admin state in force.
func (a *SharedAdmin) State() AdminState {
	a.d.Lock.Lock()
	defer a.d.Lock.Unlock()
	return a.st.Clone()
}

// StateLocked is the admin state in force, to rebuild the policy from
// (Lock held); it is not to be changed.
func (a *SharedAdmin) StateLocked() *AdminState { return &a.st }

// Load reads the shared admin state at start-up; an empty store keeps (and
// later seeds it with) admin.state_file's content. An unreachable store is
// not fatal: the instance starts from its local copy and Watch installs the
// shared state once it answers (with the Redis ledger unreachable too,
// nothing is admitted meanwhile anyway).
func (a *SharedAdmin) Load(ctx context.Context) error {
	if a.d.Store == nil {
		return nil
	}
	ctx, cancel := context.WithTimeout(ctx, 5*time.Second)
	defer cancel()
	doc, err := a.d.Store.Get(ctx, AdminDoc)
	if err != nil {
		a.d.Log.Warn("shared admin state unreachable at start; using admin.state_file until it answers", "err", err)
		return nil
	}
	if doc.Rev == 0 {
		return nil
	}
	st, err := DecodeAdmin(doc.Data)
	if err != nil {
		return err
	}
	a.d.Lock.Lock()
	a.st, a.applied = st, doc
	a.d.Lock.Unlock()
	return nil
}

// Change applies change to the admin state and rebuilds the policy:
// through the shared store when there is one (compare-and-set, re-applied
// on conflict), else locally. A change the policy refuses is
// ErrInvalidAdmin and changes nothing. change may return
// statestore.ErrUnchanged.
func (a *SharedAdmin) Change(change func(st *AdminState) error) error {
	a.d.Lock.Lock()
	defer a.d.Lock.Unlock()
	file := a.d.File()
	validate := func(st *AdminState) error { return Check(file, st, a.d.Now(), a.d.Keyer) }
	if a.d.Store == nil {
		next := a.st.Clone()
		if err := change(&next); err != nil {
			if errors.Is(err, statestore.ErrUnchanged) {
				return nil
			}
			return err
		}
		if err := validate(&next); err != nil {
			return err
		}
		return a.installLocked(next, statestore.Doc{})
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	var next *AdminState
	doc, err := statestore.Update(ctx, a.d.Store, AdminDoc, func(old []byte) ([]byte, error) {
		next = nil
		st, err := DecodeAdmin(old)
		if err != nil {
			return nil, err
		}
		if old == nil {
			st = a.st.Clone() // first write seeds the fleet with this instance's state
		}
		if err := change(&st); err != nil {
			return nil, err
		}
		if err := validate(&st); err != nil {
			return nil, err
		}
		next = &st
		return json.Marshal(st)
	})
	if err != nil {
		return err
	}
	if next == nil || a.applied.After(doc) {
		return nil // unchanged, or the poll already installed a later one
	}
	return a.installLocked(*next, doc)
}

// ExpireClamps drops clamps whose time has come and rebuilds the policy,
// so a clamp ends on time even with no admin call; it returns the clamps
// it dropped. Every instance does it for itself (effective limits ignore
// an expired clamp anyway); the shared document is cleaned by whichever
// instance gets there first.
func (a *SharedAdmin) ExpireClamps() []Clamp {
	now := a.d.Now()
	var expired []Clamp
	err := a.Change(func(st *AdminState) error {
		expired = expireClamps(st, now, expired[:0])
		if len(expired) == 0 {
			return statestore.ErrUnchanged
		}
		return nil
	})
	if err != nil {
		// The shared store is unreachable: expire locally all the same.
		a.d.Log.Warn("clamp expiry not written to the shared admin state", "err", err)
		a.d.Lock.Lock()
		next := a.st.Clone()
		expired = expireClamps(&next, now, expired[:0])
		if len(expired) > 0 {
			if err := a.installLocked(next, a.applied); err != nil {
				a.d.Log.Error("rebuilding policy after clamp expiry", "err", err)
			}
		}
		a.d.Lock.Unlock()
	}
	return expired
}

// expireClamps deletes st's clamps expired at now and appends them to out.
func expireClamps(st *AdminState, now time.Time, out []Clamp) []Clamp {
	for name, c := range st.Clamps {
		if !now.Before(c.ExpiresAt) {
			delete(st.Clamps, name)
			out = append(out, c)
		}
	}
	return out
}

// installLocked makes st the admin state of the shared document's
// revision doc (Lock held; the zero Doc without a shared store): rebuilds
// the policy and persists the local copy.
func (a *SharedAdmin) installLocked(st AdminState, doc statestore.Doc) error {
	prev := a.st
	a.st = st
	if err := a.d.Rebuild(&a.st); err != nil {
		a.st = prev
		return err
	}
	a.applied = doc
	if err := a.persistLocked(); err != nil {
		a.d.Log.Error("admin state not written to admin.state_file", "err", err)
	}
	return nil
}

// persistLocked writes the admin state atomically (Lock held).
func (a *SharedAdmin) persistLocked() error {
	path := a.d.File().Admin.StateFile
	if path == "" {
		return nil
	}
	b, err := a.st.EncodeFile()
	if err != nil {
		return err
	}
	if err := atomicfile.Replace(path, b, true); err != nil {
		return fmt.Errorf("admin state: %w", err)
	}
	return nil
}

// Watch installs admin changes other instances wrote to the shared store,
// within AdminPoll, until ctx ends.
func (a *SharedAdmin) Watch(ctx context.Context) error {
	if a.d.Store == nil {
		<-ctx.Done()
		return nil
	}
	err := statestore.Watch(ctx, a.d.Store, AdminDoc, AdminPoll, a.Apply, func(err error) {
		a.d.Log.Warn("shared admin state unreadable; keeping the last one", "err", err)
	})
	if ctx.Err() != nil {
		return nil
	}
	return err
}

// Apply installs a read d of the shared admin state when it is a later
// revision than the one applied. A read that is neither that nor the
// applied one is read again (it may have raced this instance's own
// write); when the store really went back, the instance converges on it: a
// document the store forgot, or an older revision of the same history, is
// rewritten with the state this instance applied (a failover or a restart
// without persistence does not silently drop budget overrides and clamps),
// and another history someone already wrote is adopted as is.
func (a *SharedAdmin) Apply(d statestore.Doc) {
	a.d.Lock.Lock()
	applied := a.applied
	a.d.Lock.Unlock()
	if d.Same(applied) {
		return
	}
	if d.After(applied) {
		a.adopt(d, applied)
		return
	}
	ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
	defer cancel()
	d2, err := a.d.Store.Get(ctx, AdminDoc)
	if err != nil {
		return // the next poll reads again
	}
	a.d.Lock.Lock()
	applied = a.applied
	a.d.Lock.Unlock()
	switch {
	case d2.Same(applied):
		return
	case d2.After(applied):
		a.adopt(d2, applied)
		return
	}
	a.d.Log.Warn("the shared admin state went back (failover, restart without persistence or a deleted document)",
		"applied_rev", applied.Rev, "applied_epoch", applied.Epoch, "store_rev", d2.Rev, "store_epoch", d2.Epoch)
	if d2.Rev > 0 && (d2.Epoch != applied.Epoch || d2.Rev >= applied.Rev) {
		a.adopt(d2, applied) // another history, already written by someone: it is the fleet's
		return
	}
	a.d.Lock.Lock()
	b, err := json.Marshal(a.st)
	a.d.Lock.Unlock()
	if err != nil {
		return
	}
	nd, err := a.d.Store.CompareAndSet(ctx, AdminDoc, d2.Rev, b)
	if err != nil {
		a.d.Log.Info("shared admin state repair not written; reading it again at the next poll", "err", err)
		return
	}
	a.d.Log.Info("shared admin state rewritten with this instance's", "rev", nd.Rev, "epoch", nd.Epoch)
	a.adopt(nd, applied)
}

// adopt installs d if the applied revision is still expect.
func (a *SharedAdmin) adopt(d statestore.Doc, expect statestore.Doc) {
	st, err := DecodeAdmin(d.Data)
	if err != nil {
		a.d.Log.Error("shared admin state refused", "err", err)
		return
	}
	a.d.Lock.Lock()
	defer a.d.Lock.Unlock()
	if !a.applied.Same(expect) {
		return // a write or another read installed something meanwhile
	}
	prev := a.st.Clamps
	if err := a.installLocked(st, d); err != nil {
		a.d.Log.Error("shared admin state refused by this instance's config", "rev", d.Rev, "err", err)
		return
	}
	for name, c := range st.Clamps {
		if old, ok := prev[name]; (!ok || old.ExpiresAt != c.ExpiresAt) && c.Source != "auto" {
			a.d.Clamped(name, c.ExpiresAt)
		}
	}
	for name := range prev {
		if _, ok := st.Clamps[name]; !ok {
			a.d.Lifted(name)
		}
	}
	a.d.Log.Info("admin state changed by another instance", "rev", d.Rev, "budgets", len(st.Budgets), "clamps", len(st.Clamps))
}
