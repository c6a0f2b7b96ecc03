package scheduler

import (
	"context"
	"errors"
	"net/http"
	"time"

	"github.com/sluicehq/sluice/gpu"
	"github.com/sluicehq/sluice/scheduler/fleet"
	"github.com/sluicehq/sluice/vllm"
)

// ReplicaSource publishes the latest scrape of each replica (vllm.Poller).
type ReplicaSource interface {
	Get(name string) (*vllm.Replica, bool)
}

// ModelLister lists a replica's served models (vllm.Client).
type ModelLister interface {
	Models(ctx context.Context, baseURL string) ([]vllm.Model, error)
}

// Observe feeds one round of replica scrapes into the GPU monitor (health,
// capacity, GPU clocks) and the dispatch gate, and wakes the dispatch loop
// since room may have changed. ObserveLoop calls it as polls land.
func (s *Server) Observe(ctx context.Context, src ReplicaSource, models ModelLister) {
	for _, r := range s.reps.List() {
		snap, ok := src.Get(r.Name)
		if !ok || snap.CheckedAt.Equal(r.polledAt) {
			// No poll since the last Observe (its ticker also runs it):
			// one poll is one observation. Seen again, a failure would count
			// twice towards down_after, a waiting queue twice towards the
			// overcommit cut, and the scrape's completions baseline
			// (finishedAt) would move past completions it does not show.
			continue
		}
		r.polledAt = snap.CheckedAt
		r.NotePoll(snap)
		m := snap.Metrics
		obs := gpu.ReplicaMetrics{OK: snap.Up && snap.Healthy && m.Running.OK, Reason: snap.LastError}
		if !snap.Up || !snap.Healthy {
			if obs.Reason == "" {
				obs.Reason = "replica /health failing"
			}
		}
		prev := r.Obs.Load()
		// A poll that only timed out while the replica kept completing
		// requests is a slow /metrics, not a dead replica: it does not count
		// towards down_after.
		obs.Excused = !obs.OK && snap.TimedOut && prev != nil && r.Finished.Load() > prev.FinishedAt
		obs.NumGPUBlocks, obs.BlockSize = int64(m.NumGPUBlocks.V), int64(m.BlockSize.V)
		obs.KVUsage = m.KVUsage.V
		// Deferred requests (LoRA budget, KV transfer, grammar) wait on
		// something other than room: they do not cut the overcommit.
		obs.Waiting, obs.Running = int64(m.CapacityWaiting().V), int64(m.Running.V)
		obs.Preemptions = m.PreemptionsTotal.V
		// The simulator's utilisation stands in for NVML only when telemetry
		// comes from vLLM metrics; otherwise a replica is busy while it runs
		// requests (exact for vLLM's back-to-back decode steps).
		if s.gpu.Config().Telemetry == gpu.ModeVLLM {
			obs.SimGPUUtilization, obs.HasSimGPUUtilization = m.GPUUtilization.V, m.GPUUtilization.OK
			obs.SimGPUBusySeconds, obs.HasSimGPUBusy = m.GPUBusySecondsTotal.V, m.GPUBusySecondsTotal.OK
			obs.SimGPUEnergyJoules, obs.HasSimGPUEnergy = m.GPUEnergyJoulesTotal.V, m.GPUEnergyJoulesTotal.OK
			// The counters were read after the scrape was sent and before
			// its answer arrived; the send time errs on the side where no
			// newly dispatched request has finished a step yet (gpu/doc.go).
			obs.At, obs.Restarted = snap.CheckedAt, snap.Restarted
		}
		o := &fleet.Obs{OK: obs.OK, Running: obs.Running, Waiting: int64(m.Waiting.V), Deferred: int64(m.WaitingDeferred.V),
			KVUsage: obs.KVUsage, FinishedAt: r.Finished.Load(), LoRAs: m.LoRARunning}
		if prev != nil {
			o.Models, o.Parents = prev.Models, prev.Parents
		}
		// Models before capacity: a replica sized up with its models
		// unknown would take requests for models it does not serve.
		if obs.OK && models != nil && (prev == nil || len(prev.Models) == 0 || s.now().UnixNano()-r.ModelsAt.Load() > int64(fleet.ModelRefresh)) {
			s.readModels(ctx, r, models, o)
			if len(o.Models) > 0 && (prev == nil || len(prev.Models) == 0) {
				r.Obs.Store(&fleet.Obs{Models: o.Models, Parents: o.Parents})
			}
		}
		if obs.OK && !m.KVCapacityTokens.OK {
			obs.BatchTokens = r.batchTokens() // after /v1/models: its context length
		}
		_ = s.gpu.ObserveReplica(r.Name, obs)
		if v, ok := s.gpu.Snapshot().Replica(r.Name); ok {
			o.Sizing = v.Sizing
			if v.Sizing == gpu.SizingBatch && !r.batchWarned {
				r.batchWarned = true
				s.log.Warn("replica metrics lack vllm:cache_config_info: sized on its batch (max_num_seqs) instead of its KV cache; set upstream.replicas[].capacity_tokens to size it in tokens",
					"replica", r.Name, "missing_metric", "vllm:cache_config_info", "max_num_seqs", r.MaxSeqs)
			}
		}
		r.Obs.Store(o)
		s.exportReplica(r)
	}
	s.signal(s.wake)
}

// batchSeqTokens bounds one sequence's tokens in a batch-sized replica's
// token bound while its context length is unknown.
const batchSeqTokens = 1 << 24

// batchTokens is the token bound of a replica sized on its batch:
// max_num_seqs sequences of the context length at most, so that the
// sequence limit, not tokens, decides its room (SCHEDULING §7).
func (r *replica) batchTokens() int64 {
	per := r.MaxModelLen.Load()
	if per <= 0 {
		per = batchSeqTokens
	}
	return max(r.MaxSeqs, 1) * per
}

// readModels reads r's /v1/models into o: base models and LoRA adapters
// (with their parent), and the context length when config sets none.
func (s *Server) readModels(ctx context.Context, r *replica, models ModelLister, o *fleet.Obs) {
	mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ms, err := models.Models(mctx, r.URL)
	var ue *vllm.UpstreamError
	if errors.As(err, &ue) && (ue.Status == http.StatusUnauthorized || ue.Status == http.StatusForbidden) && !r.authWarned {
		// vLLM's --api-key guards /v1 only: /health and /metrics answer, so
		// the replica looks up while every request to it would fail.
		r.authWarned = true
		s.log.Warn("replica refuses Sluice's credential on /v1/models: set or correct upstream.replicas[].api_key_env or api_key_file",
			"replica", r.Name, "status", ue.Status)
	}
	r.NoteModels(err, s.now())
	if err != nil {
		return
	}
	r.authWarned = false
	o.Models = make([]string, 0, len(ms))
	o.Parents = map[string]string{}
	for _, md := range ms {
		o.Models = append(o.Models, md.ID)
		if md.Parent != "" {
			o.Parents[md.ID] = md.Parent
		}
		if md.MaxModelLen > 0 && r.MaxModelLen.Load() == 0 {
			r.MaxModelLen.Store(int64(md.MaxModelLen))
		}
	}
	r.ModelsAt.Store(s.now().UnixNano())
}

func (s *Server) exportReplica(r *replica) {
	s.m.ReplicaInflight.WithLabelValues(r.Name).Set(float64(r.Load.Load()))
	held := 0.0
	if r.distrusted(s.now()) {
		held = 1
	}
	s.m.ReplicaAborts.WithLabelValues(r.Name).Set(held)
	s.m.ReplicaShare.WithLabelValues(r.Name).Set(float64(r.Share.Load()))
	s.m.ReplicaBatch.WithLabelValues(r.Name).Set(float64(r.batch.learned.Load()))
}

// ObserveLoop calls Observe as each round of polls lands (polled, the
// poller's Polled; nil: none) and at least every interval, until ctx ends.
// On the interval alone a poll's health and KV usage reached dispatch up to
// an interval after the scrape.
func (s *Server) ObserveLoop(ctx context.Context, src ReplicaSource, models ModelLister, interval time.Duration, polled <-chan struct{}) error {
	t := time.NewTicker(interval)
	defer t.Stop()
	for {
		s.Observe(ctx, src, models)
		select {
		case <-ctx.Done():
			return nil
		case <-polled:
		case <-t.C:
		}
	}
}
