package redisledger

import (
	"encoding/base64"
	"slices"
	"strconv"
	"testing"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// TestKeySlot: the batcher groups operations by the Cluster slot Redis
// computes (values from the Cluster specification and CLUSTER KEYSLOT).
func TestKeySlot(t *testing.T) {
	for key, want := range map[string]uint16{
		"foo":                  12182,
		"123456789":            0x31C3 & 16383,
		"{user1000}.following": keySlot("user1000"),
		"{user1000}.followers": keySlot("user1000"),
		"foo{}{bar}":           keySlot("foo{}{bar}"), // an empty tag hashes the whole key
		"sluice:{T}:q:x":       keySlot("T"),
	} {
		if got := keySlot(key); got != want {
			t.Errorf("keySlot(%q) = %d, want %d", key, got, want)
		}
	}
	if keySlot("foo{}{bar}") == keySlot("bar") {
		t.Error("an empty first tag must not fall through to the second")
	}
}

// TestRecordName: the record id text is the unpadded base64url of the id,
// as EncodeToString writes it, and the record key is "<base>q:<id>"; a hold
// is "G.gid" and parses back, and decodeKey agrees with ParseScopeKey.
func TestRecordName(t *testing.T) {
	l := &Ledger{prefix: "pfx"}
	tenant := ledger.ScopeKey(ledger.NewRequestID())
	for range 100 {
		id := ledger.NewRequestID()
		want := base64.RawURLEncoding.EncodeToString(id[:])
		if got := encID(id); got != want {
			t.Fatalf("encID = %q, want %q", got, want)
		}
		rec := l.recordName(ledger.Ref{Tenant: tenant, ID: id})
		if wantKey := "pfx:{" + tenant.String() + "}:q:" + want; rec.key != wantKey || rec.id != want {
			t.Fatalf("recordName = %q, %q, want %q, %q", rec.key, rec.id, wantKey, want)
		}
		ref := ledger.Ref{Tenant: tenant, ID: id}
		h := encodeHold(ref)
		if wantHold := tenant.String() + "." + want; h != wantHold {
			t.Fatalf("encodeHold = %q, want %q", h, wantHold)
		}
		if back, ok := parseHold(h); !ok || back != ref {
			t.Fatalf("parseHold(%q) = %v, %v", h, back, ok)
		}
	}
	for _, s := range []string{"", "AAAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAA", "AAAAAAAAAAAAAAAAAAAAAAA",
		"AAAAAAAAAAAAAAAAAAAA+A", "AAAAAAAAAAAAAAAAAAAA-_", "AAAAAAAAAAAAAAAAAAAA=="} {
		k, err := ledger.ParseScopeKey(s)
		got, ok := decodeKey(s)
		if ok != (err == nil) || (ok && got != k) {
			t.Errorf("decodeKey(%q) = %x, %v; ParseScopeKey: %x, %v", s, got, ok, k, err)
		}
	}
	if _, ok := parseHold("x." + encID(ledger.NewRequestID())); ok {
		t.Error("parseHold accepted a bad global key")
	}
}

// TestOwnerText: the cached owner text follows a change of owner.
func TestOwnerText(t *testing.T) {
	l := &Ledger{}
	a, b := ledger.NewOwner(), ledger.NewOwner()
	for _, o := range []ledger.Owner{a, a, b, a} {
		if got := l.ownerText(o); got != o.String() {
			t.Fatalf("ownerText = %q, want %q", got, o.String())
		}
	}
}

// TestKeyAllocs: a record name and a hold take one allocation each; parsing
// a hold and a cached owner's text none.
func TestKeyAllocs(t *testing.T) {
	l := &Ledger{prefix: "pfx"}
	ref := ledger.Ref{Tenant: ledger.ScopeKey(ledger.NewRequestID()), ID: ledger.NewRequestID()}
	o := ledger.NewOwner()
	l.recordName(ref) // caches the partition's key names
	h := encodeHold(ref)
	l.ownerText(o)
	for name, c := range map[string]struct {
		f    func()
		want float64
	}{
		"recordName": {func() { l.recordName(ref) }, 1},
		"encodeHold": {func() { encodeHold(ref) }, 1},
		"parseHold":  {func() { parseHold(h) }, 0},
		"ownerText":  {func() { l.ownerText(o) }, 0},
	} {
		if got := testing.AllocsPerRun(100, c.f); got != c.want {
			t.Errorf("%s: %v allocations, want %v", name, got, c.want)
		}
	}
}

// TestSpecCache: a partition's spec cache gives the spec buildSpec writes
// and the scope keys scopeKeysFromSpec derives from it, once per spec (the
// same entry for a Reserve's scopes and for the stored text), without
// allocating on a hit, and is cleared, not grown, past maxPartSpecs.
func TestSpecCache(t *testing.T) {
	l := &Ledger{prefix: "pfx"}
	tenant := ledger.ScopeKey(ledger.NewRequestID())
	pk := l.partKeys(tenant)
	scopes := []ledger.Scope{
		{Kind: ledger.KindTenant, Key: tenant, Limits: []ledger.Limit{
			{Dim: ledger.Tokens, Window: time.Hour, Max: ledger.MaxAmount},
			{Dim: ledger.Slots, Max: 7, Mode: ledger.Warn}}},
		{Kind: ledger.KindAPIKey, Key: ledger.ScopeKey(ledger.NewRequestID())},
	}
	want := "1" + tenant.String() + "/" + strconv.Itoa(int(ledger.Tokens)) + ":3600:" + strconv.FormatInt(ledger.MaxAmount, 10) + ":b," +
		strconv.Itoa(int(ledger.Slots)) + ":0:7:w;2" + scopes[1].Key.String() + "/"
	sk := pk.specFor(scopes, false)
	if sk.spec != want || buildSpec(scopes) != want {
		t.Fatalf("spec %q, buildSpec %q, want %q", sk.spec, buildSpec(scopes), want)
	}
	keys, ok := scopeKeysFromSpec(nil, pk.prefix, pk.base, want)
	if !ok || !slices.Equal(sk.scopes, keys) || len(keys) != 2 || keys[1] != pk.base+"s:"+scopes[1].Key.String() {
		t.Fatalf("scope keys %q, from the spec %q", sk.scopes, keys)
	}
	if p, ok := pk.parsedSpec(want); !ok || p != sk || pk.specFor(scopes, false) != sk {
		t.Fatal("a second spec entry for the same spec")
	}
	if got := testing.AllocsPerRun(100, func() { pk.specFor(scopes, false) }); got != 0 {
		t.Errorf("specFor hit: %v allocations", got)
	}
	if p, ok := pk.parsedSpec(""); !ok || p != noSpec {
		t.Error("empty spec")
	}
	if _, ok := pk.parsedSpec("1x"); ok {
		t.Error("malformed spec accepted")
	}
	for i := range maxPartSpecs - 1 { // one more than the first
		scopes[1].Limits = []ledger.Limit{{Dim: ledger.Tokens, Window: time.Hour, Max: int64(i)}}
		pk.specFor(scopes, false)
	}
	if n := len(pk.specs); n != maxPartSpecs {
		t.Errorf("%d specs cached, want %d", n, maxPartSpecs)
	}
	scopes[1].Limits[0].Max = -1
	pk.specFor(scopes, false)
	if n := len(pk.specs); n != 1 {
		t.Errorf("%d specs cached past the bound, want 1", n)
	}
}
