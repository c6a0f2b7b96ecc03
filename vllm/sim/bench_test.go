package sim

import (
	"bufio"
	"bytes"
	"context"
	"net"
	"net/http"
	"strings"
	"sync"
	"syscall"
	"testing"
	"time"
)

func cpuTime() time.Duration {
	var ru syscall.Rusage
	if err := syscall.Getrusage(syscall.RUSAGE_SELF, &ru); err != nil {
		return 0
	}
	return time.Duration(ru.Utime.Nano() + ru.Stime.Nano())
}

// BenchmarkStream256 streams from one replica to 256 concurrent clients in
// the same process. One iteration: 256 streams of 200 tokens each.
// Reported: streamed chunks/s (a chunk may carry several tokens when a
// client falls behind, as in vLLM), the mean time per token of each stream
// against the configured step (step_ratio, 1 = exact), and process CPU per
// 1,000 chunks (clients and server together).
func BenchmarkStream256(b *testing.B) {
	const (
		streams = 256
		tokens  = 200
		step    = 8 * time.Millisecond
	)
	cfg := DefaultConfig()
	cfg.MaxNumSeqs = streams
	cfg.KVTokens = 1 << 20
	cfg.DecodeStep = step
	cfg.PrefillTPS = 1e9
	r, err := New(cfg)
	if err != nil {
		b.Fatal(err)
	}
	ln, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		b.Fatal(err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()
	defer func() {
		cancel()
		if err := <-done; err != nil {
			b.Error(err)
		}
	}()
	tr := &http.Transport{MaxIdleConnsPerHost: streams, MaxConnsPerHost: streams}
	defer tr.CloseIdleConnections()
	client := &http.Client{Transport: tr}
	url := "http://" + ln.Addr().String() + "/v1/completions"
	body := `{"model":"sim-model","prompt":"bench prompt","max_tokens":200,"ignore_eos":true,"stream":true}`

	var chunks, gapsN int64
	var gapSum time.Duration
	var wall, cpu, busy time.Duration
	b.ReportAllocs()
	for b.Loop() {
		var mu sync.Mutex
		var wg sync.WaitGroup
		start, cpu0, busy0 := time.Now(), cpuTime(), r.Stats().BusyTime
		for range streams {
			wg.Go(func() {
				resp, err := client.Post(url, "application/json", strings.NewReader(body))
				if err != nil {
					b.Error(err)
					return
				}
				defer resp.Body.Close()
				br := bufio.NewReaderSize(resp.Body, 4096)
				var n int64
				var first, last time.Time
				for {
					line, err := br.ReadSlice('\n')
					if err != nil {
						break
					}
					if !bytes.HasPrefix(line, []byte("data: {")) {
						continue
					}
					now := time.Now()
					if n == 0 {
						first = now
					}
					last = now
					n++
				}
				mu.Lock()
				chunks += n
				if n > 1 {
					// ignore_eos: 200 tokens, one per step; merged chunks
					// do not change the span from token 0 to token 199.
					gapSum += last.Sub(first) / (tokens - 1)
					gapsN++
				}
				mu.Unlock()
			})
		}
		wg.Wait()
		wall += time.Since(start)
		cpu += cpuTime() - cpu0
		busy += r.Stats().BusyTime - busy0
	}
	if chunks == 0 || gapsN == 0 {
		b.Fatal("no chunks")
	}
	meanGap := gapSum / time.Duration(gapsN)
	b.ReportMetric(float64(chunks)/wall.Seconds(), "chunks/s")
	b.ReportMetric(float64(meanGap)/float64(step), "step_ratio")
	b.ReportMetric(float64(cpu.Milliseconds())/float64(chunks)*1000, "cpu_ms/1k_chunks")
	b.ReportMetric(float64(chunks)/float64(b.N), "chunks/op")
	b.ReportMetric(wall.Seconds()/busy.Seconds(), "wall/busy")
}

// BenchmarkTokenChunk measures encoding one streamed chunk with
// continuous usage.
func BenchmarkTokenChunk(b *testing.B) {
	enc := newChunkEncoder(kindChat, "0123456789abcdef", 1700000000, "sim-model")
	b.ReportAllocs()
	i := 0
	for b.Loop() {
		enc.buf = enc.buf[:0]
		enc.tokenChunk(0, 42, i, i+1, "", true, 100)
		i++
	}
}
