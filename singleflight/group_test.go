package singleflight

import (
	"context"
	"errors"
	"fmt"
	"runtime"
	"strconv"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

func TestHundredCallersOneCall(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			rp := newReply(`{"n":1}`)
			wait := doAll(t, g, key, 100, rp.fn)
			rp.release()
			outs := wait()
			if got := rp.calls.Load(); got != 1 {
				t.Fatalf("owner function ran %d times; want 1", got)
			}
			for i, o := range outs {
				if o.err != nil || o.body != `{"n":1}` || o.head.Status != 200 {
					t.Fatalf("caller %d: got (%d, %q, %v); want (200, %q, nil)", i, o.head.Status, o.body, o.err, `{"n":1}`)
				}
			}
			roles := countRoles(outs)
			if roles[RoleOwner] != 1 || roles[RoleFollower] != 99 {
				t.Fatalf("roles %v; want 1 owner and 99 followers", roles)
			}
			if outs[0].role != RoleOwner {
				t.Fatalf("the first caller's role is %v; want owner", outs[0].role)
			}

			// A repeat is served from the stored result.
			again := doAll(t, g, key, 1, rp.fn)()[0]
			if again.role != RoleHit || again.body != `{"n":1}` || rp.calls.Load() != 1 {
				t.Fatalf("repeat: role %v body %q calls %d; want hit, same body, 1 call", again.role, again.body, rp.calls.Load())
			}
		})
	}
}

func TestDistinctKeysIndependent(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{})
			var waits []func() []outcome
			var replies []*reply
			for i := range 10 {
				rp := newReply(fmt.Sprintf("body-%d", i))
				replies = append(replies, rp)
				waits = append(waits, doAll(t, g, uniqueKey(), 10, rp.fn))
			}
			// Release in reverse: no key waits for another.
			for i := len(replies) - 1; i >= 0; i-- {
				replies[i].release()
				for _, o := range waits[i]() {
					if o.err != nil || o.body != fmt.Sprintf("body-%d", i) {
						t.Fatalf("key %d: got (%q, %v); want body-%d", i, o.body, o.err, i)
					}
				}
				if c := replies[i].calls.Load(); c != 1 {
					t.Fatalf("key %d: %d calls; want 1", i, c)
				}
			}
		})
	}
}

func TestNoCacheSkipsStoredResult(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			rp := newReply("x")
			rp.release()
			doAll(t, g, key, 1, rp.fn)()
			r, _ := g.Do(key, true, rp.fn)
			o := readAll(context.Background(), r)
			if o.role != RoleOwner || rp.calls.Load() != 2 {
				t.Fatalf("no-cache: role %v, calls %d; want owner, 2", o.role, rp.calls.Load())
			}
		})
	}
}

func TestDedupeOnlyStoresNothing(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{}) // ResultTTL 0
			key := uniqueKey()
			rp := newReply("x")
			rp.release()
			doAll(t, g, key, 1, rp.fn)()
			o := doAll(t, g, key, 1, rp.fn)()[0]
			if o.role != RoleOwner || rp.calls.Load() != 2 {
				t.Fatalf("after the flight: role %v, calls %d; want owner, 2", o.role, rp.calls.Load())
			}
		})
	}
}

func TestShareOutcomeNotStored(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			gate := make(chan struct{})
			calls := 0
			fn := func(ctx context.Context, w *Writer) (Result, error) {
				calls++
				<-gate
				return Result{Head: Head{Status: 400}, Body: []byte("bad"), Outcome: Share}, nil
			}
			wait := doAll(t, g, key, 5, fn)
			close(gate)
			for _, o := range wait() {
				if o.head.Status != 400 || o.body != "bad" {
					t.Fatalf("got (%d, %q); want (400, bad)", o.head.Status, o.body)
				}
			}
			gate = make(chan struct{})
			close(gate)
			if o := doAll(t, g, key, 1, fn)()[0]; o.role != RoleOwner || calls != 2 {
				t.Fatalf("after a shared 400: role %v calls %d; want owner, 2 (not stored)", o.role, calls)
			}
		})
	}
}

func TestRetryThenSuccess(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{ResultTTL: time.Minute})
			key := uniqueKey()
			gate := make(chan struct{})
			calls := 0
			fn := func(ctx context.Context, w *Writer) (Result, error) {
				calls++
				<-gate
				if calls == 1 {
					return Result{Head: Head{Status: 500}, Body: []byte("boom"), Outcome: Retry}, nil
				}
				return Result{Head: Head{Status: 200}, Body: []byte("ok")}, nil
			}
			wait := doAll(t, g, key, 5, fn)
			close(gate)
			outs := wait()
			// The leader gets its own upstream answer; the others get the retry's.
			if outs[0].head.Status != 500 || outs[0].body != "boom" {
				t.Fatalf("leader: got (%d, %q); want its own (500, boom)", outs[0].head.Status, outs[0].body)
			}
			for i, o := range outs[1:] {
				if o.err != nil || o.head.Status != 200 || o.body != "ok" {
					t.Fatalf("caller %d: got (%d, %q, %v); want (200, ok)", i+1, o.head.Status, o.body, o.err)
				}
			}
			if calls != 2 {
				t.Fatalf("%d calls; want 2", calls)
			}
		})
	}
}

// TestInlineOwnerGetsItsOwnFailureAtOnce: a caller leading its flight on its own goroutine
// (CallOptions.Inline) whose call fails while others wait with it gets that failed answer
// as soon as its call ends: the retries for the others run on a goroutine of their own,
// not before DoWith returns. And it keeps its own answer when the retries fail too, read
// however late.
func TestInlineOwnerGetsItsOwnFailureAtOnce(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{MaxAttempts: 3})
			key := uniqueKey()
			first, retries := make(chan struct{}), make(chan struct{})
			var opened sync.Once
			openRetries := func() { opened.Do(func() { close(retries) }) }
			defer openRetries() // a failed test does not leave the retry hanging
			running := make(chan int, 3)
			var calls atomic.Int32
			fn := func(ctx context.Context, w *Writer) (Result, error) {
				n := int(calls.Add(1))
				running <- n
				gate := retries
				if n == 1 {
					gate = first
				}
				select {
				case <-gate:
				case <-ctx.Done():
					return Result{}, context.Cause(ctx)
				}
				body := []byte("call " + strconv.Itoa(n))
				return Result{Head: Head{Status: 500}, Body: body, Outcome: Retry}, nil
			}
			led := doAsync(t, g, key, CallOptions{Inline: true}, fn)
			if n := <-running; n != 1 {
				t.Fatalf("call %d ran first", n)
			}
			wait := doAll(t, g, key, 3, fn) // they join the call in flight
			close(first)
			if n := <-running; n != 2 {
				t.Fatalf("call %d ran second", n)
			}
			var leader *Reader
			select {
			case leader = <-led:
			case <-time.After(5 * time.Second):
				t.Fatal("the inline caller is still leading while the retry for the others runs")
			}
			openRetries()
			for i, o := range wait() {
				if o.head.Status != 500 || o.body != "call 3" {
					t.Errorf("waiter %d: got (%d, %q, %v); want the last attempt's (500, call 3)", i, o.head.Status, o.body, o.err)
				}
			}
			o := readAll(context.Background(), leader)
			if o.err != nil || o.head.Status != 500 || o.body != "call 1" || o.role != RoleOwner {
				t.Fatalf("inline caller: got (%d, %q, %v, %v); want its own call's (500, call 1) as owner", o.head.Status, o.body, o.role, o.err)
			}
			if n := calls.Load(); n != 3 {
				t.Fatalf("%d calls; want MaxAttempts = 3", n)
			}
		})
	}
}

func TestZombieOwnerHardTimeout(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{Timeout: 100 * time.Millisecond, MaxAttempts: 3})
			key := uniqueKey()
			var causes []error
			calls := 0
			fn := func(ctx context.Context, w *Writer) (Result, error) {
				calls++
				<-ctx.Done() // hangs until the flight context ends it
				causes = append(causes, context.Cause(ctx))
				return Result{}, context.Cause(ctx)
			}
			outs := doAll(t, g, key, 4, fn)()
			for i, o := range outs {
				if !errors.Is(o.err, ErrFailed) {
					t.Fatalf("caller %d: err %v; want ErrFailed", i, o.err)
				}
			}
			if calls != 3 {
				t.Fatalf("%d calls; want MaxAttempts = 3", calls)
			}
			for _, c := range causes {
				if !errors.Is(c, ErrTimeout) {
					t.Fatalf("cause %v; want ErrTimeout", c)
				}
			}
		})
	}
}

func TestPanicReleasesWaiters(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			o := Options{MaxAttempts: 2}
			g := b.group(t, o)
			key := uniqueKey()
			gate := make(chan struct{})
			running := make(chan struct{}, 10)
			fn := started(running, func(ctx context.Context, w *Writer) (Result, error) {
				<-gate
				panic("owner bug")
			})
			waits := []func() []outcome{doAll(t, g, key, 3, fn)}
			<-running
			if b.redis != nil { // a remote follower too
				g2 := b.group(t, o)
				waits = append(waits, doAll(t, g2, key, 3, fn))
			}
			close(gate)
			for _, w := range waits {
				for i, o := range w() {
					if !errors.Is(o.err, ErrFailed) {
						t.Fatalf("caller %d: err %v; want ErrFailed", i, o.err)
					}
				}
			}
		})
	}
}

// TestInlineCallerLeadsOnItsGoroutine: a caller with CallOptions.Inline that starts a
// flight runs its owner function on its own goroutine (DoWith returns with the flight
// over); a caller joining meanwhile gets the same answer, from one call.
func TestInlineCallerLeadsOnItsGoroutine(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{})
			key := uniqueKey()
			rp := newReply("answer")
			running := make(chan struct{}, 1)
			var onCaller atomic.Bool
			fn := started(running, func(ctx context.Context, w *Writer) (Result, error) {
				buf := make([]byte, 64<<10)
				// A frame of DoWith below it, not just "created by" DoWith.
				onCaller.Store(strings.Contains(string(buf[:runtime.Stack(buf, false)]), "(*Group).DoWith("))
				return rp.fn(ctx, w)
			})
			led := doAsync(t, g, key, CallOptions{Inline: true}, fn)
			<-running
			joiner, err := g.Do(key, false, rp.fn)
			if err != nil {
				t.Fatal(err)
			}
			rp.release()
			ctx := context.Background()
			if out := readAll(ctx, <-led); out.err != nil || out.body != "answer" || out.role != RoleOwner {
				t.Fatalf("inline caller: %+v; want the answer as its owner", out)
			}
			if out := readAll(ctx, joiner); out.err != nil || out.body != "answer" || out.role != RoleFollower {
				t.Fatalf("joiner: %+v; want the answer as a follower", out)
			}
			if !onCaller.Load() {
				t.Error("the owner function ran on a goroutine of its own, not the caller's")
			}
			if n := rp.calls.Load(); n != 1 {
				t.Errorf("%d calls; want 1", n)
			}
		})
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
