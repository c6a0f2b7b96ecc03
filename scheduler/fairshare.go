package scheduler

import (
	"context"
	"time"

	"github.com/sluicehq/sluice/queue"
	"github.com/sluicehq/sluice/queue/fleet"
)

// Fleet-wide fair share (SCHEDULING §9). Each instance is fair among the
// requests it holds; without more, a tenant that reaches two instances
// sharing a replica gets each one's share, up to N times an equally
// weighted tenant that reaches one. So every instance of a Redis fleet
// reports, every shareInterval, its own charged service and lifts per
// flow, and adds the others' to its counters (package queue/fleet): the
// dispatch order on every instance follows what each tenant was served
// anywhere. The exchange is off the dispatch path: a pick reads only the
// local counters, which the exchange moves four times a second.

// fairExchange is what fleet-wide fair share needs of the fleet
// (peers.Redis).
type fairExchange interface {
	ExchangeFlows(ctx context.Context, flows []fleet.Flow) (map[string][]fleet.Flow, error)
	LeaveFlows(ctx context.Context) error
}

// FairStale bounds how long the counters follow the fleet without an
// exchange that answered: then dispatch falls back to local fair share
// (the lifts are local again; what was added stays) until one answers.
const FairStale = 2 * time.Second

// fairTimeout bounds one exchange; it also ends at the fallback.
const fairTimeout = 500 * time.Millisecond

// FairShareLoop exchanges fair-share counters with the other instances
// every shareInterval until ctx ends; then it withdraws this instance's
// report.
func (s *Server) FairShareLoop(ctx context.Context, ex fairExchange) error {
	t := time.NewTicker(shareInterval)
	defer t.Stop()
	fallback := time.NewTimer(time.Hour)
	fallback.Stop()
	defer fallback.Stop()
	var (
		m      fleet.Merger
		local  []queue.FlowState
		lastOK time.Time
		on     bool
		warned bool
	)
	goLocal := func() {
		s.Queue().SetFleetFloors([queue.NumBands]float64{}, [queue.NumBands]bool{})
		s.m.FairShareFleet.Set(0)
		on = false
	}
	for {
		select {
		case <-ctx.Done():
			goLocal()
			lctx, cancel := context.WithTimeout(context.WithoutCancel(ctx), time.Second)
			defer cancel()
			if err := ex.LeaveFlows(lctx); err != nil {
				s.log.Warn("withdrawing this instance's fair-share report", "err", err)
			}
			return nil
		case <-fallback.C:
			s.log.Warn("no fair-share exchange with the other instances answered for 2 s: fair share is local to this instance until one does")
			goLocal()
			continue
		case <-t.C:
		}
		local = s.Queue().AppendFlows(local[:0])
		timeout := fairTimeout
		if on {
			timeout = min(timeout, lastOK.Add(FairStale).Sub(s.now()))
		}
		xctx, cancel := context.WithTimeout(ctx, timeout)
		others, err := ex.ExchangeFlows(xctx, fleet.Report(local))
		cancel()
		if err != nil {
			if lastOK.IsZero() && !warned {
				// Never answered yet: the fallback timer is not running.
				s.log.Warn("exchanging fair-share counters with the other instances: fair share is local to this instance until an exchange answers", "err", err)
				warned = true
			} else {
				s.log.Debug("exchanging fair-share counters", "err", err)
			}
		}
		if others == nil {
			continue
		}
		res := m.Merge(s.now(), local, s.Queue().Weight, others)
		for _, a := range res.Adjust {
			s.Queue().AdjustFleet(a.Tenant, a.Band, a.Service, a.Lifted)
		}
		s.Queue().SetFleetFloors(res.Floor, res.HasFloor)
		lastOK = s.now()
		fallback.Reset(FairStale)
		if !on {
			s.log.Info("fair share follows the fleet's counters")
			s.m.FairShareFleet.Set(1)
			on = true
		}
	}
}
