package sim

import (
	"cmp"
	"context"
	"math"
	"net/http"
	"slices"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

// Sequence states published to handlers.
const (
	stActive   int32 = iota // waiting or running
	stFinished              // reached its target; out is final
	stAborted               // dropped after a cancel
	stError                 // the engine died
)

// seq is one choice of one prompt: vLLM's child request.
type seq struct {
	req    *request
	choice int    // index in the response's choices
	prompt int    // prompt tokens
	target int    // tokens to generate
	key    uint64 // output text key
	atCap  bool   // target == the request's cap: finish_reason "length"
	// hashes are the prompt's full-block hashes for the prefix cache
	// (prefixcache.go); cached is the hit at first admission.
	hashes []uint64
	cached int
	order  uint64 // arrival order, set by the engine

	// Owned by the engine goroutine.
	gen       int  // tokens generated
	blocks    int  // KV blocks held
	prefilled bool // has produced its first token since (re)admission
	computed  int  // prompt (+ recomputed) tokens prefilled since admission
	chunk     int  // tokens prefilled in the current step
	started   bool // has produced a token at all

	// Published to the handler: out is stored before state.
	out   atomic.Int32
	state atomic.Int32
}

// request groups the sequences of one HTTP request.
type request struct {
	seqs     []*seq
	priority int
	arrived  time.Time
	// lora is the LoRA adapter the request asked for ("" for a base model).
	lora   string
	notify chan struct{} // size 1: the engine has news for the handler
	cancel atomic.Bool   // set by the handler: drop this request

	counted bool // engine-owned: counted in sim_aborted_requests_total
}

func newRequest(priority int, arrived time.Time) *request {
	return &request{priority: priority, arrived: arrived, notify: make(chan struct{}, 1)}
}

func (r *request) wake() {
	select {
	case r.notify <- struct{}{}:
	default:
	}
}

// maxCatchUp bounds how far behind its schedule the engine may run and
// still catch up (steps then follow without waiting); beyond it, as after
// a stall of the host, the schedule restarts from now.
const maxCatchUp = 50 * time.Millisecond

// engine is the continuous-batching step loop of one replica.
type engine struct {
	cfg         *Config
	clk         Clock
	m           *metrics
	st          *counters
	totalBlocks int

	wake chan struct{} // size 1: inbox or cancels changed
	dead atomic.Bool

	mu    sync.Mutex // guards inbox and inboxTokens
	inbox []*seq
	// inboxTokens is the prompt tokens in inbox, for queue limits.
	inboxTokens int

	// Owned by the engine goroutine.
	waiting    []*seq
	running    []*seq
	freeBlocks int
	nextOrder  uint64
	stepRand   uint64 // per-step fault stream
	wakeBuf    []*request
	pubBuf     []*seq
	// waitingTokens is published for MaxNumQueuedTokens checks.
	waitingTokens atomic.Int64
	cache         *prefixCache // nil with DisablePrefixCaching
	// deferred counts the waiting sequences the last schedule skipped for
	// the LoRA budget (MaxLoRAs).
	deferred int
}

func newEngine(cfg *Config, m *metrics, st *counters) *engine {
	blocks := cfg.KVTokens / cfg.BlockSize
	e := &engine{
		cfg: cfg, clk: cfg.Clock, m: m, st: st,
		totalBlocks: blocks, freeBlocks: blocks,
		wake:     make(chan struct{}, 1),
		stepRand: mix(uint64(cfg.Seed)) ^ mix(uint64(cfg.ReplicaIndex)+0x5eed),
	}
	if !cfg.DisablePrefixCaching {
		e.cache = newPrefixCache(blocks)
	}
	return e
}

func (e *engine) signal() {
	select {
	case e.wake <- struct{}{}:
	default:
	}
}

// submit queues a request's sequences, or refuses it with vLLM's 503 when
// a queue limit is set and reached, or a 500 once the engine is dead.
func (e *engine) submit(r *request) *apiError {
	if e.dead.Load() {
		return newAPIError(http.StatusInternalServerError, "", "The engine is dead.")
	}
	tokens := 0
	for _, s := range r.seqs {
		tokens += s.prompt
	}
	e.mu.Lock()
	// vLLM's limit counts the engine's requests, waiting and running
	// (vllm/v1/engine/admission_control.py).
	if lim := e.cfg.MaxNumQueuedReqs; lim > 0 && int(e.st.waiting.Load()+e.st.running.Load())+len(e.inbox)+len(r.seqs) > lim {
		e.mu.Unlock()
		return newAPIError(http.StatusServiceUnavailable, "", "The waiting queue is full (max_num_queued_reqs=%d).", lim)
	}
	if lim := e.cfg.MaxNumQueuedTokens; lim > 0 && int(e.waitingTokens.Load())+e.inboxTokens+tokens > lim {
		e.mu.Unlock()
		return newAPIError(http.StatusServiceUnavailable, "", "The waiting queue is full (max_num_queued_tokens=%d).", lim)
	}
	e.inbox = append(e.inbox, r.seqs...)
	e.inboxTokens += tokens
	e.mu.Unlock()
	e.signal()
	return nil
}

func (e *engine) blocksFor(tokens int) int { return (tokens + e.cfg.BlockSize - 1) / e.cfg.BlockSize }

// roll returns the next per-step random number in [0, 1).
func (e *engine) roll() float64 {
	e.stepRand++
	return unitFloat(mix(e.stepRand))
}

func unitFloat(x uint64) float64 { return float64(x>>11) / (1 << 53) }

// run is the step loop; it returns when ctx ends.
func (e *engine) run(ctx context.Context) error {
	start := e.clk.Now()
	var deadC <-chan time.Time
	if d := e.cfg.Faults.DeadAfter; d > 0 {
		deadC = e.clk.After(d)
	}
	var lastEnd time.Time
	contiguous := false
	for {
		if deadC != nil && e.clk.Now().Sub(start) >= e.cfg.Faults.DeadAfter {
			e.die()
			deadC = nil
		}
		e.drainInbox()
		e.reapCancelled()
		if e.dead.Load() {
			e.failAll()
		}
		if len(e.running) == 0 && len(e.waiting) == 0 {
			e.publishGauges()
			contiguous = false
			select {
			case <-ctx.Done():
				return nil
			case <-e.wake:
			case <-deadC:
			}
			continue
		}
		if f := e.cfg.Faults; f.StallRate > 0 && e.roll() < f.StallRate {
			contiguous = false
			select {
			case <-ctx.Done():
				return nil
			case <-e.clk.After(f.Stall):
			}
			continue
		}
		prefill, decoding := e.schedule()
		e.publishGauges()
		if len(e.running) == 0 {
			// Nothing fits (cannot happen with a valid config); wait for news.
			contiguous = false
			select {
			case <-ctx.Done():
				return nil
			case <-e.wake:
			}
			continue
		}
		dur := e.cfg.DecodeStep + time.Duration(decoding)*e.cfg.DecodeStepPerSeq +
			time.Duration(float64(prefill)/e.cfg.PrefillTPS*float64(time.Second))
		if f := e.cfg.Faults; f.SpikeRate > 0 && e.roll() < f.SpikeRate {
			dur += f.Spike
		}
		now := e.clk.Now()
		stepStart := now
		busy := dur
		if contiguous && now.Sub(lastEnd) < maxCatchUp+dur {
			// Keep the step cadence exact: the engine's own work between
			// steps, and a late wake-up of this goroutine, is not simulated
			// GPU time; a late engine catches up with shorter waits.
			stepStart = lastEnd
		} else if contiguous {
			// Too late to catch up (an overloaded host): the batch was not
			// empty meanwhile, so the lost time is still busy time, as a
			// GPU's busy counter would see it.
			busy += now.Sub(lastEnd)
		}
		end := stepStart.Add(dur)
		if wait := end.Sub(now); wait > 0 {
			select {
			case <-ctx.Done():
				return nil
			case <-e.clk.After(wait):
			}
		}
		lastEnd, contiguous = end, true
		e.finishStep(busy, end)
	}
}

func (e *engine) drainInbox() {
	e.mu.Lock()
	in := e.inbox
	e.inbox = nil
	e.inboxTokens = 0
	e.mu.Unlock()
	for _, s := range in {
		s.order = e.nextOrder
		e.nextOrder++
		e.enqueue(s, false)
	}
}

// enqueue adds s to the waiting queue: at the back (FCFS) or by priority
// then arrival; a preempted sequence goes back to the front (FCFS).
func (e *engine) enqueue(s *seq, front bool) {
	switch {
	case e.cfg.SchedulingPolicy == PolicyPriority:
		i, _ := slices.BinarySearchFunc(e.waiting, s, func(a, b *seq) int {
			if c := cmp.Compare(a.req.priority, b.req.priority); c != 0 {
				return c
			}
			return cmp.Compare(a.order, b.order)
		})
		e.waiting = slices.Insert(e.waiting, i, s)
	case front:
		e.waiting = slices.Insert(e.waiting, 0, s)
	default:
		e.waiting = append(e.waiting, s)
	}
	e.waitingTokens.Add(int64(s.prompt))
}

// reapCancelled drops cancelled sequences, waiting or running.
func (e *engine) reapCancelled() {
	e.waiting = slices.DeleteFunc(e.waiting, func(s *seq) bool {
		if !s.req.cancel.Load() {
			return false
		}
		e.waitingTokens.Add(-int64(s.prompt))
		e.abortSeq(s)
		return true
	})
	e.running = slices.DeleteFunc(e.running, func(s *seq) bool {
		if !s.req.cancel.Load() {
			return false
		}
		e.abortSeq(s)
		return true
	})
}

// abortSeq frees s (which the caller removes from its list) and counts it.
func (e *engine) abortSeq(s *seq) {
	e.freeBlocks += s.blocks
	s.blocks = 0
	s.state.Store(stAborted)
	e.m.success(reasonAbort)
	e.st.abortedSeqs.Add(1)
	if !s.req.counted {
		s.req.counted = true
		e.m.aborted.Inc()
		e.st.aborted.Add(1)
	}
	s.req.wake()
}

func (e *engine) die() {
	e.dead.Store(true)
}

func (e *engine) failAll() {
	for _, s := range e.waiting {
		s.state.Store(stError)
		e.m.success(reasonError)
		s.req.wake()
	}
	for _, s := range e.running {
		e.freeBlocks += s.blocks
		s.blocks = 0
		s.state.Store(stError)
		e.m.success(reasonError)
		s.req.wake()
	}
	e.waiting, e.running = e.waiting[:0], e.running[:0]
	e.waitingTokens.Store(0)
}

// schedule makes room for the running sequences' next token, preempting
// when KV is short, then admits waiting sequences. It returns the prompt
// tokens to prefill and the number of decoding sequences in this step.
// With MaxNumBatchedTokens, decodes take one token of the step's budget
// each and prefills are chunked into what remains (chunked prefill).
func (e *engine) schedule() (prefill, decoding int) {
	budget := e.cfg.MaxNumBatchedTokens
	if budget == 0 {
		budget = math.MaxInt
	}
	preempted := false
	for len(e.running) > 0 {
		// Decodes need room for their next token; a sequence still in
		// prefill needs room for at least one more prompt token.
		need := 0
		for _, s := range e.running {
			need += e.blocksFor(e.minTokens(s)) - s.blocks
		}
		if need <= e.freeBlocks {
			break
		}
		e.preempt(e.victim())
		preempted = true
	}
	for _, s := range e.running {
		if s.prefilled {
			nb := e.blocksFor(s.prompt + s.gen + 1)
			e.freeBlocks -= nb - s.blocks
			s.blocks = nb
			decoding++
			budget--
		}
	}
	for _, s := range e.running {
		if !s.prefilled {
			s.chunk = e.grant(s, max(0, min(s.prompt+s.gen-s.computed, budget)))
			budget -= s.chunk
			prefill += s.chunk
		}
	}
	// With a LoRA budget, a waiting request whose adapter is not running
	// while MaxLoRAs adapters are is skipped, and those behind it may run
	// (vllm/v1/core/sched/scheduler.py skips it and counts it deferred).
	var active map[string]bool
	if e.cfg.MaxLoRAs > 0 {
		active = e.runningLoRAs()
	}
	e.deferred = 0
	i := 0
	for !preempted && budget > 0 && i < len(e.waiting) && len(e.running) < e.cfg.MaxNumSeqs {
		// As vLLM, no new admissions in a step that had to preempt. vLLM v1
		// admits a request when its first chunk fits, not its whole
		// prompt (vllm/v1/core/sched/scheduler.py: allocate_slots for
		// num_new_tokens of this step).
		s := e.waiting[i]
		if l := s.req.lora; active != nil && l != "" && !active[l] && len(active) >= e.cfg.MaxLoRAs {
			e.deferred++
			i++
			continue
		}
		chunk := min(s.prompt+s.gen, budget)
		if e.blocksFor(e.chunkTokens(s, chunk)) > e.freeBlocks {
			break
		}
		if i == 0 {
			e.waiting = e.waiting[1:]
		} else {
			e.waiting = slices.Delete(e.waiting, i, i+1)
		}
		if active != nil && s.req.lora != "" {
			active[s.req.lora] = true
		}
		e.waitingTokens.Add(-int64(s.prompt))
		s.blocks = 0
		s.prefilled = false
		s.computed = e.prefixHit(s)
		s.chunk = e.grant(s, min(s.prompt+s.gen-s.computed, budget))
		budget -= s.chunk
		prefill += s.chunk
		e.running = append(e.running, s)
	}
	if len(e.waiting) == 0 {
		e.waiting = nil // let the backing array go
	}
	e.m.promptTokens.Add(float64(prefill))
	e.st.promptTokens.Add(int64(prefill))
	return prefill, decoding
}

// chunkTokens is the KV a prefilling sequence holds once chunk more prompt
// tokens are computed: the whole sequence plus its first output token when
// the chunk completes the prompt.
func (e *engine) chunkTokens(s *seq, chunk int) int {
	t := s.computed + chunk
	if t >= s.prompt+s.gen {
		t = s.prompt + s.gen + 1
	}
	return t
}

// minTokens is the KV s needs to make progress this step.
func (e *engine) minTokens(s *seq) int {
	if s.prefilled {
		return s.prompt + s.gen + 1
	}
	return e.chunkTokens(s, 1)
}

// grant allocates KV blocks for up to chunk more prompt tokens of s and
// returns how many fit.
func (e *engine) grant(s *seq, chunk int) int {
	for chunk > 0 && e.blocksFor(e.chunkTokens(s, chunk))-s.blocks > e.freeBlocks {
		chunk = min(chunk-1, (s.blocks+e.freeBlocks)*e.cfg.BlockSize-s.computed)
	}
	if chunk <= 0 {
		return 0
	}
	nb := e.blocksFor(e.chunkTokens(s, chunk))
	e.freeBlocks -= nb - s.blocks
	s.blocks = nb
	return chunk
}

// victim returns the index in running of the sequence to preempt: the
// newest (FCFS) or the worst priority, then newest (priority).
func (e *engine) victim() int {
	v := len(e.running) - 1
	if e.cfg.SchedulingPolicy == PolicyPriority {
		for i, s := range e.running {
			w := e.running[v]
			if s.req.priority > w.req.priority || (s.req.priority == w.req.priority && s.order > w.order) {
				v = i
			}
		}
	}
	return v
}

func (e *engine) preempt(i int) {
	s := e.running[i]
	e.running = slices.Delete(e.running, i, i+1)
	e.freeBlocks += s.blocks
	s.blocks = 0
	s.prefilled = false
	s.computed, s.chunk = 0, 0
	e.enqueue(s, true)
	e.m.preemptions.Inc()
	e.st.preemptions.Add(1)
}

// finishStep gives each running sequence its token, unless it was
// cancelled during the step, and retires finished ones. Counters are
// updated before any handler is woken, so a response never runs ahead of
// Stats.
func (e *engine) finishStep(dur time.Duration, end time.Time) {
	produced := 0
	wake := e.wakeBuf[:0]
	pub := e.pubBuf[:0]
	keep := e.running[:0]
	for _, s := range e.running {
		r := s.req
		if r.cancel.Load() {
			e.abortSeq(s)
			continue
		}
		if !s.prefilled {
			s.computed += s.chunk
			s.chunk = 0
			if s.computed < s.prompt+s.gen {
				keep = append(keep, s) // prefill continues next step
				continue
			}
			e.prefixStore(s)
		}
		s.gen++
		produced++
		if !s.started {
			s.started = true
			e.m.ttft.Observe(end.Sub(r.arrived).Seconds())
		} else if s.prefilled {
			e.m.itl.Observe(dur.Seconds())
		}
		s.prefilled = true
		pub = append(pub, s)
		if s.gen >= s.target {
			e.freeBlocks += s.blocks
			s.blocks = 0
			if s.atCap {
				e.m.success(reasonLength)
			} else {
				e.m.success(reasonStop)
			}
			e.m.e2e.Observe(end.Sub(r.arrived).Seconds())
			e.st.finishedSeqs.Add(1)
		} else {
			keep = append(keep, s)
		}
		if len(wake) == 0 || wake[len(wake)-1] != r {
			wake = append(wake, r)
		}
	}
	clear(e.running[len(keep):])
	e.running = keep
	e.m.genTokens.Add(float64(produced))
	e.st.genTokens.Add(int64(produced))
	e.st.steps.Add(1)
	e.st.busy.Add(int64(dur))
	e.m.util.add(end, dur)
	e.publishGauges()
	for _, s := range pub {
		s.out.Store(int32(s.gen))
		if s.gen >= s.target {
			s.state.Store(stFinished)
		}
	}
	for _, r := range wake {
		r.wake()
	}
	clear(wake)
	clear(pub)
	e.wakeBuf, e.pubBuf = wake[:0], pub[:0]
}

func (e *engine) publishGauges() {
	waiting := len(e.waiting)
	deferred := min(e.deferred, waiting)
	e.st.running.Store(int64(len(e.running)))
	e.st.waiting.Store(int64(waiting))
	e.st.deferred.Store(int64(deferred))
	e.st.kvUsedBlocks.Store(int64(e.totalBlocks - e.freeBlocks))
	e.m.running.Set(float64(len(e.running)))
	e.m.waiting.Set(float64(waiting))
	e.m.waitingCapacity.Set(float64(waiting - deferred))
	e.m.waitingDeferred.Set(float64(deferred))
	e.m.kvUsage.Set(float64(e.totalBlocks-e.freeBlocks) / float64(e.totalBlocks))
	if e.m.loraInfo != nil {
		e.m.loraInfo.WithLabelValues(strconv.Itoa(e.cfg.MaxLoRAs), e.loraList(e.waiting), e.loraList(e.running)).
			Set(float64(e.clk.Now().UnixNano()) / 1e9)
	}
}

// runningLoRAs is the set of adapters in the running batch.
func (e *engine) runningLoRAs() map[string]bool {
	m := map[string]bool{}
	for _, s := range e.running {
		if s.req.lora != "" {
			m[s.req.lora] = true
		}
	}
	return m
}

// loraList is the distinct adapters of seqs, comma-joined in first-seen
// order, as vLLM's lora_requests_info labels (",".join of a dict's keys).
func (e *engine) loraList(seqs []*seq) string {
	var out []string
	for _, s := range seqs {
		if l := s.req.lora; l != "" && !slices.Contains(out, l) {
			out = append(out, l)
		}
	}
	return strings.Join(out, ",")
}
