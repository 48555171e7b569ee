package singleflight

import (
	"context"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// Edge cases of the cut of a call nobody waits for (ADR 0074), each a way it went wrong.

// A cut ends its own attempt: the ending of the flight before it, which its late followers
// may still be reading, stays in the stream for linger.
func TestCutKeepsTheEndingOfTheFlightBefore(t *testing.T) {
	srv := redistest.Start(t)
	g := backend{name: "redis", redis: srv}.group(t, Options{AbandonGrace: 20 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond})
	key := uniqueKey()
	first := newReply("the first flight's answer")
	first.release()
	if got := readAll(context.Background(), mustDo(t, g, key, first.fn)); got.err != nil {
		t.Fatalf("first flight: %v", got.err)
	}
	c := newLongCall()
	r := firstChunk(t, g, key, c.fn) // ResultTTL 0: a new flight
	r.Close()
	c.waitCut(t)
	entries, err := srv.Client().XRange(context.Background(), g.coord.(*remote).keys(key).stream, "-", "+").Result()
	if err != nil {
		t.Fatal(err)
	}
	for _, e := range entries {
		if e.Values["t"] == "done" && e.Values["d"] == "the first flight's answer" {
			return
		}
	}
	t.Fatalf("the first flight's done entry is gone after the next one was cut: %v", entries)
}

// lostCut is a hook that loses the reply of the first renewal that cut (it landed, its
// answer did not arrive): the owner learns of the cut from what it sends next.
type lostCut struct {
	lost atomic.Bool
}

// renewing reports whether cmd sends renew.lua, by its SHA or whole.
func renewing(cmd redis.Cmder) bool {
	a := cmd.Args()
	return len(a) > 1 && (a[1] == renewScript.Hash() || a[1] == wakeSrc+restoreSrc+renewSrc)
}

func (h *lostCut) DialHook(next redis.DialHook) redis.DialHook { return next }

func (h *lostCut) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		return h.lose(cmd, next(ctx, cmd))
	}
}

func (h *lostCut) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		err := next(ctx, cmds)
		for _, c := range cmds {
			_ = h.lose(c, nil)
		}
		return err
	}
}

func (h *lostCut) lose(cmd redis.Cmder, err error) error {
	c, ok := cmd.(*redis.Cmd)
	if !ok || !renewing(c) {
		return err
	}
	if v, _ := c.Int64(); v == cutRenew && h.lost.CompareAndSwap(false, true) {
		c.SetErr(context.DeadlineExceeded)
		return context.DeadlineExceeded
	}
	return err
}

// A renewal that cut, whose reply was lost, is carried out by whatever learns of the cut
// next: here the streaming owner's next append.
func TestCutWhoseReplyIsLostIsCarriedOut(t *testing.T) {
	srv := redistest.Start(t)
	rdb := srv.Client()
	hook := &lostCut{}
	rdb.AddHook(hook)
	g := New(Options{Redis: rdb, AbandonGrace: 20 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond})
	t.Cleanup(func() {
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Second)
		defer cancel()
		_ = g.Close(ctx)
	})
	cut := make(chan error, 1)
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		w.WriteHead(Head{Status: 200})
		for {
			_, _ = w.Write([]byte("data: more\n\n"))
			select {
			case <-ctx.Done():
				cut <- context.Cause(ctx)
				return Result{}, context.Cause(ctx)
			case <-time.After(5 * time.Millisecond):
			}
		}
	}
	r := firstChunk(t, g, uniqueKey(), fn)
	r.Close()
	select {
	case err := <-cut:
		if !hook.lost.Load() {
			t.Fatalf("no cut's reply was lost: the test did not reach its case (the call ended with %v)", err)
		}
		if err != ErrAbandoned {
			t.Fatalf("the call ended with %v; want ErrAbandoned", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("the call was not cut (a cut's reply lost: %v)", hook.lost.Load())
	}
}

// A flight Redis lost after its lease ran out goes on for this process's callers alone
// (ADR 0011); once they have all left, nobody anywhere can wait for it: it is cut.
func TestFlightRedisLostIsCutWhenItsCallersLeave(t *testing.T) {
	srv := redistest.Start(t)
	var hold atomic.Bool
	released := make(chan struct{})
	g := backend{name: "redis", redis: srv}.group(t, Options{AbandonGrace: 20 * time.Millisecond,
		HeartbeatInterval: 50 * time.Millisecond, LeaseTTL: 200 * time.Millisecond})
	g.hooks.beforeRenew = func(context.Context) {
		if hold.Load() {
			<-released
		}
	}
	rec := newRecorder()
	g.opts.Observer = rec
	c := newLongCall()
	key := uniqueKey()
	r := firstChunk(t, g, key, c.fn)
	hold.Store(true)
	meta := g.coord.(*remote).keys(key).meta
	rdb := srv.Client()
	waitCond(t, 5*time.Second, "the lease runs out", func() bool {
		until, _ := rdb.HGet(context.Background(), meta, "lease_until").Int64()
		now, _ := rdb.Time(context.Background()).Result()
		return until > 0 && now.UnixMilli() > until
	})
	if err := rdb.FlushAll(context.Background()).Err(); err != nil {
		t.Fatal(err)
	}
	hold.Store(false)
	close(released)
	rec.waitMatch(t, "the flight gone", func(e Event) bool { return e.Kind == EventHeartbeatFailed && e.Err == ErrFlightGone }, 5*time.Second)
	r.Close()
	c.waitCut(t)
}

// An owner function that returns its whole answer as Redis cuts the flight: the answer is
// stored all the same (the cut flight is still its owner's to end), and another instance
// gets it as a hit instead of calling again.
func TestWholeAnswerReturnedAsTheCutLandsIsKept(t *testing.T) {
	srv := redistest.Start(t)
	opts := Options{AbandonGrace: 20 * time.Millisecond, HeartbeatInterval: time.Hour, LeaseTTL: 3 * time.Hour, ResultTTL: time.Minute}
	a := backend{name: "redis", redis: srv}.group(t, opts)
	b := backend{name: "redis", redis: srv}.group(t, opts)
	key := uniqueKey()
	var calls atomic.Int32
	release, returned := make(chan struct{}), make(chan struct{})
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		calls.Add(1)
		w.WriteHead(Head{Status: 200})
		_, _ = w.Write([]byte("data: first\n\n"))
		<-release // not the context: the answer is whole whatever happens to it
		_, _ = w.Write([]byte("data: last\n\n"))
		defer close(returned)
		return Result{Outcome: Store}, nil
	}
	var first sync.Once
	var hookErr atomic.Value
	a.hooks.cutAsked = func(cut bool) {
		if !cut {
			return
		}
		first.Do(func() {
			close(release)
			<-returned
			if err := condWithin(5*time.Second, "the attempt ended here", func() bool { return a.attemptEnded(key) }); err != nil {
				hookErr.Store(err)
			}
		})
	}
	written := make(chan struct{})
	a.hooks.completed = once(func() { close(written) })
	r := firstChunk(t, a, key, fn)
	r.Close()
	<-returned
	<-written // the final write answered
	if err, _ := hookErr.Load().(error); err != nil {
		t.Fatal(err)
	}
	got := readAll(context.Background(), mustDo(t, b, key, fn))
	if got.err != nil || got.role != RoleHit || got.body != "data: first\n\ndata: last\n\n" {
		t.Fatalf("elsewhere: %q %v %v; want the whole answer as a hit", got.body, got.role, got.err)
	}
	if n := calls.Load(); n != 1 {
		t.Fatalf("%d calls; want 1", n)
	}
}

// attemptEnded reports whether key's flight has no attempt running here any more.
func (g *Group) attemptEnded(key string) bool {
	g.mu.Lock()
	f := g.flights[key]
	g.mu.Unlock()
	if f == nil {
		return true
	}
	f.mu.Lock()
	defer f.mu.Unlock()
	return f.owned == nil
}
