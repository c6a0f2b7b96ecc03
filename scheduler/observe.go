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
		if !ok || snap.CheckedAt.Equal(r.PolledAt) {
			// No poll since the last Observe (its ticker also runs it):
			// one poll is one observation. Seen again, a failure would count
			// twice towards down_after, a waiting queue twice towards the
			// overcommit cut, and the scrape's completions baseline
			// (finishedAt) would move past completions it does not show.
			continue
		}
		r.PolledAt = snap.CheckedAt
		r.NotePoll(snap)
		m := snap.Metrics
		r.NoteLatency(m.E2ESecondsTotal, m.E2ECount, snap.Restarted)
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
			obs.BatchTokens = r.BatchTokens() // after /v1/models: its context length
		}
		_ = s.gpu.ObserveReplica(r.Name, obs)
		if v, ok := s.gpu.Snapshot().Replica(r.Name); ok {
			o.Sizing = v.Sizing
			if v.Sizing == gpu.SizingBatch && !r.BatchWarned {
				r.BatchWarned = true
				s.log.Warn("replica metrics lack vllm:cache_config_info: sized on its batch (max_num_seqs) instead of its KV cache; set upstream.replicas[].capacity_tokens to size it in tokens",
					"replica", r.Name, "missing_metric", "vllm:cache_config_info", "max_num_seqs", r.MaxSeqs)
			}
		}
		r.Obs.Store(o)
		s.exportReplica(r)
	}
	s.Wake()
}

// ScrapeFast is vllm.PollerConfig.Fast: whether the named replica is
// learning its batch and is to be scraped every
// upstream.learn_scrape_interval.
func (s *Server) ScrapeFast(name string) bool {
	r := s.reps.Get(name)
	return r != nil && r.LearningBatch()
}

// ScrapeHook is vllm.PollerConfig.Scrape: it reads this instance's counts
// for a replica as its /metrics is asked for and installs the answer for
// the batch estimate as it arrives, not when the round of polls lands
// (Observe).
func (s *Server) ScrapeHook(name string) func(*vllm.Metrics) {
	r := s.reps.Get(name)
	if r == nil {
		return nil
	}
	mark := r.MarkScrape(s.now())
	return func(m *vllm.Metrics) {
		learned0 := r.Learned()
		now := s.now()
		in := r.Install(m, mark, now)
		if l := r.Learned(); l != learned0 && (l == 0 || learned0 == 0 || l < learned0) {
			// Learned, lowered or forgotten: worth a line; a probe upwards
			// is not.
			s.log.Info("replica batch learned from its scrapes (waiting requests while running stays flat)",
				"replica", r.Name, "batch", l, "previous", learned0, "max_num_seqs", r.MaxSeqs)
		}
		if w := min(int64(m.CapacityWaiting().V), r.Excess()); w > 0 && in.Confirmed {
			// Full at a batch this scrape confirmed: what of this
			// instance's waits there is out of order
			// (lifecycle/takeback.go).
			s.TakeBackWaiting(r, w, mark.Sent())
		}
		if in.Distrusted {
			s.log.Warn("replica shows sequences this instance did not send or has let go: another instance shares it, or it ignores aborts; aborted requests keep their slots there until a scrape shows them gone",
				"replica", r.Name, "scraped", int64(m.Running.V+m.Waiting.V), "own", r.Count.Load())
		}
		s.Wake() // room may have changed
	}
}

// readModels reads r's /v1/models into o: base models and LoRA adapters
// (with their parent), and the context length when config sets none.
func (s *Server) readModels(ctx context.Context, r *fleet.Replica, models ModelLister, o *fleet.Obs) {
	mctx, cancel := context.WithTimeout(ctx, 2*time.Second)
	defer cancel()
	ms, err := models.Models(mctx, r.URL)
	var ue *vllm.UpstreamError
	if errors.As(err, &ue) && (ue.Status == http.StatusUnauthorized || ue.Status == http.StatusForbidden) && !r.AuthWarned {
		// vLLM's --api-key guards /v1 only: /health and /metrics answer, so
		// the replica looks up while every request to it would fail.
		r.AuthWarned = true
		s.log.Warn("replica refuses Sluice's credential on /v1/models: set or correct upstream.replicas[].api_key_env or api_key_file",
			"replica", r.Name, "status", ue.Status)
	}
	r.NoteModels(err, s.now())
	if err != nil {
		return
	}
	r.AuthWarned = false
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

func (s *Server) exportReplica(r *fleet.Replica) {
	s.m.ReplicaInflight.WithLabelValues(r.Name).Set(float64(r.Load.Load()))
	held := 0.0
	if r.Distrusted(s.now()) {
		held = 1
	}
	s.m.ReplicaAborts.WithLabelValues(r.Name).Set(held)
	s.m.ReplicaShare.WithLabelValues(r.Name).Set(float64(r.Share.Load()))
	s.m.ReplicaBatch.WithLabelValues(r.Name).Set(float64(r.Learned()))
	s.m.ReplicaService.WithLabelValues(r.Name).Set(r.ServiceTime())
	s.m.ReplicaReserve.WithLabelValues(r.Name).Set(s.Pools().ReservedOn(r.Slot, s.now().UnixNano()))
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
