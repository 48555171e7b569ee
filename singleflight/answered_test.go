package singleflight

import (
	"context"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// The interleavings at the moment an owner has answered its own client and Redis does not
// know it yet: the owner's final write is held by a hook (a slow Redis, a round trip on a
// loaded network). A request sent from then on was sent after an answer arrived. It may be
// served a stored answer it accepts; never that answer as if it were still in flight, which
// would give a no-cache request, or any request when nothing is stored, the very answer
// it was sent to replace.

// numbered answers "answer-N" on its N-th call; the first call waits for gate.
type numbered struct {
	calls atomic.Int32
	gate  chan struct{}
}

func newNumbered() *numbered { return &numbered{gate: make(chan struct{})} }

func (n *numbered) fn(ctx context.Context, w *Writer) (Result, error) {
	i := n.calls.Add(1)
	if i == 1 {
		select {
		case <-n.gate:
		case <-ctx.Done():
			return Result{}, context.Cause(ctx)
		}
	}
	return Result{Head: Head{Status: 200}, Body: fmt.Appendf(nil, "answer-%d", i)}, nil
}

// holdComplete holds g's first final write in Redis until release is called.
func holdComplete(t *testing.T, g *Group) (release func()) {
	ch := make(chan struct{})
	var once atomicOnce
	release = func() { once.do(func() { close(ch) }) }
	g.hooks.finalWrite = func(_ string, write func()) { <-ch; write() }
	t.Cleanup(release)
	return release
}

type atomicOnce struct{ done atomic.Bool }

func (o *atomicOnce) do(fn func()) {
	if o.done.CompareAndSwap(false, true) {
		fn()
	}
}

// answeredFirst reads an owner's reader, which must have its answer while the owner's
// final write is held.
func answeredFirst(t *testing.T, r *Reader, want string) {
	t.Helper()
	got := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		got <- readAll(ctx, r)
	}()
	select {
	case out := <-got:
		if out.err != nil || out.body != want || out.role != RoleOwner {
			t.Fatalf("owner got (%q, %v, %v); want %q as owner", out.body, out.role, out.err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the owner's client was not answered before its final write landed")
	}
}

// readIn reads r in the background.
func readIn(r *Reader) <-chan outcome {
	got := make(chan outcome, 1)
	go func() {
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		defer cancel()
		got <- readAll(ctx, r)
	}()
	return got
}

// following waits until g's flight of key follows another attempt in Redis, or out has
// come (a request served at once, from this process's store).
func following(t *testing.T, g *Group, key string, out <-chan outcome) (outcome, bool) {
	t.Helper()
	var res outcome
	done := false
	waitCond(t, 10*time.Second, "the request following the running flight", func() bool {
		select {
		case res = <-out:
			done = true
			return true
		default:
		}
		return g.flightRole(key) == RoleFollower || g.flightRole(key+"\x00nocache") == RoleFollower
	})
	return res, done
}

type afterAnswerCase struct {
	name    string
	ttl     time.Duration // ResultTTL: 0 stores nothing
	noCache bool
	want    string // what the request sent after the answer gets
}

var afterAnswerCases = []afterAnswerCase{
	{name: "nothing stored", want: "answer-2"},
	{name: "nothing stored/no-cache", noCache: true, want: "answer-2"},
	{name: "stored/no-cache", ttl: time.Minute, noCache: true, want: "answer-2"},
	// The answer is stored and the request takes stored answers: it gets the first
	// answer, and no second call is made for it.
	{name: "stored", ttl: time.Minute, want: "answer-1"},
}

func (c afterAnswerCase) check(t *testing.T, who string, out outcome, n *numbered) {
	t.Helper()
	if out.err != nil || out.body != c.want {
		t.Errorf("%s got (%q, %v, %v); want %q", who, out.body, out.role, out.err, c.want)
	}
	wantCalls := int32(1)
	if c.want == "answer-2" {
		wantCalls = 2
	}
	if got := n.calls.Load(); got != wantCalls {
		t.Errorf("%d upstream calls; want %d", got, wantCalls)
	}
}

// A request sent to another instance after the owner's client had its answer.
func TestRequestAfterAnswerElsewhere(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range afterAnswerCases {
		t.Run(c.name, func(t *testing.T) {
			b := backend{name: "redis", redis: srv}
			a, other := b.group(t, Options{ResultTTL: c.ttl}), b.group(t, Options{ResultTTL: c.ttl})
			key := uniqueKey()
			n := newNumbered()
			release := holdComplete(t, a)
			ra, _ := a.Do(key, false, n.fn)
			close(n.gate)
			answeredFirst(t, ra, "answer-1")

			rb, _ := other.Do(key, c.noCache, n.fn)
			got := readIn(rb)
			out, done := following(t, other, key, got)
			release()
			if !done {
				out = <-got
			}
			c.check(t, "the request sent after the answer", out, n)
		})
	}
}

// A request sent to the owner's own instance after its client had its answer.
func TestRequestAfterAnswerOnOwnerInstance(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range afterAnswerCases {
		t.Run(c.name, func(t *testing.T) {
			b := backend{name: "redis", redis: srv}
			a := b.group(t, Options{ResultTTL: c.ttl})
			key := uniqueKey()
			n := newNumbered()
			release := holdComplete(t, a)
			ra, _ := a.Do(key, false, n.fn)
			close(n.gate)
			answeredFirst(t, ra, "answer-1")

			rb, _ := a.Do(key, c.noCache, n.fn)
			got := readIn(rb)
			out, done := following(t, a, key, got)
			release()
			if !done {
				out = <-got
			}
			c.check(t, "the request sent after the answer", out, n)
		})
	}
}

// A request that joins, after the owner's client had its answer, a local flight of
// another instance that was following the owner since before: the flight's first caller
// gets the answer it waited for; the late one is served as if it had come to Redis itself.
func TestLateJoinerOfFollowingFlight(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range afterAnswerCases {
		t.Run(c.name, func(t *testing.T) {
			b := backend{name: "redis", redis: srv}
			a, other := b.group(t, Options{ResultTTL: c.ttl}), b.group(t, Options{ResultTTL: c.ttl})
			key := uniqueKey()
			n := newNumbered()
			release := holdComplete(t, a)
			ra, _ := a.Do(key, false, n.fn)
			waitCond(t, 10*time.Second, "the owner running", func() bool { return n.calls.Load() == 1 })
			early, _ := other.Do(key, c.noCache, n.fn)
			earlyOut := readIn(early)
			following(t, other, key, earlyOut)
			close(n.gate)
			answeredFirst(t, ra, "answer-1")

			late, _ := other.DoWith(key, CallOptions{NoCache: c.noCache}, n.fn)
			if late.f != early.f {
				t.Fatal("the late request did not join the following flight")
			}
			lateOut := readIn(late)
			release()
			if out := <-earlyOut; out.err != nil || out.body != "answer-1" || out.role != RoleFollower {
				t.Errorf("the request that waited for the answer got (%q, %v, %v); want answer-1 as follower", out.body, out.role, out.err)
			}
			c.check(t, "the request that joined after the answer", <-lateOut, n)
		})
	}
}

// A final write slower than a lease: the owner's client has its answer, and the attempt
// keeps its lease renewed until the write lands, so the follower elsewhere gets that
// answer rather than taking the flight over for a second call.
func TestSlowFinalWriteKeepsTheLease(t *testing.T) {
	srv := redistest.Start(t)
	o := Options{LeaseTTL: 300 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, TakeoverJitter: 10 * time.Millisecond}
	rdb := srv.Client()
	renewals := &cmdCounter{match: scriptRuns(renewScript)}
	rdb.AddHook(renewals)
	oa := o
	oa.Redis = rdb
	a := New(oa)
	t.Cleanup(func() { a.Close(context.Background()) })
	other := backend{name: "redis", redis: srv}.group(t, o)
	key := uniqueKey()
	n := newNumbered()
	release := holdComplete(t, a)
	ra, _ := a.Do(key, false, n.fn)
	waitCond(t, 10*time.Second, "the owner running", func() bool { return n.calls.Load() == 1 })
	rb, _ := other.Do(key, false, n.fn)
	got := readIn(rb)
	following(t, other, key, got)
	close(n.gate)
	answeredFirst(t, ra, "answer-1")
	// Held for more than two leases, as its renewals count.
	from := renewals.calls.Load()
	waitCond(t, 10*time.Second, "renewals for two leases", func() bool { return renewals.calls.Load() >= from+7 })
	release()
	if out := <-got; out.err != nil || out.body != "answer-1" {
		t.Errorf("the follower got (%q, %v, %v); want answer-1", out.body, out.role, out.err)
	}
	if c := n.calls.Load(); c != 1 {
		t.Errorf("%d upstream calls; want 1", c)
	}
}

// Forget after the owner's client had the answer and before its final write landed: the
// final write must not store the answer Forget was called to drop.
func TestForgetBeforeFinalWriteLands(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	o := Options{ResultTTL: time.Minute}
	a, other := b.group(t, o), b.group(t, o)
	key := uniqueKey()
	n := newNumbered()
	release := holdComplete(t, a)
	landed := make(chan struct{})
	held := a.hooks.finalWrite
	a.hooks.finalWrite = func(k string, write func()) { held(k, write); close(landed) }
	ra, _ := a.Do(key, false, n.fn)
	close(n.gate)
	answeredFirst(t, ra, "answer-1")
	if _, err := other.Forget(context.Background(), key); err != nil {
		t.Fatal(err)
	}
	release()
	<-landed
	// Forget clears its own instance's memory at once, the others' when its message
	// reaches them: ask it, and an instance that kept nothing.
	for _, g := range []*Group{other, b.group(t, o)} {
		rd, _ := g.Do(key, false, n.fn)
		if out := <-readIn(rd); out.body == "answer-1" {
			t.Fatalf("after Forget, a request got the forgotten answer (%v)", out.role)
		}
	}
	if c := n.calls.Load(); c != 2 {
		t.Errorf("%d upstream calls; want 2 (the answer forgotten, then the next one stored)", c)
	}
}

// A follower's flight can end from its attempt's stored answer instead of the done entry
// (a look after a read gap finds it stored): the answer's fence goes with it. Here the
// follower is held before it reads the done entry, and its flight is ended as such a look
// ends it; the caller that joined after the owner's client had the answer asked for no
// stored answer, and gets a call of its own.
func TestFollowerEndingFromStoredAnswerIsFenced(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	o := Options{ResultTTL: time.Minute}
	a, other := b.group(t, o), b.group(t, o)
	hold := make(chan struct{})
	var holding atomic.Bool
	other.hooks.resumed = func() {
		if holding.Load() {
			<-hold
		}
	}
	t.Cleanup(func() { close(hold) })
	key := uniqueKey()
	n := newNumbered()
	release := holdComplete(t, a)
	landed := make(chan struct{})
	held := a.hooks.finalWrite
	a.hooks.finalWrite = func(k string, write func()) { held(k, write); close(landed) }
	ra, _ := a.Do(key, false, n.fn)
	waitCond(t, 10*time.Second, "the owner running", func() bool { return n.calls.Load() == 1 })
	early, _ := other.Do(key, false, n.fn)
	earlyOut := readIn(early)
	following(t, other, key, earlyOut)
	close(n.gate)
	answeredFirst(t, ra, "answer-1")

	holding.Store(true)
	late, _ := other.DoWith(key, CallOptions{NoCache: true}, n.fn)
	if late.f != early.f {
		t.Fatal("the late request did not join the following flight")
	}
	f := late.f
	lateOut := readIn(late)
	release()
	<-landed
	d, err := other.remote.lookup(key, false, "", CallOptions{})
	if err != nil || d.kind != "hit" || d.answered.redis == 0 {
		t.Fatalf("lookup after the final write: %+v, %v; want a hit with its fence", d, err)
	}
	other.remote.serveHit(f, d, &position{token: d.token})
	if out := <-earlyOut; out.err != nil || out.body != "answer-1" {
		t.Errorf("the request that waited for the answer got (%q, %v, %v); want answer-1", out.body, out.role, out.err)
	}
	if out := <-lateOut; out.err != nil || out.body != "answer-2" {
		t.Errorf("the no-cache request that joined after the answer got (%q, %v, %v); want answer-2", out.body, out.role, out.err)
	}
}
