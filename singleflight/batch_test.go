package singleflight

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// tripCounter counts the round trips that carry a script: alone, or in a pipeline.
type tripCounter struct {
	hash         string
	trips, calls atomic.Int64
}

func (c *tripCounter) carries(cmd redis.Cmder) bool {
	a := cmd.Args()
	return len(a) > 1 && a[0] == "evalsha" && a[1] == c.hash
}
func (c *tripCounter) DialHook(next redis.DialHook) redis.DialHook { return next }
func (c *tripCounter) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if c.carries(cmd) {
			c.trips.Add(1)
			c.calls.Add(1)
		}
		return next(ctx, cmd)
	}
}
func (c *tripCounter) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		n := 0
		for _, cmd := range cmds {
			if c.carries(cmd) {
				n++
			}
		}
		if n > 0 {
			c.trips.Add(1)
			c.calls.Add(int64(n))
		}
		return next(ctx, cmds)
	}
}

// TestCompletesAtOnceShareRoundTrips: answers completed at the same moment go to Redis in
// shared pipelines, and each flight still gets its own answer, stored.
func TestCompletesAtOnceShareRoundTrips(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	tc := &tripCounter{hash: completeScript.Hash()}
	rdb.AddHook(tc)
	owner := New(Options{Redis: rdb, ResultTTL: time.Minute})
	t.Cleanup(func() { owner.Close(context.Background()) })
	const n = 200
	gate := make(chan struct{})
	keys := make([]string, n)
	var readers []*Reader
	for i := range keys {
		keys[i] = uniqueKey()
		body := fmt.Sprintf(`{"n":%d}`, i)
		r, err := owner.Do(keys[i], false, func(ctx context.Context, w *Writer) (Result, error) {
			<-gate
			return Result{Head: Head{Status: 200}, Body: []byte(body)}, nil
		})
		if err != nil {
			t.Fatal(err)
		}
		readers = append(readers, r)
	}
	waitCond(t, 10*time.Second, "owners running", func() bool { return owner.Owned() == n })
	tc.trips.Store(0)
	tc.calls.Store(0)
	close(gate)
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	for i, r := range readers {
		if o := readAll(ctx, r); o.err != nil || o.body != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("flight %d: %+v", i, o)
		}
	}
	if c := tc.calls.Load(); c != n {
		t.Fatalf("%d completes sent; want %d", c, n)
	}
	if trips := tc.trips.Load(); trips > n/2 {
		t.Fatalf("%d completes took %d round trips; want them shared", n, trips)
	}
	other := New(Options{Redis: srv.Client(), ResultTTL: time.Minute})
	t.Cleanup(func() { other.Close(context.Background()) })
	for i, k := range keys {
		if o := doAll(t, other, k, 1, instant)()[0]; o.role != RoleHit || o.body != fmt.Sprintf(`{"n":%d}`, i) {
			t.Fatalf("stored answer %d: %+v", i, o)
		}
	}
}
