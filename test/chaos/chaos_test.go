package chaos

import (
	"bytes"
	"context"
	"encoding/json"
	"flag"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/sluicehq/sluice/internal/testport"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/ledger/redisledger"
	"github.com/sluicehq/sluice/scheduler/config"
	"github.com/sluicehq/sluice/vllm/sim"
)

var (
	flagSeeds   = flag.Int("chaos.seeds", 3, "seeds per backend (0: skip); the default is make test's short run")
	flagBase    = flag.Uint64("chaos.base", 1, "first seed")
	flagSeed    = flag.Uint64("chaos.seed", 0, "replay this one seed")
	flagTraffic = flag.Duration("chaos.traffic", 3*time.Second, "traffic phase of each run")
	flagRace    = flag.Bool("chaos.race", false, "build sluice with the race detector")
	flagBin     = flag.String("chaos.bin", "", "run this sluice binary instead of building one (e.g. an older commit's)")
)

const (
	adminToken = "chaos-admin-token-0123456789"
	ledgerKey  = "chaos-ledger-id-key-0123456789abcdef"
	leaseTTL   = 3 * time.Second
	window     = 744 * time.Hour // 31 days: one window for the whole run
	maxOut     = 48              // tenants' max_output_tokens
	// clusterNodes is the size of the "cluster" backend's Redis Cluster.
	clusterNodes = 3
)

func TestMain(m *testing.M) {
	flag.Parse()
	if len(seeds()) == 0 {
		os.Exit(m.Run())
	}
	if *flagBin != "" {
		sluiceBin = *flagBin
		os.Exit(m.Run())
	}
	dir, err := os.MkdirTemp("", "sluice-chaos-")
	if err != nil {
		fmt.Fprintln(os.Stderr, err)
		os.Exit(1)
	}
	sluiceBin = filepath.Join(dir, "sluice")
	args := []string{"build", "-o", sluiceBin}
	if *flagRace {
		args = append(args, "-race")
	}
	cmd := exec.Command("go", append(args, "github.com/sluicehq/sluice/cmd/sluice")...)
	cmd.Stdout, cmd.Stderr = os.Stderr, os.Stderr
	if err := cmd.Run(); err != nil {
		fmt.Fprintln(os.Stderr, "chaos: building sluice:", err)
		os.Exit(1)
	}
	code := m.Run()
	_ = os.RemoveAll(dir)
	os.Exit(code)
}

func seeds() []uint64 {
	if *flagSeeds <= 0 && *flagSeed == 0 {
		return nil
	}
	if *flagSeed != 0 {
		return []uint64{*flagSeed}
	}
	out := make([]uint64, *flagSeeds)
	for i := range out {
		out[i] = *flagBase + uint64(i)
	}
	return out
}

// TestChaos runs the seeded fault simulator on each ledger backend: the
// embedded ledger, one redis-server, and a three-node Redis Cluster.
func TestChaos(t *testing.T) {
	for bi, backend := range []string{"memory", "redis", "cluster"} {
		t.Run(backend, func(t *testing.T) {
			for _, seed := range seeds() {
				t.Run(strconv.FormatUint(seed, 10), func(t *testing.T) {
					p := makePlan(seed, uint64(bi), backend, *flagTraffic)
					w := newWorld(t, p)
					w.run()
					if v := w.check(); len(v) > 0 {
						t.Errorf("seed %d on %s: %d violation(s):\n  %s\n\nevents:\n%s\nreplay: go test ./test/chaos -run 'TestChaos/%s/%d$' -chaos.seed=%d",
							seed, backend, len(v), strings.Join(v, "\n  "), w.eventLog(v), backend, seed, seed)
						for _, in := range w.inst {
							t.Logf("%s log tail:\n%s", in.name, tail(in.logPath, 25))
						}
					}
				})
			}
		})
	}
}

// --- The plan ---------------------------------------------------------------

type tenantSpec struct {
	name        string
	concurrency int
	tokens      int64 // block token budget in the run's window
	outage      bool  // outage allowance (Redis only matters)
}

var tenants = []tenantSpec{
	{name: "acme", concurrency: 3, tokens: 1 << 40},
	{name: "beta", concurrency: 2, tokens: 2500},
	{name: "gamma", concurrency: 2, tokens: 1 << 40, outage: true},
	{name: "late", concurrency: 2, tokens: 1 << 40}, // added by a reload
}

func tenantByName(name string) tenantSpec {
	for _, t := range tenants {
		if t.name == name {
			return t
		}
	}
	panic(name)
}

func rawKey(tenant string) string { return "sk-chaos-" + tenant + "-key" }

type evKind int

const (
	evAttempt evKind = iota
	evKill
	evRestart
	evKillForever
	evReplyLoss
	evStall
	evClamp
	evUnclamp
	evBudget
	evReload
	evMigrate
)

var evNames = [...]string{"attempt", "kill-9", "restart", "kill-9 (no restart)", "redis reply loss", "redis stall",
	"clamp", "unclamp", "budget", "reload", "redis slot move"}

type opSpec struct {
	id         int
	tenant     string
	kind       opKind
	shape      shape
	model      string // "": the replicas' first model
	items      int    // list inputs, score/rerank documents, chat documents
	docWords   int    // words per chat document
	cutFirst   bool   // streamed responses: the client leaves at the first delta
	stream     bool
	n          int
	maxTokens  int // 0: unset
	words      int
	timeout    time.Duration
	idem       string
	disconnect time.Duration // 0: never
	badN       bool
	slow       time.Duration // the replica holds the request this long first (a long generation)
}

type event struct {
	at      time.Duration
	kind    evKind
	op      *opSpec
	attempt int // evAttempt: 0 first, 1 retry
	inst    int
	n       int
	d       time.Duration
	tenant  string
}

func (e event) String() string {
	s := fmt.Sprintf("%7.3fs %-20s inst=%d", e.at.Seconds(), evNames[e.kind], e.inst)
	if e.op != nil {
		o := e.op
		s += fmt.Sprintf(" op=%d try=%d tenant=%s kind=%s shape=%s stream=%v n=%d max_tokens=%d timeout=%v idem=%q disconnect=%v badN=%v",
			o.id, e.attempt, o.tenant, o.kind, o.shape, o.stream, o.n, o.maxTokens, o.timeout, o.idem, o.disconnect, o.badN)
		if o.model != "" {
			s += " model=" + o.model
		}
		if o.items > 0 {
			s += fmt.Sprintf(" items=%d doc_words=%d", o.items, o.docWords)
		}
		if o.cutFirst {
			s += " cut-at-first-delta"
		}
		if o.slow > 0 {
			s += fmt.Sprintf(" slow=%v", o.slow)
		}
	}
	if e.tenant != "" {
		s += " tenant=" + e.tenant
	}
	if e.n != 0 {
		s += fmt.Sprintf(" n=%d", e.n)
	}
	if e.d != 0 {
		s += fmt.Sprintf(" for=%v", e.d)
	}
	return s
}

type plan struct {
	seed      uint64
	backend   string
	instances int
	traffic   time.Duration
	replicas  []sim.Faults
	// batch is the sequences each replica really runs; Sluice's config
	// leaves max_num_seqs at its default, so it learns them.
	batch  int
	events []event
	ops    map[int]*opSpec
}

func makePlan(seed, stream uint64, backend string, traffic time.Duration) *plan {
	rng := rand.New(rand.NewPCG(seed, stream))
	p := &plan{seed: seed, backend: backend, instances: 1, traffic: traffic, ops: map[int]*opSpec{}}
	if backend != "memory" {
		p.instances = 2
	}
	// One seed in three runs replicas whose batch (1) is below the
	// tenants' caps summed, with longer generations, the default scrape
	// cadences and a burst of acme's streams first: the pool is
	// overloaded, the batch is learned under faults, and what waits inside
	// a replica is taken back (SCHEDULING §7). Drawn from its own stream,
	// so that the other seeds' plans stay as they were.
	p.batch = 16
	if rand.New(rand.NewPCG(seed, stream^0xba7c)).IntN(3) == 0 {
		p.batch = 1
	}
	for range 2 {
		var f sim.Faults
		if rng.IntN(2) == 0 {
			f.DropRate = 0.04
		}
		if rng.IntN(3) == 0 {
			f.StreamErrorRate = 0.03
		}
		if rng.IntN(3) == 0 {
			f.ErrorRate, f.ErrorStatus = 0.03, 500
		}
		if rng.IntN(3) == 0 {
			f.StallRate, f.Stall = 0.005, 80*time.Millisecond
		}
		p.replicas = append(p.replicas, f)
	}
	at := func(lo, hi float64) time.Duration {
		return time.Duration((lo + rng.Float64()*(hi-lo)) * float64(traffic))
	}
	reloadAt := time.Duration(-1)
	if rng.Float64() < 0.35 {
		reloadAt = at(0.1, 0.5)
		p.events = append(p.events, event{at: reloadAt, kind: evReload})
	}
	if rng.Float64() < 0.5 {
		e := event{at: at(0.05, 0.6), kind: evClamp, inst: rng.IntN(p.instances), tenant: []string{"acme", "beta", "gamma"}[rng.IntN(3)],
			d: time.Duration(500+rng.IntN(2500)) * time.Millisecond}
		p.events = append(p.events, e)
		if rng.IntN(2) == 0 {
			p.events = append(p.events, event{at: e.at + time.Duration(200+rng.IntN(800))*time.Millisecond, kind: evUnclamp,
				inst: rng.IntN(p.instances), tenant: e.tenant})
		}
	}
	if rng.Float64() < 0.3 {
		p.events = append(p.events, event{at: at(0.1, 0.7), kind: evBudget, inst: rng.IntN(p.instances), tenant: "beta", n: 4000})
	}
	if rng.Float64() < 0.5 {
		k := event{at: at(0.3, 0.8), kind: evKill, inst: rng.IntN(p.instances)}
		p.events = append(p.events, k, event{at: k.at + time.Duration(200+rng.IntN(600))*time.Millisecond, kind: evRestart, inst: k.inst})
	} else if p.instances > 1 && rng.Float64() < 0.5 {
		p.events = append(p.events, event{at: at(0.4, 0.8), kind: evKillForever, inst: 1})
	}
	if backend != "memory" {
		// (inst is the Redis node: always 0 on one server)
		node := func() int {
			if backend == "cluster" {
				return rng.IntN(clusterNodes)
			}
			return 0
		}
		if rng.Float64() < 0.6 {
			p.events = append(p.events, event{at: at(0.05, 0.8), kind: evReplyLoss, n: 1 + rng.IntN(3), inst: node()})
		}
		if rng.Float64() < 0.4 {
			p.events = append(p.events, event{at: at(0.1, 0.7), kind: evStall, d: time.Duration(400+rng.IntN(800)) * time.Millisecond,
				inst: node()})
		}
		if backend == "cluster" && rng.Float64() < 0.6 {
			p.events = append(p.events, event{at: at(0.1, 0.7), kind: evMigrate, tenant: []string{"acme", "beta", "gamma"}[rng.IntN(3)]})
		}
	}
	id := 0
	if rng.IntN(2) == 0 {
		// Two long generations fill beta's two slots; the next two beta
		// requests wait in the queue longer than the lease.
		t0 := at(0.05, 0.3)
		for k := range 4 {
			id++
			o := &opSpec{id: id, tenant: "beta", kind: kChat, stream: k%2 == 0, n: 1, words: 8, maxTokens: 4}
			if k < 2 {
				o.slow = leaseTTL + 300*time.Millisecond
			}
			p.ops[id] = o
			p.events = append(p.events, event{at: t0 + time.Duration(k)*20*time.Millisecond, kind: evAttempt, op: o})
		}
	}
	if p.batch < 16 {
		// A batch job: a burst of acme's streams at the start, over
		// replicas whose batch is not learned yet.
		for range 12 {
			id++
			o := &opSpec{id: id, tenant: "acme", kind: kChat, stream: true, n: 1, words: 8, maxTokens: 32}
			p.ops[id] = o
			p.events = append(p.events, event{kind: evAttempt, op: o, inst: rng.IntN(p.instances)})
		}
	}
	// Traffic: Poisson arrivals at about 30 attempts/s.
	for t := time.Duration(0); ; {
		t += time.Duration(rng.ExpFloat64() / 30 * float64(time.Second))
		if t >= traffic {
			break
		}
		id++
		tn := []string{"acme", "acme", "beta", "gamma"}[rng.IntN(4)]
		if reloadAt >= 0 && t > reloadAt+200*time.Millisecond && rng.IntN(4) == 0 {
			tn = "late"
		}
		o := &opSpec{id: id, tenant: tn, kind: pickKind(rng), n: 1, words: 5 + rng.IntN(60)}
		o.shape = pickShape(rng, o.kind)
		if o.kind.generates() {
			o.stream = rng.IntN(2) == 0
			if rng.IntN(2) == 0 {
				o.maxTokens = 1 + rng.IntN(40)
			}
		}
		if (o.kind == kChat || o.kind == kCompletion) && rng.IntN(6) == 0 {
			o.n = 2
		}
		if tn != "beta" && rng.IntN(5) == 0 {
			o.model = otherModel
		}
		switch o.kind {
		case kEmbed, kPooling, kClassify, kScore, kRerank:
			o.items = 1 + rng.IntN(3)
		case kChat:
			if o.shape == shDocuments {
				o.items, o.docWords = 1+rng.IntN(3), 20+rng.IntN(200)
			}
		case kResponses:
			o.cutFirst = o.stream && rng.IntN(4) == 0
		}
		if rng.Float64() < 0.3 {
			o.timeout = time.Duration(150+rng.IntN(1350)) * time.Millisecond
		}
		if rng.Float64() < 0.15 {
			o.disconnect = time.Duration(rng.IntN(250)+1) * time.Millisecond
		}
		if rng.Float64() < 0.02 && (o.kind == kChat || o.kind == kCompletion) {
			o.badN = true
		}
		if rng.Float64() < 0.04 {
			o.slow = time.Duration(1500+rng.IntN(1500)) * time.Millisecond // queues its tenant past the lease
		}
		if o.shape.hostile() {
			// Refused before admission whatever the timing: nothing to cut.
			o.timeout, o.disconnect, o.badN, o.slow, o.n, o.cutFirst = 0, 0, false, 0, 1, false
			if o.shape == shDupMaxTokens && o.maxTokens == 0 {
				o.maxTokens = 8 // the first of the two caps
			}
		}
		p.ops[id] = o
		inst := rng.IntN(p.instances)
		if rng.Float64() < 0.25 && !o.shape.hostile() {
			o.idem = fmt.Sprintf("idem-%d-%d", seed, id)
			p.events = append(p.events, event{at: t, kind: evAttempt, op: o, inst: inst})
			if rng.Float64() < 0.6 {
				p.events = append(p.events, event{at: t + time.Duration(50+rng.IntN(1500))*time.Millisecond, kind: evAttempt,
					op: o, attempt: 1, inst: rng.IntN(p.instances)})
			}
			continue
		}
		p.events = append(p.events, event{at: t, kind: evAttempt, op: o, inst: inst})
	}
	sort.SliceStable(p.events, func(i, j int) bool { return p.events[i].at < p.events[j].at })
	return p
}

// --- The world --------------------------------------------------------------

type result struct {
	ev        event
	sent      time.Time
	status    int
	code      string        // error code of a refusal or of a stream's error event
	reason    string        // a refusal's details.reason
	transport string        // transport error, if any
	done      bool          // stream: [DONE] arrived
	cancelled bool          // the client left on purpose
	killed    bool          // its instance was killed while it ran (or was down)
	queued    time.Duration // Server-Timing queue;dur (Sluice's own clock); -1 unknown
}

type world struct {
	t       *testing.T
	p       *plan
	dir     string
	redis   []*redisServer    // one, or a Cluster's nodes
	proxy   []*replyLossProxy // in front of each
	reps    []string
	log     replicaLog
	inst    []*instance
	kills   []atomic.Int64 // per instance: kills so far
	reload  atomic.Bool
	start   time.Time
	budgetX atomic.Int64 // highest beta token limit ever set

	mu      sync.Mutex
	results []*result
	applied []string // admin event outcomes, for the log
}

func newWorld(t *testing.T, p *plan) *world {
	w := &world{t: t, p: p, dir: t.TempDir(), kills: make([]atomic.Int64, p.instances)}
	w.budgetX.Store(tenantByName("beta").tokens)
	for i, f := range p.replicas {
		cfg := sim.DefaultConfig()
		cfg.MaxNumSeqs = p.batch
		cfg.OutputLenMax = 32
		cfg.MaxModelLen = 16384 // a hidden prompt of hiddenWords fits: the replica runs what it is sent
		cfg.DecodeStep = 3 * time.Millisecond
		if p.batch < 16 {
			cfg.DecodeStep = 10 * time.Millisecond // what waits still waits at the scrape that learns the batch
		}
		cfg.Seed = int64(p.seed)
		cfg.ReplicaIndex = i
		cfg.ServedModelNames = []string{otherModel}
		cfg.MediaTokens = mediaTokens
		cfg.Faults = f
		if cfg.Faults.ErrorStatus == 0 {
			cfg.Faults.ErrorStatus = 500
		}
		w.reps = append(w.reps, startReplica(t, cfg, &w.log, p.ops))
	}
	switch p.backend {
	case "redis":
		w.redis, w.proxy = startStore(t, 1)
	case "cluster":
		w.redis, w.proxy = startStore(t, clusterNodes)
	}
	for i := range p.instances {
		in := &instance{
			name:    fmt.Sprintf("sluice-%d", i),
			config:  filepath.Join(w.dir, fmt.Sprintf("sluice-%d.yaml", i)),
			api:     fmt.Sprintf("http://127.0.0.1:%d", testport.Free(t)),
			admin:   fmt.Sprintf("http://127.0.0.1:%d", testport.Free(t)),
			logPath: filepath.Join(w.dir, fmt.Sprintf("sluice-%d.log", i)),
			env:     []string{"SLUICE_ADMIN_TOKEN=" + adminToken, "SLUICE_LEDGER_KEY=" + ledgerKey},
		}
		w.inst = append(w.inst, in)
		w.writeConfig(i, false)
		in.start(t)
	}
	t.Cleanup(func() {
		for _, in := range w.inst {
			in.kill()
		}
	})
	return w
}

func (w *world) writeConfig(i int, withLate bool) {
	in := w.inst[i]
	var b strings.Builder
	fmt.Fprintf(&b, "listen: %s\nadmin_listen: %s\n", strings.TrimPrefix(in.api, "http://"), strings.TrimPrefix(in.admin, "http://"))
	fmt.Fprintf(&b, "ledger:\n  lease_ttl: %s\n", leaseTTL)
	if w.p.backend != "memory" {
		var addrs []string
		for _, p := range w.proxy {
			addrs = append(addrs, strconv.Quote(p.addr()))
		}
		fmt.Fprintf(&b, "  backend: redis\n  redis: {addrs: [%s]}\n", strings.Join(addrs, ", "))
	} else {
		fmt.Fprintf(&b, "  backend: memory\n  journal: %q\n", filepath.Join(w.dir, "journal"))
	}
	if w.p.batch < 16 {
		b.WriteString("upstream:\n  replicas:\n") // the default cadences: the learning scrape and the ramp
	} else {
		b.WriteString("upstream:\n  scrape_interval: 50ms\n  replicas:\n")
	}
	for j, u := range w.reps {
		fmt.Fprintf(&b, "    - {name: r%d, url: %q}\n", j, u)
	}
	b.WriteString("gpu: {telemetry: off}\n")
	// A hold prediction floor below every cap: streamed chat and
	// completions hold 8 output tokens per choice and grow through the
	// ledger as they generate (the first usage chunk asks for the step).
	fmt.Fprintf(&b, "server: {drain_timeout: 5s, max_wait: 5s, media_allowance: %d, hold_prediction: {floor_tokens: 8, step_tokens: %d}}\n", mediaAllowance, predictStep)
	fmt.Fprintf(&b, "admin: {state_file: %q}\n", filepath.Join(w.dir, fmt.Sprintf("admin-%d.json", i)))
	fmt.Fprintf(&b, "audit: {path: %q}\n", filepath.Join(w.dir, fmt.Sprintf("audit-%d.log", i)))
	b.WriteString("tenants:\n")
	for _, t := range tenants {
		if t.name == "late" && !withLate {
			continue
		}
		fmt.Fprintf(&b, "  - name: %s\n    api_keys: [%q]\n    concurrency: %d\n    max_output_tokens: %d\n    max_input_tokens: %d\n",
			t.name, config.HashKey(rawKey(t.name)), t.concurrency, maxOut, maxInputTokens)
		if ms := tenantModels[t.name]; len(ms) > 0 {
			fmt.Fprintf(&b, "    models: [%s]\n", strings.Join(ms, ", "))
		}
		// max_wait above lease_ttl: a queued hold must be renewed. Beta
		// queues in EDF order, the others FIFO, so both orders hold
		// queues that outlive the lease.
		order := ""
		if t.name == "beta" {
			order = ", order: edf"
		}
		fmt.Fprintf(&b, "    queue: {max_depth: 32, max_wait: 4s%s}\n    budgets:\n", order)
		fmt.Fprintf(&b, "      - {dimension: tokens, limit: %d, window: %s}\n", t.tokens, window)
		fmt.Fprintf(&b, "      - {dimension: requests, limit: %d, window: %s}\n", int64(1)<<40, window)
		if t.outage {
			b.WriteString("    outage_allowance: {requests: 4, tokens: 4000}\n")
		}
	}
	// A fleet-wide budget on every request that never denies: the checker
	// finds its holds and charges equal to the tenants' sums.
	fmt.Fprintf(&b, "global:\n  budgets:\n      - {dimension: tokens, limit: %d, window: %s}\n", int64(1)<<40, window)
	fmt.Fprintf(&b, "      - {dimension: requests, limit: %d, window: %s}\n", int64(1)<<40, window)
	if err := os.WriteFile(in.config, []byte(b.String()), 0o644); err != nil {
		w.t.Fatalf("write config: %v", err)
	}
}

func (w *world) note(format string, args ...any) {
	w.mu.Lock()
	w.applied = append(w.applied, fmt.Sprintf("%7.3fs ", time.Since(w.start).Seconds())+fmt.Sprintf(format, args...))
	w.mu.Unlock()
}

// run plays the schedule, waits for every attempt, then lets the system
// quiesce.
func (w *world) run() {
	w.start = time.Now()
	var wg sync.WaitGroup
	for _, ev := range w.p.events {
		if d := time.Until(w.start.Add(ev.at)); d > 0 {
			time.Sleep(d) // the schedule's own clock, not synchronisation
		}
		switch ev.kind {
		case evAttempt:
			wg.Add(1)
			go func() { defer wg.Done(); w.attempt(ev) }()
		case evKill, evKillForever:
			w.kills[ev.inst].Add(1)
			w.inst[ev.inst].kill()
			if ev.kind == evKillForever {
				w.note("%s stays down", w.inst[ev.inst].name)
			}
			w.note("killed %s", w.inst[ev.inst].name)
		case evRestart:
			w.inst[ev.inst].start(w.t)
			w.note("restarted %s", w.inst[ev.inst].name)
		case evReplyLoss:
			w.proxy[ev.inst].armed.Store(int32(ev.n))
			w.note("armed reply loss for %d script replies of redis node %d", ev.n, ev.inst)
		case evStall:
			w.redis[ev.inst].stall(ev.d)
			w.note("redis node %d stalled for %v", ev.inst, ev.d)
		case evMigrate:
			wg.Add(1)
			go func() { defer wg.Done(); w.note("%s", w.migrate(ev.tenant)) }()
		case evClamp:
			code, body := adminCall(context.Background(), w.inst[ev.inst].admin, "POST", "/admin/tenants/"+ev.tenant+"/clamp", adminToken,
				map[string]any{"concurrency": 1, "reason": "chaos", "expires_in": ev.d.String()})
			w.note("clamp %s on %s: %d %s", ev.tenant, w.inst[ev.inst].name, code, short(body))
		case evUnclamp:
			code, body := adminCall(context.Background(), w.inst[ev.inst].admin, "DELETE", "/admin/tenants/"+ev.tenant+"/clamp", adminToken, nil)
			w.note("unclamp %s on %s: %d %s", ev.tenant, w.inst[ev.inst].name, code, short(body))
		case evBudget:
			code, body := adminCall(context.Background(), w.inst[ev.inst].admin, "PUT", "/admin/budgets", adminToken,
				map[string]any{"tenant": ev.tenant, "dimension": "tokens", "limit": ev.n, "window": window.String()})
			if code == http.StatusOK && int64(ev.n) > w.budgetX.Load() {
				w.budgetX.Store(int64(ev.n))
			}
			w.note("budget %s tokens=%d on %s: %d %s", ev.tenant, ev.n, w.inst[ev.inst].name, code, short(body))
		case evReload:
			w.reload.Store(true)
			for i, in := range w.inst {
				w.writeConfig(i, true)
				code, body := adminCall(context.Background(), in.admin, "POST", "/admin/reload", adminToken, nil)
				w.note("reload %s: %d %s", in.name, code, short(body))
			}
		}
	}
	wg.Wait()
}

// queueDur reads the queue wait from a Server-Timing header
// ("queue;dur=<ms>, ...").
func queueDur(h string) time.Duration {
	for _, part := range strings.Split(h, ",") {
		name, rest, _ := strings.Cut(strings.TrimSpace(part), ";")
		if name != "queue" {
			continue
		}
		if ms, err := strconv.ParseFloat(strings.TrimPrefix(rest, "dur="), 64); err == nil {
			return time.Duration(ms * float64(time.Millisecond))
		}
	}
	return -1
}

func short(s string) string {
	s = strings.TrimSpace(s)
	if len(s) > 160 {
		return s[:160] + "…"
	}
	return s
}

// attempt sends one request as a client would and records its one outcome.
func (w *world) attempt(ev event) {
	o := ev.op
	// A load balancer sends around an instance that is down.
	for i := range w.inst {
		if !w.inst[ev.inst].isDown() {
			break
		}
		ev.inst = (ev.inst + i + 1) % len(w.inst)
	}
	in := w.inst[ev.inst]
	kills := w.kills[ev.inst].Load()
	r := &result{ev: ev, sent: time.Now(), killed: in.isDown(), queued: -1}
	var cancelled atomic.Bool
	defer func() {
		r.cancelled = cancelled.Load()
		if w.kills[ev.inst].Load() != kills || in.isDown() {
			r.killed = true
		}
		w.mu.Lock()
		w.results = append(w.results, r)
		w.mu.Unlock()
	}()
	ctx, cancel := context.WithTimeout(context.Background(), 20*time.Second)
	defer cancel()
	if o.disconnect > 0 {
		tm := time.AfterFunc(o.disconnect, func() { cancelled.Store(true); cancel() })
		defer tm.Stop()
	}
	req, _ := http.NewRequestWithContext(ctx, "POST", in.api+kindPaths[o.kind], bytes.NewReader(o.body()))
	req.Header.Set("Authorization", "Bearer "+rawKey(o.tenant))
	req.Header.Set("Content-Type", "application/json")
	if o.timeout > 0 {
		req.Header.Set("X-Request-Timeout", strconv.FormatFloat(o.timeout.Seconds(), 'f', 3, 64))
	}
	if o.idem != "" {
		req.Header.Set("Idempotency-Key", o.idem)
	}
	// Named in the instance's audit trail, which a request-count violation
	// lists (chargedNotRun).
	req.Header.Set("X-Request-Id", fmt.Sprintf("chaos-%d-%d", o.id, ev.attempt))
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		r.transport = err.Error()
		return
	}
	defer resp.Body.Close()
	r.status = resp.StatusCode
	r.queued = queueDur(resp.Header.Get("Server-Timing"))
	if resp.StatusCode != http.StatusOK {
		b, _ := io.ReadAll(resp.Body)
		var e struct {
			Error struct {
				Code    any `json:"code"`
				Details struct {
					Reason string `json:"reason"`
				} `json:"details"`
			} `json:"error"`
		}
		if json.Unmarshal(b, &e) == nil && e.Error.Code != nil {
			r.code, r.reason = fmt.Sprint(e.Error.Code), e.Error.Details.Reason
		}
		return
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") && o.kind == kResponses {
		var cut func()
		if o.cutFirst {
			cut = func() { cancelled.Store(true); cancel() }
		}
		code, done, err := readEvents(resp.Body, cut)
		r.code, r.done = code, done
		if err != nil {
			r.transport = err.Error()
		}
		return
	}
	if strings.HasPrefix(resp.Header.Get("Content-Type"), "text/event-stream") {
		code, done, err := readSSE(resp.Body)
		r.code, r.done = code, done
		if err != nil {
			r.transport = err.Error()
		}
		return
	}
	if _, err := io.ReadAll(resp.Body); err != nil {
		r.transport = err.Error()
	}
}

var opRef = regexp.MustCompile(`\bop (\d+)\b`)

// eventLog is the minimal log of a failing seed: every fault and admin
// event, and the attempts of the ops the violations name.
func (w *world) eventLog(violations []string) string {
	named := map[int]bool{}
	for _, v := range violations {
		for _, m := range opRef.FindAllStringSubmatch(v, -1) {
			id, _ := strconv.Atoi(m[1])
			named[id] = true
		}
	}
	var b strings.Builder
	for _, e := range w.p.events {
		if e.kind != evAttempt || named[e.op.id] {
			b.WriteString("  " + e.String() + "\n")
		}
	}
	w.mu.Lock()
	defer w.mu.Unlock()
	for _, a := range w.applied {
		b.WriteString("  applied " + a + "\n")
	}
	fmt.Fprintf(&b, "  (%d attempts; replicas' batch %d, faults %+v; reply loss dropped %d)\n", len(w.results), w.p.batch, w.p.replicas, w.lostReplies())
	return b.String()
}

func (w *world) killedAny() bool {
	for i := range w.kills {
		if w.kills[i].Load() > 0 {
			return true
		}
	}
	return false
}

func (w *world) lostReplies() int32 {
	var n int32
	for _, p := range w.proxy {
		n += p.lost.Load()
	}
	return n
}

// --- The invariants -----------------------------------------------------------

// pinned is the error-code set of the external contract.
var pinned = map[string]bool{
	"invalid_request": true, "context_length_exceeded": true, "invalid_api_key": true, "request_too_large": true,
	"queue_full": true, "tenant_budget_exceeded": true, "workflow_budget_exceeded": true, "idempotency_conflict": true,
	"tenant_clamped": true, "deadline_exceeded": true, "ledger_unavailable": true, "no_healthy_replica": true,
	"upstream_error": true, "draining": true, "model_not_found": true,
}

func (w *world) check() []string {
	var v []string
	add := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }

	// Responses.
	byOp := map[int][]*result{}
	for _, r := range w.results {
		o := r.ev.op
		byOp[o.id] = append(byOp[o.id], r)
		id := fmt.Sprintf("op %d try %d (%s, inst %d)", o.id, r.ev.attempt, o.tenant, r.ev.inst)
		switch {
		case r.transport != "" && !r.cancelled && !r.killed:
			add("%s: transport error without a disconnect or a kill: %s", id, r.transport)
		case r.status >= 500 && r.status != 502 && r.status != 503 && r.status != 504:
			add("%s: status %d code %q", id, r.status, r.code)
		case r.status == http.StatusBadGateway && !w.replicaFaulted(o.id):
			add("%s: 502 %q but no replica failed it", id, r.code)
		case r.status == http.StatusConflict && o.idem == "":
			add("%s: 409 %q without an Idempotency-Key", id, r.code)
		case r.status != 0 && r.status != http.StatusOK && !pinned[r.code]:
			add("%s: status %d with unpinned code %q", id, r.status, r.code)
		case r.status == http.StatusOK && r.code == "ledger_error":
			add("%s: stream error event ledger_error", id)
		case r.status == http.StatusOK && o.timeout > 0 && r.queued > o.timeout+time.Millisecond:
			add("%s: dispatched after %v in the queue, past its %v deadline (Server-Timing)", id, r.queued, o.timeout)
		}
	}

	// Executions: every replica handler has returned (aborted requests end
	// within an engine step of their connection closing).
	done := make(chan struct{})
	go func() { w.log.active.Wait(); close(done) }()
	select {
	case <-done:
	case <-time.After(15 * time.Second):
		add("replica handlers still running 15s after the last client answer")
	}
	w.log.mu.Lock()
	execs := slices.Clone(w.log.execs)
	w.log.mu.Unlock()
	perOp := map[int]int{}
	v = append(v, w.markTakenBack(execs, byOp)...)
	type span struct{ a, b time.Time }
	spans := map[string][]span{}
	for _, ex := range execs {
		o := w.p.ops[ex.op]
		if o == nil {
			add("replica saw unknown op %d", ex.op)
			continue
		}
		if executed(ex) {
			perOp[ex.op]++
		}
		if o.timeout > 0 {
			var last *result
			for _, r := range byOp[o.id] {
				if !r.sent.After(ex.arrival) && (last == nil || r.sent.After(last.sent)) {
					last = r
				}
			}
			// The slack covers the hop from Sluice's last deadline check to
			// the replica's handler on a loaded 2-core machine.
			if last != nil && ex.arrival.After(last.sent.Add(o.timeout+deadlineSlack)) {
				add("op %d reached a replica %v after its deadline (%v)", o.id, ex.arrival.Sub(last.sent.Add(o.timeout)), o.timeout)
			}
		}
		if ex.completed && !ex.end.IsZero() {
			spans[o.tenant] = append(spans[o.tenant], span{ex.arrival, ex.end})
		}
	}
	// Sluice may abandon a running request only for a cause: the client
	// left or its deadline passed, its instance died, or the ledger could
	// not renew the lease (a store fault). Anything else aborted work the
	// client was still waiting for.
	storeFaults := slices.ContainsFunc(w.p.events, func(e event) bool {
		return e.kind == evReplyLoss || e.kind == evStall || e.kind == evMigrate
	})
	for _, ex := range execs {
		o := w.p.ops[ex.op]
		if o == nil || !ex.gone || ex.takenBack || o.timeout > 0 || storeFaults {
			continue
		}
		if !slices.ContainsFunc(byOp[o.id], func(r *result) bool { return r.cancelled || r.killed }) {
			add("op %d: Sluice abandoned it at the replica after %v with no client disconnect, deadline, kill or store fault",
				o.id, time.Since(ex.arrival).Round(time.Millisecond))
		}
	}
	for id, n := range perOp {
		if n > 1 {
			o := w.p.ops[id]
			add("op %d (idem %q) executed %d times", id, o.idem, n)
		}
	}
	for tn, ss := range spans {
		limit := tenantByName(tn).concurrency
		if tn == "gamma" {
			limit *= w.p.instances // outage admissions use the local cap
		}
		if peak := peakOverlap(ss, func(s span) (time.Time, time.Time) { return s.a, s.b }); peak > limit {
			add("tenant %s had %d completed requests running at once at the replicas (cap %d)", tn, peak, limit)
		}
	}

	v = append(v, w.checkLedger(byOp, execs, perOp)...)
	v = append(v, w.checkAdmitted(execs, byOp)...)
	w.t.Logf("answers by endpoint/shape (status code: count; 0 = no answer): %s", w.tally())
	for _, in := range w.inst { // every instance has stopped by now
		v = append(v, in.logProblems()...)
	}
	return v
}

// replicaFaulted reports whether a replica failed op: an error status, an
// error event, or a stream cut before its end that its client did not cut.
func (w *world) replicaFaulted(op int) bool {
	w.log.mu.Lock()
	defer w.log.mu.Unlock()
	for _, ex := range w.log.execs {
		if ex.op == op && (ex.status >= 400 || ex.errEvent || (!ex.completed && !ex.gone)) {
			return true
		}
	}
	return false
}

// deadlineSlack is how late after a client's deadline a replica may see
// its request: Sluice re-checks the deadline before its first upstream byte.
// Only gross lateness is judged here; Server-Timing's queue wait, measured
// on Sluice's own clock, is the exact check for answered requests.
const deadlineSlack = 250 * time.Millisecond

// executed reports whether a replica worked on the request: it answered 200
// or was left before writing anything (queued or in prefill); an error
// status before any output is a refusal, and an attempt taken back waited
// in the replica's queue and was charged nothing.
func executed(ex *execution) bool {
	return !ex.takenBack && (ex.status == http.StatusOK || ex.status == 0)
}

// markTakenBack finds the attempts Sluice took back from a replica's
// queue (SCHEDULING §7). A take-back is possible only where a replica's
// batch is below what Sluice may send it (p.batch): the tenants' caps sum
// to less than 16. An attempt was taken back when Sluice left it and
// either sent it again under the same X-Request-Id (a client's retry
// carries a new one), or answered its client 504 deadline_exceeded for a
// deadline before dispatch: it waited in Sluice's queue again until its
// deadline. Only a stream is ever taken back, and only before its first
// event reaches Sluice: its first output (one write: the chat role chunk
// and the first token's chunk) may be on the wire as Sluice aborts (the
// race SCHEDULING §7 names), a later event may not. A stream whose client
// left after Sluice left it, before any event past its first output, may
// have been taken back (charged nothing) or aborted for its client
// (charged): mayTakenBack.
func (w *world) markTakenBack(execs []*execution, byOp map[int][]*result) []string {
	var v []string
	byID := map[string][]*execution{}
	for _, ex := range execs {
		if ex.reqID != "" {
			byID[ex.reqID] = append(byID[ex.reqID], ex)
		}
	}
	expired := func(ex *execution) (expired, left bool) {
		for _, r := range byOp[ex.op] {
			if fmt.Sprintf("chaos-%d-%d", ex.op, r.ev.attempt) != ex.reqID {
				continue
			}
			expired = expired || (r.code == "deadline_exceeded" && r.status == http.StatusGatewayTimeout &&
				(r.reason == "max_wait" || r.reason == "server_max_wait" || r.reason == "client_deadline" || r.reason == "shed_after"))
			left = left || r.cancelled
		}
		return expired, left
	}
	n, raced := 0, 0
	for id, exs := range byID {
		slices.SortFunc(exs, func(a, b *execution) int { return a.arrival.Compare(b.arrival) })
		for i, ex := range exs {
			if !ex.gone || ex.completed {
				continue // it ran to its end: executed twice, which check names
			}
			queued, left := expired(ex)
			if i == len(exs)-1 && !queued {
				ex.mayTakenBack = left && ex.events == ex.firstOutput && w.p.batch < 16
				continue
			}
			ex.takenBack = true
			n++
			if ex.events > 0 {
				raced++
			}
			if w.p.batch >= 16 {
				v = append(v, fmt.Sprintf("op %d: %s was taken back from a replica whose batch (%d) is above all Sluice may send it", ex.op, id, w.p.batch))
			}
			if o := w.p.ops[ex.op]; o != nil && !o.stream {
				v = append(v, fmt.Sprintf("op %d: %s, not streamed, was taken back", ex.op, id))
			}
			if ex.events > ex.firstOutput {
				v = append(v, fmt.Sprintf("op %d: %s was taken back after its replica had sent %d events, %d of them past its first output", ex.op, id, ex.events, ex.events-ex.firstOutput))
			}
		}
	}
	w.t.Logf("attempts taken back from a replica's queue: %d, %d of them with their first output already sent (replicas' batch %d)", n, raced, w.p.batch)
	return v
}

func peakOverlap[T any](xs []T, iv func(T) (time.Time, time.Time)) int {
	type edge struct {
		t time.Time
		d int
	}
	var es []edge
	for _, x := range xs {
		a, b := iv(x)
		es = append(es, edge{a, 1}, edge{b, -1})
	}
	sort.Slice(es, func(i, j int) bool {
		if es[i].t.Equal(es[j].t) {
			return es[i].d < es[j].d
		}
		return es[i].t.Before(es[j].t)
	})
	peak, cur := 0, 0
	for _, e := range es {
		cur += e.d
		peak = max(peak, cur)
	}
	return peak
}

// strandedCharge is an entry of an instance's owed outage charges
// (scheduler/settle/outage.go OwedCharge).
type strandedCharge struct {
	Req     ledger.ChargeRequest `json:"req"`
	Tenant  string               `json:"tenant"`
	ReqID   string               `json:"request_id"`
	Running bool                 `json:"running"`
}

// strandedOutage reads the owed outage charges of the instances that are
// down for good: a Sluice process persists them for its own restart, so
// without one they are never charged (like UNRESOLVED records, they are a
// killed instance's loss). A call still running at the kill is left out:
// its client saw the kill, so it is an orphan already.
func (w *world) strandedOutage() []strandedCharge {
	var out []strandedCharge
	for i, in := range w.inst {
		if !in.isDown() {
			continue
		}
		b, err := os.ReadFile(filepath.Join(w.dir, fmt.Sprintf("admin-%d.json.pending.jsonl", i)))
		if err != nil {
			continue
		}
		// The pending-writes log (scheduler/settle/outbox.go): an owed charge's
		// last line (op 4) wins; op 5 says it is no longer owed.
		owed := map[ledger.RequestID]strandedCharge{}
		var order []ledger.RequestID
		for _, line := range bytes.Split(b, []byte("\n")) {
			var l struct {
				Op     int             `json:"op"`
				Ref    ledger.Ref      `json:"ref"`
				Charge *strandedCharge `json:"charge"`
			}
			if len(line) == 0 {
				continue
			}
			if err := json.Unmarshal(line, &l); err != nil {
				w.t.Errorf("%s: pending-writes log: %v", in.name, err)
				continue
			}
			switch {
			case l.Op == 4 && l.Charge != nil:
				if _, ok := owed[l.Ref.ID]; !ok {
					order = append(order, l.Ref.ID)
				}
				owed[l.Ref.ID] = *l.Charge
			case l.Op == 5:
				delete(owed, l.Ref.ID)
			}
		}
		for _, id := range order {
			if ch, ok := owed[id]; ok && !ch.Running {
				out = append(out, ch)
			}
		}
	}
	return out
}

// ledgerView is what the checker reads from the ledger.
type ledgerView interface {
	Snapshot(ctx context.Context, tenant, scope ledger.ScopeKey) (ledger.Usage, error)
	List(ctx context.Context, tenant ledger.ScopeKey, state ledger.State, limit int) ([]ledger.ReservationInfo, error)
}

// checkLedger waits for quiescence, then compares the ledger with what the
// replicas executed.
func (w *world) checkLedger(byOp map[int][]*result, execs []*execution, perOp map[int]int) []string {
	var v []string
	add := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	keyer, err := ledger.NewKeyer([]byte(ledgerKey))
	if err != nil {
		return []string{err.Error()}
	}
	ctx := context.Background()
	stranded := w.strandedOutage()
	var led ledgerView
	if w.p.backend != "memory" {
		// The servers that are still up reclaim on their own; the checker
		// only reads.
		var addrs []string
		for _, s := range w.redis {
			addrs = append(addrs, s.addr())
		}
		l, err := redisledger.Open(redisledger.Config{Addrs: addrs, LeaseTTL: leaseTTL, StoreTimeout: 2 * time.Second})
		if err != nil {
			return []string{"open redis ledger: " + err.Error()}
		}
		defer l.Close()
		led = l
	} else {
		for _, in := range w.inst {
			in.stop(w.t)
		}
		m, err := ledger.NewMemory(ledger.MemoryConfig{Journal: filepath.Join(w.dir, "journal"), LeaseTTL: leaseTTL})
		if err != nil {
			return []string{"replay journal: " + err.Error()}
		}
		defer m.Close()
		rctx, stop := context.WithCancel(ctx)
		defer stop()
		go func() { _ = m.Run(rctx) }()
		led = m
	}
	names := []string{"acme", "beta", "gamma"}
	if w.reload.Load() {
		names = append(names, "late")
	}
	open := func() (string, int) {
		var b strings.Builder
		n := 0
		parts := map[string]ledger.ScopeKey{"global": keyer.GlobalKey()} // (a Cluster's global holds)
		for _, tn := range names {
			parts[tn] = keyer.Key(ledger.KindTenant, tn)
		}
		for _, tn := range append(names, "global") {
			for _, st := range []ledger.State{ledger.Reserved, ledger.Dispatched} {
				recs, err := led.List(ctx, parts[tn], st, 0)
				if err != nil {
					fmt.Fprintf(&b, "%s: list %v: %v; ", tn, st, err)
					n++
					continue
				}
				if len(recs) > 0 {
					fmt.Fprintf(&b, "%s: %d %v; ", tn, len(recs), st)
					n += len(recs)
				}
			}
		}
		return b.String(), n
	}
	if !eventually(3*leaseTTL+5*time.Second, func() bool { _, n := open(); return n == 0 }) {
		s, _ := open()
		add("open records never reclaimed after quiescence: %s", s)
	}
	if w.p.backend != "memory" {
		for _, in := range w.inst {
			in.stop(w.t)
		}
	}

	type bounds struct {
		reqLo, reqHi, tokLo, tokHi, partial int64
		allowance                           int64    // the abort allowance of the partial executions
		partials                            []string // what a token-bound violation names
		orphans                             []int    // what a request-bound violation names
	}
	want := map[string]*bounds{}
	for _, tn := range names {
		want[tn] = &bounds{}
	}
	for _, ex := range execs {
		o := w.p.ops[ex.op]
		if o == nil || !executed(ex) || want[o.tenant] == nil {
			continue
		}
		b := want[o.tenant]
		orphan := false
		clean := false
		for _, r := range byOp[o.id] {
			orphan = orphan || r.killed
			clean = clean || (r.status == http.StatusOK && r.transport == "" && (!o.stream || r.done) && r.code == "")
		}
		// Charged if its client left it inside the replica, not if it had
		// been taken back by then.
		orphan = orphan || ex.mayTakenBack
		n := int64(max(1, o.n))
		b.reqHi++
		if !orphan {
			b.reqLo++
		} else {
			b.orphans = append(b.orphans, o.id)
		}
		got := int64(max(0, ex.prompt) + max(0, ex.completion))
		switch {
		case ex.completed && clean && !orphan:
			b.tokLo += got
			b.tokHi += got
		default:
			b.partial++
			var seen []string
			for _, r := range byOp[o.id] {
				seen = append(seen, fmt.Sprintf("try %d inst %d status %d %q cancelled=%v killed=%v done=%v", r.ev.attempt, r.ev.inst, r.status, r.code, r.cancelled, r.killed, r.done))
			}
			b.partials = append(b.partials, fmt.Sprintf("op %d (stream=%v n=%d): replica prompt %d completion %d completed=%v gone=%v errEvent=%v status %d; clients: %s",
				o.id, o.stream, n, ex.prompt, ex.completion, ex.completed, ex.gone, ex.errEvent, ex.status, strings.Join(seen, "; ")))
			if !orphan {
				b.tokLo += max(0, got-2*n)
			}
			b.tokHi += o.inputUpper() + n*int64(o.cap()+2)
			b.allowance += n * abortAllowance
		}
	}
	// A client that left, or whose deadline passed (Sluice aborts the
	// upstream request: 504 deadline_exceeded), while Sluice was sending may
	// be charged for a request the replica never read: the abort closes the
	// connection, and the replica's kernel may drop a request it had not yet
	// read (seeds memory 402, 634 and 718 showed it: "charged, never run …
	// reason=deadline"). Sluice cannot know it was not read.
	//
	// A 5xx other than 503 to a request sent upstream non-streamed is
	// charged its hold (docs/api.md, "Transparency to vLLM's clients"): vLLM answers 500 after
	// generating when a choice ends in error, and reports nothing of what
	// ran, so Sluice cannot tell it from a failure before any step (the
	// simulator's injected errors are those).
	failedWhole := map[int]bool{}
	for _, ex := range execs {
		if ex.status >= 500 && ex.status != http.StatusServiceUnavailable && !bytes.Contains(ex.body, []byte(`"stream":true`)) {
			failedWhole[ex.op] = true
		}
	}
	for id, rs := range byOp {
		o := w.p.ops[id]
		if perOp[id] > 0 || want[o.tenant] == nil || o.badN {
			continue
		}
		if failedWhole[id] {
			b := want[o.tenant]
			b.reqHi++
			b.tokHi += o.inputUpper() + int64(max(1, o.n))*int64(o.cap()+2)
			continue
		}
		for _, r := range rs {
			if r.cancelled || r.killed || r.code == "deadline_exceeded" {
				b := want[o.tenant]
				b.reqHi++
				b.tokHi += o.inputUpper() + int64(max(1, o.n))*int64(o.cap()+2)
				break
			}
		}
	}
	// Usage owed by an instance killed during an outage and never
	// restarted stays in its outage file: no one else can charge it.
	for _, ch := range stranded {
		if b := want[ch.Tenant]; b != nil {
			w.t.Logf("%s: outage usage of %s (%d tokens) stranded on a killed instance", ch.Tenant, ch.ReqID, ch.Req.Amounts[ledger.Tokens])
			b.reqLo--
			b.tokLo -= ch.Req.Amounts[ledger.Tokens]
		}
	}
	// The global scope holds what the tenants' records hold and is charged
	// what they are (each request once), within the outage usage that an
	// instance killed between a Charge's tenant and global steps leaves
	// charged to its tenant only.
	var sumReserved ledger.Amounts
	var sumTok, sumReq int64
	trail := w.readAudit()
	for _, tn := range names {
		key := keyer.Key(ledger.KindTenant, tn)
		u, err := led.Snapshot(ctx, key, key)
		if err != nil {
			add("%s: snapshot: %v", tn, err)
			continue
		}
		unres, err := led.List(ctx, key, ledger.Unresolved, 0)
		if err != nil {
			add("%s: list unresolved: %v", tn, err)
		}
		var held ledger.Amounts
		for _, r := range unres {
			for d := range held {
				held[d] += r.Held[d]
			}
		}
		if u.SlotsInUse != 0 {
			add("%s: %d slots still in use after quiescence", tn, u.SlotsInUse)
		}
		for d := ledger.Dim(0); d < ledger.Slots; d++ {
			if u.Reserved[d] != held[d] {
				add("%s: reserved %s = %d after quiescence, but UNRESOLVED records hold %d", tn, d, u.Reserved[d], held[d])
			}
			sumReserved[d] += u.Reserved[d]
		}
		tok, req := committed(u)
		sumTok, sumReq = sumTok+tok, sumReq+req
		b := want[tn]
		if len(unres) > 0 {
			ids := make([]string, 0, len(unres))
			for _, r := range unres {
				ids = append(ids, r.Ref.ID.String())
			}
			if w.killedAny() {
				w.t.Logf("%s: %d UNRESOLVED record(s) left by a killed instance: %s", tn, len(unres), strings.Join(ids, " "))
			} else {
				add("%s: %d UNRESOLVED record(s) without any instance kill: %s", tn, len(unres), strings.Join(ids, " "))
			}
		}
		// An UNRESOLVED record is charged its hold when its first window
		// closes (the ledger's resolve), after this check: a request a
		// killed instance answered but could not settle is one. The lower
		// bounds count those charges as made; the hold is at least what the
		// replica did.
		pendReq, pendTok := int64(len(unres)), held[ledger.Tokens]
		if req+pendReq < b.reqLo || req > b.reqHi {
			add("%s: %d requests charged (and %d pending in UNRESOLVED records), replicas executed %d (%d of them orphaned by a kill: ops %v)%s",
				tn, req, pendReq, b.reqHi, b.reqHi-b.reqLo, b.orphans, w.chargedNotRun(tn, byOp, perOp))
		}
		if tok+pendTok < b.tokLo || tok > b.tokHi {
			add("%s: %d tokens charged (and %d pending in UNRESOLVED records), outside [%d, %d] from what the replicas delivered (%d partial: %s)",
				tn, tok, pendTok, b.tokLo, b.tokHi, b.partial, strings.Join(b.partials, " | "))
		}
		if spec := tenantByName(tn); spec.tokens < 1<<40 {
			// A block budget holds up to the ledger's overrun (LEDGER.md
			// I1: c + r ≤ max + overrun, r = 0 now). A hold covers the
			// input bound and the cap sent upstream, so the overrun is at
			// most the abort allowance of the requests settled without a
			// final usage: one token per unfinished choice (VLLM.md).
			lim := spec.tokens
			if tn == "beta" {
				lim = w.budgetX.Load() // the highest limit the admin API set
			}
			// A generation stopped at the budget (a predicted hold that
			// could not grow) passes it by less than one step each
			// (LEDGER.md §12): the documented overshoot.
			over := b.allowance + predictStep*trail.stoppedBy[tn]
			if tok > lim+over {
				add("%s: %d tokens charged against a block budget of %d (+%d: abort allowance of %d partial requests, one step for each of %d stopped at the budget: %s)",
					tn, tok, lim, over, b.partial, trail.stoppedBy[tn], strings.Join(b.partials, " | "))
			}
		}
	}
	g := keyer.GlobalKey()
	gu, err := led.Snapshot(ctx, g, g)
	if err != nil {
		return append(v, "global: snapshot: "+err.Error())
	}
	for d := ledger.Dim(0); d < ledger.Slots; d++ {
		if gu.Reserved[d] != sumReserved[d] {
			add("global: reserved %s = %d after quiescence, the tenants' %d", d, gu.Reserved[d], sumReserved[d])
		}
	}
	gTok, gReq := committed(gu)
	var owedTok, owedReq int64 // outage usage a never-restarted instance may have charged to its tenant only
	for _, ch := range stranded {
		owedTok, owedReq = owedTok+ch.Req.Amounts[ledger.Tokens], owedReq+1
	}
	w.t.Logf("global: %d tokens / %d requests charged, the tenants %d / %d", gTok, gReq, sumTok, sumReq)
	if gTok > sumTok || gTok < sumTok-owedTok || gReq > sumReq || gReq < sumReq-owedReq {
		add("global: charged %d tokens / %d requests, the tenants %d / %d (outage usage stranded: %d / %d)",
			gTok, gReq, sumTok, sumReq, owedTok, owedReq)
	}
	return v
}

// committed returns the tokens and requests a scope committed in the run's
// window.
func committed(u ledger.Usage) (tok, req int64) {
	for _, l := range u.Limits {
		if l.Limit.Window != window {
			continue
		}
		switch l.Limit.Dim {
		case ledger.Tokens:
			tok = l.Committed
		case ledger.Requests:
			req = l.Committed
		}
	}
	return tok, req
}

// chargedNotRun lists, from the instances' audit trails, tenant's requests
// charged (settled as sent) that no replica ran, with what their clients saw:
// the evidence a request-count violation needs.
func (w *world) chargedNotRun(tenant string, byOp map[int][]*result, perOp map[int]int) string {
	var b strings.Builder
	for i := range w.inst {
		f, err := os.ReadFile(filepath.Join(w.dir, fmt.Sprintf("audit-%d.log", i)))
		if err != nil {
			continue
		}
		for line := range strings.SplitSeq(string(f), "\n") {
			var rec struct {
				Kind, Tenant, Source, State, Reason, Code string
				RequestID                                 string `json:"request_id"`
			}
			if json.Unmarshal([]byte(line), &rec) != nil || rec.Kind != "settle" || rec.Tenant != tenant || rec.Source == "not_sent" {
				continue
			}
			var op, try int
			if _, err := fmt.Sscanf(rec.RequestID, "chaos-%d-%d", &op, &try); err != nil || perOp[op] > 0 {
				continue
			}
			fmt.Fprintf(&b, "\n    charged, never run: inst %d %s source=%s state=%s reason=%q code=%q; clients:", i, rec.RequestID, rec.Source, rec.State, rec.Reason, rec.Code)
			for _, r := range byOp[op] {
				fmt.Fprintf(&b, " [try %d inst %d status %d %q transport %q cancelled=%v killed=%v done=%v]",
					r.ev.attempt, r.ev.inst, r.status, r.code, r.transport, r.cancelled, r.killed, r.done)
			}
		}
	}
	return b.String()
}
