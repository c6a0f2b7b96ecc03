package vllm

import (
	"context"
	"errors"
	"fmt"
	"net/url"
	"regexp"
)

// ScrapeFailure is one endpoint's failure in a poll of a replica, fit to
// show an operator: its message names no URL (a replica URL may carry
// userinfo) and never a header (the replica's Authorization credential).
type ScrapeFailure struct {
	// Endpoint is the path that failed: /metrics, /health or /v1/models.
	Endpoint string `json:"endpoint"`
	// Message is the cause, e.g. "status 503" or "dial tcp 10.0.0.7:8000:
	// connect: connection refused".
	Message string `json:"message"`
}

func (f ScrapeFailure) String() string { return f.Endpoint + ": " + f.Message }

var (
	// userinfoRE matches the userinfo of a URL inside a message.
	userinfoRE = regexp.MustCompile(`([A-Za-z][A-Za-z0-9+.\-]*://)[^/@\s"']*@`)
	// bearerRE matches a bearer credential inside a message.
	bearerRE = regexp.MustCompile(`(?i)(bearer)\s+[^\s"']+`)
)

// ShowError renders err for an operator without a credential: a
// *url.Error is replaced by its cause (its URL may carry userinfo; net/http
// masks only the password), a deadline reads "timed out", an
// *UpstreamError is its status and type (its Replica is the URL), and any
// userinfo or bearer value left in the text is dropped.
func ShowError(err error) string {
	if err == nil {
		return ""
	}
	if errors.Is(err, context.DeadlineExceeded) {
		return "timed out"
	}
	var ue *UpstreamError
	if errors.As(err, &ue) {
		s := fmt.Sprintf("status %d", ue.Status)
		if ue.Type != "" {
			s += " " + ue.Type
		}
		return s
	}
	var uerr *url.Error
	for errors.As(err, &uerr) {
		err = uerr.Err
	}
	return ScrubSecrets(err.Error())
}

// ScrubSecrets drops URL userinfo and bearer values from s.
func ScrubSecrets(s string) string {
	s = userinfoRE.ReplaceAllString(s, "$1")
	return bearerRE.ReplaceAllString(s, "$1 [redacted]")
}

// RedactURL is u without its userinfo, for display; u unchanged when it
// does not parse.
func RedactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return ScrubSecrets(u)
	}
	if p.User == nil {
		return u
	}
	p.User = nil
	return p.String()
}
