package vllm

import (
	"bufio"
	"bytes"
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/http/httptrace"
	"strconv"
	"strings"
	"sync/atomic"
)

// The rest of vLLM's OpenAI surface (numbered after the generation
// endpoints; values are never renumbered).
const (
	EndpointEmbeddings  Endpoint = iota + 3 // POST /v1/embeddings
	EndpointResponses                       // POST /v1/responses
	EndpointTokenize                        // POST /tokenize
	EndpointDetokenize                      // POST /detokenize
	EndpointScore                           // POST /v1/score (/score)
	EndpointRerank                          // POST /v1/rerank (/rerank, /v2/rerank)
	EndpointPooling                         // POST /pooling
	EndpointClassify                        // POST /classify
	EndpointMessages                        // POST /v1/messages (Anthropic)
	EndpointCountTokens                     // POST /v1/messages/count_tokens
)

var extraPaths = map[Endpoint]string{
	EndpointEmbeddings: "/v1/embeddings", EndpointResponses: "/v1/responses",
	EndpointTokenize: "/tokenize", EndpointDetokenize: "/detokenize",
	EndpointScore: "/v1/score", EndpointRerank: "/v1/rerank",
	EndpointPooling: "/pooling", EndpointClassify: "/classify",
	EndpointMessages: "/v1/messages", EndpointCountTokens: "/v1/messages/count_tokens",
}

// extraEndpoints maps every path vLLM serves them under (vllm's
// api_server.py also mounts /score, /rerank and /v2/rerank).
var extraEndpoints = map[string]Endpoint{
	"/v1/embeddings": EndpointEmbeddings, "/v1/responses": EndpointResponses,
	"/tokenize": EndpointTokenize, "/detokenize": EndpointDetokenize,
	"/v1/score": EndpointScore, "/score": EndpointScore,
	"/v1/rerank": EndpointRerank, "/rerank": EndpointRerank, "/v2/rerank": EndpointRerank,
	"/pooling": EndpointPooling, "/classify": EndpointClassify,
	"/v1/messages": EndpointMessages, "/v1/messages/count_tokens": EndpointCountTokens,
}

// HasOutput reports whether the endpoint generates tokens (and so gets an
// output cap and an output reservation).
func (e Endpoint) HasOutput() bool {
	return e == EndpointChat || e == EndpointCompletions || e == EndpointResponses || e == EndpointMessages
}

// RequestOnly reports endpoints that are counted as requests only (no
// tokens held or charged): /tokenize, /detokenize and Anthropic's
// count_tokens run no model.
func (e Endpoint) RequestOnly() bool {
	return e == EndpointTokenize || e == EndpointDetokenize || e == EndpointCountTokens
}

// Anthropic reports the endpoints of Anthropic's Messages API, whose
// refusals and stream errors take Anthropic's error shape.
func (e Endpoint) Anthropic() bool { return e == EndpointMessages || e == EndpointCountTokens }

// parseOther parses the bodies of the non-generation endpoints and of
// /v1/responses: the model, the stream flag and output cap of responses,
// and an upper bound of the input tokens, by the same bytes rule as chat
// (every string's decoded bytes plus special tokens, token ids counted
// as given, media parts at the media allowance). Every top-level member is
// read: a body with a duplicate key, or nested past the scanner's depth,
// is refused rather than forwarded unread (topMembers).
func parseOther(e Endpoint, body []byte, opts CountOptions) (*Request, error) {
	if _, ok := extraPaths[e]; !ok {
		return nil, fmt.Errorf("parse: unknown endpoint %d", e)
	}
	if !validJSON(body) && !json.Valid(body) {
		return nil, invalid("", "body is not valid JSON")
	}
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return nil, invalid("", "body must be a JSON object")
	}
	opts = opts.withDefaults()
	r := &Request{Endpoint: e, N: 1, body: body, mediaTokens: opts.MediaTokensPerPart}
	fields, err := topMembers(body, i)
	if err != nil {
		return nil, err
	}
	present := func(name string) (span, bool) {
		v, ok := fields[name]
		return v, ok && !isNull(body, v)
	}
	if v, ok := present("model"); ok {
		s, err := unquoteJSON(body[v.start:v.end])
		if body[v.start] != '"' || err != nil {
			return nil, invalid("model", "must be a string")
		}
		r.Model = s
	}
	if v, ok := present("cache_salt"); ok {
		r.cacheSalt = v
	}
	if v, ok := present("priority"); ok {
		// Type-checked as vLLM would; never forwarded (UpstreamBody).
		if r.Priority, _, err = optSignedInt(body, v, "priority"); err != nil {
			return nil, err
		}
	}
	sp := opts.SpecialTokensPerPrompt
	need := func(name string) (span, error) {
		v, ok := present(name)
		if !ok {
			return span{}, invalid(name, "is required")
		}
		return v, nil
	}
	media := func(b bound) {
		if b.media > 0 {
			r.HasMedia = true
			r.MediaParts += b.media
		}
	}
	switch e {
	case EndpointTokenize, EndpointDetokenize:
		r.InputTokens, r.InputExact = []int{0}, true
	case EndpointEmbeddings, EndpointPooling, EndpointClassify:
		_, hasIn := present("input")
		_, hasMsgs := present("messages")
		if hasIn && hasMsgs {
			// vLLM's request type is a union of the completion and chat
			// forms, both accepting extra fields: which one it runs is
			// pydantic's choice, not the client's. Refuse the ambiguity.
			return nil, invalid("messages", "send either input or messages, not both")
		}
		name := "input"
		if hasMsgs {
			name = "messages" // vLLM's chat-style request
		}
		v, err := need(name)
		if err != nil {
			return nil, err
		}
		b := boundOf(body, v)
		media(b)
		n := b.tokens(opts.MediaTokensPerPart) + b.strings*sp
		if name == "messages" {
			n += b.strings*opts.TemplateTokensPerMessage + opts.TemplateTokensPerRequest
			for _, extra := range []string{"chat_template_kwargs", "documents", "tools"} {
				if x, ok := present(extra); ok {
					n += indentedLen(body[x.start:x.end])
				}
			}
			if _, ok := present("chat_template"); ok {
				return nil, invalid("chat_template", "is not accepted on this endpoint: Sluice cannot bound what it renders")
			}
		}
		r.InputTokens = []int{n}
	case EndpointScore, EndpointRerank:
		qn, dn := "text_1", "text_2"
		if e == EndpointRerank {
			qn, dn = "query", "documents"
		}
		for _, alt := range [][2]string{{"queries", "documents"}, {"data_1", "data_2"}} {
			if _, ok := present(qn); !ok {
				if _, ok := present(alt[0]); ok {
					qn, dn = alt[0], alt[1]
				}
			}
		}
		q, err := need(qn)
		if err != nil {
			return nil, err
		}
		d, err := need(dn)
		if err != nil {
			return nil, err
		}
		// Each document is scored together with a query: n × the
		// longest query bounds the query side.
		qb, db := boundOf(body, q), boundOf(body, d)
		media(qb)
		media(db)
		docs := max(1, db.items)
		r.InputTokens = []int{docs*(qb.maxItem+2*sp+qb.media*opts.MediaTokensPerPart) + db.tokens(opts.MediaTokensPerPart)}
	case EndpointResponses:
		if err := r.parseResponses(present, need, opts); err != nil {
			return nil, err
		}
	case EndpointMessages, EndpointCountTokens:
		if err := r.parseMessages(present, need, opts); err != nil { // messages.go
			return nil, err
		}
	}
	return r, nil
}

// parseResponses bounds a /v1/responses body: input items (text, media,
// tool calls and outputs), instructions and tools; its stream flag and
// max_output_tokens.
func (r *Request) parseResponses(present func(string) (span, bool), need func(string) (span, error), opts CountOptions) error {
	body := r.body
	if v, ok := present("background"); ok && string(body[v.start:v.end]) != "false" {
		// vLLM runs a background response detached from its HTTP request
		// (responses/serving.py): Sluice would free its slot and room while
		// the replica still generates, and could not charge what ran.
		return invalid("background", "background responses are not supported through Sluice; send the request in the foreground (stream it for long generations)")
	}
	for _, name := range []string{"previous_response_id", "conversation"} {
		if _, ok := present(name); ok {
			// The prompt then holds a stored conversation whose size the
			// body does not show: it is bounded by the model's context
			// (Plan), which vLLM enforces on the whole prompt.
			r.ContextInput = true
		}
	}
	v, err := need("input")
	if err != nil {
		return err
	}
	b := boundOf(body, v)
	if b.media > 0 {
		r.HasMedia, r.MediaParts = true, b.media
	}
	n := b.tokens(opts.MediaTokensPerPart) + opts.TemplateTokensPerRequest + max(1, b.items)*opts.TemplateTokensPerMessage
	if ins, ok := present("instructions"); ok {
		n += boundOf(body, ins).bytes + opts.TemplateTokensPerMessage
	}
	if t, ok := present("tools"); ok {
		n += indentedLen(body[t.start:t.end])
	}
	r.InputTokens = []int{n}
	st, _ := present("stream")
	if r.Stream, err = optBool(body, st, "stream", false); err != nil {
		return err
	}
	mo, _ := present("max_output_tokens")
	v2, set, err := optInt(body, mo, "max_output_tokens")
	if err != nil {
		return err
	}
	if set && v2 < 1 {
		return invalid("max_output_tokens", "must be at least 1")
	}
	r.MaxTokens = v2
	return nil
}

// UpstreamBody appends to dst the body sent upstream for the
// non-generation endpoints and /v1/responses: the client's members byte
// for byte, less its "priority" (Sluice's to set, see RewriteOptions) and,
// with capTokens > 0, with the output cap set to capTokens
// (/v1/responses' max_output_tokens, /v1/messages' max_tokens). Parse refused duplicates, so each member dropped is the only
// one of its name.
func (r *Request) UpstreamBody(dst []byte, capTokens int, o RewriteOptions) []byte {
	b := r.body
	capKey := ""
	switch r.Endpoint {
	case EndpointResponses:
		capKey = "max_output_tokens"
	case EndpointMessages:
		capKey = "max_tokens"
	}
	setCap := capKey != "" && capTokens > 0
	start := skipSpace(b, 0)
	dst = append(dst, '{')
	first := true
	_ = eachMember(b, start, func(m member) bool {
		if m.keyIs(b, "priority") || (setCap && m.keyIs(b, capKey)) || (o.CacheSalt != "" && m.keyIs(b, "cache_salt")) {
			return true
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, b[m.keyStart:m.valEnd]...)
		return true
	})
	sep := func() {
		if !first {
			dst = append(dst, ',')
		}
		first = false
	}
	if setCap {
		sep()
		dst = append(dst, '"')
		dst = append(dst, capKey...)
		dst = append(dst, `":`...)
		dst = strconv.AppendInt(dst, int64(capTokens), 10)
	}
	if o.SetPriority {
		sep()
		dst = append(dst, `"priority":`...)
		dst = strconv.AppendInt(dst, int64(o.Priority), 10)
	}
	if o.CacheSalt != "" {
		sep()
		dst = append(dst, `"cache_salt":`...)
		dst = strconv.AppendQuote(dst, o.CacheSalt)
	}
	return append(dst, '}')
}

// BodyUsage reads the usage of a non-streamed answer: prompt_tokens (or
// input_tokens, or rerank's total_tokens) and completion_tokens (or
// output_tokens), and cached tokens. ok is false when there is none.
func BodyUsage(body []byte) (u Usage, ok bool) {
	i := skipSpace(body, 0)
	if i >= len(body) || body[i] != '{' {
		return u, false
	}
	_ = eachMember(body, i, func(m member) bool {
		if m.keyIs(body, "usage") && body[m.valStart] == '{' {
			u, ok = usageObject(body, m.valStart)
			return false
		}
		return true
	})
	return u, ok
}

func usageObject(b []byte, at int) (Usage, bool) {
	var u Usage
	var total, cacheRead, cacheWrite int
	ok := false
	num := func(v []byte) int {
		n, good := parseInt(v)
		if !good || n < 0 || n >= maxCount {
			return 0
		}
		ok = true
		return int(n)
	}
	_ = eachMember(b, at, func(m member) bool {
		v := b[m.valStart:m.valEnd]
		switch {
		case m.keyIs(b, "prompt_tokens"), m.keyIs(b, "input_tokens"):
			u.PromptTokens = num(v)
		case m.keyIs(b, "completion_tokens"), m.keyIs(b, "output_tokens"):
			u.CompletionTokens = num(v)
		case m.keyIs(b, "total_tokens"):
			total = num(v)
		case m.keyIs(b, "cache_read_input_tokens"):
			// Anthropic's input_tokens leaves out the cache's tokens
			// (read and written), which were prompt all the same.
			cacheRead = num(v)
		case m.keyIs(b, "cache_creation_input_tokens"):
			cacheWrite = num(v)
		case (m.keyIs(b, "prompt_tokens_details") || m.keyIs(b, "input_tokens_details")) && v[0] == '{':
			_ = eachMember(b, m.valStart, func(dm member) bool {
				if dm.keyIs(b, "cached_tokens") {
					if n, good := parseInt(b[dm.valStart:dm.valEnd]); good && n >= 0 && n < maxCount {
						u.CachedTokens = int(n)
					}
				}
				return true
			})
		}
		return true
	})
	if cacheRead+cacheWrite > 0 {
		u.PromptTokens += cacheRead + cacheWrite
		u.CachedTokens = cacheRead
	}
	if u.PromptTokens == 0 && u.CompletionTokens == 0 && total > 0 {
		u.PromptTokens = total // rerank reports total_tokens only
	}
	u.Known, u.Final = ok, ok
	return u, ok
}

// Post sends body to baseURL+path and returns the response once 200
// headers arrived; the caller reads and closes its body. Errors are as
// [Client.Stream]'s: *UpstreamError for non-200, ErrNotSent before a
// connection was obtained. Cancelling ctx closes the connection (vLLM's
// abort signal).
func (c *Client) Post(ctx context.Context, baseURL, path string, body []byte, requestID string) (*http.Response, error) {
	var gotConn atomic.Bool
	trace := &httptrace.ClientTrace{GotConn: func(httptrace.GotConnInfo) { gotConn.Store(true) }}
	req, err := http.NewRequestWithContext(httptrace.WithClientTrace(ctx, trace), http.MethodPost,
		strings.TrimSuffix(baseURL, "/")+path, bytes.NewReader(body))
	if err != nil {
		return nil, fmt.Errorf("upstream %s: build request: %w: %w", baseURL, ErrNotSent, err)
	}
	req.Header = http.Header{"Content-Type": {"application/json"}}
	if requestID != "" {
		req.Header["X-Request-Id"] = []string{requestID}
	}
	if tp := traceparentOf(ctx); tp != "" {
		req.Header["Traceparent"] = []string{tp}
	}
	resp, err := c.hc.Do(req)
	if err != nil {
		if !gotConn.Load() {
			return nil, fmt.Errorf("upstream %s: %w: %w", baseURL, ErrNotSent, err)
		}
		return nil, fmt.Errorf("upstream %s: %w", baseURL, err)
	}
	if resp.StatusCode != http.StatusOK {
		return nil, c.errorFrom(resp.StatusCode, resp.Body, baseURL)
	}
	return resp, nil
}

// ReadBody reads a unary answer up to the client's response limit.
func (c *Client) ReadBody(resp *http.Response) ([]byte, error) {
	defer resp.Body.Close()
	b, err := io.ReadAll(io.LimitReader(resp.Body, int64(c.cfg.MaxResponseBytes)+1))
	if err != nil {
		return nil, err
	}
	if len(b) > c.cfg.MaxResponseBytes {
		return nil, fmt.Errorf("response over %d bytes", c.cfg.MaxResponseBytes)
	}
	return b, nil
}

// ResponsesStream reads a streamed /v1/responses or /v1/messages answer:
// SSE events "event: <type>\ndata: <json>" with no [DONE], ending after
// response.completed (or .incomplete/.failed; vllm/entrypoints/openai/
// responses/api_router.py) or Anthropic's message_stop, whose usage came
// in message_delta (vllm/entrypoints/anthropic/serving.py). For a stream
// cut before its end it bounds the output from the deltas seen.
type ResponsesStream struct {
	br    *bufio.Reader
	max   int
	usage Usage
	// out bounds the output tokens of the deltas seen: each delta event
	// (text, reasoning, tool-call arguments) counts its decoded bytes, at
	// least one. A byte-level BPE token decodes to at least one byte, so
	// the bytes bound what generated them, however many tokens one delta
	// carries (a server --stream-interval above 1, a tool parser that
	// sends a call's arguments whole).
	out    int
	deltas int
	// text is the output text the deltas carried, up to maxSeenText
	// bytes (textOver past it), for an exact count of a cut stream.
	text     []byte
	textOver bool
	ended    bool
	// prompt is the engine's prompt count when the stream reported it
	// first (Anthropic's message_start); 0 otherwise.
	prompt int
}

// NewResponsesStream reads events from r; maxEventBytes ≤ 0 is 1 MiB.
func NewResponsesStream(r io.Reader, maxEventBytes int) *ResponsesStream {
	if maxEventBytes <= 0 {
		maxEventBytes = defaultMaxEventBytes
	}
	return &ResponsesStream{br: bufio.NewReaderSize(r, streamReadBuf), max: maxEventBytes}
}

// Next returns the next event's raw bytes (with its blank line). io.EOF
// after the terminal event; ErrStreamCut when the stream ends before it.
func (s *ResponsesStream) Next() ([]byte, error) {
	if s.ended {
		return nil, io.EOF
	}
	var raw, data []byte
	for {
		line, err := s.br.ReadSlice('\n')
		if len(raw)+len(line) > s.max || errors.Is(err, bufio.ErrBufferFull) {
			return nil, ErrEventTooLarge
		}
		raw = append(raw, line...)
		if err != nil {
			return nil, fmt.Errorf("%w: %w", ErrStreamCut, io.ErrUnexpectedEOF)
		}
		l := bytes.TrimRight(line, "\r\n")
		if len(l) == 0 {
			if len(data) == 0 {
				raw = raw[:0]
				continue
			}
			break
		}
		if d, ok := bytes.CutPrefix(l, []byte("data:")); ok {
			data = append(data, bytes.TrimPrefix(d, []byte(" "))...)
		}
	}
	s.track(data)
	return raw, nil
}

func (s *ResponsesStream) track(data []byte) {
	var typ, delta []byte
	resp, msg := -1, -1
	_ = eachMember(data, 0, func(m member) bool {
		switch {
		case m.keyIs(data, "type"):
			typ = data[m.valStart:m.valEnd]
		case m.keyIs(data, "delta"):
			delta = data[m.valStart:m.valEnd]
		case m.keyIs(data, "response") && data[m.valStart] == '{':
			resp = m.valStart
		case m.keyIs(data, "message") && data[m.valStart] == '{':
			msg = m.valStart
		}
		return true
	})
	switch t := string(typ); {
	case t == `"message_start"`:
		// Anthropic: the prompt as the engine counted it.
		if msg >= 0 {
			if u, ok := BodyUsage(data[msg:]); ok {
				s.prompt = u.PromptTokens
			}
		}
	case t == `"message_delta"`:
		if u, ok := BodyUsage(data); ok {
			s.usage = u
		}
	case t == `"message_stop"`:
		s.ended = true
	case t == `"content_block_delta"`:
		if len(delta) > 0 && delta[0] == '{' {
			n := 0
			_ = eachMember(delta, 0, func(m member) bool {
				if !m.keyIs(delta, "type") && !m.keyIs(delta, "signature") && delta[m.valStart] == '"' {
					l, _ := stringLen(delta[m.valStart:m.valEnd])
					n += l
					s.keep(delta[m.valStart:m.valEnd])
				}
				return true
			})
			s.out += max(1, n)
			s.deltas++
		}
	case t == `"response.completed"`, t == `"response.incomplete"`, t == `"response.failed"`:
		s.ended = true
		if resp >= 0 {
			if u, ok := BodyUsage(data[resp:]); ok {
				s.usage = u
			}
		}
	case t == `"error"`:
		s.ended = true
	case strings.HasSuffix(t, `.delta"`):
		n := 1
		if len(delta) > 0 && delta[0] == '"' {
			if l, err := stringLen(delta); err == nil {
				n = max(1, l)
			}
			s.keep(delta)
		} else if len(delta) > 0 {
			n = max(1, len(delta))
			s.textOver = true
		}
		s.out += n
		s.deltas++
	}
}

// maxSeenText bounds the output text a stream keeps for a cut stream's
// count.
const maxSeenText = 4 << 20

// keep appends a delta's decoded text to the text seen.
func (s *ResponsesStream) keep(quoted []byte) {
	if s.textOver {
		return
	}
	t, err := unquoteJSON(quoted)
	if err != nil || len(s.text)+len(t) > maxSeenText {
		s.textOver, s.text = true, nil
		return
	}
	s.text = append(s.text, t...)
}

// Ended reports the stream's own end (its usage is then vLLM's).
func (s *ResponsesStream) Ended() bool { return s.usage.Final }

// SeenText returns the output text of the deltas read, for an exact count
// of a cut stream; ok is false when it is incomplete (too long, or a delta
// that was not text).
func (s *ResponsesStream) SeenText() (text string, ok bool) {
	return string(s.text), !s.textOver
}

// Settle is the usage to charge: vLLM's own once the terminal event came,
// else the prompt (the engine's count when the stream gave it, else the
// bound) plus the output seen plus allowance (what the engine may have
// generated past the last delta read), never above capTokens. The output
// seen is counted (the model's tokenizer on the text seen, at least one
// token per delta) when counted ≥ 0, else bounded by the deltas' bytes:
// a token decodes to at least one byte, however many one delta carries.
func (s *ResponsesStream) Settle(promptTokens, allowance, capTokens, counted int) Usage {
	if s.usage.Final {
		return s.usage
	}
	if s.prompt > 0 {
		promptTokens = s.prompt
	}
	out := s.out
	if counted >= 0 {
		out = max(counted, s.deltas)
	}
	return Usage{PromptTokens: promptTokens, CompletionTokens: min(capTokens, out+allowance), Known: true}
}

// PromptBytes returns the raw JSON of what the prompt is built from (chat
// messages, a completions prompt), for prefix-affinity routing; nil for
// other endpoints.
func (r *Request) PromptBytes() []byte {
	switch {
	case r.Endpoint == EndpointChat && r.messages.ok():
		return r.body[r.messages.start:r.messages.end]
	case r.Endpoint == EndpointCompletions && r.prompt.ok():
		return r.body[r.prompt.start:r.prompt.end]
	}
	return nil
}
