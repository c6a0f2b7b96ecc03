package ledger

import (
	"errors"
	"testing"
	"time"
)

// FuzzParseJournal: any byte string either parses (a prefix of valid
// entries) or is ErrCorrupt; it never panics, and the valid prefix re-encodes
// to the same bytes.
func FuzzParseJournal(f *testing.F) {
	t := ScopeKey{1}
	req := &ReserveRequest{Ref: Ref{Tenant: t, ID: RequestID{2}}, Owner: Owner{3}, Held: Amounts{Requests: 1},
		Scopes: []Scope{{Kind: KindTenant, Key: t, Limits: []Limit{{Dim: Tokens, Window: time.Hour, Max: 5}}}}}
	var seed []byte
	for _, e := range []entry{
		{op: opOpen, time: 1, max: 3600000},
		{op: opReserve, time: 2, ref: req.Ref, req: req, ttl: 60000},
		{op: opSettle, time: 3, ref: req.Ref, actual: Amounts{Requests: 1}, src: SourceFinal},
		{op: opAdjust, time: 4, ref: req.Ref, scope: t, dim: Tokens, ttl: 3600000, max: -1},
	} {
		seed = e.encode(seed)
	}
	f.Add(seed)
	f.Add(seed[:len(seed)-3])
	f.Add([]byte{})
	f.Fuzz(func(t *testing.T, data []byte) {
		entries, good, err := parseJournal(data)
		if err != nil {
			if !errors.Is(err, ErrCorrupt) {
				t.Fatalf("error %v is not ErrCorrupt", err)
			}
			return
		}
		if good > len(data) {
			t.Fatalf("valid prefix %d longer than input %d", good, len(data))
		}
		var re []byte
		for i := range entries {
			re = entries[i].encode(re)
		}
		if string(re) != string(data[:good]) {
			t.Fatalf("re-encoding differs from the valid prefix")
		}
	})
}
