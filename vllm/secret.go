package vllm

import (
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
)

// Secret is an upstream credential (a replica's --api-key). Every way of
// printing it — fmt verbs, slog, JSON, text encoding — writes "[redacted]"
// (or "" when empty); only [Secret.Reveal] gives the value. The value sits
// behind a pointer, so that even a struct that holds a Secret in an
// unexported field, printed with %+v (which cannot call its methods),
// shows an address, not the key.
type Secret struct{ p *string }

// NewSecret wraps s.
func NewSecret(s string) Secret {
	if s == "" {
		return Secret{}
	}
	return Secret{p: &s}
}

const redacted = "[redacted]"

// Reveal returns the credential, for the Authorization header only.
func (s Secret) Reveal() string {
	if s.p == nil {
		return ""
	}
	return *s.p
}

// Set reports whether a credential is present.
func (s Secret) Set() bool { return s.p != nil && *s.p != "" }

func (s Secret) show() string {
	if !s.Set() {
		return ""
	}
	return redacted
}

// String redacts.
func (s Secret) String() string { return s.show() }

// GoString redacts (%#v).
func (s Secret) GoString() string { return fmt.Sprintf("vllm.Secret(%q)", s.show()) }

// Format redacts under every verb.
func (s Secret) Format(f fmt.State, verb rune) {
	if verb == 'v' && f.Flag('#') {
		_, _ = f.Write([]byte(s.GoString()))
		return
	}
	_, _ = f.Write([]byte(s.show()))
}

// LogValue redacts in slog.
func (s Secret) LogValue() slog.Value { return slog.StringValue(s.show()) }

// MarshalText redacts in JSON, YAML and other text encodings.
func (s Secret) MarshalText() ([]byte, error) { return []byte(s.show()), nil }

// credentials maps a replica's base URL to its credential.
type credentials struct {
	bases []credBase
}

type credBase struct {
	scheme, host, path string // path without a trailing slash
	key                string // the base URL as configured, trimmed of "/"
	auth               string // "Bearer <key>"
}

// lookup returns the Authorization value for a request to u, or "".
func (c *credentials) lookup(u *url.URL) string {
	if c == nil {
		return ""
	}
	for _, b := range c.bases {
		if !strings.EqualFold(u.Scheme, b.scheme) || !strings.EqualFold(u.Host, b.host) {
			continue
		}
		p := u.Path
		if b.path == "" || p == b.path || strings.HasPrefix(p, b.path+"/") {
			return b.auth
		}
	}
	return ""
}

// byBase returns the Authorization value for a base URL as configured.
func (c *credentials) byBase(base string) string {
	if c == nil {
		return ""
	}
	base = strings.TrimSuffix(base, "/")
	for _, b := range c.bases {
		if b.key == base {
			return b.auth
		}
	}
	return ""
}

// SetCredentials installs the upstream credentials, by replica base URL
// (as passed to Stream, Post, Tokenize, Models and the poller): every call
// to that replica then carries "Authorization: Bearer <key>". It replaces
// the previous set atomically (a reload rotates keys without a restart);
// a base URL without a set Secret sends none.
func (c *Client) SetCredentials(creds map[string]Secret) error {
	cs := &credentials{}
	for base, s := range creds {
		if !s.Set() {
			continue
		}
		if !validHeaderValue(s.Reveal()) {
			return fmt.Errorf("the credential of %s is not a valid header value", base)
		}
		u, err := url.Parse(strings.TrimSuffix(base, "/"))
		if err != nil || u.Host == "" {
			return fmt.Errorf("credential for %q: not a base URL", base)
		}
		cs.bases = append(cs.bases, credBase{scheme: u.Scheme, host: u.Host, path: strings.TrimSuffix(u.Path, "/"),
			key: strings.TrimSuffix(base, "/"), auth: "Bearer " + s.Reveal()})
	}
	c.creds.Store(cs)
	c.h1.creds.Store(cs)
	return nil
}

// authTransport adds a replica's credential to the net/http calls
// (/metrics, /health, /tokenize, /v1/models and the other endpoints). It
// matches on the request's own URL, so a redirect to another host never
// carries the key.
type authTransport struct {
	base  http.RoundTripper
	creds *atomic.Pointer[credentials]
}

func (t authTransport) RoundTrip(req *http.Request) (*http.Response, error) {
	auth := t.creds.Load().lookup(req.URL)
	if auth == "" || req.Header.Get("Authorization") != "" {
		return t.base.RoundTrip(req)
	}
	r2 := req.Clone(req.Context())
	r2.Header.Set("Authorization", auth)
	return t.base.RoundTrip(r2)
}

// CloseIdleConnections passes http.Client.CloseIdleConnections through.
func (t authTransport) CloseIdleConnections() {
	if c, ok := t.base.(interface{ CloseIdleConnections() }); ok {
		c.CloseIdleConnections()
	}
}
