package singleflight

import (
	"context"
	"strings"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// A Redis that answers PING but refuses every command the proxy sends is a configuration
// to fix, shown at start-up as degraded, and stays degraded: a read-only replica named as
// the server, a database index out of range, several addresses (a Cluster client) naming
// a server that is no Cluster. Before, Check and the probe asked with a PING: the first two
// cases were never reported (every request an owner, nothing stored, errors at debug
// level), and the replica made the instance degrade and recover on every request.
func TestRedisThatRefusesTheProxyStaysDegraded(t *testing.T) {
	master := redistest.Start(t)
	_, port, _ := strings.Cut(master.Addr, ":")
	replica := redistest.Start(t, redistest.Options{Args: []string{"--replicaof", "127.0.0.1", port}})
	cases := map[string]func() redis.UniversalClient{
		"read-only replica": func() redis.UniversalClient { return replica.Client() },
		"db out of range": func() redis.UniversalClient {
			return redis.NewClient(&redis.Options{Addr: master.Addr, DB: 99, MaxRetries: 1})
		},
		"cluster client, server no cluster": func() redis.UniversalClient {
			return redis.NewClusterClient(&redis.ClusterOptions{Addrs: []string{master.Addr, master.Addr}, MaxRetries: 1})
		},
	}
	for name, client := range cases {
		t.Run(name, func(t *testing.T) {
			rdb := client()
			probes := &cmdCounter{match: scriptCalls(usableScript)}
			rdb.AddHook(probes)
			rec := newRecorder()
			g := New(Options{Redis: rdb, Observer: rec})
			t.Cleanup(func() { g.Close(context.Background()); rdb.Close() })
			ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
			defer cancel()
			if err := g.Check(ctx); err == nil || !g.Degraded() {
				t.Fatalf("Check: %v, degraded %v; want an error and the Group degraded", err, g.Degraded())
			}
			// The probe asks again every 250 ms: three rounds, and still degraded.
			asked := probes.n.Load()
			waitCond(t, 5*time.Second, "three probes", func() bool { return probes.n.Load() >= asked+3 })
			if n := rec.count(EventRecovered); n != 0 || !g.Degraded() {
				t.Fatalf("%d recoveries, degraded %v; want none and degraded", n, g.Degraded())
			}
		})
	}
}
