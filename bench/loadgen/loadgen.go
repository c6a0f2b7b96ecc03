// Package loadgen sends a workload schedule at an OpenAI-compatible
// endpoint: the dispatcher (one goroutine per request), the HTTP/1.1
// client, the SSE reader and outcome classification.
package loadgen

import (
	"bytes"
	"context"
	"crypto/tls"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"time"

	"github.com/sluicehq/sluice/bench/workload"
)

// Config drives one run of a schedule against one target.
type Config struct {
	// Targets are base URLs (http://host:port). Requests go round-robin over
	// them in schedule order (A mode); one target is the usual case.
	Targets []string
	// Endpoint is the path. Default "/v1/completions".
	Endpoint string
	// Backend is "openai" (completions, token-id prompts) or "openai-chat".
	// Default "openai".
	Backend string
	// Model is sent as "model". Required.
	Model string
	// IgnoreEOS sets "ignore_eos": true so output lengths are exact.
	IgnoreEOS bool
	// MaxConcurrency caps requests in flight; the wait is client_queue_time.
	// 0 means unlimited.
	MaxConcurrency int
	// RequestTimeout is the client-side cut-off per request. 0 disables.
	RequestTimeout time.Duration
	// DrainTimeout bounds the wait after the last arrival; still-open
	// requests become cancelled_at_end. Default 120s.
	DrainTimeout time.Duration
	// IDPrefix and Run build X-Request-Id: <prefix><tenant>-<n>-r<run>.
	IDPrefix string
	Run      int
	// Salt selects prompt content (new salt: same lengths, new tokens).
	Salt uint64
	// Preconnect opens this many connections per target before t0 with
	// GET /v1/models (no budget is spent). 0 disables.
	Preconnect int
	// Client is the HTTP client. Nil builds one with [NewTransport].
	Client *http.Client
	// Progress, when set, receives a live line every ProgressEvery.
	Progress      io.Writer
	ProgressEvery time.Duration
}

// Record is what happened to one request. Times are offsets from t0; -1
// means "never".
type Record struct {
	ID           string
	Tenant       int
	N            int
	Intended     time.Duration
	Sent         time.Duration
	First        time.Duration // first event with non-empty choices (TTFT)
	FirstContent time.Duration // first event with non-empty text
	// EarlyEmpty: before the first text came a choices event with no
	// text, no role, no tool call and no finish_reason, an empty chunk
	// some hop sent. vLLM's own chat role chunk ({"role":"assistant",
	// "content":""}, sent with the first output by
	// vllm/entrypoints/openai/chat_completion/serving.py) is not one.
	EarlyEmpty   bool
	Done         time.Duration // last choices event (E2EL); for failures, when it ended
	ITL          []time.Duration
	ClientQueue  time.Duration
	InTokens     int // usage.prompt_tokens, else the intended length
	InIntended   int
	OutTokens    int // usage.completion_tokens, else the chunk count
	OutIntended  int
	Chunks       int
	TokensApprox bool // no usage chunk
	Status       int
	Outcome      Outcome
	Reason       string
	UnknownCode  bool
	DeadlineS    float64 // the X-Request-Timeout sent; 0 = none
	Deadline     time.Duration
	// Headers is when the response's headers arrived. With a Sluice
	// target, ServerQueue and ServerUpstream are its Server-Timing
	// (arrival to dispatch, dispatch to vLLM's first byte), so a slow
	// TTFT splits into Sluice's queue, vLLM and the rest; -1 when the
	// header did not carry them.
	Headers        time.Duration
	ServerQueue    time.Duration
	ServerUpstream time.Duration
}

// TTFT returns First − Sent.
func (r *Record) TTFT() time.Duration { return r.First - r.Sent }

// E2EL returns Done − Sent.
func (r *Record) E2EL() time.Duration { return r.Done - r.Sent }

// Result is one run's raw output.
type Result struct {
	Start    time.Time // t0
	Records  []Record  // in schedule order
	NewConns int64     // connections opened after t0
	Elapsed  time.Duration
}

// Errors returned as context causes.
var (
	errPlannedCancel  = errors.New("planned cancel")
	errRequestTimeout = errors.New("request timeout")
	errDrain          = errors.New("drain timeout")
)

// NewTransport returns the shared HTTP/1.1 transport: no compression, no
// per-host connection cap and an idle pool of at least idle connections.
func NewTransport(idle int) *http.Transport {
	return &http.Transport{
		Proxy:               nil,
		DialContext:         (&net.Dialer{Timeout: 10 * time.Second, KeepAlive: 30 * time.Second}).DialContext,
		MaxIdleConns:        0,
		MaxIdleConnsPerHost: max(idle, 64),
		MaxConnsPerHost:     0,
		IdleConnTimeout:     90 * time.Second,
		DisableCompression:  true,
		ForceAttemptHTTP2:   false,
		TLSNextProto:        map[string]func(string, *tls.Conn) http.RoundTripper{},
	}
}

type runner struct {
	cfg      Config
	sched    *workload.Schedule
	client   *http.Client
	t0       time.Time
	sem      chan struct{}
	newConns atomic.Int64
	prog     *progress
}

func (r *runner) now() time.Duration { return time.Since(r.t0) }

// Run sends sched open-loop: one dispatcher sleeps until each intended time
// and starts one goroutine per request, so a slow response never delays a
// later send. It returns when every request has ended (or was cancelled at
// the drain timeout). If ctx is cancelled the requests still open become
// cancelled_at_end and Run returns the partial result with ctx's error.
func Run(ctx context.Context, sched *workload.Schedule, cfg Config) (*Result, error) {
	if len(cfg.Targets) == 0 {
		return nil, errors.New("loadgen: no target")
	}
	if cfg.Endpoint == "" {
		cfg.Endpoint = "/v1/completions"
	}
	if cfg.Backend == "" {
		cfg.Backend = "openai"
	}
	if cfg.DrainTimeout == 0 {
		cfg.DrainTimeout = 120 * time.Second
	}
	r := &runner{cfg: cfg, sched: sched, client: cfg.Client}
	if r.client == nil {
		idle := cfg.MaxConcurrency
		if idle == 0 {
			idle = min(len(sched.Requests), 10000)
		}
		r.client = &http.Client{Transport: NewTransport(idle)}
	}
	if cfg.MaxConcurrency > 0 {
		r.sem = make(chan struct{}, cfg.MaxConcurrency)
	}
	if err := r.preconnect(ctx); err != nil {
		return nil, err
	}
	recs := make([]Record, len(sched.Requests))
	runCtx, stop := context.WithCancelCause(ctx)
	defer stop(nil)
	r.t0 = time.Now()
	if cfg.Progress != nil && cfg.ProgressEvery > 0 {
		r.prog = &progress{}
	}
	var wg sync.WaitGroup
	progDone := make(chan struct{})
	var pwg sync.WaitGroup
	if r.prog != nil {
		pwg.Go(func() { r.prog.run(progDone, r, len(sched.Requests)) })
	}
	timer := time.NewTimer(0)
	<-timer.C
dispatch:
	for i := range sched.Requests {
		q := &sched.Requests[i]
		if d := q.At - r.now(); d > 0 {
			timer.Reset(d)
			select {
			case <-timer.C:
			case <-ctx.Done():
				for j := i; j < len(sched.Requests); j++ {
					recs[j] = r.unsent(&sched.Requests[j], j)
				}
				break dispatch
			}
		}
		if r.prog != nil {
			r.prog.offered.Add(1)
		}
		wg.Go(func() { recs[i] = r.do(runCtx, q, i) })
	}
	finished := make(chan struct{})
	go func() { wg.Wait(); close(finished) }()
	drain := time.NewTimer(cfg.DrainTimeout)
	select {
	case <-finished:
	case <-drain.C:
		stop(errDrain)
		<-finished
	case <-ctx.Done():
		<-finished
	}
	drain.Stop()
	close(progDone)
	pwg.Wait()
	res := &Result{Start: r.t0, Records: recs, NewConns: r.newConns.Load(), Elapsed: r.now()}
	return res, ctx.Err()
}

func (r *runner) unsent(q *workload.Request, i int) Record {
	rec := r.newRecord(q, i)
	rec.Outcome = CancelledAtEnd
	return rec
}

func (r *runner) newRecord(q *workload.Request, _ int) Record {
	p := &r.sched.Tenants[q.Tenant]
	return Record{ID: fmt.Sprintf("%s%s-%d-r%d", r.cfg.IDPrefix, p.Name, q.N, r.cfg.Run), Tenant: q.Tenant, N: q.N,
		Intended: q.At, Sent: -1, First: -1, FirstContent: -1, Done: -1, InTokens: q.InputLen, InIntended: q.InputLen,
		OutIntended: q.OutputLen, Deadline: p.Deadline, Headers: -1, ServerQueue: -1, ServerUpstream: -1}
}

func (r *runner) preconnect(ctx context.Context) error {
	if r.cfg.Preconnect <= 0 {
		return nil
	}
	key := ""
	if len(r.sched.Tenants) > 0 {
		key = r.sched.Tenants[0].APIKey
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	var firstErr error
	for _, t := range r.cfg.Targets {
		for range r.cfg.Preconnect {
			wg.Go(func() {
				req, err := http.NewRequestWithContext(ctx, http.MethodGet, strings.TrimRight(t, "/")+"/v1/models", nil)
				if err == nil && key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				var resp *http.Response
				if err == nil {
					resp, err = r.client.Do(req)
				}
				if err == nil {
					_, _ = io.Copy(io.Discard, resp.Body)
					_ = resp.Body.Close()
				}
				if err != nil {
					mu.Lock()
					firstErr = cmpErr(firstErr, fmt.Errorf("preconnect %s: %w", t, err))
					mu.Unlock()
				}
			})
		}
	}
	wg.Wait()
	return firstErr
}

func cmpErr(a, b error) error {
	if a != nil {
		return a
	}
	return b
}

// Body builds the request body for q (exported for tests and A/B byte
// checks). Random prompts are token ids chosen by (q.PromptSeed, salt);
// custom-dataset entries are sent as written.
func Body(backend, model string, sc *workload.Schedule, q *workload.Request, salt uint64, ignoreEOS bool) []byte {
	var ids []int
	text := ""
	if q.Entry > 0 && sc != nil && q.Entry <= len(sc.Dataset) {
		e := &sc.Dataset[q.Entry-1]
		ids, text = e.PromptIDs, e.Prompt
	} else {
		ids = workload.PromptTokens(q.PromptSeed, salt, q.InputLen)
	}
	chat := backend == "openai-chat"
	b := make([]byte, 0, 128+len(model)+6*len(ids)+len(text))
	b = append(b, `{"model":`...)
	mj, _ := json.Marshal(model)
	b = append(b, mj...)
	switch {
	case text != "" && chat:
		tj, _ := json.Marshal(text)
		b = append(b, `,"messages":[{"role":"user","content":`...)
		b = append(b, tj...)
		b = append(b, `}],"max_completion_tokens":`...)
	case text != "":
		tj, _ := json.Marshal(text)
		b = append(b, `,"prompt":`...)
		b = append(b, tj...)
		b = append(b, `,"max_tokens":`...)
	case chat:
		b = append(b, `,"messages":[{"role":"user","content":"`...)
		for i, id := range ids {
			if i > 0 {
				b = append(b, ' ')
			}
			b = strconv.AppendInt(b, int64(id), 10)
		}
		b = append(b, `"}],"max_completion_tokens":`...)
	default:
		b = append(b, `,"prompt":[`...)
		for i, id := range ids {
			if i > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(id), 10)
		}
		b = append(b, `],"max_tokens":`...)
	}
	b = strconv.AppendInt(b, int64(q.OutputLen), 10)
	b = append(b, `,"stream":true,"stream_options":{"include_usage":true}`...)
	if ignoreEOS {
		b = append(b, `,"ignore_eos":true`...)
	}
	return append(b, '}')
}

// FormatTimeout renders X-Request-Timeout: deadline − lag in decimal
// seconds, floored at 0.001.
func FormatTimeout(deadline, lag time.Duration) (string, float64) {
	s := (deadline - lag).Seconds()
	if s < 0.001 {
		s = 0.001
	}
	s = float64(int64(s*1e6+0.5)) / 1e6
	return strconv.FormatFloat(s, 'f', -1, 64), s
}

func (r *runner) do(ctx context.Context, q *workload.Request, i int) (rec Record) {
	rec = r.newRecord(q, i)
	p := &r.sched.Tenants[q.Tenant]
	if r.prog != nil {
		defer func() { r.prog.record(&rec) }()
	}
	if r.sem != nil {
		w := r.now()
		select {
		case r.sem <- struct{}{}:
			defer func() { <-r.sem }()
		case <-ctx.Done():
			rec.Outcome = CancelledAtEnd
			return rec
		}
		rec.ClientQueue = r.now() - w
	}
	if r.cfg.RequestTimeout > 0 {
		var cancel context.CancelFunc
		ctx, cancel = context.WithTimeoutCause(ctx, r.cfg.RequestTimeout, errRequestTimeout)
		defer cancel()
	}
	ctx, cancel := context.WithCancelCause(ctx)
	defer cancel(nil)
	target := r.cfg.Targets[i%len(r.cfg.Targets)]
	body := Body(r.cfg.Backend, r.cfg.Model, r.sched, q, r.cfg.Salt, r.cfg.IgnoreEOS)
	req, err := http.NewRequestWithContext(ctx, http.MethodPost, strings.TrimRight(target, "/")+r.cfg.Endpoint, bytes.NewReader(body))
	if err != nil {
		rec.Outcome, rec.Reason = Error, "bad_request"
		return rec
	}
	req.Header.Set("Content-Type", "application/json")
	req.Header.Set("Accept", "text/event-stream")
	req.Header.Set("X-Request-Id", rec.ID)
	if p.APIKey != "" {
		req.Header.Set("Authorization", "Bearer "+p.APIKey)
	}
	if p.HasPriority {
		req.Header.Set("X-Priority", strconv.Itoa(p.Priority))
	}
	req = req.WithContext(httptrace.WithClientTrace(ctx, &httptrace.ClientTrace{GotConn: func(ci httptrace.GotConnInfo) {
		if !ci.Reused {
			r.newConns.Add(1)
		}
	}}))
	rec.Sent = r.now()
	if p.Deadline > 0 {
		var h string
		h, rec.DeadlineS = FormatTimeout(p.Deadline, rec.Sent-rec.Intended)
		req.Header.Set("X-Request-Timeout", h)
	}
	if r.prog != nil {
		r.prog.sent.Add(1)
	}
	resp, err := r.client.Do(req)
	if err != nil {
		rec.Done = r.now()
		r.failed(ctx, &rec, err)
		return rec
	}
	defer resp.Body.Close()
	rec.Headers = r.now()
	rec.Status = resp.StatusCode
	rec.ServerQueue, rec.ServerUpstream = ServerTiming(resp.Header.Get("Server-Timing"))
	if resp.StatusCode/100 != 2 {
		b, _ := io.ReadAll(io.LimitReader(resp.Body, 64<<10))
		rec.Done = r.now()
		rec.Outcome, rec.Reason, rec.UnknownCode = Classify(resp.StatusCode, errorCode(b))
		return rec
	}
	r.readStream(ctx, resp.Body, cancel, q, &rec)
	if rec.Outcome.OK() {
		// Read the chunked terminator after [DONE] so the connection goes
		// back to the pool instead of being closed.
		_, _ = io.Copy(io.Discard, io.LimitReader(resp.Body, 64<<10))
	}
	return rec
}

// ServerTiming reads the queue and upstream durations of a Server-Timing
// header ("queue;dur=12.5, upstream;dur=3.0", milliseconds); each is -1
// when absent or malformed.
func ServerTiming(h string) (queue, upstream time.Duration) {
	queue, upstream = -1, -1
	for m := range strings.SplitSeq(h, ",") {
		name, params, _ := strings.Cut(strings.TrimSpace(m), ";")
		var dur time.Duration = -1
		for p := range strings.SplitSeq(params, ";") {
			k, v, ok := strings.Cut(strings.TrimSpace(p), "=")
			if !ok || k != "dur" {
				continue
			}
			if f, err := strconv.ParseFloat(v, 64); err == nil && f >= 0 {
				dur = time.Duration(f * 1e6)
			}
		}
		switch name {
		case "queue":
			queue = dur
		case "upstream":
			upstream = dur
		}
	}
	return queue, upstream
}

// failed classifies a transport or stream error, looking at the context
// cause first.
func (r *runner) failed(ctx context.Context, rec *Record, err error) {
	switch cause := context.Cause(ctx); {
	case errors.Is(cause, errPlannedCancel):
		rec.Outcome, rec.Reason = ClientTimeout, ReasonPlannedCancel
	case errors.Is(cause, errRequestTimeout):
		rec.Outcome, rec.Reason = ClientTimeout, ReasonRequestTimeout
	case cause != nil:
		rec.Outcome = CancelledAtEnd
	default:
		rec.Outcome, rec.Reason = Error, transportReason(err)
	}
}

// nonEmpty records whether a JSON string value is non-empty without
// allocating it.
type nonEmpty bool

func (n *nonEmpty) UnmarshalJSON(b []byte) error {
	*n = len(b) > 2 && b[0] == '"'
	return nil
}

type chunk struct {
	Choices []struct {
		Text  nonEmpty `json:"text"`
		Delta struct {
			Role             nonEmpty        `json:"role"`
			Content          nonEmpty        `json:"content"`
			ReasoningContent nonEmpty        `json:"reasoning_content"`
			ToolCalls        json.RawMessage `json:"tool_calls"`
		} `json:"delta"`
		FinishReason nonEmpty `json:"finish_reason"`
	} `json:"choices"`
	Usage *struct {
		PromptTokens     int `json:"prompt_tokens"`
		CompletionTokens int `json:"completion_tokens"`
	} `json:"usage"`
	Error json.RawMessage `json:"error"`
}

// errorCode extracts a string error.code from an error body ("" if absent
// or not a string, as in vLLM's numeric codes).
func errorCode(b []byte) string {
	var e struct {
		Error json.RawMessage `json:"error"`
	}
	if json.Unmarshal(b, &e) != nil {
		return ""
	}
	return codeOf(e.Error)
}

func codeOf(raw json.RawMessage) string {
	var e struct {
		Code json.RawMessage `json:"code"`
	}
	if json.Unmarshal(raw, &e) != nil {
		return ""
	}
	var s string
	if json.Unmarshal(e.Code, &s) != nil {
		return ""
	}
	return s
}

func (r *runner) readStream(ctx context.Context, body io.Reader, cancel context.CancelCauseFunc, q *workload.Request, rec *Record) {
	sr := NewSSEReader(body, r.now)
	var last time.Duration
	done, usage := false, false
	finish := func() {
		if !rec.Outcome.OK() {
			return
		}
		if !usage {
			rec.OutTokens = rec.Chunks
			rec.TokensApprox = true
		}
		if rec.Deadline > 0 && rec.Done-rec.Intended > rec.Deadline {
			rec.Outcome = Late
		}
	}
	for {
		ev, err := sr.Next()
		if err != nil {
			switch {
			case context.Cause(ctx) != nil:
				rec.Done = r.now()
				r.failed(ctx, rec, err)
			case err == io.EOF && usage && rec.Chunks > 0:
				rec.Outcome = Success
				finish()
			case err == io.EOF && rec.Chunks == 0 && usage:
				rec.Outcome, rec.Reason, rec.Done = Error, ReasonNoChoices, r.now()
			case err == io.EOF:
				rec.Outcome, rec.Reason, rec.Done = Error, ReasonStreamCut, r.now()
			default:
				rec.Done = r.now()
				r.failed(ctx, rec, err)
				if rec.Outcome == Error && context.Cause(ctx) == nil {
					rec.Reason = ReasonStreamCut
				}
			}
			return
		}
		if ev.Keepalive {
			continue
		}
		if bytes.Equal(bytes.TrimSpace(ev.Data), []byte("[DONE]")) {
			done = true
			break
		}
		var c chunk
		if json.Unmarshal(ev.Data, &c) != nil {
			rec.Outcome, rec.Reason, rec.Done = Error, ReasonBadJSON, ev.At
			return
		}
		if len(c.Error) > 0 && string(c.Error) != "null" {
			code := codeOf(c.Error)
			if code == "" {
				code = "upstream_error"
			}
			rec.Outcome, rec.Reason, rec.UnknownCode = Classify(200, code)
			rec.Done = ev.At
			return
		}
		if len(c.Choices) > 0 {
			if rec.First < 0 {
				rec.First = ev.At
			} else {
				rec.ITL = append(rec.ITL, ev.At-last)
			}
			last = ev.At
			rec.Done = ev.At
			rec.Chunks++
			ch := c.Choices[0]
			if rec.FirstContent < 0 {
				switch {
				case bool(ch.Text || ch.Delta.Content || ch.Delta.ReasoningContent):
					rec.FirstContent = ev.At
				case !bool(ch.Delta.Role || ch.FinishReason) && (len(ch.Delta.ToolCalls) == 0 || string(ch.Delta.ToolCalls) == "null"):
					rec.EarlyEmpty = true
				}
			}
			if q.CancelAfter > 0 && rec.Chunks >= q.CancelAfter {
				cancel(errPlannedCancel)
				rec.Outcome, rec.Reason = ClientTimeout, ReasonPlannedCancel
				return
			}
		}
		if c.Usage != nil {
			usage = true
			if c.Usage.PromptTokens > 0 {
				rec.InTokens = c.Usage.PromptTokens
			}
			rec.OutTokens = c.Usage.CompletionTokens
		}
	}
	if done && rec.Chunks == 0 {
		rec.Outcome, rec.Reason = Error, ReasonNoChoices
		if rec.Done < 0 {
			rec.Done = r.now()
		}
		return
	}
	rec.Outcome = Success
	finish()
}
