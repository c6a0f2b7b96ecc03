package queue_test

import (
	"errors"
	"fmt"

	"github.com/sluicehq/sluice/queue"
)

// Example shows the scheduler's side: enqueue at admission, a dispatch
// predicate enforcing a per-tenant in-flight cap, and completion.
func Example() {
	q, err := queue.New(queue.Config{
		Tenants: []queue.TenantConfig{
			{Name: "acme", Weight: 2, MaxDepth: 2},
			{Name: "beta"},
		},
	}, queue.Deps[string]{
		// Called with the queue's mutex held: hand off only (e.g. a
		// non-blocking send to the request's waiter, which answers 504).
		OnExpire: func(queue.Item[string]) {},
	})
	if err != nil {
		fmt.Println(err)
		return
	}
	for _, r := range []struct{ tenant, id string }{
		{"acme", "a1"}, {"acme", "a2"}, {"acme", "a3"}, {"beta", "b1"}, {"beta", "b2"},
	} {
		_, err := q.Enqueue(queue.Request[string]{Tenant: r.tenant, Cost: 100, BodyBytes: 512, Payload: r.id})
		var full *queue.FullError
		if errors.As(err, &full) {
			fmt.Printf("%s refused: %s, retry after %v\n", r.id, full.Bound, full.RetryAfter)
		}
	}

	inflight := map[string]int{}
	atCap := func(it queue.Item[string]) queue.Verdict {
		if inflight[it.Tenant] >= 1 {
			return queue.Park // keeps its place; rejoins on Unpark
		}
		return queue.Dispatch // or queue.Block when no replica has room
	}
	drain := func() {
		for {
			it, ok := q.Next(atCap)
			if !ok {
				return // the real loop now waits on q.Ready() or freed room
			}
			inflight[it.Tenant]++
			q.Release(it.Handle) // the slot was taken; otherwise q.Requeue(it.Handle)
			fmt.Println("dispatch", it.Payload)
		}
	}
	drain()

	// a1 completes having used 60 of its predicted 100.
	inflight["acme"]--
	q.Reconcile("acme", 0, 100, 60)
	q.Unpark("acme")
	drain()
	// Output:
	// a3 refused: tenant_depth, retry after 1s
	// dispatch a1
	// dispatch b1
	// dispatch a2
}
