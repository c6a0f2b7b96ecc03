package sim

import (
	"container/list"
	"encoding/json"
	"hash/fnv"
	"sync"
)

// vLLM's automatic prefix caching (v1, on by default), as the simulator
// models it:
//
//   - a prompt's full blocks are hashed in a chain, each hash covering the
//     parent block's hash and the block's token ids
//     (vllm/v1/core/kv_cache_utils.py, hash_block_tokens; a partial last
//     block is never cached);
//   - on admission the longest run of leading block hashes found in the
//     cache is a hit, capped at num_tokens − 1 because the last token is
//     always recomputed for its logits
//     (vllm/v1/core/kv_cache_manager.py, get_computed_blocks); hit tokens
//     skip prefill;
//   - vllm:prefix_cache_queries_total counts request.num_tokens and
//     vllm:prefix_cache_hits_total the hit tokens, once per admission
//     (record_prefix_cache_stats; vllm/v1/metrics/loggers.py);
//   - computed blocks are cached once the prefill completes; blocks stay
//     cached after their request ends and are evicted least recently used
//     first when the cache would exceed the KV cache's blocks
//     (vllm/v1/core/block_pool.py, the free block queue). The simulator
//     keeps one private copy of KV per running sequence, so the KV usage it
//     reports does not shrink for shared prefixes.
type prefixCache struct {
	mu       sync.Mutex // the engine and PrefixHit (benchmarks' oracle)
	capacity int
	lru      *list.List // front: most recently used block hash
	at       map[uint64]*list.Element
}

func newPrefixCache(blocks int) *prefixCache {
	return &prefixCache{capacity: blocks, lru: list.New(), at: map[uint64]*list.Element{}}
}

// blockHashes chains the hashes of ids' full blocks.
func blockHashes(ids []int, blockSize int, salt string) []uint64 {
	n := len(ids) / blockSize
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	var parent uint64
	if salt != "" {
		// vLLM adds cache_salt to the first block's extra keys
		// (v1/core/kv_cache_utils.py generate_block_hash_extra_keys), so
		// every block of a salted prompt hashes apart from unsalted ones.
		h := fnv.New64a()
		_, _ = h.Write([]byte(salt))
		parent = h.Sum64() | 1
	}
	buf := make([]byte, 8+4*blockSize)
	for b := range n {
		h := fnv.New64a()
		for i := range 8 {
			buf[i] = byte(parent >> (8 * i))
		}
		for j, id := range ids[b*blockSize : (b+1)*blockSize] {
			o := 8 + 4*j
			buf[o], buf[o+1], buf[o+2], buf[o+3] = byte(id), byte(id>>8), byte(id>>16), byte(id>>24)
		}
		_, _ = h.Write(buf)
		parent = h.Sum64()
		out[b] = parent
	}
	return out
}

// hit returns how many leading hashes are cached, marking them used.
func (c *prefixCache) hit(hashes []uint64) int {
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range hashes {
		el, ok := c.at[h]
		if !ok {
			break
		}
		c.lru.MoveToFront(el)
		n++
	}
	return n
}

// insert caches hashes (or refreshes them), evicting the least recently
// used beyond capacity.
func (c *prefixCache) insert(hashes []uint64) {
	c.mu.Lock()
	defer c.mu.Unlock()
	for _, h := range hashes {
		if el, ok := c.at[h]; ok {
			c.lru.MoveToFront(el)
			continue
		}
		c.at[h] = c.lru.PushFront(h)
	}
	for c.lru.Len() > c.capacity {
		el := c.lru.Back()
		delete(c.at, el.Value.(uint64))
		c.lru.Remove(el)
	}
}

// prefixHit looks s up at admission (engine goroutine): it counts the
// query and the hit and returns the tokens whose prefill is skipped.
func (e *engine) prefixHit(s *seq) int {
	if e.cache == nil {
		return 0
	}
	tokens := s.prompt + s.gen
	hit := min(e.cache.hit(s.hashes)*e.cfg.BlockSize, max(0, tokens-1))
	hit -= hit % e.cfg.BlockSize // block aligned, as allocate_slots needs
	e.m.prefixQueries.Add(float64(tokens))
	e.m.prefixHits.Add(float64(hit))
	e.m.promptTokens.Add(float64(hit)) // prefilled tokens are added per step
	e.st.promptTokens.Add(int64(hit))
	e.st.prefixQueries.Add(int64(tokens))
	e.st.prefixHits.Add(int64(hit))
	if !s.started {
		s.cached = hit
	}
	return hit
}

// prefixStore caches s's prompt blocks once its prefill is done.
func (e *engine) prefixStore(s *seq) {
	if e.cache != nil {
		e.cache.insert(s.hashes)
	}
}

// promptHashes tokenizes a chat or single completions prompt for the
// prefix cache; nil when caching is off or the request has several
// prompts (each would need its own chain; they are simply not cached).
func (r *Replica) promptHashes(k kind, w *wireRequest) []uint64 {
	if r.cfg.DisablePrefixCaching {
		return nil
	}
	sink := &tokenSink{}
	switch k {
	case kindChat:
		addGen := w.AddGenerationPrompt == nil || *w.AddGenerationPrompt
		if _, e := chatPromptTokens(w.Messages, w.Tools, addGen, sink); e != nil {
			return nil
		}
	default:
		counts, e := completionPrompts(w.Prompt, sink)
		if e != nil || len(counts) != 1 {
			return nil
		}
	}
	salt := ""
	if w.CacheSalt != nil {
		salt = *w.CacheSalt
	}
	return blockHashes(sink.ids, r.cfg.BlockSize, salt)
}

// messagesHashes is promptHashes for chat messages built by the handler
// (/v1/responses).
func (r *Replica) messagesHashes(msgs []chatMessage) []uint64 {
	if r.cfg.DisablePrefixCaching {
		return nil
	}
	sink := &tokenSink{}
	if _, e := chatPromptTokens(msgs, json.RawMessage(nil), true, sink); e != nil {
		return nil
	}
	return blockHashes(sink.ids, r.cfg.BlockSize, "")
}

// cachedTokens is usage.prompt_tokens_details.cached_tokens: the request's
// prefix-cache hit when --enable-prompt-tokens-details is on, else -1
// (null), as vLLM's serving_chat.py and serving_completion.py report it.
// The cached value is written by the engine before the sequence's first
// token is published, which the handler has seen by then.
func (r *Replica) cachedTokens(req *request) int {
	if !r.cfg.EnablePromptTokensDetails || len(req.seqs) == 0 {
		return -1
	}
	return req.seqs[0].cached
}

// PrefixHit reports how many prompt tokens of a chat or completions body
// (kind by path) the replica's prefix cache holds now, without touching
// it: what an oracle router would know. 0 when caching is off.
func (r *Replica) PrefixHit(path string, body []byte) int {
	if r.eng.cache == nil {
		return 0
	}
	w, e := decodeWire(body)
	if e != nil {
		return 0
	}
	k := kindChat
	if path == "/v1/completions" {
		k = kindCompletion
	}
	hs := r.promptHashes(k, w)
	c := r.eng.cache
	c.mu.Lock()
	defer c.mu.Unlock()
	n := 0
	for _, h := range hs {
		if _, ok := c.at[h]; !ok {
			break
		}
		n++
	}
	return n * r.cfg.BlockSize
}
