// Package suggest finds the likely intended word for a mistyped command,
// flag or config key: the "did you mean" of the CLI and of config errors.
package suggest

import "slices"

// Closest returns the candidate nearest to word by edit distance (ties go
// to the alphabetically first), or "" when none is close: within one edit
// for words up to 4 letters, two up to 8, three beyond. A candidate that
// starts with word (a prefix typed short) counts as close too.
func Closest(word string, candidates []string) string {
	if word == "" {
		return ""
	}
	limit := 1
	switch n := len([]rune(word)); {
	case n > 8:
		limit = 3
	case n > 4:
		limit = 2
	}
	cs := slices.Clone(candidates)
	slices.Sort(cs)
	best, bestD := "", limit+1
	for _, c := range cs {
		if c == word {
			continue
		}
		d := distance(word, c)
		if len(word) >= 3 && len(c) > len(word) && c[:len(word)] == word {
			d = min(d, limit)
		}
		if d < bestD {
			best, bestD = c, d
		}
	}
	return best
}

// distance is the Damerau-Levenshtein distance (optimal string alignment):
// insertions, deletions, substitutions and swaps of neighbours cost 1.
func distance(a, b string) int {
	ra, rb := []rune(a), []rune(b)
	prev2 := make([]int, len(rb)+1)
	prev := make([]int, len(rb)+1)
	cur := make([]int, len(rb)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(ra); i++ {
		cur[0] = i
		for j := 1; j <= len(rb); j++ {
			cost := 1
			if ra[i-1] == rb[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
			if i > 1 && j > 1 && ra[i-1] == rb[j-2] && ra[i-2] == rb[j-1] {
				cur[j] = min(cur[j], prev2[j-2]+1)
			}
		}
		prev2, prev, cur = prev, cur, prev2
	}
	return prev[len(rb)]
}
