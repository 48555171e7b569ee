package singleflight

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// BenchmarkManyFollowedKeys: one Group owns N flights of distinct keys, held; another
// follows each of them. Reports the Redis commands the follower sends per second over its
// first minute of waiting, the connections it holds, and the time from release to its last answer.
func BenchmarkManyFollowedKeys(b *testing.B) {
	const n = 10000
	srv := redistest.Start(b)
	for b.Loop() {
		owner := New(Options{Redis: srv.Client(), ResultTTL: time.Minute})
		fc := srv.Client()
		cnt := &cmdCounter{}
		fc.AddHook(cnt)
		rec := newRecorder()
		follower := New(Options{Redis: fc, ResultTTL: time.Minute, Observer: rec})
		gate := make(chan struct{})
		keys := make([]string, n)
		var owners []*Reader
		for i := range keys {
			keys[i] = uniqueKey()
			r, _ := owner.Do(keys[i], false, func(ctx context.Context, w *Writer) (Result, error) {
				<-gate
				return Result{Head: Head{Status: 200}, Body: []byte(`{"ok":true}`)}, nil
			})
			owners = append(owners, r)
		}
		var readers []*Reader
		for _, k := range keys {
			r, _ := follower.Do(k, false, instant)
			readers = append(readers, r)
		}
		rec.waitFor(b, EventRole, n, time.Minute)
		time.Sleep(500 * time.Millisecond) // subscriptions settle
		c0 := cnt.n.Load()
		// A minute: looks come as a follow's age doubles, ten leases apart at most (ADR 0082).
		time.Sleep(time.Minute)
		perSec := float64(cnt.n.Load()-c0) / 60
		before, _ := srv.Client().Info(context.Background(), "commandstats").Result()
		start := time.Now()
		close(gate)
		var wg sync.WaitGroup
		var ownersDone time.Duration
		wg.Go(func() {
			var ow sync.WaitGroup
			for _, r := range owners {
				ow.Go(func() { drain(b, r) })
			}
			ow.Wait()
			ownersDone = time.Since(start)
		})
		for _, r := range readers {
			wg.Go(func() { drain(b, r) })
		}
		wg.Wait()
		b.ReportMetric(float64(ownersDone.Milliseconds()), "ms-release-to-owners")
		after, _ := srv.Client().Info(context.Background(), "commandstats").Result()
		b.Logf("before:\n%s\nafter:\n%s", before, after)
		b.ReportMetric(perSec, "cmds/s-waiting")
		b.ReportMetric(float64(rec.count(EventTakeover)), "takeovers")
		b.ReportMetric(float64(time.Since(start).Milliseconds()), "ms-release-to-last")
		follower.Close(context.Background())
		owner.Close(context.Background())
	}
}
