package singleflight

import (
	"context"
	"fmt"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestCompletesAtOnceShareRoundTrips: answers completed at the same moment go to Redis in
// shared pipelines, and each flight still gets its own answer, stored.
func TestCompletesAtOnceShareRoundTrips(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	tc := &cmdCounter{match: scriptRuns(completeScript)}
	rdb.AddHook(tc)
	owner := New(Options{Redis: rdb, ResultTTL: time.Minute})
	t.Cleanup(func() { owner.Close(context.Background()) })
	const n = 200
	gate := make(chan struct{})
	keys, readers := ownEach(t, owner, n, func(i int) Func {
		return func(ctx context.Context, w *Writer) (Result, error) {
			<-gate
			return Result{Head: Head{Status: 200}, Body: fmt.Appendf(nil, `{"n":%d}`, i)}, nil
		}
	})
	tc.n.Store(0)
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
	if trips := tc.n.Load(); trips > n/2 {
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
