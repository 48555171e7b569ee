package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// restore.lua puts a lost meta back for an owner whose last lease still runs, on the
// ground that "within its lease nobody else can have owned and finished the flight".
// That holds only while a finished flight's meta outlives the rest of that lease: a meta
// lost to a restart is claimed at once by the next caller (lookup on absent), which may
// complete before the old owner's next renewal, and its DONE meta lives only Linger.
// With Linger shorter than the lease (the configuration allows any linger ≥ 1ms), the old
// owner's renewal found nothing, restored its stale token, and its complete then
// overwrote the answer the new owner stored: a stale owner wrote. A finished meta now
// lives at least a lease.
func TestStaleOwnerDoesNotRestoreOverFinishedFlight(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{LeaseTTL: 3 * time.Second, HeartbeatInterval: time.Second, Linger: 200 * time.Millisecond, ResultTTL: time.Minute}
	a, c := b.group(t, o), b.group(t, o)
	key := uniqueKey()
	running, proceed := make(chan struct{}, 1), make(chan struct{})
	ra, _ := a.Do(key, false, started(running, func(ctx context.Context, w *Writer) (Result, error) {
		<-proceed
		return Result{Head: Head{Status: 200}, Body: []byte("from-a"), Outcome: Store}, nil
	}))
	<-running
	ctx := context.Background()
	rdb := srv.Client()
	if err := rdb.FlushAll(ctx).Err(); err != nil { // a restart without persistence
		t.Fatalf("FLUSHALL: %v", err)
	}
	rc, _ := c.Do(key, false, func(ctx context.Context, w *Writer) (Result, error) {
		return Result{Head: Head{Status: 200}, Body: []byte("from-c"), Outcome: Store}, nil
	})
	if got := readWithin(rc, 3*time.Second); got.body != "from-c" || got.role != RoleOwner {
		t.Fatalf("c got (%q, %v, %v); want to own the lost flight", got.body, got.role, got.err)
	}
	meta := "ai:flight:meta:{" + key + "}"
	time.Sleep(o.Linger + 100*time.Millisecond) // past c's linger; a's lease still runs
	if rdb.Exists(ctx, meta).Val() == 0 {
		t.Fatal("c's finished meta is gone while a's lease may still run: a could restore its token over it")
	}
	// a's next renewal comes within a heartbeat.
	time.Sleep(o.HeartbeatInterval + 200*time.Millisecond)
	close(proceed)
	if got := readWithin(ra, 3*time.Second); got.err != nil || (got.body != "from-a" && got.body != "from-c") {
		t.Fatalf("a's own caller got (%q, %v); want a whole answer to its request", got.body, got.err)
	}
	if body := rdb.HGet(ctx, "ai:flight:result:{"+key+"}", "body").Val(); body != "from-c" {
		t.Fatalf("stored answer is %q, written by a's token after c owned and finished the flight; want c's %q", body, "from-c")
	}
}
