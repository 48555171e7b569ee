package singleflight

import (
	"context"
	"testing"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// rem is the Redis coordinator of a Group made with Options.Redis.
func (g *Group) rem() *remote { return g.coord.(*remote) }

func TestBackendNamesItsCoordinator(t *testing.T) {
	for _, b := range backends(t) {
		g := b.group(t, Options{})
		if got := g.Backend(); got != b.name {
			t.Errorf("Backend() = %q; want %q", got, b.name)
		}
		if err := g.Check(context.Background()); err != nil {
			t.Errorf("%s: Check() = %v; want nil", b.name, err)
		}
	}
}

// Check loads the protocol's scripts on every master it finds usable: the first flights
// then send them by SHA, not their text within a lease (ADR 0085).
func TestCheckLoadsTheScripts(t *testing.T) {
	ctx := context.Background()
	srv := redistest.Start(t)
	cl := redistest.StartCluster(t, redistest.ClusterOptions{Masters: 3})
	for _, tc := range []struct {
		name    string
		client  redis.UniversalClient
		servers func() []*redis.Client
	}{
		{"one server", srv.Client(), func() []*redis.Client { return []*redis.Client{srv.Client()} }},
		{"a Cluster", cl.Client(), func() []*redis.Client {
			masters, err := cl.Masters()
			if err != nil {
				t.Fatal(err)
			}
			var out []*redis.Client
			for _, m := range masters {
				out = append(out, m.Client())
			}
			return out
		}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			g := New(Options{Redis: tc.client})
			t.Cleanup(func() { g.Close(ctx) })
			if err := g.Check(ctx); err != nil {
				t.Fatal(err)
			}
			for _, c := range tc.servers() {
				for _, s := range protocolScripts {
					ok, err := c.ScriptExists(ctx, s.Hash()).Result()
					if err != nil || !ok[0] {
						t.Fatalf("%s: script %.8s loaded %v (%v); want every script on every master", c.Options().Addr, s.Hash(), ok, err)
					}
				}
			}
		})
	}
}
