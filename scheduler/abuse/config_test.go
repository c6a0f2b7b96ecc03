package abuse

import (
	"strings"
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
	"go.yaml.in/yaml/v3"
)

func TestConfigYAMLShape(t *testing.T) {
	t.Parallel()
	const doc = `
window: 20s
baseline: 5m
min_rate: {tokens_per_second: 100, usd_micros_per_second: 50, gpu_ms_per_second: 200}
spend_rate_factor: 10
gpu_ms_rate_factor: 8
max_cap_burst: {count: 20, share: 0.5}
disconnect_share: {share: 0.6, min_count: 30}
denials: 50
clamp: {concurrency: 2, weight: 1, max_output_tokens: 512, models: [small], duration: 15m}
cooldown: 20m
`
	var got Config
	dec := yaml.NewDecoder(strings.NewReader(doc))
	dec.KnownFields(true)
	require.NoError(t, dec.Decode(&got))
	assert.Equal(t, Config{
		Window:          20 * time.Second,
		Baseline:        5 * time.Minute,
		MinRate:         Rates{TokensPerSecond: 100, USDMicrosPerSecond: 50, GPUMsPerSecond: 200},
		SpendRateFactor: 10,
		GPUMsRateFactor: 8,
		MaxCapBurst:     MaxCapBurst{Count: 20, Share: 0.5},
		DisconnectShare: DisconnectShare{Share: 0.6, MinCount: 30},
		Denials:         50,
		Clamp:           Clamp{Concurrency: 2, Weight: 1, MaxOutputTokens: 512, Models: []string{"small"}, Duration: 15 * time.Minute},
		Cooldown:        20 * time.Minute,
	}, got)
	require.NoError(t, got.Validate("tenants[0].abuse"))
}

func TestConfigDefaults(t *testing.T) {
	t.Parallel()
	var c Config
	c.ApplyDefaults()
	assert.Equal(t, Config{
		Window:   30 * time.Second,
		Baseline: 10 * time.Minute,
		Cooldown: 10 * time.Minute,
		Clamp:    Clamp{Duration: 10 * time.Minute},
	}, c)
	assert.False(t, c.Enabled(), "the zero config never clamps")
	require.NoError(t, c.Validate("abuse"))

	c = Config{DisconnectShare: DisconnectShare{Share: 0.5}, Baseline: time.Hour}
	c.ApplyDefaults()
	assert.Equal(t, int64(20), c.DisconnectShare.MinCount)
	assert.Equal(t, time.Hour, c.Cooldown, "cooldown defaults to the baseline")
}

func TestConfigValidate(t *testing.T) {
	t.Parallel()
	tests := []struct {
		name string
		mod  func(c *Config)
		want []string // every problem, in order; nil = valid
	}{
		{name: "valid", mod: func(*Config) {}},
		{name: "window too short", mod: func(c *Config) { c.Window = 500 * time.Millisecond },
			want: []string{"tenants[2].abuse.window must be >= 1s"}},
		{name: "window too long", mod: func(c *Config) { c.Window, c.Baseline = 11*time.Minute, time.Hour },
			want: []string{"tenants[2].abuse.window must be <= 10m0s"}},
		{name: "window not whole seconds", mod: func(c *Config) { c.Window = 1500 * time.Millisecond },
			want: []string{"tenants[2].abuse.window must be whole seconds"}},
		{name: "baseline shorter than window", mod: func(c *Config) { c.Baseline = 10 * time.Second },
			want: []string{"tenants[2].abuse.baseline must be >= window (30s)"}},
		{name: "baseline too long", mod: func(c *Config) { c.Baseline = 25 * time.Hour },
			want: []string{"tenants[2].abuse.baseline must be <= 24h0m0s"}},
		{name: "baseline too many windows", mod: func(c *Config) { c.Window, c.Baseline = time.Second, time.Hour },
			want: []string{"tenants[2].abuse.baseline must be <= 1440 windows (got 3600)"}},
		{name: "bad rates and factors", mod: func(c *Config) {
			c.MinRate.TokensPerSecond = -1
			c.SpendRateFactor = 1
			c.GPUMsRateFactor = -2
		}, want: []string{
			"tenants[2].abuse.min_rate.tokens_per_second must be a finite number >= 0",
			"tenants[2].abuse.spend_rate_factor must be 0 (off) or a finite number > 1",
			"tenants[2].abuse.gpu_ms_rate_factor must be 0 (off) or a finite number > 1",
		}},
		{name: "bad counts and shares", mod: func(c *Config) {
			c.MaxCapBurst = MaxCapBurst{Share: 1.5}
			c.DisconnectShare = DisconnectShare{Share: 0.5, MinCount: -1}
			c.Denials = -1
			c.Cooldown = -time.Second
		}, want: []string{
			"tenants[2].abuse.max_cap_burst.share must be in 0..1",
			"tenants[2].abuse.max_cap_burst.count must be >= 1 when share is set",
			"tenants[2].abuse.disconnect_share.min_count must be >= 0",
			"tenants[2].abuse.denials must be >= 0",
			"tenants[2].abuse.cooldown must be >= 0",
		}},
		{name: "bad clamp", mod: func(c *Config) {
			c.Clamp = Clamp{Concurrency: -1, Weight: -1, MaxOutputTokens: -1, Models: []string{" "}, Duration: -time.Minute}
		}, want: []string{
			"tenants[2].abuse.clamp.concurrency must be >= 0",
			"tenants[2].abuse.clamp.weight must be >= 0",
			"tenants[2].abuse.clamp.max_output_tokens must be >= 0",
			"tenants[2].abuse.clamp.models[0] must not be empty",
			"tenants[2].abuse.clamp.duration must be > 0",
		}},
		{name: "detector without a clamp", mod: func(c *Config) { c.Clamp = Clamp{Duration: time.Minute} },
			want: []string{"tenants[2].abuse.clamp must restrict at least one of concurrency, weight, max_output_tokens, models when a detector is enabled"}},
		{name: "no detector needs no clamp", mod: func(c *Config) { *c = Config{} }},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			c := Config{Denials: 5, Clamp: Clamp{Concurrency: 1}}
			tt.mod(&c)
			c.ApplyDefaults()
			err := c.Validate("tenants[2].abuse")
			if tt.want == nil {
				assert.NoError(t, err)
				return
			}
			require.Error(t, err)
			assert.Equal(t, strings.Join(tt.want, "\n"), err.Error())
		})
	}
}

func TestNewRejectsInvalidConfig(t *testing.T) {
	t.Parallel()
	_, err := New(Config{Denials: 1}, nil)
	require.Error(t, err)
	assert.Equal(t, "abuse.clamp must restrict at least one of concurrency, weight, max_output_tokens, models when a detector is enabled", err.Error())
	d, err := New(Config{}, nil)
	require.NoError(t, err)
	_, ok := d.Observe("a", Event{Kind: Denied})
	assert.False(t, ok, "real clock, nothing enabled")
}
