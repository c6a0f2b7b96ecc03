package audit

import (
	"encoding/json"
	"fmt"
	"strconv"
	"strings"
	"unicode/utf8"
)

// Kind names what a line records.
type Kind string

// The kinds the server writes. Other non-empty kinds are accepted, so a new
// admin action needs no change here.
const (
	KindAdmit     Kind = "admit"      // request admitted: budgets reserved, queued
	KindDeny      Kind = "deny"       // request refused; Code and Reason say why
	KindSettle    Kind = "settle"     // usage charged exactly once
	KindRelease   Kind = "release"    // hold released without charge (never dispatched)
	KindResolve   Kind = "resolve"    // operator resolved an unresolved reservation
	KindClamp     Kind = "clamp"      // tenant clamped by an operator
	KindUnclamp   Kind = "unclamp"    // clamp lifted
	KindBudgetSet Kind = "budget_set" // budget created or changed
	KindBudgetRm  Kind = "budget_rm"  // budget removed
	KindReload    Kind = "reload"     // configuration reloaded
	KindDrain     Kind = "drain"      // server drain started
	KindKeyCreate Kind = "key_create" // API key created at run time (id and name, never the key)
	KindKeyRevoke Kind = "key_revoke" // run-time API key revoked
)

// Record is one audit event, filled by the caller and passed by value to
// [Log.Append]. Empty strings and zero numbers are omitted from the line.
//
// Record deliberately has no field for an API key or any credential: pass
// the tenant's config name and Sluice's request id, never what the client
// sent in its Authorization header.
type Record struct {
	// Kind is required.
	Kind Kind
	// Tenant is the tenant's config name (never a key or key hash).
	Tenant string
	// RequestID is Sluice's request id.
	RequestID string
	// Code is the machine-readable outcome, e.g. an OpenAI error code such
	// as "rate_limit_exceeded" or "budget_exhausted".
	Code string
	// Reason is a short human-readable explanation.
	Reason string
	// State is a ledger record state (e.g. "SETTLED", "UNRESOLVED").
	State string
	// Source says where a number came from (e.g. "usage", "estimate",
	// "operator").
	Source string
	// TokensHeld is the token hold reserved at admission, in tokens.
	TokensHeld int64
	// TokensCharged is the tokens charged at settlement or resolve.
	TokensCharged int64
	// GPUMs is GPU time in milliseconds (held or charged, per Kind).
	GPUMs int64
	// USDMicros is spend in micro-USD (1 USD = 1,000,000).
	USDMicros int64
	// Fields holds anything else, encoded with encoding/json (keys sorted).
	// Optional; it costs allocations, so prefer the typed fields on hot
	// paths. Keys that look like credentials are refused with
	// [ErrForbiddenField].
	Fields map[string]any
}

// appendBody appends the record's JSON members, each preceded by a comma
// (the caller has written `{"seq":…,"ts":…,"prev":…`), and the closing '}'.
func (r *Record) appendBody(b []byte) ([]byte, error) {
	if r.Kind == "" {
		return b, ErrNoKind
	}
	b = appendStr(b, `,"kind":`, string(r.Kind))
	b = appendStr(b, `,"tenant":`, r.Tenant)
	b = appendStr(b, `,"request_id":`, r.RequestID)
	b = appendStr(b, `,"code":`, r.Code)
	b = appendStr(b, `,"reason":`, r.Reason)
	b = appendStr(b, `,"state":`, r.State)
	b = appendStr(b, `,"source":`, r.Source)
	b = appendInt(b, `,"tokens_held":`, r.TokensHeld)
	b = appendInt(b, `,"tokens_charged":`, r.TokensCharged)
	b = appendInt(b, `,"gpu_ms":`, r.GPUMs)
	b = appendInt(b, `,"usd_micros":`, r.USDMicros)
	if len(r.Fields) > 0 {
		for k := range r.Fields {
			if credentialLike(k) {
				return b, fmt.Errorf("fields[%q]: %w", k, ErrForbiddenField)
			}
		}
		js, err := json.Marshal(r.Fields)
		if err != nil {
			return b, fmt.Errorf("encode fields: %w", err)
		}
		b = append(b, `,"fields":`...)
		b = append(b, js...)
	}
	return append(b, '}'), nil
}

// credentialLike reports whether a Fields key names something that must
// never be logged.
func credentialLike(k string) bool {
	k = strings.ToLower(k)
	for _, bad := range []string{"key", "authorization", "bearer", "password", "secret"} {
		if k == bad {
			return true
		}
	}
	return strings.Contains(k, "api_key") || strings.Contains(k, "apikey") ||
		strings.Contains(k, "api-key") || strings.Contains(k, "authorization")
}

func appendStr(b []byte, name, v string) []byte {
	if v == "" {
		return b
	}
	return appendJSONString(append(b, name...), v)
}

func appendInt(b []byte, name string, v int64) []byte {
	if v == 0 {
		return b
	}
	return strconv.AppendInt(append(b, name...), v, 10)
}

const hexDigits = "0123456789abcdef"

// appendJSONString appends s as a JSON string the way encoding/json does
// (without HTML escaping): invalid UTF-8 becomes U+FFFD, control
// characters and U+2028/U+2029 are escaped.
func appendJSONString(b []byte, s string) []byte {
	b = append(b, '"')
	start := 0
	for i := 0; i < len(s); {
		c := s[i]
		if c < utf8.RuneSelf {
			if c >= 0x20 && c != '"' && c != '\\' {
				i++
				continue
			}
			b = append(b, s[start:i]...)
			switch c {
			case '"', '\\':
				b = append(b, '\\', c)
			case '\n':
				b = append(b, '\\', 'n')
			case '\r':
				b = append(b, '\\', 'r')
			case '\t':
				b = append(b, '\\', 't')
			case '\b':
				b = append(b, '\\', 'b')
			case '\f':
				b = append(b, '\\', 'f')
			default:
				b = append(b, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xf])
			}
			i++
			start = i
			continue
		}
		r, size := utf8.DecodeRuneInString(s[i:])
		if r == utf8.RuneError && size == 1 {
			b = append(b, s[start:i]...)
			b = append(b, `\ufffd`...)
			i += size
			start = i
			continue
		}
		if r == '\u2028' || r == '\u2029' {
			b = append(b, s[start:i]...)
			b = append(b, '\\', 'u', '2', '0', '2', hexDigits[r&0xf])
			i += size
			start = i
			continue
		}
		i += size
	}
	b = append(b, s[start:]...)
	return append(b, '"')
}
