package vllm

import "strconv"

// The upstream body of a chat or completions request: the client's
// members byte for byte, less what Sluice replaces (the output cap, the
// stream options, priority, cache_salt) and with Sluice's values appended.

// RewriteOptions adjusts [Request.RewriteWith].
type RewriteOptions struct {
	// SetPriority writes "priority": Priority upstream, for replicas
	// started with --scheduling-policy priority (vLLM orders and preempts
	// by it, lower first). The client's own "priority" member is always
	// dropped: on such a replica it would let one tenant preempt another's
	// running work, and elsewhere a non-zero value is vLLM's 400.
	SetPriority bool
	Priority    int
	// CacheSalt, when not empty, is written as vLLM's "cache_salt" in
	// place of any the client sent (a tenant's prefix-cache namespace).
	CacheSalt string
	// StreamInterval > 0 sends a non-streamed request upstream as a stream
	// of that many tokens per chunk (its "stream_interval"), with
	// continuous usage, for [NewAssembler] to rebuild vLLM's body: an
	// abort is then charged from the usage that arrived. See
	// [Request.Reassemblable] for the requests this is faithful for.
	StreamInterval int
	keepCap        bool
}

// CacheSalt returns the raw JSON of the client's "cache_salt" (nil when
// absent): vLLM hits only blocks cached under the same salt, so prefix
// affinity keys on it.
func (r *Request) CacheSalt() []byte {
	if !r.cacheSalt.ok() || isNull(r.body, r.cacheSalt) {
		return nil
	}
	return r.body[r.cacheSalt.start:r.cacheSalt.end]
}

// rewriteKey reports the members Rewrite replaces or drops.
func (r *Request) rewriteKey(m member, o RewriteOptions) bool {
	b := r.body
	switch {
	case m.keyIs(b, "priority"):
		return true
	case o.CacheSalt != "" && m.keyIs(b, "cache_salt"):
		return true
	case (r.Stream || o.StreamInterval > 0) && (m.keyIs(b, "stream") || m.keyIs(b, "stream_options")):
		return true
	case !r.Stream && o.StreamInterval > 0 && m.keyIs(b, "stream_interval"):
		// vLLM ignores it on a non-streamed request; Sluice's interval
		// replaces it.
		return true
	case !o.keepCap && m.keyIs(b, "max_tokens"):
		return true
	case !o.keepCap && r.Endpoint == EndpointChat && m.keyIs(b, "max_completion_tokens"):
		return true
	}
	return false
}

// Rewrite appends to dst the upstream body for output cap capTokens: every
// member of the client's body is kept byte for byte except the cap fields,
// replaced by the cap in max_completion_tokens and max_tokens (chat) or
// max_tokens (completions), appended before the closing brace. A streamed
// request's stream and stream_options are replaced by "stream":true,
// "stream_options":{"include_usage":true,"continuous_usage_stats":true}; a
// non-streamed request stays non-streamed, so that vLLM's non-streaming
// features (prompt_logprobs, use_beam_search, its non-streaming tool and
// reasoning parsers) work and its body passes through (VLLM.md Part 2;
// the measurements are in docs/benchmarks/transparency.md).
func (r *Request) Rewrite(dst []byte, capTokens int) []byte {
	return r.RewriteWith(dst, capTokens, RewriteOptions{})
}

// RewriteWith is Rewrite with options. A capTokens ≤ 0 keeps the client's
// cap fields as they are (see Plan.Default).
func (r *Request) RewriteWith(dst []byte, capTokens int, o RewriteOptions) []byte {
	o.keepCap = capTokens <= 0
	b := r.body
	start := skipSpace(b, 0)
	first := true
	prevEnd := -1 // valEnd of the previous member
	prevKept := false
	lastEnd := start + 1
	dst = append(dst, b[:start+1]...)
	_ = eachMember(b, start, func(m member) bool {
		drop := r.rewriteKey(m, o)
		if !drop {
			switch {
			case first && prevEnd < 0:
				dst = append(dst, b[lastEnd:m.keyStart]...)
			case first:
			case prevKept:
				dst = append(dst, b[prevEnd:m.keyStart]...)
			default:
				dst = append(dst, ',')
			}
			dst = append(dst, b[m.keyStart:m.valEnd]...)
			first = false
		}
		prevKept = !drop
		prevEnd = m.valEnd
		return true
	})
	tail := lastEnd
	if prevEnd >= 0 {
		tail = prevEnd
	}
	closing := skipSpace(b, tail)
	if prevKept {
		dst = append(dst, b[tail:closing]...)
	}
	var add []byte
	if o.SetPriority {
		add = append(add, `"priority":`...)
		add = strconv.AppendInt(add, int64(o.Priority), 10)
	}
	if o.CacheSalt != "" {
		if len(add) > 0 {
			add = append(add, ',')
		}
		add = append(add, `"cache_salt":`...)
		add = strconv.AppendQuote(add, o.CacheSalt)
	}
	if r.Stream || o.StreamInterval > 0 {
		if len(add) > 0 {
			add = append(add, ',')
		}
		add = append(add, `"stream":true,"stream_options":{"include_usage":true,"continuous_usage_stats":true}`...)
	}
	if !r.Stream && o.StreamInterval > 0 {
		add = append(add, `,"stream_interval":`...)
		add = strconv.AppendInt(add, int64(o.StreamInterval), 10)
	}
	if !o.keepCap {
		if len(add) > 0 {
			add = append(add, ',')
		}
		if r.Endpoint == EndpointChat {
			add = append(add, `"max_completion_tokens":`...)
			add = strconv.AppendInt(add, int64(capTokens), 10)
			add = append(add, ',')
		}
		add = append(add, `"max_tokens":`...)
		add = strconv.AppendInt(add, int64(capTokens), 10)
	}
	if len(add) > 0 {
		if !first {
			dst = append(dst, ',')
		}
		dst = append(dst, add...)
	}
	return append(dst, b[closing:]...)
}
