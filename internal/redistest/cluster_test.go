package redistest

import (
	"context"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"
)

// TestCluster: a 3-master cluster with a replica each answers through a cluster client;
// killing the master of a key promotes its replica, which still has the key.
func TestCluster(t *testing.T) {
	c := StartCluster(t, ClusterOptions{Masters: 3, Replicas: 1, NodeTimeout: time.Second})
	if len(c.Nodes) != 6 {
		t.Fatalf("%d nodes; want 6", len(c.Nodes))
	}
	ms, err := c.Masters()
	if err != nil || len(ms) != 3 {
		t.Fatalf("masters %v, %v; want 3", ms, err)
	}
	ctx := context.Background()
	cl := c.Client()
	const key = "redistest:{k}"
	mc, err := cl.MasterForKey(ctx, key)
	if err != nil {
		t.Fatal(err)
	}
	m, err := c.MasterOf(key)
	if err != nil {
		t.Fatal(err)
	}
	// The write must have reached the replica before its master dies, or the promoted
	// replica may not have it (replication is asynchronous). WAIT counts the writes of its
	// own connection: both go to the key's master in one pipeline, on one connection.
	var wait *redis.Cmd
	if _, err := mc.Pipelined(ctx, func(p redis.Pipeliner) error {
		p.Set(ctx, key, "v", 0)
		wait = p.Do(ctx, "WAIT", 1, 2000)
		return nil
	}); err != nil {
		t.Fatal(err)
	}
	if n, err := wait.Int(); err != nil || n != 1 {
		t.Fatalf("WAIT 1: %d replicas, %v; want 1", n, err)
	}
	c.Kill(m)
	if m.Alive() {
		t.Fatal("killed master still running")
	}
	start := time.Now()
	promoted := c.WaitServed(key, 15*time.Second)
	if promoted == m {
		t.Fatalf("slot still served by the killed master %s", m.Addr)
	}
	t.Logf("failover of %s to %s in %v", m.Addr, promoted.Addr, time.Since(start).Round(time.Millisecond))
	// A new client: go-redis keeps a client's slot map until a MOVED reply or its reload
	// interval (a minute), and a dead master sends no MOVED.
	if v, err := c.Client().Get(ctx, key).Result(); err != nil || v != "v" {
		t.Errorf("GET after failover: %q, %v; want \"v\"", v, err)
	}
}
