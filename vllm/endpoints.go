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
	EndpointEmbeddings Endpoint = iota + 3 // POST /v1/embeddings
	EndpointResponses                      // POST /v1/responses
	EndpointTokenize                       // POST /tokenize
	EndpointDetokenize                     // POST /detokenize
	EndpointScore                          // POST /v1/score (/score)
	EndpointRerank                         // POST /v1/rerank (/rerank, /v2/rerank)
	EndpointPooling                        // POST /pooling
	EndpointClassify                       // POST /classify
)

var extraPaths = map[Endpoint]string{
	EndpointEmbeddings: "/v1/embeddings", EndpointResponses: "/v1/responses",
	EndpointTokenize: "/tokenize", EndpointDetokenize: "/detokenize",
	EndpointScore: "/v1/score", EndpointRerank: "/v1/rerank",
	EndpointPooling: "/pooling", EndpointClassify: "/classify",
}

// extraEndpoints maps every path vLLM serves them under (vllm's
// api_server.py also mounts /score, /rerank and /v2/rerank).
var extraEndpoints = map[string]Endpoint{
	"/v1/embeddings": EndpointEmbeddings, "/v1/responses": EndpointResponses,
	"/tokenize": EndpointTokenize, "/detokenize": EndpointDetokenize,
	"/v1/score": EndpointScore, "/score": EndpointScore,
	"/v1/rerank": EndpointRerank, "/rerank": EndpointRerank, "/v2/rerank": EndpointRerank,
	"/pooling": EndpointPooling, "/classify": EndpointClassify,
}

// HasOutput reports whether the endpoint generates tokens (and so gets an
// output cap and an output reservation).
func (e Endpoint) HasOutput() bool {
	return e == EndpointChat || e == EndpointCompletions || e == EndpointResponses
}

// RequestOnly reports endpoints that are counted as requests only (no
// tokens held or charged): /tokenize and /detokenize run no model.
func (e Endpoint) RequestOnly() bool { return e == EndpointTokenize || e == EndpointDetokenize }

// parseOther parses the bodies of the non-generation endpoints and of
// /v1/responses: the model, the stream flag and output cap of responses,
// and an upper bound of the input tokens, by the same bytes rule as chat
// (every string's decoded bytes plus special tokens, token ids counted
// as given).
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
	r := &Request{Endpoint: e, N: 1, body: body}
	fields := map[string]span{}
	_ = eachMember(body, i, func(m member) bool {
		k, err := unquoteJSON(body[m.keyStart:m.keyEnd])
		if err == nil {
			fields[k] = span{m.valStart, m.valEnd}
		}
		return true
	})
	if v, ok := fields["model"]; ok && !isNull(body, v) {
		s, err := unquoteJSON(body[v.start:v.end])
		if body[v.start] != '"' || err != nil {
			return nil, invalid("model", "must be a string")
		}
		r.Model = s
	}
	sp := opts.SpecialTokensPerPrompt
	need := func(name string) (span, error) {
		v, ok := fields[name]
		if !ok || isNull(body, v) {
			return span{}, invalid(name, "is required")
		}
		return v, nil
	}
	switch e {
	case EndpointTokenize, EndpointDetokenize:
		r.InputTokens, r.InputExact = []int{0}, true
	case EndpointEmbeddings, EndpointPooling, EndpointClassify:
		name := "input"
		if _, ok := fields["messages"]; ok {
			name = "messages" // vLLM's chat-style embedding request
		}
		v, err := need(name)
		if err != nil {
			return nil, err
		}
		b := boundOf(body, v)
		n := b.bytes + b.strings*sp + b.ints
		if name == "messages" {
			n += b.strings*opts.TemplateTokensPerMessage + opts.TemplateTokensPerRequest
		}
		r.InputTokens = []int{n}
	case EndpointScore, EndpointRerank:
		qn, dn := "text_1", "text_2"
		if e == EndpointRerank {
			qn, dn = "query", "documents"
		}
		for _, alt := range [][2]string{{"queries", "documents"}, {"data_1", "data_2"}} {
			if _, ok := fields[qn]; !ok {
				if _, ok := fields[alt[0]]; ok {
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
		docs := max(1, db.items)
		r.InputTokens = []int{docs*(qb.maxItem+2*sp) + db.bytes + db.ints}
	case EndpointResponses:
		v, err := need("input")
		if err != nil {
			return nil, err
		}
		b := boundOf(body, v)
		n := b.bytes + b.ints + opts.TemplateTokensPerRequest + max(1, b.items)*opts.TemplateTokensPerMessage
		if ins, ok := fields["instructions"]; ok && !isNull(body, ins) {
			n += boundOf(body, ins).bytes + opts.TemplateTokensPerMessage
		}
		if t, ok := fields["tools"]; ok && !isNull(body, t) {
			n += indentedLen(body[t.start:t.end])
		}
		r.InputTokens = []int{n}
		var err2 error
		if r.Stream, err2 = optBool(body, fields["stream"], "stream", false); err2 != nil {
			return nil, err2
		}
		v2, set, err := optInt(body, fields["max_output_tokens"], "max_output_tokens")
		if err != nil {
			return nil, err
		}
		if set && v2 < 1 {
			return nil, invalid("max_output_tokens", "must be at least 1")
		}
		r.MaxTokens = v2
	}
	return r, nil
}

// bound sums what a JSON value can contribute to a prompt.
type bound struct {
	bytes, strings, ints int
	items                int // top-level array elements (1 for a scalar)
	maxItem              int // largest top-level element's bytes + ints
}

// boundOf walks v: decoded string bytes, string count, integer count.
func boundOf(b []byte, v span) bound {
	var out bound
	var walk func(start, end int) (int, int)
	walk = func(start, end int) (int, int) { // bytes+ints, strings
		switch b[start] {
		case '"':
			n, _ := stringLen(b[start:end])
			out.bytes += n
			out.strings++
			return n, 1
		case '[':
			total, strs := 0, 0
			_ = eachElement(b, start, func(s, e int) bool {
				t, st := walk(s, e)
				total, strs = total+t, strs+st
				return true
			})
			return total, strs
		case '{':
			total, strs := 0, 0
			_ = eachMember(b, start, func(m member) bool {
				t, st := walk(m.valStart, m.valEnd)
				total, strs = total+t, strs+st
				return true
			})
			return total, strs
		case 'n', 't', 'f':
			return 0, 0
		}
		out.ints++
		return 1, 0
	}
	if b[v.start] == '[' {
		_ = eachElement(b, v.start, func(s, e int) bool {
			t, _ := walk(s, e)
			out.items++
			out.maxItem = max(out.maxItem, t)
			return true
		})
		return out
	}
	t, _ := walk(v.start, v.end)
	out.items, out.maxItem = 1, t
	return out
}

// RewriteOutputCap appends to dst the body of a /v1/responses request
// with max_output_tokens set to capTokens (every other member kept byte
// for byte).
func (r *Request) RewriteOutputCap(dst []byte, capTokens int) []byte {
	b := r.body
	start := skipSpace(b, 0)
	dst = append(dst, '{')
	first := true
	_ = eachMember(b, start, func(m member) bool {
		if m.keyIs(b, "max_output_tokens") {
			return true
		}
		if !first {
			dst = append(dst, ',')
		}
		first = false
		dst = append(dst, b[m.keyStart:m.valEnd]...)
		return true
	})
	if !first {
		dst = append(dst, ',')
	}
	dst = append(dst, `"max_output_tokens":`...)
	dst = strconv.AppendInt(dst, int64(capTokens), 10)
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
	var total int
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

// ResponsesStream reads a streamed /v1/responses answer: SSE events
// "event: <type>\ndata: <json>" ending after response.completed (or
// .incomplete/.failed) with no [DONE] (vllm/entrypoints/openai/responses/
// api_router.py). It counts output_text deltas for an early end.
type ResponsesStream struct {
	br     *bufio.Reader
	max    int
	usage  Usage
	deltas int
	ended  bool
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
	var typ []byte
	resp := -1
	_ = eachMember(data, 0, func(m member) bool {
		switch {
		case m.keyIs(data, "type"):
			typ = data[m.valStart:m.valEnd]
		case m.keyIs(data, "response") && data[m.valStart] == '{':
			resp = m.valStart
		}
		return true
	})
	switch string(typ) {
	case `"response.output_text.delta"`, `"response.reasoning_text.delta"`:
		s.deltas++
	case `"response.completed"`, `"response.incomplete"`, `"response.failed"`:
		s.ended = true
		if resp >= 0 {
			if u, ok := BodyUsage(data[resp:]); ok {
				s.usage = u
			}
		}
	case `"error"`:
		s.ended = true
	}
}

// Settle is the usage to charge: vLLM's own once the terminal event came,
// else the prompt bound plus one token per delta seen plus allowance
// (vLLM sends one delta per stream interval of at least one token).
func (s *ResponsesStream) Settle(promptTokens, allowance, capTokens int) Usage {
	if s.usage.Final {
		return s.usage
	}
	return Usage{PromptTokens: promptTokens, CompletionTokens: min(capTokens, s.deltas+allowance), Known: true}
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
