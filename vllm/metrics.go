package vllm

import (
	"bytes"
	"math"
	"strconv"
	"strings"
)

// Value is a metric reading that may be unknown. A metric missing from a
// scrape is unknown, never zero.
type Value struct {
	V  float64
	OK bool
}

func (v *Value) add(x float64) {
	v.V += x
	v.OK = true
}

// Metrics is what Sluice reads from one replica's /metrics for one model
// (VLLM.md §1.7; SCHEDULING.md §7). Series are filtered by model_name (series
// without the label are accepted) and summed over the engine label.
type Metrics struct {
	// Running and Waiting are vllm:num_requests_running / _waiting.
	Running, Waiting Value
	// WaitingCapacity and WaitingDeferred split Waiting by
	// vllm:num_requests_waiting_by_reason's reason label: "capacity"
	// (waiting for a slot or KV) and "deferred" (held back by a transient
	// constraint: LoRA budget, KV transfer, a grammar being compiled).
	// vllm/v1/metrics/loggers.py (WAITING_REASON_CAPACITY/_DEFERRED);
	// unknown on releases without the metric.
	WaitingCapacity, WaitingDeferred Value
	// LoRARunning and LoRAWaiting are the LoRA adapters of the running and
	// the waiting requests, from the newest vllm:lora_requests_info series:
	// vLLM sets the series of the current lists to the time at each
	// scheduler update and never removes older lists' series
	// (loggers.py: gauge_lora_info ... set_to_current_time()), so the
	// largest value is the current one. LoRAKnown reports that the series
	// was present (vLLM started with --enable-lora); MaxLoRA is its
	// max_lora label (vLLM's --max-loras).
	LoRARunning, LoRAWaiting []string
	LoRAKnown                bool
	MaxLoRA                  Value
	// KVUsage is vllm:kv_cache_usage_perc (0–1), or the deprecated
	// vllm:gpu_cache_usage_perc when the former is absent; the mean over
	// engines.
	KVUsage Value
	// PreemptionsTotal is vllm:num_preemptions_total.
	PreemptionsTotal Value
	// PromptTokensTotal and GenerationTokensTotal are vllm:prompt_tokens_total
	// and vllm:generation_tokens_total.
	PromptTokensTotal, GenerationTokensTotal Value
	// SuccessTotal sums vllm:request_success_total over finish reasons;
	// AbortsTotal is its finished_reason (or finish_reason) = "abort" series.
	SuccessTotal, AbortsTotal Value
	// KVCapacityTokens is num_gpu_blocks × block_size from
	// vllm:cache_config_info.
	KVCapacityTokens Value
	// NumGPUBlocks and BlockSize are vllm:cache_config_info's labels. With
	// data parallelism vLLM already sums num_gpu_blocks over its engines and
	// writes that total once per engine label (vllm/v1/metrics/loggers.py
	// builds one cache_config_info from the shared vllm_config.cache_config,
	// whose num_gpu_blocks the DP coordinator set to the total), so the
	// largest value is taken, never the sum; the block size of the last
	// series seen.
	NumGPUBlocks, BlockSize Value
	// GPUUtilization is the simulator's sim_gpu_utilization_ratio.
	GPUUtilization Value
	// GPUBusySecondsTotal is the simulator's sim_gpu_busy_seconds_total.
	GPUBusySecondsTotal Value
	// GPUEnergyJoulesTotal is the simulator's sim_gpu_energy_joules_total.
	GPUEnergyJoulesTotal Value
	// SimAbortedTotal is the simulator's sim_aborted_requests_total.
	SimAbortedTotal Value
	// E2ESecondsTotal and E2ECount are vllm:e2e_request_latency_seconds'
	// _sum and _count: each finished request's time from its arrival at
	// the frontend to its last token (vllm/v1/metrics/stats.py,
	// IterationStats.update_from_finished_request), summed.
	E2ESecondsTotal, E2ECount Value
}

// counters lists the monotonic readings, for restart detection.
func (m *Metrics) counters() [10]Value {
	return [10]Value{m.GPUEnergyJoulesTotal, m.PreemptionsTotal, m.PromptTokensTotal, m.GenerationTokensTotal,
		m.SuccessTotal, m.AbortsTotal, m.GPUBusySecondsTotal, m.SimAbortedTotal, m.E2ESecondsTotal, m.E2ECount}
}

// CounterDropped reports whether any counter known in both prev and m went
// down: the replica restarted between the two scrapes.
func (m *Metrics) CounterDropped(prev *Metrics) bool {
	a, b := prev.counters(), m.counters()
	for i := range a {
		if a[i].OK && b[i].OK && b[i].V < a[i].V {
			return true
		}
	}
	return false
}

// maxMetricsLine bounds one exposition line; longer lines are skipped.
const maxMetricsLine = 64 << 10

const maxLabels = 32

type label struct{ name, value []byte }

// ParseMetrics parses Prometheus text exposition tolerantly: unknown metrics,
// comments and malformed lines are skipped; only the series Sluice uses are
// read. model filters on the model_name label ("" accepts all).
func ParseMetrics(text []byte, model string) Metrics {
	var m Metrics
	var kvNew, kvOld Value
	loraAt := math.Inf(-1)
	var kvNewN, kvOldN int
	var labels [maxLabels]label
	for len(text) > 0 {
		var line []byte
		if i := bytes.IndexByte(text, '\n'); i >= 0 {
			line, text = text[:i], text[i+1:]
		} else {
			line, text = text, nil
		}
		if len(line) == 0 || len(line) > maxMetricsLine || line[0] == '#' {
			continue
		}
		name, rest := splitName(line)
		kind := metricKind(name)
		if kind == mNone {
			continue
		}
		ls, rest, ok := parseLabels(rest, labels[:0])
		if !ok {
			continue
		}
		v, ok := parseSampleValue(rest)
		if !ok {
			continue
		}
		if model != "" {
			if mn, has := labelValue(ls, "model_name"); has && string(mn) != model {
				continue
			}
		}
		switch kind {
		case mRunning:
			m.Running.add(v)
		case mWaiting:
			m.Waiting.add(v)
		case mWaitingByReason:
			switch r, _ := labelValue(ls, "reason"); string(r) {
			case "capacity":
				m.WaitingCapacity.add(v)
			case "deferred":
				m.WaitingDeferred.add(v)
			}
		case mLoRAInfo:
			if v < loraAt {
				continue
			}
			loraAt = v
			run, _ := labelValue(ls, "running_lora_adapters")
			wait, _ := labelValue(ls, "waiting_lora_adapters")
			m.LoRARunning, m.LoRAWaiting, m.LoRAKnown = splitList(run), splitList(wait), true
			if ml, ok := labelValue(ls, "max_lora"); ok {
				if x, err := strconv.ParseFloat(string(ml), 64); err == nil {
					m.MaxLoRA = Value{V: x, OK: true}
				}
			}
		case mKVUsage:
			kvNew.add(v)
			kvNewN++
		case mGPUCacheUsage:
			kvOld.add(v)
			kvOldN++
		case mPreemptions:
			m.PreemptionsTotal.add(v)
		case mPromptTokens:
			m.PromptTokensTotal.add(v)
		case mGenTokens:
			m.GenerationTokensTotal.add(v)
		case mSuccess:
			m.SuccessTotal.add(v)
			r, has := labelValue(ls, "finished_reason")
			if !has {
				r, has = labelValue(ls, "finish_reason")
			}
			if has && string(r) == "abort" {
				m.AbortsTotal.add(v)
			} else if !m.AbortsTotal.OK && has {
				m.AbortsTotal.OK = true // reasons are reported; abort count is 0 so far
			}
		case mCacheConfig:
			blocks, ok1 := labelValue(ls, "num_gpu_blocks")
			size, ok2 := labelValue(ls, "block_size")
			if !ok1 || !ok2 {
				continue
			}
			nb, err1 := strconv.ParseFloat(string(blocks), 64)
			bs, err2 := strconv.ParseFloat(string(size), 64)
			if err1 != nil || err2 != nil || nb < 0 || bs < 0 {
				continue
			}
			if !m.NumGPUBlocks.OK || nb > m.NumGPUBlocks.V {
				m.NumGPUBlocks = Value{V: nb, OK: true}
				m.KVCapacityTokens = Value{V: nb * bs, OK: true}
			}
			m.BlockSize = Value{V: bs, OK: true}
		case mSimUtil:
			m.GPUUtilization.add(v)
		case mSimBusy:
			m.GPUBusySecondsTotal.add(v)
		case mSimEnergy:
			m.GPUEnergyJoulesTotal.add(v)
		case mSimAborted:
			m.SimAbortedTotal.add(v)
		case mE2ESum:
			m.E2ESecondsTotal.add(v)
		case mE2ECount:
			m.E2ECount.add(v)
		}
	}
	switch {
	case kvNewN > 0:
		m.KVUsage = Value{V: kvNew.V / float64(kvNewN), OK: true}
	case kvOldN > 0:
		m.KVUsage = Value{V: kvOld.V / float64(kvOldN), OK: true}
	}
	return m
}

// CapacityWaiting is the requests waiting for room (a slot or KV):
// vllm:num_requests_waiting_by_reason{reason="capacity"} where the replica
// reports it, else all of vllm:num_requests_waiting. Deferred requests
// wait on something else (a LoRA slot, a KV transfer, a grammar), so they
// are no sign that the replica is full.
func (m *Metrics) CapacityWaiting() Value {
	if m.WaitingCapacity.OK || m.WaitingDeferred.OK {
		return Value{V: m.WaitingCapacity.V, OK: true}
	}
	return m.Waiting
}

// splitList splits a comma-joined label value; "" is no element.
func splitList(b []byte) []string {
	if len(b) == 0 {
		return nil
	}
	return strings.Split(string(b), ",")
}

type mKind uint8

const (
	mNone mKind = iota
	mRunning
	mWaiting
	mWaitingByReason
	mLoRAInfo
	mKVUsage
	mGPUCacheUsage
	mPreemptions
	mPromptTokens
	mGenTokens
	mSuccess
	mCacheConfig
	mSimUtil
	mSimBusy
	mSimEnergy
	mSimAborted
	mE2ESum
	mE2ECount
)

func metricKind(name []byte) mKind {
	switch string(name) {
	case "vllm:num_requests_running":
		return mRunning
	case "vllm:num_requests_waiting":
		return mWaiting
	case "vllm:num_requests_waiting_by_reason":
		return mWaitingByReason
	case "vllm:lora_requests_info":
		return mLoRAInfo
	case "vllm:kv_cache_usage_perc":
		return mKVUsage
	case "vllm:gpu_cache_usage_perc":
		return mGPUCacheUsage
	case "vllm:num_preemptions_total", "vllm:num_preemptions":
		return mPreemptions
	case "vllm:prompt_tokens_total", "vllm:prompt_tokens":
		return mPromptTokens
	case "vllm:generation_tokens_total", "vllm:generation_tokens":
		return mGenTokens
	case "vllm:request_success_total", "vllm:request_success":
		return mSuccess
	case "vllm:cache_config_info":
		return mCacheConfig
	case "sim_gpu_utilization_ratio":
		return mSimUtil
	case "sim_gpu_busy_seconds_total":
		return mSimBusy
	case "sim_gpu_energy_joules_total":
		return mSimEnergy
	case "sim_aborted_requests_total":
		return mSimAborted
	case "vllm:e2e_request_latency_seconds_sum":
		return mE2ESum
	case "vllm:e2e_request_latency_seconds_count":
		return mE2ECount
	}
	return mNone
}

func splitName(line []byte) (name, rest []byte) {
	for i, c := range line {
		if c == '{' || c == ' ' || c == '\t' {
			return line[:i], line[i:]
		}
	}
	return line, nil
}

// parseLabels parses an optional {a="b",…} block. Label values keep their
// escapes (\\, \", \n); the labels Sluice compares never contain them.
func parseLabels(b []byte, ls []label) ([]label, []byte, bool) {
	if len(b) == 0 || b[0] != '{' {
		return ls, b, true
	}
	i := 1
	for {
		for i < len(b) && (b[i] == ' ' || b[i] == ',') {
			i++
		}
		if i >= len(b) {
			return nil, nil, false
		}
		if b[i] == '}' {
			return ls, b[i+1:], true
		}
		ns := i
		for i < len(b) && b[i] != '=' && b[i] != '}' && b[i] != ',' {
			i++
		}
		if i >= len(b) || b[i] != '=' {
			return nil, nil, false
		}
		name := bytes.TrimSpace(b[ns:i])
		i++
		for i < len(b) && b[i] == ' ' {
			i++
		}
		if i >= len(b) || b[i] != '"' {
			return nil, nil, false
		}
		i++
		vs := i
		for i < len(b) && b[i] != '"' {
			if b[i] == '\\' {
				i++
			}
			i++
		}
		if i >= len(b) {
			return nil, nil, false
		}
		if len(ls) < cap(ls) {
			ls = append(ls, label{name: name, value: b[vs:i]})
		}
		i++
	}
}

func labelValue(ls []label, name string) ([]byte, bool) {
	for _, l := range ls {
		if string(l.name) == name {
			return l.value, true
		}
	}
	return nil, false
}

func parseSampleValue(b []byte) (float64, bool) {
	b = bytes.TrimLeft(b, " \t")
	if i := bytes.IndexAny(b, " \t"); i >= 0 {
		b = b[:i] // drop the timestamp
	}
	b = bytes.TrimRight(b, "\r")
	if len(b) == 0 {
		return 0, false
	}
	v, err := strconv.ParseFloat(string(b), 64)
	if err != nil || v != v { // NaN is unknown
		return 0, false
	}
	return v, true
}
