package sim_test

import (
	"context"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"

	"github.com/sluicehq/sluice/vllm/sim"
)

// A replica on a loopback port, one request, and its counters.
func ExampleReplica_Serve() {
	r, _ := sim.New(sim.DefaultConfig())
	ln, _ := net.Listen("tcp", "127.0.0.1:0")
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- r.Serve(ctx, ln) }()

	resp, err := http.Post("http://"+ln.Addr().String()+"/v1/completions", "application/json",
		strings.NewReader(`{"model":"sim-model","prompt":"hello","max_tokens":5,"ignore_eos":true}`))
	if err != nil {
		cancel()
		fmt.Println(err)
		return
	}
	_, _ = io.Copy(io.Discard, resp.Body)
	resp.Body.Close()

	st := r.Stats()
	fmt.Println(resp.StatusCode, st.Received, st.GenerationTokens)
	cancel()
	fmt.Println(<-done)
	// Output:
	// 200 1 5
	// <nil>
}
