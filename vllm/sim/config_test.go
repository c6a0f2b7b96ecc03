package sim

import (
	"testing"
	"time"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

func TestConfigValidate(t *testing.T) {
	tests := []struct {
		name    string
		mod     func(*Config)
		wantErr string
	}{
		{"defaults", func(*Config) {}, ""},
		{"zero value", func(c *Config) { *c = Config{} }, ""},
		{"small kv lowers the default model len", func(c *Config) { *c = Config{KVTokens: 1000} }, ""},
		{"model len over kv, as vLLM refuses", func(c *Config) { c.MaxModelLen, c.KVTokens = 8192, 4096 }, "exceeds the KV cache"},
		{"kv not a whole block more", func(c *Config) { c.MaxModelLen, c.KVTokens, c.BlockSize = 40, 40, 16 }, "exceeds the KV cache"},
		{"negative seqs", func(c *Config) { c.MaxNumSeqs = -1 }, "max_num_seqs"},
		{"policy", func(c *Config) { c.SchedulingPolicy = "lifo" }, "scheduling_policy"},
		{"disconnect", func(c *Config) { c.OnDisconnect = "x" }, "on_disconnect"},
		{"rate", func(c *Config) { c.Faults.StallRate = 1.5 }, "faults.stall_rate"},
		{"status", func(c *Config) { c.Faults.ErrorStatus = 200 }, "faults.error_status"},
		{"negative step", func(c *Config) { c.DecodeStepPerSeq = -time.Millisecond }, "decode_step_per_seq"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			c := DefaultConfig()
			tt.mod(&c)
			err := c.Validate()
			_, nerr := New(c)
			if tt.wantErr == "" {
				require.NoError(t, err)
				require.NoError(t, nerr)
				return
			}
			require.Error(t, err)
			require.ErrorContains(t, err, tt.wantErr)
			require.ErrorIs(t, err, ErrConfig)
			assert.Error(t, nerr)
		})
	}
	t.Run("all problems at once", func(t *testing.T) {
		c := Config{MaxNumSeqs: -1, SchedulingPolicy: "x", OnDisconnect: "y"}
		err := c.Validate()
		require.ErrorContains(t, err, "max_num_seqs")
		require.ErrorContains(t, err, "scheduling_policy")
		assert.ErrorContains(t, err, "on_disconnect")
	})
}
