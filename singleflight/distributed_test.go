package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// Stored results are kept in the process too: a repeat costs no Redis command, and hits go
// on while Redis is down.
func TestLocalFirstLevelHits(t *testing.T) {
	srv := redistest.Start(t)
	cnt := &cmdCounter{}
	rdb := srv.Client()
	rdb.AddHook(cnt)
	g := New(Options{Redis: rdb, ResultTTL: time.Minute})
	t.Cleanup(func() { g.Close(context.Background()) })
	other := backend{redis: srv}.group(t, Options{ResultTTL: time.Minute})
	key := uniqueKey()
	rp := newReply("stored")
	rp.release()
	doAll(t, other, key, 1, rp.fn)()         // stored in Redis by another instance
	first := doAll(t, g, key, 1, rp.fn)()[0] // a hit from Redis
	before := cnt.n.Load()
	again := doAll(t, g, key, 1, rp.fn)()[0] // a hit from this process
	if first.role != RoleHit || again.role != RoleHit || again.body != "stored" || cnt.n.Load() != before {
		t.Fatalf("roles %v, %v; %d Redis commands for the repeat; want hits and 0 commands", first.role, again.role, cnt.n.Load()-before)
	}
	srv.Stop()
	if down := doAll(t, g, key, 1, rp.fn)()[0]; down.role != RoleHit || down.body != "stored" || rp.calls.Load() != 1 {
		t.Fatalf("with Redis down: (%v, %q), %d calls; want the stored answer as a hit", down.role, down.body, rp.calls.Load())
	}
}
