package chaos

import (
	"bufio"
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math/rand/v2"
	"net/http"
	"os"
	"path/filepath"
	"sort"
	"strings"
	"testing"

	"github.com/sluicehq/sluice/vllm"
)

// The request shapes of the simulator: every endpoint family Sluice bounds
// (completions, chat, the embeddings family, /v1/responses), bodies that
// must run and be counted (RAG documents, media parts, a client priority)
// and hostile bodies that must be refused whole (duplicate keys, deep
// nesting, input together with messages, background responses).

type opKind int

const (
	kCompletion opKind = iota
	kChat
	kEmbed     // /v1/embeddings, input a string or a list of strings
	kEmbedChat // /v1/embeddings, the chat form (messages)
	kScore     // /v1/score
	kRerank    // /v1/rerank
	kPooling   // /pooling
	kClassify  // /classify
	kResponses // /v1/responses
)

var kindNames = [...]string{"completion", "chat", "embed", "embed-chat", "score", "rerank", "pooling", "classify", "responses"}

var kindPaths = [...]string{"/v1/completions", "/v1/chat/completions", "/v1/embeddings", "/v1/embeddings", "/v1/score",
	"/v1/rerank", "/pooling", "/classify", "/v1/responses"}

func (k opKind) String() string { return kindNames[k] }

// generates reports an endpoint with output tokens (and a cap to send).
func (k opKind) generates() bool { return k == kCompletion || k == kChat || k == kResponses }

// embedFamily reports the endpoints whose body takes input or messages.
func (k opKind) embedFamily() bool {
	return k == kEmbed || k == kEmbedChat || k == kPooling || k == kClassify
}

type shape int

const (
	shPlain shape = iota
	// Shapes Sluice admits: it must count them and forward what it checked.
	shDocuments // chat: RAG documents, counted in the input bound
	shImage     // chat image_url / responses input_image part, counted at the media allowance
	shPriority  // a client "priority", which is never forwarded
	// Hostile shapes: 400 invalid_request, nothing reaches a replica,
	// nothing is charged.
	shDupModel     // a second "model", naming a model the tenant may not use
	shDupModelEsc  // the same, spelled "mod\u0065l"
	shDupInput     // a second prompt member carrying hiddenWords words
	shDupMaxTokens // a second output cap far above the tenant's
	shDeep         // a member nested deeper than 512, then a second model and prompt
	shMixed        // embeddings family: input (hiddenWords) together with messages
	shBackground   // responses: "background": true
)

var shapeNames = [...]string{"plain", "documents", "image", "priority", "dup-model", "dup-model-escaped", "dup-input",
	"dup-max-tokens", "deep", "input+messages", "background"}

func (s shape) String() string { return shapeNames[s] }

func (s shape) hostile() bool { return s >= shDupModel }

const (
	// hiddenWords is the size of the prompt a hostile body hides, about
	// 6,000 of the simulator's tokens: far above every tenant's
	// max_input_tokens and beta's block budget, within the replicas'
	// context, so a replica sent it runs it.
	hiddenWords = 3600
	// deepLevels nests a member past the request scanner's 512 levels.
	deepLevels = 600
	// maxInputTokens is every tenant's max_input_tokens.
	maxInputTokens = 2000
	// mediaAllowance is the config's server.media_allowance, and
	// mediaTokens what the replicas' processor makes of a media part: a
	// bound that missed a part would fall short of what ran.
	mediaAllowance = 256
	mediaTokens    = 200
	// otherModel is the replicas' second served model name, which beta may
	// not use.
	otherModel = "sim-premium"
	baseModel  = "sim-model"
	// abortAllowance is the tokens Sluice charges per unfinished choice of
	// a request settled without vLLM's final usage (VLLM.md, "Post-abort
	// allowance").
	abortAllowance = 1
	// predictStep is server.hold_prediction.step_tokens (its default): a
	// generation stopped at a budget passes its hold, and the budget, by
	// less than one step (LEDGER.md §12).
	predictStep = 256
)

// tenantModels are the models a tenant may use (nil: every served one).
var tenantModels = map[string][]string{"beta": {baseModel}}

func mayUse(tenant, model string) bool {
	ms, ok := tenantModels[tenant]
	if !ok {
		return model == baseModel || model == otherModel
	}
	for _, m := range ms {
		if m == model {
			return true
		}
	}
	return false
}

// pickKind draws an op's endpoint: about a third of the traffic goes to
// the embeddings family and the Responses API.
func pickKind(rng *rand.Rand) opKind {
	switch r := rng.IntN(20); {
	case r < 7:
		return kChat
	case r < 13:
		return kCompletion
	case r < 15:
		return kEmbed
	case r < 16:
		return kEmbedChat
	case r < 17:
		return []opKind{kScore, kRerank}[rng.IntN(2)]
	case r < 18:
		return []opKind{kPooling, kClassify}[rng.IntN(2)]
	default:
		return kResponses
	}
}

// pickShape draws an op's body shape for its kind: hostile ones at about
// 8%, counted extras at about 10%.
func pickShape(rng *rand.Rand, k opKind) shape {
	var cands []shape
	switch f := rng.Float64(); {
	case f < 0.08:
		cands = hostileShapes(k)
	case f < 0.18:
		cands = countedShapes(k)
	default:
		return shPlain
	}
	return cands[rng.IntN(len(cands))]
}

// hostileShapes are the hostile shapes of kind k (repeats weigh a draw).
func hostileShapes(k opKind) []shape {
	out := []shape{shDupModel, shDupModelEsc, shDupInput, shDeep}
	if k.generates() {
		out = append(out, shDupMaxTokens)
	}
	if k.embedFamily() {
		out = append(out, shMixed, shMixed)
	}
	if k == kResponses {
		out = append(out, shBackground, shBackground)
	}
	return out
}

// countedShapes are the admitted extras of kind k.
func countedShapes(k opKind) []shape {
	out := []shape{shPriority}
	if k == kChat {
		out = append(out, shDocuments, shDocuments, shImage)
	}
	if k == kResponses {
		out = append(out, shImage)
	}
	return out
}

func words(prefix string, n int) string {
	var b strings.Builder
	b.WriteString(prefix)
	for i := range n {
		fmt.Fprintf(&b, " w%d", i)
	}
	return b.String()
}

// body is the op's request body: encoding/json for the member values, then
// the hostile members spliced in as raw JSON (encoding/json writes neither
// duplicate keys nor escaped key spellings).
func (o *opSpec) body() []byte {
	text := words(fmt.Sprintf("chaos-op-%d", o.id), o.words)
	m := map[string]any{"model": o.modelName()}
	msgs := func(content any) []map[string]any { return []map[string]any{{"role": "user", "content": content}} }
	switch o.kind {
	case kCompletion:
		m["prompt"] = text
	case kChat:
		if o.shape == shImage {
			m["messages"] = msgs([]map[string]any{{"type": "text", "text": text},
				{"type": "image_url", "image_url": map[string]string{"url": "data:image/png;base64,iVBORw0KGgo="}}})
		} else {
			m["messages"] = msgs(text)
		}
		if o.shape == shDocuments {
			var docs []map[string]string
			for d := range o.items {
				docs = append(docs, map[string]string{"title": fmt.Sprintf("doc %d", d), "text": words("", o.docWords)})
			}
			m["documents"] = docs
		}
	case kEmbed, kPooling, kClassify:
		if o.items > 1 {
			in := []string{text}
			for d := 1; d < o.items; d++ {
				in = append(in, words(fmt.Sprintf("item %d", d), o.words/2))
			}
			m["input"] = in
		} else {
			m["input"] = text
		}
	case kEmbedChat:
		m["messages"] = msgs(text)
	case kScore, kRerank:
		var docs []string
		for d := range max(1, o.items) {
			docs = append(docs, words(fmt.Sprintf("doc %d", d), 3+o.words/3))
		}
		if o.kind == kScore {
			m["text_1"], m["text_2"] = text, docs
		} else {
			m["query"], m["documents"] = text, docs
		}
	case kResponses:
		if o.shape == shImage {
			m["input"] = []map[string]any{{"role": "user", "content": []map[string]any{{"type": "input_text", "text": text},
				{"type": "input_image", "image_url": "data:image/png;base64,iVBORw0KGgo="}}}}
		} else {
			m["input"] = text
		}
	}
	if o.kind.generates() {
		m["stream"] = o.stream
		if o.maxTokens > 0 {
			m[o.capKey()] = o.maxTokens
		}
	}
	if o.badN {
		m["n"] = 1 << 30
	} else if o.n > 1 {
		m["n"] = o.n
	}
	if o.shape == shPriority {
		m["priority"] = -5 // what a tenant would send to jump the replica's queue
	}
	out, _ := json.Marshal(m)
	var extra string
	switch o.shape {
	case shDupModel:
		extra = `,"model":"` + otherModel + `"`
	case shDupModelEsc:
		extra = `,"mod\u0065l":"` + otherModel + `"`
	case shDupInput:
		extra = "," + o.hiddenMember()
	case shDupMaxTokens:
		extra = fmt.Sprintf(`,%q:%d`, o.capKey(), 4000)
	case shDeep:
		extra = `,"x":` + strings.Repeat("[", deepLevels) + strings.Repeat("]", deepLevels) +
			`,"model":"` + otherModel + `",` + o.hiddenMember()
	case shMixed:
		// vLLM's union runs input; a bound of messages would miss it.
		if o.kind == kEmbedChat {
			extra = `,"input":` + quote(words(fmt.Sprintf("chaos-op-%d hidden", o.id), hiddenWords))
		} else {
			extra = `,"messages":[{"role":"user","content":"short"}]`
			out, _ = json.Marshal(map[string]any{"model": o.modelName(),
				"input": words(fmt.Sprintf("chaos-op-%d hidden", o.id), hiddenWords)})
		}
	case shBackground:
		extra = `,"background":true,"store":true`
	}
	if extra != "" {
		out = append(append(out[:len(out)-1], extra...), '}')
	}
	return out
}

func quote(s string) string { b, _ := json.Marshal(s); return string(b) }

// hiddenMember is a second prompt member of hiddenWords words.
func (o *opSpec) hiddenMember() string {
	big := quote(words(fmt.Sprintf("chaos-op-%d hidden", o.id), hiddenWords))
	switch o.kind {
	case kCompletion:
		return `"prompt":` + big
	case kChat, kEmbedChat:
		return `"messages":[{"role":"user","content":` + big + `}]`
	case kScore:
		return `"text_1":` + big
	case kRerank:
		return `"query":` + big
	}
	return `"input":` + big
}

func (o *opSpec) modelName() string {
	if o.model != "" {
		return o.model
	}
	return baseModel
}

// capKey is the member of the op's output cap.
func (o *opSpec) capKey() string {
	if o.kind == kResponses {
		return "max_output_tokens"
	}
	return "max_tokens"
}

func (o *opSpec) cap() int {
	if !o.kind.generates() {
		return 0
	}
	if o.maxTokens > 0 {
		return min(o.maxTokens, maxOut)
	}
	return maxOut
}

// inputUpper bounds the input tokens Sluice may charge for the op without
// a usage report (an abort before any): its bytes bound, which counts
// documents re-indented (at most twice their bytes here), each media part
// at the media allowance and, for score and rerank, the query once per
// document.
func (o *opSpec) inputUpper() int64 {
	n := int64(2*len(o.body()) + 64)
	if o.kind == kScore || o.kind == kRerank {
		n *= int64(max(1, o.items) + 1)
	}
	if o.shape == shImage {
		n += mediaAllowance
	}
	return n
}

// expectRefusal reports whether the op must be refused before it is
// admitted, and with what: a hostile body with 400 invalid_request.
func (o *opSpec) expectRefusal() bool { return o.shape.hostile() }

// readEvents reads a streamed /v1/responses answer: "event:"/"data:" pairs
// ending with response.completed (or .incomplete); no [DONE]. cut, when
// set, is called at the first output delta (a client leaving mid-stream).
func readEvents(r io.Reader, cut func()) (code string, done bool, err error) {
	sc := bufio.NewScanner(r)
	sc.Buffer(make([]byte, 64<<10), 1<<20)
	for sc.Scan() {
		data, ok := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
		if !ok {
			continue
		}
		var ev struct {
			Type  string          `json:"type"`
			Code  any             `json:"code"`
			Error json.RawMessage `json:"error"`
		}
		if json.Unmarshal(data, &ev) != nil {
			continue
		}
		switch ev.Type {
		case "response.completed", "response.incomplete":
			done = true
		case "response.output_text.delta":
			if cut != nil {
				cut()
				cut = nil
			}
		case "error", "response.failed":
			code = "stream_error"
			if ev.Code != nil {
				code = fmt.Sprint(ev.Code)
			}
		}
		if len(ev.Error) > 0 && string(ev.Error) != "null" {
			var e struct {
				Code any `json:"code"`
			}
			if json.Unmarshal(ev.Error, &e) == nil && e.Code != nil {
				code = fmt.Sprint(e.Code)
			}
		}
	}
	return code, done, sc.Err()
}

// tally is the run's outcomes per endpoint and shape, for the test log: a
// run whose new endpoints all failed would pass the invariants vacuously.
func (w *world) tally() string {
	type key struct {
		k opKind
		s shape
	}
	counts := map[key]map[string]int{}
	for _, r := range w.results {
		k := key{r.ev.op.kind, r.ev.op.shape}
		if counts[k] == nil {
			counts[k] = map[string]int{}
		}
		o := fmt.Sprint(r.status)
		if r.code != "" {
			o += " " + r.code
		}
		if r.ev.op.badN {
			o += " (n out of range)"
		}
		counts[k][o]++
	}
	var lines []string
	for k, c := range counts {
		lines = append(lines, fmt.Sprintf("%s/%s %v", k.k, k.s, c))
	}
	sort.Strings(lines)
	return strings.Join(lines, "; ")
}

// --- What the replicas ran was admitted ----------------------------------------

// auditTrail is what the instances' audit trails say of each request id.
type auditTrail struct {
	held    map[string]int64    // admit / outage_admit, and settle (a grown hold): the most tokens held
	charged map[string][]string // kinds that reserve or charge: admit, outage_admit, settle (with tokens)
	// stopped names the requests whose generation Sluice stopped at a
	// budget (settle reason "budget"), and stoppedBy counts them per tenant.
	stopped   map[string]bool
	stoppedBy map[string]int64
}

func (w *world) readAudit() auditTrail {
	a := auditTrail{held: map[string]int64{}, charged: map[string][]string{}, stopped: map[string]bool{}, stoppedBy: map[string]int64{}}
	for i := range w.inst {
		paths, _ := filepath.Glob(filepath.Join(w.dir, fmt.Sprintf("audit-%d.log*", i)))
		for _, p := range paths {
			if strings.HasSuffix(p, ".lock") {
				continue
			}
			f, err := os.ReadFile(p)
			if err != nil {
				continue
			}
			for line := range strings.SplitSeq(string(f), "\n") {
				var rec struct {
					Kind          string `json:"kind"`
					Tenant        string `json:"tenant"`
					Reason        string `json:"reason"`
					RequestID     string `json:"request_id"`
					TokensHeld    int64  `json:"tokens_held"`
					TokensCharged int64  `json:"tokens_charged"`
				}
				if json.Unmarshal([]byte(line), &rec) != nil || rec.RequestID == "" {
					continue
				}
				switch rec.Kind {
				case "admit", "outage_admit":
					a.held[rec.RequestID] = max(a.held[rec.RequestID], rec.TokensHeld)
					a.charged[rec.RequestID] = append(a.charged[rec.RequestID], rec.Kind)
				case "settle", "outage_charge":
					// A predicted hold grows as its request runs: its
					// settle names the hold it grew to.
					a.held[rec.RequestID] = max(a.held[rec.RequestID], rec.TokensHeld)
					if rec.Reason == "budget" && !a.stopped[rec.RequestID] {
						a.stopped[rec.RequestID] = true
						a.stoppedBy[rec.Tenant]++
					}
					if rec.TokensCharged > 0 {
						a.charged[rec.RequestID] = append(a.charged[rec.RequestID], fmt.Sprintf("%s of %d tokens", rec.Kind, rec.TokensCharged))
					}
				}
			}
		}
	}
	return a
}

// checkAdmitted checks every body a replica received against what Sluice
// checked, reading it the way vLLM does (encoding/json into a map keeps the
// last of duplicate keys, like Python's json.loads): a model the tenant
// may use, no client priority (no replica here runs priority scheduling,
// so Sluice sets none), no background run, and a prompt, as the replica
// counted it, within the tenant's max_input_tokens and, with its output,
// within the tokens Sluice held for it. And no hostile op reached a replica
// or was admitted or charged. The audit trails are read after every
// instance has stopped (a graceful stop flushes them); a killed instance
// may lose its last lines, so a missing admission is a violation only in a
// run without kills.
func (w *world) checkAdmitted(execs []*execution, byOp map[int][]*result) []string {
	var v []string
	add := func(format string, args ...any) { v = append(v, fmt.Sprintf(format, args...)) }
	trail := w.readAudit()
	for _, ex := range execs {
		o := w.p.ops[ex.op]
		if o == nil {
			continue
		}
		if o.shape.hostile() {
			add("op %d (%s %s, tenant %s): a hostile body reached a replica (%s)", o.id, o.kind, o.shape, o.tenant, ex.path)
		}
		var m map[string]any
		if err := json.Unmarshal(ex.body, &m); err != nil {
			add("op %d: the replica received a body it cannot read: %v", o.id, err)
			continue
		}
		model := baseModel // vLLM's default: the first served model
		if s, ok := m["model"].(string); ok {
			model = s
		}
		if !mayUse(o.tenant, model) {
			add("op %d (%s %s): the replica ran model %q, which tenant %s may not use", o.id, o.kind, o.shape, model, o.tenant)
		}
		if p, ok := m["priority"]; ok {
			add("op %d (%s %s): the replica received priority %v (no replica runs priority scheduling; a client's is never forwarded)", o.id, o.kind, o.shape, p)
		}
		if b, _ := m["background"].(bool); b {
			add("op %d (%s): the replica received background: true", o.id, o.kind)
		}
		if ex.prompt > maxInputTokens {
			add("op %d (%s %s, tenant %s): the replica counted %d prompt tokens, above the tenant's max_input_tokens %d",
				o.id, o.kind, o.shape, o.tenant, ex.prompt, maxInputTokens)
		}
		held, ok := trail.held[ex.reqID]
		switch {
		case !ok && executed(ex) && !w.killedAny():
			add("op %d (%s): a replica ran %s, which no audit trail admitted", o.id, o.kind, ex.reqID)
		case ok && trail.stopped[ex.reqID] && int64(max(0, ex.prompt)+max(0, ex.completion)) > held+predictStep:
			add("op %d (%s %s, tenant %s): stopped at a budget, the replica ran %d prompt + %d completion tokens, above the %d tokens held plus one step (%d)",
				o.id, o.kind, o.shape, o.tenant, ex.prompt, ex.completion, held, predictStep)
		case ok && !trail.stopped[ex.reqID] && int64(max(0, ex.prompt)+max(0, ex.completion)) > held:
			add("op %d (%s %s, tenant %s): the replica ran %d prompt + %d completion tokens, above the %d tokens held at admission or grown to",
				o.id, o.kind, o.shape, o.tenant, ex.prompt, ex.completion, held)
		}
	}
	for id, rs := range byOp {
		o := w.p.ops[id]
		if !o.expectRefusal() {
			continue
		}
		for _, r := range rs {
			if r.status != 0 && (r.status != http.StatusBadRequest || r.code != "invalid_request") {
				add("op %d try %d (%s %s, tenant %s): status %d %q, want 400 invalid_request", id, r.ev.attempt, o.kind, o.shape, o.tenant, r.status, r.code)
			}
			if r.status == 0 && !r.killed {
				add("op %d try %d (%s %s): no answer (%s)", id, r.ev.attempt, o.kind, o.shape, r.transport)
			}
			if ks := trail.charged[fmt.Sprintf("chaos-%d-%d", id, r.ev.attempt)]; len(ks) > 0 {
				add("op %d try %d (%s %s, tenant %s): a hostile body was admitted or charged: %s", id, r.ev.attempt, o.kind, o.shape, o.tenant, strings.Join(ks, ", "))
			}
		}
	}
	return v
}

// TestShapes pins the generator: every hostile body is one Sluice's parser
// refuses with 400 invalid_request and one that json.loads (encoding/json
// into a map: the last duplicate wins) reads as the shape says; every
// counted shape parses. It needs no sluice build: run it with
// -chaos.seeds=0.
func TestShapes(t *testing.T) {
	eps := map[opKind]vllm.Endpoint{kCompletion: vllm.EndpointCompletions, kChat: vllm.EndpointChat,
		kEmbed: vllm.EndpointEmbeddings, kEmbedChat: vllm.EndpointEmbeddings, kScore: vllm.EndpointScore,
		kRerank: vllm.EndpointRerank, kPooling: vllm.EndpointPooling, kClassify: vllm.EndpointClassify,
		kResponses: vllm.EndpointResponses}
	prompt := map[opKind]string{kCompletion: "prompt", kChat: "messages", kEmbedChat: "messages", kScore: "text_1", kRerank: "query"}
	for k := kCompletion; k <= kResponses; k++ {
		shapes := append([]shape{shPlain}, countedShapes(k)...)
		seen := map[shape]bool{}
		for _, s := range append(shapes, hostileShapes(k)...) {
			if seen[s] {
				continue
			}
			seen[s] = true
			o := &opSpec{id: 7, kind: k, shape: s, n: 1, words: 10, items: 2, docWords: 30, maxTokens: 8}
			name := fmt.Sprintf("%s/%s", k, s)
			body := o.body()
			var m map[string]any
			if err := json.Unmarshal(body, &m); err != nil {
				t.Fatalf("%s: %v", name, err)
			}
			_, err := vllm.Parse(eps[k], body, vllm.CountOptions{})
			if !s.hostile() {
				if err != nil {
					t.Errorf("%s: refused: %v", name, err)
				}
				continue
			}
			var ie *vllm.InvalidRequestError
			if !errors.As(err, &ie) {
				t.Errorf("%s: want an invalid request, got %v", name, err)
			}
			key := prompt[k]
			if key == "" || s == shMixed {
				key = "input"
			}
			pj, _ := json.Marshal(m[key])
			switch s {
			case shDupModel, shDupModelEsc:
				if m["model"] != otherModel {
					t.Errorf("%s: json.loads reads model %v", name, m["model"])
				}
			case shDupInput, shDeep, shMixed:
				if !strings.Contains(string(pj), "hidden") || (s == shDeep && m["model"] != otherModel) {
					t.Errorf("%s: json.loads does not run the hidden prompt: model %v, %s %.60s", name, m["model"], key, pj)
				}
			case shDupMaxTokens:
				if m[o.capKey()] != float64(4000) {
					t.Errorf("%s: json.loads reads %s %v", name, o.capKey(), m[o.capKey()])
				}
			case shBackground:
				if m["background"] != true {
					t.Errorf("%s: no background", name)
				}
			}
		}
	}
}
