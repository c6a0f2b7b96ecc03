package vllm

import (
	"fmt"
	"strings"
)

// pollSnap is one published state of the poller: the replicas in target
// order and their index by name. Immutable.
type pollSnap struct {
	reps  []*Replica
	index map[string]int
}

func newPollSnap(reps []*Replica) *pollSnap {
	s := &pollSnap{reps: reps, index: make(map[string]int, len(reps))}
	for i, r := range reps {
		s.index[r.Name] = i
	}
	return s
}

// publish stores a round of polls. A target set changed while the round
// ran wins: a replica removed meanwhile is not brought back and one added
// meanwhile keeps its (unpolled) entry.
func (p *Poller) publish(polled []*Replica) {
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := p.snap.Load()
	byName := make(map[string]*Replica, len(polled))
	for _, r := range polled {
		byName[r.Name] = r
	}
	next := make([]*Replica, len(cur.reps))
	for i, r := range cur.reps {
		if pr, ok := byName[r.Name]; ok && pr.URL == r.URL {
			next[i] = pr
		} else {
			next[i] = r
		}
	}
	for name := range byName {
		if _, kept := cur.index[name]; !kept {
			p.up.DeleteLabelValues(name) // set by this round after SetTargets dropped it
		}
	}
	p.snap.Store(newPollSnap(next))
}

// SetTargets replaces the replicas polled: a target whose name and URL
// are already polled keeps its state (failures, last metrics); a new one
// starts unpolled (not up) and is polled in the next round; one no longer
// listed is dropped, and its series removed. Replica discovery calls it as
// the fleet changes.
func (p *Poller) SetTargets(targets []Target) error {
	seen := map[string]bool{}
	for _, t := range targets {
		if t.Name == "" || seen[t.Name] {
			return fmt.Errorf("poller targets: empty or duplicate name %q", t.Name)
		}
		seen[t.Name] = true
		if !strings.HasPrefix(t.URL, "http://") && !strings.HasPrefix(t.URL, "https://") {
			return fmt.Errorf("poller target %s: url must start with http:// or https://", t.Name)
		}
	}
	p.mu.Lock()
	defer p.mu.Unlock()
	cur := p.snap.Load()
	next := make([]*Replica, len(targets))
	for i, t := range targets {
		if j, ok := cur.index[t.Name]; ok && cur.reps[j].URL == t.URL && cur.reps[j].Model == t.Model {
			next[i] = cur.reps[j]
			continue
		}
		next[i] = &Replica{Name: t.Name, URL: t.URL, Model: t.Model}
	}
	for _, r := range cur.reps {
		if !seen[r.Name] {
			p.up.DeleteLabelValues(r.Name)
			p.errs.DeletePartialMatch(map[string]string{"replica": r.Name})
		}
	}
	p.snap.Store(newPollSnap(next))
	return nil
}
