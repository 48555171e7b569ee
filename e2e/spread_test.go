package e2e

import (
	"context"
	"fmt"
	"strconv"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/redis/go-redis/v9"
)

// TestSpread: a herd of distinct prompts, the traffic the proxy exists for, each sent at
// once to all three instances, against a Redis whose maxclients is far below one
// connection per waiting key. Followers wait on one pub/sub connection per instance, not
// a blocked connection per key: every prompt costs exactly one upstream call, every
// client gets its own prompt's answer, and Redis never holds more than a bounded number of
// clients nor refuses one.
func TestSpread(t *testing.T) {
	const (
		prompts    = 1500
		maxClients = 128 // three instances: a pool and one pub/sub connection each, and the test's own
	)
	// A lease of 6 s, renewed every 2 s, and a Redis deadline of 5 s, not the suite's short
	// ones: thousands of requests at once on two cores shared with other test packages
	// delay a renewal by seconds, and a PING past half a second degrades an instance (ADR
	// 0056). This test is about connections, not takeovers or hangs.
	c := startCluster(t, clusterOpts{
		redisArgs: []string{"--maxclients", strconv.Itoa(maxClients)},
		env: map[string]string{"LLM_DEDUPE_FLIGHT_LEASE_TTL": "6s", "LLM_DEDUPE_FLIGHT_HEARTBEAT_INTERVAL": "2s",
			"LLM_DEDUPE_REDIS_READ_TIMEOUT": "5s"},
	})
	c.fake.set(fakeupstream.Behavior{Hold: true})
	model := "e2e-spread"
	rdb := c.redis.Client()
	ctx := context.Background()

	// Redis's client count, sampled until the test ends: the most it reached.
	var (
		mu      sync.Mutex
		peak    int
		stop    = make(chan struct{})
		sampled = make(chan struct{})
	)
	go func() {
		defer close(sampled)
		for {
			if n, err := clientsOf(ctx, rdb); err == nil {
				mu.Lock()
				peak = max(peak, n)
				mu.Unlock()
			}
			select {
			case <-stop:
				return
			case <-time.After(20 * time.Millisecond): // a sample rate, not a wait for an event
			}
		}
	}()

	chs := make([][]<-chan answer, prompts)
	for p := range chs {
		body := chatBody(model, fmt.Sprintf("spread prompt %d", p))
		for _, in := range c.ins {
			chs[p] = append(chs[p], postAsync(in.URL, chatPath, body, apiKeyA))
		}
	}
	start := time.Now()
	waitWaiting(t, c.ins, prompts*len(c.ins))
	waited := time.Since(start)
	c.fake.release()
	released := time.Now()

	calls := map[int64]int{}
	for p, per := range chs {
		var first int64
		for i, a := range collect(per) {
			n := wantChat(t, fmt.Sprintf("prompt %d on instance %d", p, i), a, model, 0)
			if i == 0 {
				first = n
			} else if n != first {
				t.Errorf("prompt %d: instance %d got the answer of call %d, instance 0 of call %d: one prompt, two calls", p, i, n, first)
			}
		}
		calls[first]++
	}
	answered := time.Since(released)
	close(stop)
	<-sampled
	s := c.fake.stats()
	info, _ := rdb.Info(ctx, "stats").Result()
	rejected := infoField(info, "rejected_connections")
	t.Logf("SPREAD prompts=%d requests=%d upstream_calls=%d all_waiting_after=%v release_to_last_answer=%v redis_clients_peak=%d maxclients=%d rejected_connections=%s",
		prompts, prompts*len(c.ins), s.Calls, waited.Round(time.Millisecond), answered.Round(time.Millisecond), peak, maxClients, rejected)
	if s.Calls != prompts || len(calls) != prompts {
		t.Errorf("%d upstream calls for %d prompts (%d distinct answers); want one call per prompt", s.Calls, prompts, len(calls))
	}
	if rejected != "0" {
		t.Errorf("Redis refused %s connections (maxclients %d)", rejected, maxClients)
	}
	if bound := 3 * 32; peak > bound {
		t.Errorf("Redis held %d clients at most; want at most %d for three instances", peak, bound)
	}
}

// clientsOf is Redis's count of connected clients.
func clientsOf(ctx context.Context, rdb *redis.Client) (int, error) {
	s, err := rdb.Info(ctx, "clients").Result()
	if err != nil {
		return 0, err
	}
	return strconv.Atoi(infoField(s, "connected_clients"))
}

// infoField is one field of an INFO reply.
func infoField(info, name string) string {
	for _, line := range strings.Split(info, "\n") {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return v
		}
	}
	return ""
}
