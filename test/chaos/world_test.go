package chaos

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"io"
	"net"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"syscall"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/sluicehq/sluice/internal/testport"
	"github.com/sluicehq/sluice/ledger"
	"github.com/sluicehq/sluice/vllm/sim"
)

// sluiceBin is the sluice binary TestMain builds once.
var sluiceBin string

// eventually polls cond every 20ms until it holds or bound passes; it is the
// only way these tests wait on another process's state.
func eventually(bound time.Duration, cond func() bool) bool {
	deadline := time.Now().Add(bound)
	for {
		if cond() {
			return true
		}
		if time.Now().After(deadline) {
			return false
		}
		time.Sleep(20 * time.Millisecond)
	}
}

// --- Redis -----------------------------------------------------------------

// redisServer is a real redis-server on loopback.
type redisServer struct {
	port int
	cmd  *exec.Cmd
}

func startRedis(t testing.TB, args ...string) *redisServer {
	t.Helper()
	if _, err := exec.LookPath("redis-server"); err != nil {
		t.Fatalf("redis-server not in PATH (make test installs it via scripts/ensure-deps.sh)")
	}
	dir := t.TempDir()
	s := &redisServer{port: testport.Free(t)}
	s.cmd = exec.Command("redis-server", append([]string{"--port", strconv.Itoa(s.port), "--bind", "127.0.0.1",
		"--dir", dir, "--save", "", "--appendonly", "no", "--maxmemory-policy", "noeviction",
		"--daemonize", "no", "--logfile", filepath.Join(dir, "redis.log")}, args...)...)
	if err := s.cmd.Start(); err != nil {
		t.Fatalf("start redis-server: %v", err)
	}
	t.Cleanup(func() {
		_ = s.cmd.Process.Signal(syscall.SIGCONT)
		_ = s.cmd.Process.Kill()
		_ = s.cmd.Wait()
	})
	c := redis.NewClient(&redis.Options{Addr: s.addr(), MaxRetries: -1})
	defer c.Close()
	if !eventually(10*time.Second, func() bool { return c.Ping(context.Background()).Err() == nil }) {
		t.Fatalf("redis-server on %d did not answer PING", s.port)
	}
	return s
}

func (s *redisServer) addr() string { return net.JoinHostPort("127.0.0.1", strconv.Itoa(s.port)) }

// startStore starts the world's Redis: one server, or a Cluster of n nodes
// with the slots split evenly. Each has a reply-loss proxy in front, which a
// Cluster node announces as its address, so Sluice's Cluster client reaches
// every node through its proxy.
func startStore(t testing.TB, n int) ([]*redisServer, []*replyLossProxy) {
	t.Helper()
	if n == 1 {
		s := startRedis(t)
		return []*redisServer{s}, []*replyLossProxy{startProxy(t, s.addr())}
	}
	var nodes []*redisServer
	var proxies []*replyLossProxy
	bus := make([]int, n)
	for i := range n {
		p := listenProxy(t)
		bus[i] = testport.Free(t)
		s := startRedis(t, "--cluster-enabled", "yes", "--cluster-config-file", "nodes.conf",
			"--cluster-node-timeout", "5000", "--cluster-port", strconv.Itoa(bus[i]),
			"--cluster-announce-port", strconv.Itoa(p.ln.Addr().(*net.TCPAddr).Port),
			"--cluster-announce-bus-port", strconv.Itoa(bus[i]))
		p.to = s.addr()
		go p.accept()
		nodes, proxies = append(nodes, s), append(proxies, p)
	}
	ctx := context.Background()
	var clients []*redis.Client
	for i, s := range nodes {
		c := redis.NewClient(&redis.Options{Addr: s.addr()})
		defer c.Close()
		clients = append(clients, c)
		if err := c.Do(ctx, "CLUSTER", "ADDSLOTSRANGE", i*16384/n, (i+1)*16384/n-1).Err(); err != nil {
			t.Fatalf("cluster slots: %v", err)
		}
		if i > 0 {
			if err := clients[0].Do(ctx, "CLUSTER", "MEET", "127.0.0.1", s.port, bus[i]).Err(); err != nil {
				t.Fatalf("cluster meet: %v", err)
			}
		}
	}
	for _, c := range clients {
		if !eventually(30*time.Second, func() bool {
			info, err := c.ClusterInfo(ctx).Result()
			return err == nil && strings.Contains(info, "cluster_state:ok") &&
				strings.Contains(info, "cluster_known_nodes:"+strconv.Itoa(n)+"\r")
		}) {
			t.Fatalf("redis cluster of %d not ready", n)
		}
	}
	return nodes, proxies
}

// stall freezes the server for d (SIGSTOP, then SIGCONT): every client call
// in that time sees a timeout after its command may or may not have run.
func (s *redisServer) stall(d time.Duration) {
	_ = s.cmd.Process.Signal(syscall.SIGSTOP)
	time.AfterFunc(d, func() { _ = s.cmd.Process.Signal(syscall.SIGCONT) })
}

// migrate moves the Cluster slot of tenant's partition from its node to the
// next one, as a resharding does (redis-cli --cluster reshard): IMPORTING on
// the target, MIGRATING on the source, the slot's keys three at a time with
// a pause between (so traffic meets the slot split between the nodes), then
// the new owner on every node. It returns what it did, for the event log.
func (w *world) migrate(tenant string) string {
	keyer, err := ledger.NewKeyer([]byte(ledgerKey))
	if err != nil {
		return err.Error()
	}
	ctx := context.Background()
	nodes := make([]*redis.Client, len(w.redis))
	for i, s := range w.redis {
		nodes[i] = redis.NewClient(&redis.Options{Addr: s.addr()})
		defer nodes[i].Close()
	}
	slot, err := nodes[0].ClusterKeySlot(ctx, "sluice:{"+keyer.Key(ledger.KindTenant, tenant).String()+"}:m").Result()
	if err != nil {
		return "slot move: " + err.Error()
	}
	src := -1
	for i, n := range nodes {
		if c, err := n.ClusterCountKeysInSlot(ctx, int(slot)).Result(); err == nil && c > 0 {
			src = i
		}
	}
	if src < 0 {
		return fmt.Sprintf("slot move: %s's slot %d has no keys yet", tenant, slot)
	}
	dst := (src + 1) % len(nodes)
	id := func(i int) string { s, _ := nodes[i].Do(ctx, "CLUSTER", "MYID").Text(); return s }
	moved := 0
	steps := []func() error{
		func() error { return nodes[dst].Do(ctx, "CLUSTER", "SETSLOT", slot, "IMPORTING", id(src)).Err() },
		func() error { return nodes[src].Do(ctx, "CLUSTER", "SETSLOT", slot, "MIGRATING", id(dst)).Err() },
		func() error {
			for {
				keys, err := nodes[src].ClusterGetKeysInSlot(ctx, int(slot), 3).Result()
				if err != nil || len(keys) == 0 {
					return err
				}
				args := []any{"MIGRATE", "127.0.0.1", w.redis[dst].port, "", 0, 5000, "KEYS"}
				for _, k := range keys {
					args = append(args, k)
				}
				if err := nodes[src].Do(ctx, args...).Err(); err != nil {
					return err
				}
				moved += len(keys)
				time.Sleep(30 * time.Millisecond) // the split the traffic is to meet, not synchronisation
			}
		},
		func() error { return nodes[dst].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", id(dst)).Err() },
		func() error { return nodes[src].Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", id(dst)).Err() },
		func() error {
			for i, n := range nodes {
				if i != src && i != dst {
					if err := n.Do(ctx, "CLUSTER", "SETSLOT", slot, "NODE", id(dst)).Err(); err != nil {
						return err
					}
				}
			}
			return nil
		},
	}
	for i, step := range steps {
		if err := step(); err != nil {
			w.t.Errorf("slot move of %s (slot %d, node %d to %d), step %d: %v", tenant, slot, src, dst, i, err)
			return "slot move failed"
		}
	}
	return fmt.Sprintf("moved %s's slot %d from redis node %d to %d (%d keys)", tenant, slot, src, dst, moved)
}

// replyLossProxy forwards TCP between Sluice and Redis. While armed it lets
// a script call (EVALSHA/EVAL/FCALL) through, swallows the reply and closes
// the client's connection: the script ran, the client saw EOF, and go-redis
// retries it on a new connection — the lost-reply case.
type replyLossProxy struct {
	ln    net.Listener
	to    string
	armed atomic.Int32 // replies still to drop
	lost  atomic.Int32 // replies dropped
}

func startProxy(t testing.TB, to string) *replyLossProxy {
	t.Helper()
	p := listenProxy(t)
	p.to = to
	go p.accept()
	return p
}

// listenProxy is a proxy that listens but does not accept yet (its target
// is set first).
func listenProxy(t testing.TB) *replyLossProxy {
	t.Helper()
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("proxy listen: %v", err)
	}
	t.Cleanup(func() { _ = ln.Close() })
	return &replyLossProxy{ln: ln}
}

func (p *replyLossProxy) addr() string { return p.ln.Addr().String() }

func (p *replyLossProxy) accept() {
	for {
		c, err := p.ln.Accept()
		if err != nil {
			return
		}
		go p.serve(c)
	}
}

var scriptCmd = regexp.MustCompile(`(?i)\$(7\r\nevalsha|4\r\neval|5\r\nfcall)\r\n`)

func (p *replyLossProxy) serve(c net.Conn) {
	s, err := net.Dial("tcp", p.to)
	if err != nil {
		_ = c.Close()
		return
	}
	var dropNext atomic.Bool
	done := make(chan struct{}, 2)
	go func() { // client → server
		buf := make([]byte, 64<<10)
		for {
			n, err := c.Read(buf)
			if n > 0 {
				if scriptCmd.Match(buf[:n]) && p.armed.Load() > 0 && p.armed.Add(-1) >= 0 {
					dropNext.Store(true)
				}
				if _, werr := s.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}()
	go func() { // server → client
		buf := make([]byte, 64<<10)
		for {
			n, err := s.Read(buf)
			if n > 0 {
				if dropNext.Load() {
					p.lost.Add(1)
					break // the reply is lost with the connection
				}
				if _, werr := c.Write(buf[:n]); werr != nil {
					break
				}
			}
			if err != nil {
				break
			}
		}
		done <- struct{}{}
	}()
	<-done
	_ = c.Close()
	_ = s.Close()
}

// --- Replicas --------------------------------------------------------------

// execution is one request as a replica saw it.
type execution struct {
	op         int
	path       string
	reqID      string // X-Request-Id: Sluice's request id, the client's "chaos-<op>-<try>"
	body       []byte // as received
	arrival    time.Time
	end        time.Time // [DONE] or body written; zero when aborted
	status     int
	completed  bool // the replica finished it and wrote the final usage
	prompt     int  // last usage seen
	completion int
	gone       bool // the client (Sluice) left before the end
	errEvent   bool // the stream carried an error event
	events     int  // SSE data events written, [DONE] aside
	// firstOutput: the data events of the first write that carried any.
	// vLLM's first output is one burst: the chat role chunk and the first
	// token's chunk come out of one generator iteration
	// (vllm/entrypoints/openai/chat_completion/serving.py), so a take-back
	// racing it finds both on the wire at once.
	firstOutput int
	// takenBack: Sluice left it and sent the same request (its
	// X-Request-Id) again later: what waited inside the replica was taken
	// back into Sluice's queue (SCHEDULING §7). Set by the checker.
	takenBack bool
	// mayTakenBack: its client left after Sluice did, before any event
	// past its first output; charged or not (markTakenBack).
	mayTakenBack bool
}

// replicaLog records every request the replicas receive to run (not
// /tokenize and /detokenize, which Sluice may send to count a body).
type replicaLog struct {
	mu     sync.Mutex
	execs  []*execution
	active sync.WaitGroup // handlers still running
}

var opMarker = regexp.MustCompile(`chaos-op-(\d+)`)

// wrap records each request carrying an op marker.
func (l *replicaLog) wrap(next http.Handler, slow func(op int) time.Duration) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if r.Method != http.MethodPost || r.URL.Path == "/tokenize" || r.URL.Path == "/detokenize" {
			// Counting a prompt (before a refusal or on a budget) executes
			// nothing.
			next.ServeHTTP(w, r)
			return
		}
		body, _ := io.ReadAll(r.Body)
		r.Body = io.NopCloser(bytes.NewReader(body))
		m := opMarker.FindSubmatch(body)
		if m == nil {
			next.ServeHTTP(w, r)
			return
		}
		op, _ := strconv.Atoi(string(m[1]))
		ex := &execution{op: op, arrival: time.Now(), path: r.URL.Path, reqID: r.Header.Get("X-Request-Id"), body: body}
		l.active.Add(1)
		defer l.active.Done()
		l.mu.Lock()
		l.execs = append(l.execs, ex)
		l.mu.Unlock()
		if d := slow(op); d > 0 {
			t := time.NewTimer(d)
			select {
			case <-t.C:
			case <-r.Context().Done():
				t.Stop()
			}
		}
		rw := &recorder{w: w, ex: ex, log: l}
		next.ServeHTTP(rw, r)
		l.mu.Lock()
		defer l.mu.Unlock()
		ex.status = rw.status // 0: nothing written (left while queued or in prefill)
		if r.Context().Err() != nil && ex.end.IsZero() {
			ex.gone = true
		}
		if !rw.sse && ex.status == http.StatusOK {
			var u struct {
				Usage *usage `json:"usage"`
			}
			if json.Unmarshal(rw.body.Bytes(), &u) == nil && u.Usage != nil {
				ex.prompt, ex.completion = u.Usage.prompt(), u.Usage.completion()
				ex.completed = !ex.gone
			}
		}
	})
}

// usage is vLLM's usage object: prompt_tokens and completion_tokens, or
// the Responses API's input_tokens and output_tokens.
type usage struct {
	Prompt     int `json:"prompt_tokens"`
	Completion int `json:"completion_tokens"`
	Input      int `json:"input_tokens"`
	Output     int `json:"output_tokens"`
}

func (u *usage) prompt() int     { return max(u.Prompt, u.Input) }
func (u *usage) completion() int { return max(u.Completion, u.Output) }

// recorder watches a replica's response: usage from each SSE data line (or
// the JSON body), and the moment the answer is complete, taken before the
// bytes leave so that it precedes anything Sluice does on reading them.
type recorder struct {
	w      http.ResponseWriter
	ex     *execution
	log    *replicaLog
	status int
	sse    bool
	line   []byte
	body   bytes.Buffer
}

func (r *recorder) Header() http.Header { return r.w.Header() }

func (r *recorder) WriteHeader(code int) {
	r.status = code
	r.sse = strings.HasPrefix(r.w.Header().Get("Content-Type"), "text/event-stream")
	r.w.WriteHeader(code)
}

func (r *recorder) Write(p []byte) (int, error) {
	if r.status == 0 {
		r.WriteHeader(http.StatusOK)
	}
	if r.sse {
		r.scan(p)
		r.log.mu.Lock()
		if r.ex.firstOutput == 0 {
			r.ex.firstOutput = r.ex.events
		}
		r.log.mu.Unlock()
	} else {
		r.body.Write(p)
		var u struct {
			Usage *usage `json:"usage"`
		}
		if r.status == http.StatusOK && json.Unmarshal(r.body.Bytes(), &u) == nil && u.Usage != nil {
			r.log.mu.Lock()
			r.ex.end = time.Now()
			r.log.mu.Unlock()
		}
	}
	return r.w.Write(p)
}

func (r *recorder) scan(p []byte) {
	r.line = append(r.line, p...)
	for {
		i := bytes.IndexByte(r.line, '\n')
		if i < 0 {
			return
		}
		ln := bytes.TrimSpace(r.line[:i])
		r.line = r.line[i+1:]
		data, ok := bytes.CutPrefix(ln, []byte("data: "))
		if !ok {
			continue
		}
		r.log.mu.Lock()
		if string(data) != "[DONE]" {
			r.ex.events++
		}
		if string(data) == "[DONE]" {
			if !r.ex.errEvent && (r.ex.prompt > 0 || r.ex.completion > 0) {
				r.ex.completed = true
			}
			r.ex.end = time.Now()
		} else {
			var ch struct {
				Usage *usage          `json:"usage"`
				Err   json.RawMessage `json:"error"`
				// A /v1/responses event: its type, and the response of
				// the terminal one, with the usage (no [DONE] follows).
				Type     string `json:"type"`
				Response *struct {
					Usage *usage `json:"usage"`
				} `json:"response"`
			}
			if json.Unmarshal(data, &ch) == nil {
				if ch.Usage != nil {
					r.ex.prompt, r.ex.completion = ch.Usage.prompt(), max(r.ex.completion, ch.Usage.completion())
				}
				if len(ch.Err) > 0 && string(ch.Err) != "null" {
					r.ex.errEvent = true
				}
				switch ch.Type {
				case "response.completed", "response.incomplete":
					if ch.Response != nil && ch.Response.Usage != nil {
						r.ex.prompt, r.ex.completion = ch.Response.Usage.prompt(), ch.Response.Usage.completion()
						r.ex.completed = true
					}
					r.ex.end = time.Now()
				case "error", "response.failed":
					r.ex.errEvent = true
				}
			}
		}
		r.log.mu.Unlock()
	}
}

func (r *recorder) Flush() {
	if f, ok := r.w.(http.Flusher); ok {
		f.Flush()
	}
}

func (r *recorder) Unwrap() http.ResponseWriter { return r.w }

// startReplica serves one in-process simulator replica behind the recorder.
func startReplica(t testing.TB, cfg sim.Config, log *replicaLog, ops map[int]*opSpec) string {
	t.Helper()
	r, err := sim.New(cfg)
	if err != nil {
		t.Fatalf("sim: %v", err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatalf("sim listen: %v", err)
	}
	slow := func(op int) time.Duration {
		if o := ops[op]; o != nil {
			return o.slow
		}
		return 0
	}
	srv := &http.Server{Handler: log.wrap(r.Handler(), slow), ReadHeaderTimeout: 10 * time.Second}
	ctx, cancel := context.WithCancel(context.Background())
	engine := make(chan error, 1)
	served := make(chan error, 1)
	go func() { engine <- r.Run(ctx) }()
	go func() { served <- srv.Serve(ln) }()
	t.Cleanup(func() {
		cancel()
		_ = srv.Close()
		<-served
		<-engine
	})
	return "http://" + ln.Addr().String()
}

// --- Sluice instances -------------------------------------------------------

// instance is one `sluice serve` process; it can be killed and restarted on
// the same ports with the same config file.
type instance struct {
	name       string
	config     string
	api, admin string
	logPath    string
	env        []string

	mu     sync.Mutex
	cmd    *exec.Cmd
	exited chan struct{}
	gen    int         // incremented on every start
	ready  atomic.Bool // answering since its last start
}

func (in *instance) start(t testing.TB) {
	t.Helper()
	in.mu.Lock()
	f, err := os.OpenFile(in.logPath, os.O_CREATE|os.O_WRONLY|os.O_APPEND, 0o644)
	if err != nil {
		in.mu.Unlock()
		t.Fatalf("log: %v", err)
	}
	fmt.Fprintf(f, "=== start %d at %s\n", in.gen+1, time.Now().Format(time.RFC3339Nano))
	cmd := exec.Command(sluiceBin, "serve", "--config", in.config)
	cmd.Env = append(os.Environ(), in.env...)
	cmd.Stdout, cmd.Stderr = f, f
	if err := cmd.Start(); err != nil {
		in.mu.Unlock()
		t.Fatalf("start %s: %v", in.name, err)
	}
	exited := make(chan struct{})
	go func() { _ = cmd.Wait(); _ = f.Close(); close(exited) }()
	in.cmd, in.exited = cmd, exited
	in.gen++
	in.ready.Store(false)
	in.mu.Unlock()
	ok := eventually(20*time.Second, func() bool {
		select {
		case <-exited:
			return true
		default:
		}
		resp, err := http.Get(in.admin + "/readyz")
		if err != nil {
			return false
		}
		_ = resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	select {
	case <-exited:
		t.Fatalf("%s exited at start; log:\n%s", in.name, tail(in.logPath, 40))
	default:
	}
	if !ok {
		t.Fatalf("%s not ready; log:\n%s", in.name, tail(in.logPath, 40))
	}
	in.ready.Store(true)
}

// kill sends SIGKILL and waits for the process to end.
func (in *instance) kill() {
	in.mu.Lock()
	cmd, exited := in.cmd, in.exited
	in.mu.Unlock()
	if cmd == nil {
		return
	}
	in.ready.Store(false)
	_ = cmd.Process.Kill()
	<-exited
}

// stop sends SIGTERM (graceful drain) and waits.
func (in *instance) stop(t testing.TB) {
	in.mu.Lock()
	cmd, exited := in.cmd, in.exited
	in.mu.Unlock()
	if cmd == nil {
		return
	}
	select {
	case <-exited:
		return
	default:
	}
	_ = cmd.Process.Signal(syscall.SIGTERM)
	select {
	case <-exited:
		if code := cmd.ProcessState.ExitCode(); code != 0 {
			t.Errorf("%s exited %d after SIGTERM (a graceful drain exits 0); log:\n%s", in.name, code, tail(in.logPath, 20))
		}
	case <-time.After(20 * time.Second):
		t.Errorf("%s did not stop within 20s of SIGTERM; killing", in.name)
		_ = cmd.Process.Kill()
		<-exited
	}
}

// logProblems returns the lines of the instance's log that no run may
// produce: a data race report (-chaos.race), a panic, a fatal error.
func (in *instance) logProblems() []string {
	b, err := os.ReadFile(in.logPath)
	if err != nil {
		return []string{in.name + ": " + err.Error()}
	}
	var out []string
	for _, ln := range strings.Split(string(b), "\n") {
		if strings.Contains(ln, "WARNING: DATA RACE") || strings.HasPrefix(ln, "panic:") || strings.HasPrefix(ln, "fatal error:") {
			out = append(out, in.name+": "+ln)
		}
	}
	return out
}

// isDown reports whether the process is not serving: killed, or restarted
// and not ready yet.
func (in *instance) isDown() bool {
	if !in.ready.Load() {
		return true
	}
	in.mu.Lock()
	exited := in.exited
	in.mu.Unlock()
	select {
	case <-exited:
		return true
	default:
		return false
	}
}

func tail(path string, n int) string {
	b, err := os.ReadFile(path)
	if err != nil {
		return err.Error()
	}
	lines := strings.Split(strings.TrimRight(string(b), "\n"), "\n")
	if len(lines) > n {
		lines = lines[len(lines)-n:]
	}
	return strings.Join(lines, "\n")
}

// adminCall sends an admin API request and returns the status.
func adminCall(ctx context.Context, base, method, path, token string, body any) (int, string) {
	var rd io.Reader
	if body != nil {
		b, _ := json.Marshal(body)
		rd = bytes.NewReader(b)
	}
	req, _ := http.NewRequestWithContext(ctx, method, base+path, rd)
	req.Header.Set("Authorization", "Bearer "+token)
	req.Header.Set("Content-Type", "application/json")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		return 0, err.Error()
	}
	defer resp.Body.Close()
	b, _ := io.ReadAll(io.LimitReader(resp.Body, 4096))
	return resp.StatusCode, string(b)
}

// readSSE reads a client stream to its end and returns the error code of an
// error event, if any, and whether [DONE] arrived.
func readSSE(r io.Reader) (code string, done bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		if string(data) == "[DONE]" {
			done = true
			continue
		}
		if bytes.Contains(data, []byte(`"error"`)) {
			var e struct {
				Error struct {
					Code any `json:"code"`
				} `json:"error"`
			}
			if json.Unmarshal(data, &e) == nil && e.Error.Code != nil {
				code = fmt.Sprint(e.Error.Code)
			}
		}
	}
	return code, done, sc.Err()
}
