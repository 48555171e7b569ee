package clusterclient

import (
	"context"
	"fmt"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestANodeThatHangsHoldsUpNoNewClient: while one master of a Cluster hangs (paused:
// connections accepted, nothing answered), new clients, which have no layout yet, write
// and read keys of the other masters at once, whichever node each would have asked first.
func TestANodeThatHangsHoldsUpNoNewClient(t *testing.T) {
	c := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3, NodeTimeout: time.Minute})
	masters, err := c.Masters()
	if err != nil {
		t.Fatal(err)
	}
	x := masters[0]
	var keys []string
	for i := 0; len(keys) < 4; i++ {
		k := fmt.Sprintf("{k%d}", i)
		if m, err := c.MasterOf(k); err == nil && m != x {
			keys = append(keys, k)
		}
	}
	x.Pause()
	t.Cleanup(x.Resume)

	const clients = 8 // go-redis would ask x first for one in three
	const readTimeout = time.Second
	var wg sync.WaitGroup
	took := make(chan time.Duration, clients)
	for i := range clients {
		wg.Go(func() {
			rdb := New(&redis.ClusterOptions{Addrs: c.Addrs(), ReadTimeout: readTimeout, ContextTimeoutEnabled: true,
				MaxRetries: 2, DialerRetries: 1})
			defer rdb.Close()
			begun := time.Now()
			for _, tag := range keys {
				k := fmt.Sprintf("%s%d", tag, i) // its own key, in the tag's slot
				ctx, cancel := context.WithTimeout(context.Background(), readTimeout)
				err := rdb.Set(ctx, k, "v", time.Minute).Err()
				got, gerr := rdb.Get(ctx, k).Result()
				cancel()
				if err != nil || gerr != nil || got != "v" {
					t.Errorf("client %d, key %s: set %v, get (%q, %v)", i, k, err, got, gerr)
				}
			}
			took <- time.Since(begun)
		})
	}
	wg.Wait()
	close(took)
	for d := range took {
		if d >= readTimeout/2 {
			t.Errorf("a new client took %v for its first commands; want well within a read timeout (%v): no wait for the hung node", d, readTimeout)
		}
	}
}

// TestReachTakesTheOriginsHost: a loopback or zero-port address a node announces is the
// answering node's, as go-redis takes it, unless that node is reached on loopback too.
func TestReachTakesTheOriginsHost(t *testing.T) {
	for _, tc := range []struct{ addr, host, port, want string }{
		{"10.0.0.2:6379", "10.0.0.1", "6379", "10.0.0.2:6379"},
		{"127.0.0.1:7001", "redis.example", "7000", "redis.example:7001"},
		{"127.0.0.1:7001", "127.0.0.1", "7000", "127.0.0.1:7001"},
		{"10.0.0.2:0", "10.0.0.1", "6380", "10.0.0.2:6380"},
	} {
		if got := reach(tc.addr, tc.host, tc.port); got != tc.want {
			t.Errorf("reach(%s) through %s:%s = %s; want %s", tc.addr, tc.host, tc.port, got, tc.want)
		}
	}
}
