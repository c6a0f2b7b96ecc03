// Command loadloop is the load generator of scripts/bench.sh and
// scripts/edgecpu.sh (stdlib net/http only): -n requests with -c workers on
// kept-alive connections, to one base URL or several in turn; it prints
// "ok fail p50_us p99_us rps chunks" (chunks: SSE data events counted with
// -stream, else 0). LOADLOOP_KEY is sent as the bearer key.
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
	flag.Parse()
	urls := strings.Split(*url, ",")
	key := os.Getenv("LOADLOOP_KEY")
	cl := &http.Client{Transport: &http.Transport{MaxIdleConnsPerHost: *c, DisableCompression: true}}
	lat := make([]time.Duration, *n)
	var next, fail, chunks atomic.Int64
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
						chunks.Add(k)
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
					fail.Add(1)
					lat[i] = -1
				}
			}
		}()
	}
	wg.Wait()
	el := time.Since(start)
	ok := slices.DeleteFunc(lat, func(d time.Duration) bool { return d < 0 })
	slices.Sort(ok)
	pct := func(p float64) float64 {
		if len(ok) == 0 {
			return 0
		}
		i := min(max(int(p*float64(len(ok))+0.999999)-1, 0), len(ok)-1)
		return float64(ok[i].Microseconds())
	}
	fmt.Printf("%d %d %.0f %.0f %.1f %d\n", len(ok), fail.Load(), pct(0.50), pct(0.99), float64(len(ok))/el.Seconds(), chunks.Load())
}
