package redisledger

import (
	"encoding/base64"
	"strconv"
	"strings"
	"sync"
	"time"

	"github.com/sluicehq/sluice/ledger"
)

// Key layout (LEDGER.md §6); T is the tenant ScopeKey in base64url, the
// hash tag that puts every key of a tenant in one Cluster slot:
//
//	<prefix>:{T}:m        HASH  hwm, epoch, fence_until, pv
//	<prefix>:{T}:L        ZSET  RESERVED/DISPATCHED ids by lease expiry (ms)
//	<prefix>:{T}:U        ZSET  UNRESOLVED ids by chargeable-at (ms)
//	<prefix>:{T}:q:<id>   HASH  one record
//	<prefix>:{T}:s:<S>    HASH  per scope: r:<d>, n, o:<d>, c:<d>:<W>, w:<d>:<W>, lim
//	<prefix>:partitions   SET   every T (and global G) with records, for Run

// encLen is the length of a 16-byte id or key in unpadded base64url.
const encLen = 22

func encID(id ledger.RequestID) string {
	var b [encLen]byte // one allocation, the string's
	base64.RawURLEncoding.Encode(b[:], id[:])
	return string(b[:])
}

// recName is a record's key "<prefix>:{T}:q:<id>" and its id text, which is
// the key's tail (one allocation for both).
type recName struct{ key, id string }

// recordName returns ref's record key and id text.
func (l *Ledger) recordName(ref ledger.Ref) recName {
	base := l.partKeys(ref.Tenant).base
	var b strings.Builder
	b.Grow(len(base) + 2 + encLen)
	b.WriteString(base)
	b.WriteString("q:")
	var e [encLen]byte
	base64.RawURLEncoding.Encode(e[:], ref.ID[:])
	b.Write(e[:])
	k := b.String()
	return recName{key: k, id: k[len(k)-encLen:]}
}

// decodeKey parses the base64url text of a ScopeKey or RequestID, as
// ledger.ParseScopeKey does but without allocating.
func decodeKey(s string) ([16]byte, bool) {
	var k [16]byte
	if len(s) != encLen {
		return k, false
	}
	var src [encLen]byte
	copy(src[:], s)
	n, err := base64.RawURLEncoding.Decode(k[:], src[:])
	return k, err == nil && n == len(k)
}

// tenantBase returns "<prefix>:{T}:".
func (l *Ledger) tenantBase(t ledger.ScopeKey) string { return l.partKeys(t).base }

// partitionKeys are a partition's key names that every operation on it
// takes, built once per partition rather than per operation, and the scope
// key names of the specs its operations used.
type partitionKeys struct {
	prefix                         string // the Ledger's key prefix
	base, meta, leases, unresolved string

	mu    sync.RWMutex
	specs map[string]*specKeys // by spec; cleared when it reaches maxPartSpecs
}

// maxPartSpecs bounds a partition's spec cache (a tenant with more distinct
// scope sets in use builds some again).
const maxPartSpecs = 256

// specKeys is a spec and the scope keys it names, in its order.
type specKeys struct {
	spec   string
	scopes []string
}

// noSpec names no scopes (a record this process does not know).
var noSpec = &specKeys{}

// specFor returns the specKeys of a Reserve's scopes (cached): the spec is
// encoded on the stack and looked up before anything is allocated. With
// inline, a KindGlobal scope is kept in the record itself (global.go): its
// limits are marked B/W, its key is its own partition's scope hash, and
// that partition's meta key follows the scope keys.
func (pk *partitionKeys) specFor(scopes []ledger.Scope, inline bool) *specKeys {
	var buf [512]byte
	b := appendSpec(buf[:0], scopes, inline)
	pk.mu.RLock()
	sk := pk.specs[string(b)]
	pk.mu.RUnlock()
	if sk != nil {
		return sk
	}
	// The keys are those a record of this spec names (once per spec).
	keys, _ := scopeKeysFromSpec(make([]string, 0, len(scopes)+1), pk.prefix, pk.base, string(b))
	sk = &specKeys{spec: string(b), scopes: keys}
	pk.store(sk)
	return sk
}

// parsedSpec returns the specKeys of a stored spec (cached); false when it
// is malformed.
func (pk *partitionKeys) parsedSpec(spec string) (*specKeys, bool) {
	if spec == "" {
		return noSpec, true
	}
	pk.mu.RLock()
	sk := pk.specs[spec]
	pk.mu.RUnlock()
	if sk != nil {
		return sk, true
	}
	keys, ok := scopeKeysFromSpec(nil, pk.prefix, pk.base, spec)
	if !ok {
		return nil, false
	}
	sk = &specKeys{spec: spec, scopes: keys}
	pk.store(sk)
	return sk, true
}

func (pk *partitionKeys) store(sk *specKeys) {
	pk.mu.Lock()
	if pk.specs == nil || len(pk.specs) >= maxPartSpecs {
		pk.specs = make(map[string]*specKeys)
	}
	pk.specs[sk.spec] = sk
	pk.mu.Unlock()
}

// partKeys returns t's partitionKeys (cached: one entry per tenant or
// global partition this process touched).
func (l *Ledger) partKeys(t ledger.ScopeKey) *partitionKeys {
	if v, ok := l.parts.Load(t); ok {
		return v.(*partitionKeys)
	}
	base := partBase(l.prefix, t.String())
	v, _ := l.parts.LoadOrStore(t, &partitionKeys{prefix: l.prefix, base: base, meta: base + "m", leases: base + "L",
		unresolved: base + "U"})
	return v.(*partitionKeys)
}

// partBase returns "<prefix>:{T}:" for the partition whose ScopeKey's text is t.
func partBase(prefix, t string) string { return prefix + ":{" + t + "}:" }

// fixedKeys appends the four keys every write script takes, in idx order.
func (op *bop) fixedKeys(pk *partitionKeys, rec recName) {
	op.keys = append(op.keys, pk.meta, pk.leases, pk.unresolved, rec.key)
}

// scopeKeysFromSpec appends the scope keys named by a record's spec of the
// partition base (and, after them, the meta key of an inline global
// scope's partition, as specFor does).
func scopeKeysFromSpec(keys []string, prefix, base, spec string) ([]string, bool) {
	if spec == "" {
		return keys, true
	}
	var xmeta string
	for part := range strings.SplitSeq(spec, ";") {
		slash := strings.IndexByte(part, '/')
		if slash < 2 {
			return keys, false
		}
		name := part[1:slash]
		if inlinePart(part) {
			if xmeta != "" {
				return keys, false // one global scope at most
			}
			gb := partBase(prefix, name)
			keys, xmeta = append(keys, gb+"s:"+name), gb+"m"
			continue
		}
		keys = append(keys, base+"s:"+name)
	}
	if xmeta != "" {
		keys = append(keys, xmeta)
	}
	return keys, true
}

// inlinePart reports whether a spec part is a global scope kept inline: a
// KindGlobal scope whose limits are marked B or W.
func inlinePart(part string) bool {
	return part[0] == kindDigit(ledger.KindGlobal) && (strings.Contains(part, ":B") || strings.Contains(part, ":W"))
}

func kindDigit(k ledger.Kind) byte { return '0' + byte(k) }

// buildSpec encodes the scopes and limits of a Reserve as
// "<kind><S>/<d>:<W s>:<max>:<b|w>,...;...".
func buildSpec(scopes []ledger.Scope) string { return string(appendSpec(nil, scopes, false)) }

// appendSpec appends the spec of scopes to b; with inline, a KindGlobal
// scope's limits are marked B and W instead of b and w.
func appendSpec(b []byte, scopes []ledger.Scope, inline bool) []byte {
	for i := range scopes {
		s := &scopes[i]
		if i > 0 {
			b = append(b, ';')
		}
		b = append(b, kindDigit(s.Kind))
		b = base64.RawURLEncoding.AppendEncode(b, s.Key[:])
		b = append(b, '/')
		for j, lim := range s.Limits {
			if j > 0 {
				b = append(b, ',')
			}
			b = strconv.AppendInt(b, int64(lim.Dim), 10)
			b = append(b, ':')
			b = strconv.AppendInt(b, int64(lim.Window/time.Second), 10)
			b = append(b, ':')
			b = strconv.AppendInt(b, lim.Max, 10)
			up := inline && s.Kind == ledger.KindGlobal
			switch {
			case lim.Mode == ledger.Warn && up:
				b = append(b, ":W"...)
			case lim.Mode == ledger.Warn:
				b = append(b, ":w"...)
			case up:
				b = append(b, ":B"...)
			default:
				b = append(b, ":b"...)
			}
		}
	}
	return b
}

// specScope is one scope of a parsed spec.
type specScope struct {
	kind   ledger.Kind
	key    ledger.ScopeKey
	limits []ledger.Limit
}

// parseSpec parses one spec part or a whole spec (as stored in records and in
// a scope's "lim" field).
func parseSpec(spec string) ([]specScope, bool) {
	var out []specScope
	if spec == "" {
		return nil, true
	}
	for part := range strings.SplitSeq(spec, ";") {
		slash := strings.IndexByte(part, '/')
		if slash < 2 || part[0] < '1' || part[0] > '4' {
			return nil, false
		}
		k, err := ledger.ParseScopeKey(part[1:slash])
		if err != nil {
			return nil, false
		}
		sc := specScope{kind: ledger.Kind(part[0] - '0'), key: k}
		if rest := part[slash+1:]; rest != "" {
			for l := range strings.SplitSeq(rest, ",") {
				f := strings.Split(l, ":")
				if len(f) != 4 {
					return nil, false
				}
				d, e1 := strconv.ParseUint(f[0], 10, 8)
				w, e2 := strconv.ParseInt(f[1], 10, 64)
				mx, e3 := strconv.ParseInt(f[2], 10, 64)
				m := f[3]
				if e1 != nil || e2 != nil || e3 != nil || d >= uint64(ledger.NumDims) ||
					(m != "b" && m != "w" && m != "B" && m != "W") {
					return nil, false
				}
				lim := ledger.Limit{Dim: ledger.Dim(d), Window: time.Duration(w) * time.Second, Max: mx}
				if m == "w" || m == "W" {
					lim.Mode = ledger.Warn
				}
				sc.limits = append(sc.limits, lim)
			}
		}
		out = append(out, sc)
	}
	return out, true
}

// amountsCSV encodes amounts as "a0,a1,...".
func amountsCSV(a *ledger.Amounts) string {
	var buf [ledger.NumDims * 17]byte
	b := buf[:0]
	for i, v := range a {
		if i > 0 {
			b = append(b, ',')
		}
		b = strconv.AppendInt(b, v, 10)
	}
	return string(b)
}

func parseAmountsCSV(s string) (ledger.Amounts, bool) {
	var a ledger.Amounts
	if s == "" {
		return a, true
	}
	i := 0
	for f := range strings.SplitSeq(s, ",") {
		if i >= len(a) {
			return a, false
		}
		v, err := strconv.ParseInt(f, 10, 64)
		if err != nil || v < 0 {
			return a, false
		}
		a[i] = v
		i++
	}
	return a, true
}
