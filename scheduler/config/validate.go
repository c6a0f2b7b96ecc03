package config

import (
	"errors"
	"fmt"
	"net/url"
	"slices"
	"strings"
	"time"
)

// validator collects problems; each names its field path.
type validator struct{ errs []error }

func (v *validator) add(format string, a ...any) { v.errs = append(v.errs, fmt.Errorf(format, a...)) }

func (v *validator) err() error { return errors.Join(v.errs...) }

func (v *validator) nonEmpty(path, s string) {
	if strings.TrimSpace(s) == "" {
		v.add("%s must not be empty", path)
	}
}

func (v *validator) oneOf(path, s string, allowed ...string) {
	if !slices.Contains(allowed, s) {
		v.add("%s must be one of %s (got %q)", path, strings.Join(allowed, ", "), s)
	}
}

func (v *validator) nonNeg(path string, n int64) {
	if n < 0 {
		v.add("%s must be >= 0", path)
	}
}

func (v *validator) positive(path string, n int64) {
	if n <= 0 {
		v.add("%s must be > 0", path)
	}
}

func (v *validator) nonNegF(path string, f float64) {
	if f < 0 || f != f {
		v.add("%s must be >= 0", path)
	}
}

func (v *validator) rangeF(path string, f, lo, hi float64) {
	if !(f >= lo && f <= hi) {
		v.add("%s must be in [%g, %g]", path, lo, hi)
	}
}

func (v *validator) positiveDur(path string, d time.Duration) {
	if d <= 0 {
		v.add("%s must be > 0", path)
	}
}

func (v *validator) url(path, s string) {
	u, err := url.Parse(s)
	if s == "" || err != nil || (u.Scheme != "http" && u.Scheme != "https") || u.Host == "" {
		v.add("%s must be an http(s) URL (got %q)", path, s)
	}
}

// modelList checks a list of model names: non-empty, no duplicates.
func (v *validator) modelList(path string, ms []string) {
	seen := map[string]int{}
	for i, m := range ms {
		if m == "" {
			v.add("%s[%d] must not be empty", path, i)
			continue
		}
		if j, dup := seen[m]; dup {
			v.add("%s[%d] %q duplicates %s[%d]", path, i, m, path, j)
		}
		seen[m] = i
	}
}
