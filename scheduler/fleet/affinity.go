package fleet

import (
	"encoding/binary"
	"hash/maphash"
)

// Prefix-affinity routing, after llm-d's approximate prefix-cache scorer:
// Sluice cannot see a replica's KV cache, so it remembers, per replica,
// the hashes of the prompt chunks it recently sent there. A request goes to
// the replica whose index holds the longest run of its leading chunks,
// balanced against load (affinityScore), so that a hot prefix cannot pile
// onto one replica.

// prefixChunkBytes is the bytes per hashed chunk of a prompt's JSON: about
// one vLLM KV block (16 tokens) of text at ~4 bytes per token.
const prefixChunkBytes = 64

// maxPrefixChunks bounds the chunks hashed per request (32 KiB of prompt).
const maxPrefixChunks = 512

// prefixIndexSize is the chunks remembered per replica; older ones are
// forgotten first (vLLM evicts least recently used blocks the same way).
const prefixIndexSize = 1 << 15

// loadSlack lets the replica holding a prefix take this many more requests
// of the same size than the least loaded one before the 1.3× mean rule
// applies: at low load an imbalance of a request or two costs nothing and
// a cache miss costs a prefill.
const loadSlack = 2

// maxOverMean is the balance rule: a replica whose load after the request
// would exceed maxOverMean × the pool's mean gets it only by least load.
const maxOverMean = 1.3

// prefixSeed keys PrefixHashes; the indexes live in this process only.
var prefixSeed = maphash.MakeSeed()

// PrefixHashes chains the hashes of b's full chunks.
func PrefixHashes(salt, b []byte) []uint64 {
	n := min(len(b)/prefixChunkBytes, maxPrefixChunks)
	if n == 0 {
		return nil
	}
	out := make([]uint64, n)
	var h maphash.Hash
	h.SetSeed(prefixSeed)
	var parent [8]byte
	if len(salt) > 0 {
		// Salted chains never meet unsalted ones, as in vLLM, where the
		// salt is an extra key of the first block's hash.
		_, _ = h.Write(salt)
		binary.LittleEndian.PutUint64(parent[:], h.Sum64()|1)
	}
	for i := range n {
		h.Reset()
		_, _ = h.Write(parent[:])
		_, _ = h.Write(b[i*prefixChunkBytes : (i+1)*prefixChunkBytes])
		v := h.Sum64()
		out[i] = v
		binary.LittleEndian.PutUint64(parent[:], v)
	}
	return out
}

// prefixIndex is one replica's recently sent chunk hashes. Guarded by
// Set.mu.
type prefixIndex struct {
	stamp map[uint64]uint64 // hash → insertion stamp
	ring  []indexEntry      // insertion order, for forgetting
	next  uint64
}

type indexEntry struct{ hash, stamp uint64 }

// match returns how many leading hashes the index holds.
func (x *prefixIndex) match(hs []uint64) int {
	if x == nil {
		return 0
	}
	n := 0
	for _, h := range hs {
		if _, ok := x.stamp[h]; !ok {
			break
		}
		n++
	}
	return n
}

// add remembers hs (refreshing those already there), forgetting the oldest
// beyond prefixIndexSize.
func (x *prefixIndex) add(hs []uint64) {
	if x.stamp == nil {
		x.stamp = make(map[uint64]uint64, 1024)
		x.ring = make([]indexEntry, prefixIndexSize)
	}
	for _, h := range hs {
		x.next++
		slot := &x.ring[x.next%prefixIndexSize]
		if old, ok := x.stamp[slot.hash]; ok && old == slot.stamp && slot.stamp != 0 {
			delete(x.stamp, slot.hash)
		}
		*slot = indexEntry{hash: h, stamp: x.next}
		x.stamp[h] = x.next
	}
}

// candidate is one replica with room, as the affinity choice sees it.
type candidate struct {
	r     *Replica
	after float64 // normalized load with the request
	step  float64 // the request's share of the replica's capacity
	bias  float64 // +0.01 when degraded
}

// affinityPick chooses among the replicas with room: among those whose
// load after the request stays within maxOverMean × the pool's mean (or
// within loadSlack requests of the least loaded), the longest prefix match
// minus the load wins; ties and misses go to the least loaded. mean is the
// pool's mean normalized load including the request.
func affinityPick(cands []candidate, prefix []uint64, mean float64) *Replica {
	least := cands[0]
	for _, c := range cands[1:] {
		if c.after+c.bias < least.after+least.bias {
			least = c
		}
	}
	best, bestScore := least.r, -1.0
	for _, c := range cands {
		if c.after > maxOverMean*mean && c.after > least.after+loadSlack*c.step {
			continue
		}
		m := float64(c.r.prefix.match(prefix)) / float64(len(prefix))
		if m == 0 {
			continue
		}
		if s := m - c.after - c.bias; s > bestScore {
			best, bestScore = c.r, s
		}
	}
	return best
}
