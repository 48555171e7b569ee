package singleflight

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/redis/go-redis/v9"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// A stream whose last event comes while Redis restarts still reaches its followers on
// other instances, whole, from the one call: the owner makes its final write again while
// its lease runs, and the restarted Redis takes it (the flight put back). Before, the one
// failed write ended the attempt: every follower elsewhere, holding all but the end of the
// stream, was cut short, and the answer was not stored.
func TestStreamEndingDuringARedisRestartReachesFollowers(t *testing.T) {
	srv := redistest.Start(t)
	a, other, recA := restartPair(t, srv)
	key := uniqueKey()
	s := newStreamer(3) // its last event waits for s.hold
	ra, err := a.Do(key, false, s.fn)
	if err != nil {
		t.Fatal(err)
	}
	<-s.first
	rb, err := other.Do(key, false, s.fn)
	if err != nil {
		t.Fatal(err)
	}
	first, err := rb.Next(context.Background())
	if err != nil {
		t.Fatalf("follower's first chunk: %v", err)
	}

	endDuringRestart(t, srv, recA, func() { close(s.hold) })

	want := s.transcript()
	if out := readWithin(ra, 10*time.Second); out.err != nil || out.body != want {
		t.Fatalf("owner got (%q, %v); want the whole stream", out.body, out.err)
	}
	if out := readWithin(rb, 10*time.Second); out.err != nil || string(first)+out.body != want {
		t.Fatalf("follower got (%q, %v) after %q; want the rest of the stream", out.body, out.err, first)
	}
	wantStored(t, srv, key, want, s.calls.Load())
}

// The same for a unary answer: the follower elsewhere gets it, and nobody calls again.
func TestUnaryEndingDuringARedisRestartReachesFollowers(t *testing.T) {
	srv := redistest.Start(t)
	a, other, recA := restartPair(t, srv)
	rp, led, rb := ownAndFollow(t, a, other)

	endDuringRestart(t, srv, recA, rp.release)

	for name, r := range map[string]*Reader{"owner": <-led, "follower": rb} {
		if out := readWithin(r, 10*time.Second); out.err != nil || out.body != "call 1" {
			t.Fatalf("%s got (%q, %v); want call 1", name, out.body, out.err)
		}
	}
	wantStored(t, srv, rp.key, "call 1", rp.calls.Load())
}

// restartPair is two instances of srv, their clients set up as the proxy's are, with a
// lease long enough to outlast a restart.
func restartPair(t *testing.T, srv *redistest.Server) (a, other *Group, recA *recorder) {
	recA = newRecorder()
	o := Options{LeaseTTL: 1500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, ResultTTL: time.Minute, BatchDelay: time.Millisecond}
	oa, ob := o, o
	oa.Observer = recA
	oa.Redis, ob.Redis = productClient(t, srv), productClient(t, srv)
	return backend{}.group(t, oa), backend{}.group(t, ob), recA
}

// endDuringRestart stops Redis, lets the owner's call end (end), and starts Redis again
// (empty) once the owner's final write has failed.
func endDuringRestart(t *testing.T, srv *redistest.Server, recA *recorder, end func()) {
	t.Helper()
	srv.Stop()
	end()
	recA.waitMatch(t, "the owner's final write fails", func(e Event) bool {
		return e.Kind == EventRedisError && e.Op == "complete"
	}, 5*time.Second)
	srv.Restart()
}

// wantStored checks that the one call's answer was stored.
func wantStored(t *testing.T, srv *redistest.Server, key, want string, calls int32) {
	t.Helper()
	if calls != 1 {
		t.Fatalf("%d upstream calls; want 1", calls)
	}
	if got := srv.Client().HGet(context.Background(), "ai:flight:result:{"+key+"}", "body").Val(); got != want {
		t.Fatalf("stored answer %q; want %q", got, want)
	}
}

// A Redis that restarts with its data a moment old (an RDB snapshot, an append-only file
// synced every second) while a stream runs: the flight is there, running under the same
// token, but its last batch is lost. The owner's final write, made again once Redis
// answers, must number its done entry after the batches the owner knows landed, not the
// ones the old meta counts: a follower that had not applied the lost batch (held here, as
// a slow process would be) took the done entry for the next batch and ended with an answer
// missing its middle, and no error. Now it sees the gap and finishes from the stored answer.
func TestCompleteAfterARolledBackStreamLeavesNoHole(t *testing.T) {
	srv := redistest.Start(t)
	recA := newRecorder()
	o := Options{LeaseTTL: 1500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, ResultTTL: time.Minute, BatchDelay: time.Millisecond}
	oa := o
	appended := &replied{match: scriptCalls(appendScript), ch: make(chan struct{}, 8)}
	oa.Observer, oa.Redis = recA, productClient(t, srv)
	oa.Redis.AddHook(appended)
	a := backend{}.group(t, oa)
	b := newHeldFollower(t, srv, o)

	key := uniqueKey()
	step := []chan struct{}{make(chan struct{}), make(chan struct{})}
	fn := func(ctx context.Context, w *Writer) (Result, error) {
		w.WriteHead(Head{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}})
		for i := range 3 {
			if i > 0 {
				<-step[i-1]
			}
			fmt.Fprintf(w, "data: %d\n\n", i)
		}
		return Result{Outcome: Store}, nil
	}
	ra, err := a.Do(key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	<-appended.ch // batch 1 landed, and the owner knows it
	rb, err := b.g.Do(key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	first, err := rb.Next(context.Background())
	if err != nil {
		t.Fatal(err)
	}
	b.holding.Store(true) // from now on the follower is held before it applies what comes

	if err := srv.Client().Save(context.Background()).Err(); err != nil { // the snapshot: batch 1
		t.Fatal(err)
	}
	close(step[0])
	<-appended.ch // batch 2 landed, and the owner knows it
	srv.Stop()
	close(step[1])
	recA.waitMatch(t, "the owner's final write fails", func(e Event) bool {
		return e.Kind == EventRedisError && e.Op == "complete"
	}, 5*time.Second)
	srv.Restart() // loads the snapshot: the flight running, batch 2 lost

	owner := readWithin(ra, 10*time.Second)
	if owner.err != nil {
		t.Fatalf("owner: %v", owner.err)
	}
	b.release()
	if out := readWithin(rb, 10*time.Second); out.err == nil && string(first)+out.body != owner.body {
		t.Fatalf("the follower got %q as a whole answer; the call answered %q", string(first)+out.body, owner.body)
	}
}

// replied signals on ch each time a command that match accepts got a reply without error.
type replied struct {
	match func(redis.Cmder) bool
	ch    chan struct{}
}

func (h *replied) DialHook(next redis.DialHook) redis.DialHook { return next }
func (h *replied) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		err := next(ctx, cmd)
		if err == nil && h.match(cmd) {
			h.ch <- struct{}{}
		}
		return err
	}
}
func (h *replied) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return next
}

// The owner's final write runs on Redis (a follower elsewhere reads the done entry, and its
// client has the answer) but its reply is lost, and the owner is cut off from Redis from
// then on. While it makes the write again, its flight takes callers: one sent after the
// client elsewhere had the answer must not be given it (answered.go). The fence is set
// unless the write was refused: an unanswered write may have landed.
func TestLateJoinerOfAFlightWhoseFinalReplyWasLost(t *testing.T) {
	srv := redistest.Start(t)
	o := Options{LeaseTTL: 1500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond}
	p := &partition{cutAfter: scriptCalls(completeScript)}
	oa := o
	oa.Redis = srv.Client()
	oa.Redis.AddHook(p)
	a := backend{}.group(t, oa)
	other := backend{redis: srv}.group(t, o)

	key := uniqueKey()
	n := newNumbered()
	ra, err := a.Do(key, false, n.fn)
	if err != nil {
		t.Fatal(err)
	}
	ownerOut := readIn(ra)
	waitCond(t, 10*time.Second, "the owner running", func() bool { return n.calls.Load() == 1 })
	rb, err := other.Do(key, false, n.fn)
	if err != nil {
		t.Fatal(err)
	}
	rbOut := readIn(rb)
	following(t, other, key, rbOut)
	close(n.gate)
	if out := <-rbOut; out.body != "answer-1" {
		t.Fatalf("the follower elsewhere got (%q, %v, %v); want answer-1", out.body, out.role, out.err)
	}
	// A request sent from then on, to the owner's instance.
	late, err := a.Do(key, false, n.fn)
	if err != nil {
		t.Fatal(err)
	}
	lateOut := readIn(late)
	if out := <-ownerOut; out.err != nil || out.body != "answer-1" {
		t.Errorf("the owner's caller got (%q, %v, %v); want answer-1", out.body, out.role, out.err)
	}
	if out := <-lateOut; out.body == "answer-1" {
		t.Fatalf("a request sent after a client had answer-1 was given it as if in flight")
	}
}

// partition, once cut, fails every command of its client without sending it, as a network
// partition between one instance and Redis would; it is cut right after the first command
// that cutAfter accepts ran on Redis, whose reply is then lost.
type partition struct {
	cut      atomic.Bool
	cutAfter func(redis.Cmder) bool
}

var errPartitioned = errors.New("read tcp: connection reset by peer (test partition)")

func (p *partition) DialHook(next redis.DialHook) redis.DialHook { return next }
func (p *partition) ProcessHook(next redis.ProcessHook) redis.ProcessHook {
	return func(ctx context.Context, cmd redis.Cmder) error {
		if p.cut.Load() {
			cmd.SetErr(errPartitioned)
			return errPartitioned
		}
		err := next(ctx, cmd)
		if err == nil && p.cutAfter(cmd) && p.cut.CompareAndSwap(false, true) {
			cmd.SetErr(errPartitioned) // it ran; its reply is lost
			return errPartitioned
		}
		return err
	}
}
func (p *partition) ProcessPipelineHook(next redis.ProcessPipelineHook) redis.ProcessPipelineHook {
	return func(ctx context.Context, cmds []redis.Cmder) error {
		if p.cut.Load() {
			return failAll(cmds, errPartitioned)
		}
		return next(ctx, cmds)
	}
}

// Closing an instance while Redis is down ends within its context and one write: an owner
// released at shutdown does not make its final write again.
func TestCloseDuringAnOutageDoesNotWaitOutTheLease(t *testing.T) {
	srv := redistest.Start(t)
	g := New(Options{Redis: productClient(t, srv)}) // a lease of 3 s
	running := make(chan struct{}, 1)
	r, err := g.Do(uniqueKey(), false, started(running, func(ctx context.Context, w *Writer) (Result, error) {
		<-ctx.Done()
		return Result{}, context.Cause(ctx)
	}))
	if err != nil {
		t.Fatal(err)
	}
	defer r.Close()
	<-running
	srv.Stop()
	ctx, cancel := context.WithTimeout(context.Background(), 100*time.Millisecond)
	defer cancel()
	start := time.Now()
	_ = g.Close(ctx)
	if d := time.Since(start); d > 1500*time.Millisecond {
		t.Fatalf("Close took %v with a context of 100 ms while Redis was down; want no wait for the lease (3 s)", d)
	}
}
