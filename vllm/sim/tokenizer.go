package sim

import (
	"hash/fnv"
	"unicode"
	"unicode/utf8"
)

// Chat template overheads of the simulator's tokenizer, in tokens: each
// message costs msgOverheadTokens on top of its content, and the generation
// prompt (add_generation_prompt, on by default for chat) costs
// genPromptTokens.
const (
	msgOverheadTokens = 4
	genPromptTokens   = 3
	maxPieceBytes     = 4
	vocabSize         = 32000
)

// tokenizeText appends the token ids of s to ids and, if strs is non-nil,
// the pieces to *strs. Words are split on whitespace and cut into pieces of
// at most 4 bytes (never inside a UTF-8 sequence); each piece is one token.
func tokenizeText(s string, ids []int, strs *[]string) []int {
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if unicode.IsSpace(r) {
			i += size
			continue
		}
		// a word: cut into pieces
		start := i
		for i < len(s) {
			r, size = utf8.DecodeRuneInString(s[i:])
			if unicode.IsSpace(r) {
				break
			}
			if i-start+size > maxPieceBytes && i > start {
				ids = append(ids, tokenID(s[start:i]))
				if strs != nil {
					*strs = append(*strs, s[start:i])
				}
				start = i
			}
			i += size
		}
		ids = append(ids, tokenID(s[start:i]))
		if strs != nil {
			*strs = append(*strs, s[start:i])
		}
	}
	return ids
}

// countText returns the number of tokens of s without allocating.
func countText(s string) int {
	n := 0
	i := 0
	for i < len(s) {
		r, size := utf8.DecodeRuneInString(s[i:])
		if unicode.IsSpace(r) {
			i += size
			continue
		}
		start := i
		for i < len(s) {
			r, size = utf8.DecodeRuneInString(s[i:])
			if unicode.IsSpace(r) {
				break
			}
			if i-start+size > maxPieceBytes && i > start {
				n++
				start = i
			}
			i += size
		}
		n++
	}
	return n
}

func tokenID(piece string) int {
	h := fnv.New32a()
	_, _ = h.Write([]byte(piece))
	return int(h.Sum32() % vocabSize)
}

// words is the output vocabulary: one-token words (<= 4 bytes, no spaces),
// plain ASCII so chunks need no JSON escaping.
var words = [...]string{
	"the", "of", "and", "to", "in", "a", "is", "that", "for", "it",
	"as", "was", "with", "be", "by", "on", "not", "he", "this", "are",
	"or", "his", "from", "at", "an", "but", "have", "you", "one", "had",
	"all", "they", "were", "we", "her", "can", "she", "will", "more", "if",
	"so", "who", "what", "out", "up", "into", "its", "time", "than", "them",
	"only", "new", "some", "may", "like", "then", "now", "also", "two", "any",
	"sim", "tok", "gpu", "kv",
}

// wordAt returns the i-th output word of a sequence with key k.
func wordAt(k uint64, i int) string {
	x := k + uint64(i)*0x9E3779B97F4A7C15
	x ^= x >> 31
	x *= 0xBF58476D1CE4E5B9
	x ^= x >> 29
	return words[x%uint64(len(words))]
}

// appendOutputText appends the text of tokens [from, to) of a sequence with
// key k: words separated by single spaces, no leading space on token 0.
func appendOutputText(b []byte, k uint64, from, to int) []byte {
	for i := from; i < to; i++ {
		if i > 0 {
			b = append(b, ' ')
		}
		b = append(b, wordAt(k, i)...)
	}
	return b
}
