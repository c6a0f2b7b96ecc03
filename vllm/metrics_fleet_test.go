package vllm

import (
	"testing"

	"github.com/stretchr/testify/assert"
)

// TestParseWaitingByReasonAndLoRAInfo: the waiting split by reason is read
// per reason, and of vllm:lora_requests_info only the newest series (the
// largest value: vLLM sets the current lists' series to the time and
// keeps the older ones) counts.
func TestParseWaitingByReasonAndLoRAInfo(t *testing.T) {
	t.Parallel()
	text := []byte(`# TYPE vllm:num_requests_waiting gauge
vllm:num_requests_waiting{engine="0",model_name="m"} 5.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="capacity"} 1.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="m",reason="deferred"} 4.0
vllm:num_requests_waiting_by_reason{engine="0",model_name="other",reason="capacity"} 9.0
vllm:lora_requests_info{max_lora="2",running_lora_adapters="old",waiting_lora_adapters=""} 1.7000000e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="a,b",waiting_lora_adapters="c"} 1.7000005e+09
vllm:lora_requests_info{max_lora="2",running_lora_adapters="older",waiting_lora_adapters="a"} 1.6999999e+09
`)
	m := ParseMetrics(text, "m")
	assert.Equal(t, v(5), m.Waiting)
	assert.Equal(t, v(1), m.WaitingCapacity)
	assert.Equal(t, v(4), m.WaitingDeferred)
	assert.Equal(t, v(1), m.CapacityWaiting(), "deferred requests are no sign of a full replica")
	assert.True(t, m.LoRAKnown)
	assert.Equal(t, []string{"a", "b"}, m.LoRARunning)
	assert.Equal(t, []string{"c"}, m.LoRAWaiting)
	assert.Equal(t, v(2), m.MaxLoRA)

	// Idle: empty lists are no adapters.
	m = ParseMetrics([]byte(`vllm:lora_requests_info{max_lora="1",running_lora_adapters="",waiting_lora_adapters=""} 5`), "")
	assert.True(t, m.LoRAKnown)
	assert.Empty(t, m.LoRARunning)

	// Releases without the split: all waiting counts as waiting for room.
	m = ParseMetrics([]byte("vllm:num_requests_waiting 3\n"), "")
	assert.False(t, m.WaitingCapacity.OK)
	assert.Equal(t, v(3), m.CapacityWaiting())
	assert.False(t, m.LoRAKnown)
}
