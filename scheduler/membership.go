package scheduler

import (
	"errors"
	"fmt"
	"slices"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/vllm"
)

// Replicas join and leave at run time through replica discovery
// (scheduler/discovery): one that joins is added to the fleet's set and to
// the GPU monitor with no capacity, so nothing is routed to it before its
// first scrape has answered; one that leaves is marked gone and removed
// once nothing is in flight there (fleet/members.go).

// newReplica builds the scheduler's state for a configured or discovered
// replica. The GPU monitor must know it already (its clock).
func (s *Server) newReplica(rc config.Replica) *fleet.Replica {
	r := &fleet.Replica{Name: rc.Name, URL: rc.URL, MaxSeqs: int64(rc.MaxNumSeqs), Ramp: s.learnRamp, Clock: s.gpu.Clock(rc.Name), Pinned: rc.Models,
		UpLatency: s.m.UpstreamLatency.WithLabelValues(rc.Name), PrioritySched: rc.PriorityScheduling}
	r.MaxModelLen.Store(rc.MaxModelLen)
	return r
}

// AddReplica adds a replica found at run time: to the GPU monitor (no
// capacity until a scrape of it is observed) and to the set routed to. A
// replica of that name that is leaving comes back instead when its URL is
// the same; with another URL it is refused until the old one is gone.
func (s *Server) AddReplica(rc config.Replica) error {
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	if r := s.reps.Get(rc.Name); r != nil {
		if r.URL != rc.URL {
			return fmt.Errorf("replica %s: still draining at %s", rc.Name, r.URL)
		}
		if r.Gone.Swap(false) {
			_ = s.gpu.Drain(rc.Name, "")
			s.log.Info("replica back in its discovery source: routed to again", "replica", rc.Name, "url", rc.URL)
		}
		return nil
	}
	if err := s.gpu.AddReplica(gpu.Replica{Name: rc.Name, GPUs: rc.GPUs, CapacityTokens: rc.CapacityTokens}); err != nil {
		return err
	}
	r := s.newReplica(rc)
	cur := s.reps.List()
	r.Slot = fleet.FreeSlot(cur)
	s.reps.SetMembers(append(slices.Clone(cur), r))
	s.membersChanged()
	s.log.Info("replica joined: routed to once a scrape answers", "replica", rc.Name, "url", rc.URL)
	return nil
}

// RemoveReplica takes a replica out of every choice: it gets no new work,
// what runs there finishes and settles, and ReapReplicas removes it once
// nothing is in flight. reason is logged and shown as its drain reason.
func (s *Server) RemoveReplica(name, reason string) error {
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	r := s.reps.Get(name)
	if r == nil {
		return fmt.Errorf("remove replica %q: %w", name, gpu.ErrUnknownReplica)
	}
	if !s.reps.MarkGone(r) {
		_ = s.gpu.Drain(name, reason)
		s.membersChanged()
		s.log.Info("replica left: no new work; removed once its requests finish", "replica", name, "reason", reason, "in_flight", r.Count.Load())
	}
	return nil
}

// ReapReplicas removes the replicas that left and have nothing in flight,
// and returns their names.
func (s *Server) ReapReplicas() []string {
	s.memberMu.Lock()
	defer s.memberMu.Unlock()
	gone := s.reps.Reap()
	if len(gone) > 0 {
		s.membersChanged()
	}
	var errs []error
	for _, name := range gone {
		errs = append(errs, s.gpu.RemoveReplica(name))
		for _, v := range []interface{ DeleteLabelValues(...string) bool }{s.m.ReplicaInflight, s.m.ReplicaAborts, s.m.ReplicaShare, s.m.ReplicaBatch, s.m.ReplicaService, s.m.ReplicaReserve} {
			v.DeleteLabelValues(name)
		}
		s.log.Info("replica removed: its requests have finished", "replica", name)
	}
	if err := errors.Join(errs...); err != nil {
		s.log.Error("removing replicas from the GPU monitor", "err", err)
	}
	return gone
}

// membersChanged lets every tenant parked on a full pool compete again
// (its pool may have changed: the dispatch predicate repools its calls) and wakes the dispatch loop.
func (s *Server) membersChanged() {
	for _, n := range s.Pools().UnparkAll() {
		s.Queue().Unpark(n)
	}
	s.Wake()
}

// ReplicaTargets is what the poller scrapes: every member, leaving ones
// included (their requests still run).
func (s *Server) ReplicaTargets() []vllm.Target { return s.reps.Targets() }

// ReplicaNames is the members' names, leaving ones included.
func (s *Server) ReplicaNames() []string { return s.reps.Names() }
