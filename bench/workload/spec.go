// Package workload reads and validates workload files and builds the
// seeded, per-tenant request schedule that loadgen sends.
package workload

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"math"
	"os"
	"path/filepath"
	"regexp"
	"strconv"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"
)

// Duration is a time.Duration that reads "30s"-style strings (or a number of
// seconds) from YAML and JSON.
type Duration time.Duration

// D returns the value as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

func parseDuration(s string) (Duration, error) {
	s = strings.TrimSpace(s)
	if f, err := strconv.ParseFloat(s, 64); err == nil {
		return Duration(f * float64(time.Second)), nil
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return 0, fmt.Errorf("bad duration %q", s)
	}
	return Duration(v), nil
}

// UnmarshalYAML implements yaml.Unmarshaler.
func (d *Duration) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseDuration(n.Value)
	*d = v
	return err
}

// UnmarshalJSON implements json.Unmarshaler.
func (d *Duration) UnmarshalJSON(b []byte) error {
	v, err := parseDuration(strings.Trim(string(b), `"`))
	*d = v
	return err
}

// MarshalJSON implements json.Marshaler.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// Rate is a request rate in requests per second. Written as a number, as
// "inf" (all at t0) or as "3x" (a multiple of --capacity, resolved by
// [Spec.Resolve]).
type Rate struct {
	Value    float64 // rps, or the multiple when Multiple is set; +Inf for "inf"
	Multiple bool
}

func parseRate(s string) (Rate, error) {
	s = strings.TrimSpace(strings.ToLower(s))
	if s == "inf" || s == "+inf" {
		return Rate{Value: math.Inf(1)}, nil
	}
	if m, ok := strings.CutSuffix(s, "x"); ok {
		f, err := strconv.ParseFloat(m, 64)
		if err != nil {
			return Rate{}, fmt.Errorf("bad rate %q", s)
		}
		return Rate{Value: f, Multiple: true}, nil
	}
	f, err := strconv.ParseFloat(s, 64)
	if err != nil {
		return Rate{}, fmt.Errorf("bad rate %q", s)
	}
	return Rate{Value: f}, nil
}

// ParseRate reads a rate as written in a workload file or on the command line.
func ParseRate(s string) (Rate, error) { return parseRate(s) }

// UnmarshalYAML implements yaml.Unmarshaler.
func (r *Rate) UnmarshalYAML(n *yaml.Node) error {
	v, err := parseRate(n.Value)
	*r = v
	return err
}

// UnmarshalJSON implements json.Unmarshaler.
func (r *Rate) UnmarshalJSON(b []byte) error {
	v, err := parseRate(strings.Trim(string(b), `"`))
	*r = v
	return err
}

// MarshalJSON implements json.Marshaler.
func (r Rate) MarshalJSON() ([]byte, error) { return json.Marshal(r.String()) }

func (r Rate) String() string {
	switch {
	case math.IsInf(r.Value, 1):
		return "inf"
	case r.Multiple:
		return strconv.FormatFloat(r.Value, 'g', -1, 64) + "x"
	}
	return strconv.FormatFloat(r.Value, 'g', -1, 64)
}

// Length describes a token-length distribution.
type Length struct {
	Dist       string  `yaml:"dist" json:"dist"` // fixed | uniform | normal | lognormal | empirical
	Value      int     `yaml:"value,omitempty" json:"value,omitempty"`
	Mean       float64 `yaml:"mean,omitempty" json:"mean,omitempty"`
	RangeRatio float64 `yaml:"range_ratio,omitempty" json:"range_ratio,omitempty"`
	Stddev     float64 `yaml:"stddev,omitempty" json:"stddev,omitempty"`
	Median     float64 `yaml:"median,omitempty" json:"median,omitempty"`
	Sigma      float64 `yaml:"sigma,omitempty" json:"sigma,omitempty"`
	Min        int     `yaml:"min,omitempty" json:"min,omitempty"`
	Max        int     `yaml:"max,omitempty" json:"max,omitempty"`
	Path       string  `yaml:"path,omitempty" json:"path,omitempty"`

	samples []int // empirical values, loaded by Spec.Resolve
}

// Arrival shapes the inter-arrival process.
type Arrival struct {
	// Burstiness is the gamma shape k: 1 Poisson, < 1 burstier, inf constant.
	Burstiness *Rate `yaml:"burstiness,omitempty" json:"burstiness,omitempty"`
}

// Pattern modulates a tenant's rate over time.
type Pattern struct {
	Type  string   `yaml:"type" json:"type"` // steady | on_off | ramp
	On    Duration `yaml:"on,omitempty" json:"on,omitempty"`
	Off   Duration `yaml:"off,omitempty" json:"off,omitempty"`
	Phase Duration `yaml:"phase,omitempty" json:"phase,omitempty"`
	From  *Rate    `yaml:"from,omitempty" json:"from,omitempty"`
	To    *Rate    `yaml:"to,omitempty" json:"to,omitempty"`
}

// SLO holds goodput thresholds in milliseconds; nil means not checked.
type SLO struct {
	TTFTMs *float64 `yaml:"ttft_ms,omitempty" json:"ttft_ms,omitempty"`
	TPOTMs *float64 `yaml:"tpot_ms,omitempty" json:"tpot_ms,omitempty"`
	E2ELMs *float64 `yaml:"e2el_ms,omitempty" json:"e2el_ms,omitempty"`
}

// Cancel drops the connection mid-stream for a fraction of requests.
type Cancel struct {
	Fraction    float64 `yaml:"fraction" json:"fraction"`
	AfterChunks *Length `yaml:"after_chunks,omitempty" json:"after_chunks,omitempty"`
}

// Cost sets the fairness cost weights: c = input·in + output·out.
type Cost struct {
	Input  float64 `yaml:"input" json:"input"`
	Output float64 `yaml:"output" json:"output"`
}

// Tenant is one tenant of a workload; nil fields inherit from the defaults.
type Tenant struct {
	Name       string    `yaml:"name,omitempty" json:"name,omitempty"`
	APIKey     string    `yaml:"api_key,omitempty" json:"api_key,omitempty"`
	Role       string    `yaml:"role,omitempty" json:"role,omitempty"` // victim (default) | aggressor
	Weight     *float64  `yaml:"weight,omitempty" json:"weight,omitempty"`
	Priority   *int      `yaml:"priority,omitempty" json:"priority,omitempty"`
	Rate       *Rate     `yaml:"rate,omitempty" json:"rate,omitempty"`
	NumPrompts *int      `yaml:"num_prompts,omitempty" json:"num_prompts,omitempty"`
	Input      *Length   `yaml:"input,omitempty" json:"input,omitempty"`
	Output     *Length   `yaml:"output,omitempty" json:"output,omitempty"`
	Arrival    *Arrival  `yaml:"arrival,omitempty" json:"arrival,omitempty"`
	Pattern    *Pattern  `yaml:"pattern,omitempty" json:"pattern,omitempty"`
	Deadline   *Duration `yaml:"deadline,omitempty" json:"deadline,omitempty"`
	SLO        *SLO      `yaml:"slo,omitempty" json:"slo,omitempty"`
	Cancel     *Cancel   `yaml:"cancel,omitempty" json:"cancel,omitempty"`
	Cost       *Cost     `yaml:"cost,omitempty" json:"cost,omitempty"`
}

// Spec is a multi-tenant workload file (BENCH.md §3).
type Spec struct {
	Seed     uint64   `yaml:"seed" json:"seed"`
	Duration Duration `yaml:"duration,omitempty" json:"duration,omitempty"`
	Warmup   Duration `yaml:"warmup,omitempty" json:"warmup,omitempty"`
	Defaults Tenant   `yaml:"defaults,omitempty" json:"defaults,omitempty"`
	Tenants  []Tenant `yaml:"tenants" json:"tenants"`
}

var envRef = regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)\}`)

// Parse reads a workload from YAML or JSON (chosen by the first non-space
// byte), expanding ${VAR} with lookup (os.LookupEnv when nil; unset → "").
// Unknown fields are errors. It does not validate: call [Spec.Validate].
func Parse(data []byte, lookup func(string) (string, bool)) (*Spec, error) {
	if lookup == nil {
		lookup = os.LookupEnv
	}
	data = envRef.ReplaceAllFunc(data, func(m []byte) []byte {
		v, _ := lookup(string(m[2 : len(m)-1]))
		return []byte(v)
	})
	var s Spec
	trimmed := bytes.TrimSpace(data)
	if len(trimmed) > 0 && trimmed[0] == '{' {
		dec := json.NewDecoder(bytes.NewReader(trimmed))
		dec.DisallowUnknownFields()
		if err := dec.Decode(&s); err != nil {
			return nil, fmt.Errorf("workload json: %w", err)
		}
		return &s, nil
	}
	dec := yaml.NewDecoder(bytes.NewReader(data))
	dec.KnownFields(true)
	if err := dec.Decode(&s); err != nil {
		return nil, fmt.Errorf("workload yaml: %w", err)
	}
	return &s, nil
}

// Load reads and parses a workload file; relative empirical paths resolve
// against the file's directory.
func Load(path string) (*Spec, error) {
	b, err := os.ReadFile(path)
	if err != nil {
		return nil, fmt.Errorf("workload: %w", err)
	}
	s, err := Parse(b, nil)
	if err != nil {
		return nil, fmt.Errorf("%s: %w", path, err)
	}
	dir := filepath.Dir(path)
	for _, t := range append([]Tenant{s.Defaults}, s.Tenants...) {
		for _, l := range []*Length{t.Input, t.Output} {
			if l != nil && l.Path != "" && !filepath.IsAbs(l.Path) {
				l.Path = filepath.Join(dir, l.Path)
			}
		}
	}
	return s, nil
}

// merged returns t with nil fields taken from d.
func merged(t, d Tenant) Tenant {
	if t.APIKey == "" {
		t.APIKey = d.APIKey
	}
	if t.Role == "" {
		t.Role = d.Role
	}
	if t.Weight == nil {
		t.Weight = d.Weight
	}
	if t.Priority == nil {
		t.Priority = d.Priority
	}
	if t.Rate == nil {
		t.Rate = d.Rate
	}
	if t.NumPrompts == nil {
		t.NumPrompts = d.NumPrompts
	}
	if t.Input == nil {
		t.Input = d.Input
	}
	if t.Output == nil {
		t.Output = d.Output
	}
	if t.Arrival == nil {
		t.Arrival = d.Arrival
	}
	if t.Pattern == nil {
		t.Pattern = d.Pattern
	}
	if t.Deadline == nil {
		t.Deadline = d.Deadline
	}
	if t.Cancel == nil {
		t.Cancel = d.Cancel
	}
	if t.Cost == nil {
		t.Cost = d.Cost
	}
	switch {
	case t.SLO == nil:
		t.SLO = d.SLO
	case d.SLO != nil:
		s := *t.SLO
		if s.TTFTMs == nil {
			s.TTFTMs = d.SLO.TTFTMs
		}
		if s.TPOTMs == nil {
			s.TPOTMs = d.SLO.TPOTMs
		}
		if s.E2ELMs == nil {
			s.E2ELMs = d.SLO.E2ELMs
		}
		t.SLO = &s
	}
	return t
}

func validLength(p string, l *Length) []error {
	if l == nil {
		return []error{fmt.Errorf("%s is required", p)}
	}
	var errs []error
	bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(p+"."+f, a...)) }
	switch l.Dist {
	case "fixed":
		if l.Value < 1 {
			bad("value must be >= 1")
		}
	case "uniform":
		if l.Mean < 1 {
			bad("mean must be >= 1")
		}
		if l.RangeRatio < 0 || l.RangeRatio > 1 {
			bad("range_ratio must be in [0, 1]")
		}
	case "normal":
		if l.Mean < 1 || l.Stddev < 0 {
			bad("mean must be >= 1 and stddev >= 0")
		}
	case "lognormal":
		if l.Median < 1 || l.Sigma < 0 {
			bad("median must be >= 1 and sigma >= 0")
		}
	case "empirical":
		if l.Path == "" {
			bad("path is required for empirical")
		}
	default:
		bad("dist %q unknown (fixed, uniform, normal, lognormal, empirical)", l.Dist)
	}
	if l.Max != 0 && l.Max < l.Min {
		bad("max must be >= min")
	}
	return errs
}

// Validate checks the spec as written (before defaults are resolved against
// flags) and returns every problem, each named by its field path.
func (s *Spec) Validate() error {
	var errs []error
	if len(s.Tenants) == 0 {
		errs = append(errs, errors.New("tenants: at least one tenant is required"))
	}
	if s.Duration < 0 || s.Warmup < 0 {
		errs = append(errs, errors.New("duration and warmup must be >= 0"))
	}
	seen := map[string]bool{}
	aggressors := 0
	for i, raw := range s.Tenants {
		p := fmt.Sprintf("tenants[%d]", i)
		bad := func(f string, a ...any) { errs = append(errs, fmt.Errorf(p+"."+f, a...)) }
		t := merged(raw, s.Defaults)
		switch {
		case t.Name == "":
			bad("name is required")
		case seen[t.Name]:
			bad("name %q is duplicated", t.Name)
		case strings.ContainsAny(t.Name, " \t,/"):
			bad("name %q must not contain spaces, commas or slashes", t.Name)
		}
		seen[t.Name] = true
		switch t.Role {
		case "", "victim":
		case "aggressor":
			aggressors++
		default:
			bad("role %q unknown (victim, aggressor)", t.Role)
		}
		if t.Weight != nil && *t.Weight <= 0 {
			bad("weight must be > 0")
		}
		if t.Rate == nil {
			if t.Pattern == nil || t.Pattern.Type != "ramp" {
				bad("rate is required")
			}
		} else if !(t.Rate.Value > 0) {
			bad("rate must be > 0")
		}
		if t.Priority != nil && *t.Priority < 0 {
			bad("priority must be >= 0 (0 is the highest band)")
		}
		if t.NumPrompts != nil && *t.NumPrompts < 1 {
			bad("num_prompts must be >= 1")
		}
		if t.Input != nil {
			errs = append(errs, validLength(p+".input", t.Input)...)
		}
		if t.Output != nil {
			errs = append(errs, validLength(p+".output", t.Output)...)
		}
		if t.Arrival != nil && t.Arrival.Burstiness != nil && (!(t.Arrival.Burstiness.Value > 0) || t.Arrival.Burstiness.Multiple) {
			bad("arrival.burstiness must be > 0 or inf")
		}
		if pt := t.Pattern; pt != nil {
			switch pt.Type {
			case "", "steady":
			case "on_off":
				if pt.On <= 0 || pt.Off < 0 || pt.Phase < 0 {
					bad("pattern.on must be > 0, off and phase >= 0")
				}
			case "ramp":
				if pt.From == nil || pt.To == nil || pt.From.Value < 0 || pt.To.Value < 0 ||
					math.IsInf(pt.From.Value, 1) || math.IsInf(pt.To.Value, 1) || pt.From.Value+pt.To.Value == 0 {
					bad("pattern.from and pattern.to must be finite rates >= 0, not both 0")
				}
				if s.Duration <= 0 {
					bad("pattern ramp needs a duration")
				}
			default:
				bad("pattern.type %q unknown (steady, on_off, ramp)", pt.Type)
			}
		}
		if t.Deadline != nil && *t.Deadline <= 0 {
			bad("deadline must be > 0")
		}
		if c := t.Cancel; c != nil {
			if c.Fraction < 0 || c.Fraction > 1 {
				bad("cancel.fraction must be in [0, 1]")
			}
			if c.AfterChunks != nil {
				errs = append(errs, validLength(p+".cancel.after_chunks", c.AfterChunks)...)
			}
		}
		if c := t.Cost; c != nil && (c.Input < 0 || c.Output < 0) {
			bad("cost weights must be >= 0")
		}
	}
	if aggressors > 1 {
		errs = append(errs, errors.New("tenants: at most one tenant may have role aggressor"))
	}
	return errors.Join(errs...)
}
