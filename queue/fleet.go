package queue

// Hooks for fleet-wide fair share (package queue/fleet, SCHEDULING §9):
// instances that share replicas add each other's service to their
// counters, so that every instance orders its tenants by what the tenant
// was served anywhere. A flow's counter is always
//
//	v + rebased = lifted + (own charged + others' service added)/w
//
// where lifted sums every raise that was not service (lifts, and the
// fleet's lifts adopted with [Queue.AdjustFleet]). Instances exchange
// their own charged service and lifted per flow; each adds the others'
// service and adopts the largest lifted, so their counters agree up to
// the service not yet exchanged.

// FlowState is one flow as the fleet exchange sees it.
type FlowState struct {
	Tenant string
	Band   int
	Weight float64
	// Counter is the flow's virtual counter plus every shift of its band
	// (v + rebased): comparable with another instance's.
	Counter float64
	// Charged is this instance's net charged service (dispatches, minus
	// requeues, plus reconciliations), in cost units.
	Charged int64
	// Lifted is the sum of the raises of the counter that were not
	// service, in cost units per unit weight.
	Lifted float64
	// Backlogged: the flow has queued entries here and its tenant is not
	// parked (it competes here). A parked tenant is left out so that, as
	// on one instance, time parked earns no credit: it is lifted when it
	// rejoins, unless it competes at another instance meanwhile.
	Backlogged bool
	// Gen tells flows of one name apart: a tenant removed and configured
	// again has new flows, whose Charged starts again at 0.
	Gen int32
}

// AppendFlows appends every flow of every known tenant to dst.
func (q *Queue[T]) AppendFlows(dst []FlowState) []FlowState {
	q.mu.Lock()
	defer q.mu.Unlock()
	for _, t := range q.tenants {
		if t.dropped {
			continue
		}
		for b, f := range t.flows {
			if f == nil {
				continue
			}
			dst = append(dst, FlowState{
				Tenant: t.cfg.Name, Band: b, Weight: t.cfg.Weight,
				Counter: f.v + q.bands[b].rebased, Charged: f.charged, Lifted: f.lifted,
				Backlogged: f.entries.len() > 0 && !t.parked, Gen: f.id,
			})
		}
	}
	return dst
}

// Weight is a known tenant's weight (false when unknown or removed).
func (q *Queue[T]) Weight(tenant string) (float64, bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tenants[tenant]
	if t == nil || t.removed {
		return 0, false
	}
	return t.cfg.Weight, true
}

// AdjustFleet adds service other instances charged the flow (cost units;
// negative for their refunds) to its counter, and raises its lifted to
// lifted when that is more (adopting a lift made elsewhere), creating the
// flow if needed. It reports false for an unknown or removed tenant or a
// band out of range. The flow's own charged service is not changed.
func (q *Queue[T]) AdjustFleet(tenant string, band int, service, lifted float64) bool {
	q.mu.Lock()
	defer q.mu.Unlock()
	t := q.tenants[tenant]
	if t == nil || t.removed || band < 0 || band >= NumBands {
		return false
	}
	f := q.flowLocked(t, band)
	f.v += service / t.cfg.Weight
	if lifted > f.lifted {
		f.v += lifted - f.lifted
		f.lifted = lifted
	}
	if q.fpos[f.id] >= 0 {
		q.bands[f.band].heap.setKey(int(q.fpos[f.id]), f.v)
	}
	return true
}

// SetFleetFloors sets each band's fleet floor (ok[b] false: none): the
// least counter (in [FlowState.Counter] units) of a flow backlogged
// anywhere in the fleet. A flow that becomes eligible is lifted to at most
// its band's floor, so a tenant that is backlogged at another instance
// keeps its counter. Pass all false to fall back to local lifts.
func (q *Queue[T]) SetFleetFloors(floor [NumBands]float64, ok [NumBands]bool) {
	q.mu.Lock()
	defer q.mu.Unlock()
	for b := range q.bands {
		q.bands[b].floor, q.bands[b].hasFloor = floor[b], ok[b]
	}
}
