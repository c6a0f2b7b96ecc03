package vllm

import (
	"bufio"
	"bytes"
	"encoding/json"
	"os"
	"path/filepath"
	"syscall"
	"testing"

	"github.com/stretchr/testify/assert"
	"github.com/stretchr/testify/require"
)

// checkFastMatchesJSON asserts that when decodeChunkFast accepts data, its
// result equals json.Unmarshal's, and that it never accepts what
// json.Unmarshal rejects. It returns whether the fast path accepted.
func checkFastMatchesJSON(t testing.TB, data []byte) bool {
	t.Helper()
	var fast, slow asmChunk
	ok := decodeChunkFast(data, &fast, &asmArena{})
	err := json.Unmarshal(data, &slow)
	if !ok {
		return false
	}
	if err != nil {
		t.Fatalf("fast path accepted %q, encoding/json: %v", data, err)
	}
	if !assert.Equal(t, slow, fast, "%s", data) {
		t.FailNow()
	}
	return true
}

func TestDecodeChunkFastMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	t.Run("testdata chunks take the fast path", func(t *testing.T) {
		t.Parallel()
		files, err := filepath.Glob("testdata/*.sse")
		require.NoError(t, err)
		require.NotEmpty(t, files)
		n := 0
		for _, f := range files {
			b, err := os.ReadFile(f)
			require.NoError(t, err)
			sc := bufio.NewScanner(bytes.NewReader(b))
			sc.Buffer(nil, 1<<20)
			for sc.Scan() {
				d, found := bytes.CutPrefix(sc.Bytes(), []byte("data: "))
				if !found || string(d) == "[DONE]" {
					continue
				}
				assert.True(t, checkFastMatchesJSON(t, d), "fell back on %s", d)
				n++
			}
		}
		assert.Positive(t, n)
	})
	tests := []struct {
		name string
		data string
		fast bool
	}{
		{"plain chat chunk", `{"id":"c","object":"chat.completion.chunk","created":1,"model":"m","choices":[{"index":0,"delta":{"content":"a\nb\"c"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}`, true},
		{"final usage", `{"id":"c","choices":[],"usage":{"prompt_tokens":3,"completion_tokens":1,"prompt_tokens_details":{"cached_tokens":2}}}`, true},
		{"nulls everywhere", `{"id":null,"created":null,"model":null,"choices":[{"index":null,"delta":null,"text":null,"stop_reason":null}],"usage":null}`, true},
		{"tool calls", `{"choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"id":"t","type":"function","function":{"name":"f","arguments":"{\"a\":1}"}}]}}]}`, true},
		{"unknown keys ignored", `{"object":"x","system_fingerprint":null,"choices":[{"index":0,"text":"é","logprobs":{"tokens":["a"]},"extra":[1,2.5e3,true]}]}`, true},
		{"surrounding space", " \t{ \"id\" : \"x\" } \n", true},
		{"escaped key", `{"i\u0064":"x"}`, false},
		{"case-insensitive key", `{"ID":"x"}`, false},
		{"duplicate key", `{"id":"x","id":"y"}`, false},
		{"unicode escape", `{"choices":[{"index":0,"text":"\u00e9"}]}`, false},
		{"invalid utf-8", "{\"choices\":[{\"index\":0,\"text\":\"\xff\"}]}", false},
		{"float index", `{"choices":[{"index":1.0}]}`, false},
		{"exponent created", `{"created":1e3}`, false},
		{"huge created", `{"created":99999999999999999999}`, false},
		{"string created", `{"created":"1"}`, false},
		{"object content", `{"choices":[{"delta":{"content":{}}}]}`, false},
		{"null choice", `{"choices":[null]}`, false},
		{"array top level", `[1]`, false},
		{"null top level", `null`, false},
		{"invalid literal in ignored member", `{"x":tru,"id":"a"}`, false},
		{"leading zero", `{"x":01}`, false},
		{"raw control char", "{\"id\":\"a\x01\"}", false},
		{"trailing garbage", `{"id":"a"}x`, false},
		{"truncated", `{"id":"a"`, false},
		{"non-ascii key", `{"ſ":1}`, false},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			t.Parallel()
			assert.Equal(t, tt.fast, checkFastMatchesJSON(t, []byte(tt.data)))
		})
	}
}

func TestValidJSONMatchesEncodingJSON(t *testing.T) {
	t.Parallel()
	for _, s := range []string{
		``, ` `, `0`, `-0`, `-`, `01`, `1.`, `1.5`, `1e`, `1e+`, `1E-7`, `.5`, `"a`, `"\x"`, `"\u12"`, `"\u12G4"`, `"\u1234"`,
		`"\/"`, `tru`, `true`, `nul`, `null `, `falsey`, `[]`, `[,]`, `[1,]`, `[1 2]`, `{}`, `{"a"}`, `{"a":}`, `{"a":1,}`,
		`{a:1}`, `{"a":1}{}`, "\"\t\"", `[[[[[]]]]]`, `{"a":[{"b":null}]}`, "\xff", `"` + "\xff" + `"`,
	} {
		assert.Equal(t, json.Valid([]byte(s)), validJSON([]byte(s)), "%q", s)
	}
}

func FuzzDecodeChunkFast(f *testing.F) {
	for _, s := range []string{
		`{"id":"c","created":1,"model":"m","choices":[{"index":0,"delta":{"role":"assistant","content":"hi"},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":3,"total_tokens":4,"completion_tokens":1}}`,
		`{"choices":[{"index":1,"delta":{"tool_calls":[{"index":0,"id":"t","function":{"arguments":"{}"}}]}}]}`,
		`{"choices":[],"usage":{"prompt_tokens":1,"prompt_tokens_details":null}}`,
		`{"choices":[{"index":0,"text":"x","logprobs":{"tokens":["x"]},"stop_reason":"s"}]}`,
	} {
		f.Add([]byte(s))
	}
	f.Fuzz(func(t *testing.T, in []byte) {
		if validJSON(in) != json.Valid(in) && len(in) < 4096 {
			// validJSON may only give up on deep nesting.
			if validJSON(in) {
				t.Fatalf("validJSON accepted invalid %q", in)
			}
		}
		checkFastMatchesJSON(t, in)
	})
}

// BenchmarkDecodeChunk is the fast path's cost per chunk: a content delta
// (the common chunk) and a tool call's first chunk (every nested decoder).
// cpu-ns/op is the process's CPU time per chunk, which a busy shared host
// skews less than wall time (run it with -cpu 1).
func BenchmarkDecodeChunk(b *testing.B) {
	for _, bc := range []struct{ name, data string }{
		{"content", benchChunk[len("data: ") : len(benchChunk)-2]},
		{"toolcall", `{"id":"chatcmpl-t1","object":"chat.completion.chunk","created":1732000001,"model":"m","choices":[{"index":0,"delta":{"tool_calls":[{"id":"chatcmpl-tool-1","type":"function","index":0,"function":{"name":"get_weather","arguments":"{\"city\": "}}]},"logprobs":null,"finish_reason":null}],"usage":{"prompt_tokens":40,"total_tokens":45,"completion_tokens":5}}`},
	} {
		b.Run(bc.name, func(b *testing.B) {
			data := []byte(bc.data)
			if !checkFastMatchesJSON(b, data) {
				b.Fatal("not on the fast path")
			}
			var ar asmArena
			b.ReportAllocs()
			start := processCPU()
			for b.Loop() {
				var ch asmChunk
				if !decodeChunkFast(data, &ch, &ar) {
					b.Fatal("fell back")
				}
			}
			b.ReportMetric(float64(processCPU()-start)/float64(b.N), "cpu-ns/op")
		})
	}
}

// processCPU is the process's user and system CPU time so far, in ns.
func processCPU() int64 {
	var ru syscall.Rusage
	_ = syscall.Getrusage(syscall.RUSAGE_SELF, &ru)
	return ru.Utime.Nano() + ru.Stime.Nano()
}
