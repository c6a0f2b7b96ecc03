// Command loadloop is the load generator of scripts/bench.sh and
// scripts/edgecpu.sh (stdlib net/http only): -n requests with -c workers on
// kept-alive connections, to one base URL or several in turn; it prints
// "ok fail p50_us p99_us rps chunks" (chunks: SSE data events counted with
// -stream, else 0). With -names (one name per URL) it prints that line for
// each distinct name, prefixed with the name: targets interleaved request
// by request, so that every target meets the same host. With -rate the
// load is open: request i starts at i/rate seconds (a worker free by then
// permitting), so every target gets the same offered load whatever its
// latency (a closed loop through a slower proxy keeps fewer requests inside
// the replica, which then batches fewer per decode step). LOADLOOP_KEY is
// sent as the bearer key.
package main

import (
	"bufio"
	"bytes"
	"flag"
	"fmt"
	"io"
	"net/http"
	"os"
	"slices"
	"strings"
	"sync"
	"sync/atomic"
	"time"
)

func main() {
	url := flag.String("url", "", "target base URL; several, comma-separated, are used in turn")
	n := flag.Int("n", 1000, "requests")
	c := flag.Int("c", 1, "workers")
	body := flag.String("body", "", "JSON body")
	stream := flag.Bool("stream", false, "count SSE data events")
	names := flag.String("names", "", "one name per URL: a line per name")
	rate := flag.Float64("rate", 0, "requests per second, open loop (0: closed loop, each worker back to back)")
	flag.Parse()
	urls := strings.Split(*url, ",")
	name := make([]string, len(urls))
	if *names != "" {
		name = strings.Split(*names, ",")
		if len(name) != len(urls) {
			fmt.Fprintln(os.Stderr, "loadloop: -names needs one name per URL")
			os.Exit(2)
		}
	}
	key := os.Getenv("LOADLOOP_KEY")
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *c, DisableCompression: true}}
	lat := make([]time.Duration, *n)
	fail := make([]atomic.Int64, len(urls))
	chunks := make([]atomic.Int64, len(urls))
	var next atomic.Int64
	var wg sync.WaitGroup
	start := time.Now()
	for range *c {
		wg.Add(1)
		go func() {
			defer wg.Done()
			for {
				i := next.Add(1) - 1
				if i >= int64(*n) {
					return
				}
				if *rate > 0 {
					time.Sleep(time.Until(start.Add(time.Duration(float64(i) / *rate * float64(time.Second)))))
				}
				req, _ := http.NewRequest("POST", urls[i%int64(len(urls))]+"/v1/completions", bytes.NewReader([]byte(*body)))
				req.Header.Set("Content-Type", "application/json")
				if key != "" {
					req.Header.Set("Authorization", "Bearer "+key)
				}
				t := time.Now()
				resp, err := cl.Do(req)
				if err == nil {
					if *stream {
						sc := bufio.NewScanner(resp.Body)
						k := int64(0)
						for sc.Scan() {
							if bytes.HasPrefix(sc.Bytes(), []byte("data: ")) {
								k++
							}
						}
						err = sc.Err()
						chunks[i%int64(len(urls))].Add(k)
					} else {
						_, err = io.Copy(io.Discard, resp.Body)
					}
					resp.Body.Close()
					if err == nil && resp.StatusCode != 200 {
						err = fmt.Errorf("status %d", resp.StatusCode)
					}
				}
				lat[i] = time.Since(t)
				if err != nil {
					fail[i%int64(len(urls))].Add(1)
					lat[i] = -1
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	var seen []string
	for _, nm := range name {
		if !slices.Contains(seen, nm) {
			seen = append(seen, nm)
		}
	}
	for _, nm := range seen {
		var ok []time.Duration
		var failed, chunked int64
		for u := range urls {
			if name[u] != nm {
				continue
			}
			failed += fail[u].Load()
			chunked += chunks[u].Load()
			for i := u; i < *n; i += len(urls) {
				if lat[i] >= 0 {
					ok = append(ok, lat[i])
				}
			}
		}
		slices.Sort(ok)
		pct := func(p float64) float64 {
			if len(ok) == 0 {
				return 0
			}
			i := min(max(int(p*float64(len(ok))+0.999999)-1, 0), len(ok)-1)
			return float64(ok[i].Microseconds())
		}
		if nm != "" {
			fmt.Print(nm, " ")
		}
		fmt.Printf("%d %d %.0f %.0f %.1f %d\n", len(ok), failed, pct(0.50), pct(0.99), float64(len(ok))/el.Seconds(), chunked)
	}
}
