package singleflight

import (
	"context"
	"strconv"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// BenchmarkClaimWait weighs WAIT after a claim: with a replica attached, an owner's claim
// (the lookup that claims a free key) alone, and pipelined with WAIT 1 so that it returns
// only once the replica has it and a failover cannot lose it. The difference is what every
// request nobody shares would pay. (docs/failover.md has the figures and the decision.)
func BenchmarkClaimWait(b *testing.B) {
	ctx := context.Background()
	master, replica := redistest.Start(b), redistest.Start(b)
	host, port, _ := strings.Cut(master.Addr, ":")
	if err := replica.Client().Do(ctx, "REPLICAOF", host, port).Err(); err != nil {
		b.Fatalf("REPLICAOF: %v", err)
	}
	rdb := master.Client()
	for deadline := time.Now().Add(10 * time.Second); ; {
		n, _ := rdb.Do(ctx, "WAIT", 1, 100).Int()
		if n == 1 {
			break
		}
		if time.Now().After(deadline) {
			b.Fatal("the replica did not attach within 10s")
		}
	}
	g := New(Options{Redis: rdb})
	defer g.Close(ctx)
	r := g.rem()
	for _, wait := range []bool{false, true} {
		b.Run("wait="+strconv.FormatBool(wait), func(b *testing.B) {
			for b.Loop() {
				key := uniqueKey()
				k := r.keys(key)
				args := []any{"0", r.newToken(ctx), "bench", 3000, 33000, 30000}
				if !wait {
					if err := lookupScript.Run(ctx, rdb, []string{k.meta, k.result, k.stream}, args...).Err(); err != nil {
						b.Fatal(err)
					}
					continue
				}
				var n *redis.Cmd
				if _, err := rdb.Pipelined(ctx, func(p redis.Pipeliner) error {
					lookupScript.Run(ctx, p, []string{k.meta, k.result, k.stream}, args...)
					n = p.Do(ctx, "WAIT", 1, 100)
					return nil
				}); err != nil {
					b.Fatal(err)
				}
				if v, _ := n.Int(); v != 1 {
					b.Fatalf("WAIT answered %d replicas; want 1", v)
				}
			}
		})
	}
}
