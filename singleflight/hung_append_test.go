package singleflight

import (
	"context"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/faultproxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestOwnerSendsNoAppendToAShardFoundHanging: an owner streams while its shard hangs.
// Once a PING confirmed the hang, its appends are not sent: each would hold a connection
// for a Redis timeout, and the one sent as the call ends held the owner's own callers
// that long before the end of their stream. Its callers get the end at once, and what the
// appends carried lands with the final write once Redis answers (ADRs 0056, 0060, 0081).
func TestOwnerSendsNoAppendToAShardFoundHanging(t *testing.T) {
	srv := redistest.Start(t)
	o := Options{LeaseTTL: 3 * time.Second, HeartbeatInterval: time.Second, RedisTimeout: 2 * time.Second,
		ResultTTL: time.Minute, BatchDelay: time.Millisecond}
	a, link, confirmed := behindLink(t, srv, o)
	appends := &cmdCounter{match: scriptCalls(appendScript)}
	a.opts.Redis.AddHook(appends)
	key := uniqueKey()
	write, end := make(chan struct{}), make(chan struct{})
	writeNow, endNow := sync.OnceFunc(func() { close(write) }), sync.OnceFunc(func() { close(end) })
	t.Cleanup(func() { writeNow(); endNow() }) // before a is closed, whatever failed
	writers := make(chan *Writer, 1)
	var calls int
	r, err := a.Do(key, false, func(ctx context.Context, w *Writer) (Result, error) {
		calls++
		writers <- w
		w.WriteHead(Head{Status: 200})
		w.Write([]byte("a"))
		<-write
		w.Write([]byte("b"))
		<-end
		return Result{Outcome: Store}, nil
	})
	if err != nil {
		t.Fatal(err)
	}
	sr := readStream(context.Background(), r)
	<-sr.first
	w := <-writers
	waitCond(t, 5*time.Second, "the first batch appended, as the owner knows", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.n == 1
	})

	link.Set(faultproxy.Fault{Mode: faultproxy.Hang})
	t.Cleanup(func() { link.Set(faultproxy.Fault{}) })
	findsHanging(t, a, key, confirmed)
	sent := appends.calls.Load()
	writeNow()
	waitCond(t, 5*time.Second, "the second batch taken to be appended", func() bool {
		w.mu.Lock()
		defer w.mu.Unlock()
		return w.inflight != nil && w.inflight.n == 2
	})
	ended := time.Now()
	endNow()
	select {
	case out := <-sr.done:
		if out.err != nil || out.body != "ab" {
			t.Fatalf("the owner's caller got (%q, %v); want the whole stream", out.body, out.err)
		}
	case <-time.After(3 * o.RedisTimeout):
		t.Fatal("the owner's caller got no end of its stream")
	}
	took := time.Since(ended)
	t.Logf("the owner's caller got the end of its stream %v after the call ended", took)
	if took >= o.RedisTimeout/4 {
		t.Errorf("the owner's caller got the end of its stream %v after the call ended; want at once (a Redis timeout is %v)", took, o.RedisTimeout)
	}
	if n := appends.calls.Load() - sent; n > 0 {
		t.Errorf("%d appends sent to the shard found hanging; want none", n)
	}

	link.Set(faultproxy.Fault{})
	waitCond(t, 10*time.Second, "the answer stored once Redis answers", func() bool {
		return srv.Client().HGet(context.Background(), "ai:flight:result:{"+key+"}", "body").Val() == "ab"
	})
	if calls != 1 {
		t.Fatalf("%d upstream calls; want 1", calls)
	}
}
