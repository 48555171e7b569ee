package singleflight

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// The interleavings at a flight's end on an instance that follows it: the owner's client has
// the answer (its final write landed), and this instance has not read the done entry yet
// (held here by a hook, as a busy process or a slow push would hold it). A request sent
// from then on was sent after an answer arrived. It may be served a stored answer it
// accepts; never that answer as if it were still in flight, which would give a no-cache
// request, or any request when nothing is stored, the very answer it was sent to replace.

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

// heldScene is a flight owned on one instance and followed on another, ended: the owner's
// client has the answer, the follower is held before it reads it, and a late caller has
// joined the follower's flight.
type heldScene struct {
	other             *heldFollower
	n                 *numbered
	early             *Reader
	earlyOut, lateOut <-chan outcome
}

func heldAfterAnswer(t *testing.T, srv *redistest.Server, o Options, noCache, lateNoCache bool) *heldScene {
	t.Helper()
	a := backend{name: "redis", redis: srv}.group(t, o)
	sc := &heldScene{other: newHeldFollower(t, srv, o), n: newNumbered()}
	key := uniqueKey()
	ra, _ := a.Do(key, false, sc.n.fn)
	waitCond(t, 10*time.Second, "the owner running", func() bool { return sc.n.calls.Load() == 1 })
	sc.early, sc.earlyOut = sc.other.follow(t, key, noCache, sc.n.fn)
	close(sc.n.gate)
	if out := readAll(context.Background(), ra); out.body != "answer-1" || out.role != RoleOwner {
		t.Fatalf("owner got (%q, %v, %v); want answer-1", out.body, out.role, out.err)
	}
	late, _ := sc.other.g.DoWith(key, CallOptions{NoCache: lateNoCache}, sc.n.fn)
	if late.f != sc.early.f {
		t.Fatal("the late request did not join the following flight: it read the answer already")
	}
	sc.lateOut = readIn(late)
	return sc
}

// A request that joins, after the owner's client had the answer, a local flight of another
// instance that was following the owner since before and has not read the answer yet: the
// flight's first caller gets the answer it waited for; the late one is served as if it had
// come to Redis itself.
func TestLateJoinerOfFollowingFlight(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range afterAnswerCases {
		t.Run(c.name, func(t *testing.T) {
			sc := heldAfterAnswer(t, srv, Options{ResultTTL: c.ttl}, c.noCache, c.noCache)
			sc.other.release()
			if out := <-sc.earlyOut; out.err != nil || out.body != "answer-1" || out.role != RoleFollower {
				t.Errorf("the request that waited for the answer got (%q, %v, %v); want answer-1 as follower", out.body, out.role, out.err)
			}
			c.check(t, "the request that joined after the answer", <-sc.lateOut, sc.n)
		})
	}
}

// A follower's flight can end from its attempt's stored answer instead of the done entry
// (a look after a read gap finds it stored): the answer's landing gate goes with it. Here the
// follower is held before it reads the done entry, and its flight is ended as such a look
// ends it; the caller that joined after the owner's client had the answer asked for no
// stored answer, and gets a call of its own.
func TestFollowerEndingFromStoredAnswerIsGated(t *testing.T) {
	sc := heldAfterAnswer(t, redistest.Start(t), Options{ResultTTL: time.Minute}, false, true)
	r := sc.other.g.rem()
	d, err := r.lookup(sc.early.f.key, false, "", CallOptions{}, "1", 1)
	if err != nil || d.verdict != verdictHit || d.landed == 0 {
		t.Fatalf("lookup after the answer: %+v, %v; want a hit with its landing gate", d, err)
	}
	r.serveHit(sc.early.f, d, &position{token: d.token})
	if out := <-sc.earlyOut; out.err != nil || out.body != "answer-1" {
		t.Errorf("the request that waited for the answer got (%q, %v, %v); want answer-1", out.body, out.role, out.err)
	}
	if out := <-sc.lateOut; out.err != nil || out.body != "answer-2" {
		t.Errorf("the no-cache request that joined after the answer got (%q, %v, %v); want answer-2", out.body, out.role, out.err)
	}
	sc.other.release()
}

// A request that joins the owner's own flight after its final write landed and a client
// elsewhere had the answer, before the owner has handled the write's reply (held here by a
// hook): the owner's callers from before get the answer; the late one is served as if it
// had come to Redis itself.
func TestLateJoinerOfOwnedFlight(t *testing.T) {
	srv := redistest.Start(t)
	for _, c := range afterAnswerCases {
		t.Run(c.name, func(t *testing.T) {
			o := Options{ResultTTL: c.ttl}
			b := backend{name: "redis", redis: srv}
			a, other := b.group(t, o), b.group(t, o)
			landed := make(chan struct{})
			hold := make(chan struct{})
			var unhold atomicOnce
			release := func() { unhold.do(func() { close(hold) }) }
			t.Cleanup(release)
			a.hooks.completed = once(func() { // the first call's final write
				close(landed)
				<-hold
			})
			key := uniqueKey()
			n := newNumbered()
			ra, _ := a.DoWith(key, CallOptions{NoCache: c.noCache}, n.fn)
			ownerOut := readIn(ra)
			waitCond(t, 10*time.Second, "the owner running", func() bool { return n.calls.Load() == 1 })
			rb, _ := other.Do(key, c.noCache, n.fn)
			rbOut := readIn(rb)
			following(t, other, key, rbOut)
			close(n.gate)
			<-landed
			if out := <-rbOut; out.body != "answer-1" {
				t.Fatalf("the follower elsewhere got (%q, %v, %v); want answer-1", out.body, out.role, out.err)
			}
			late, _ := a.DoWith(key, CallOptions{NoCache: c.noCache}, n.fn)
			if late.f != ra.f {
				t.Fatal("the late request did not join the owner's flight")
			}
			lateOut := readIn(late)
			release()
			if out := <-ownerOut; out.err != nil || out.body != "answer-1" || out.role != RoleOwner {
				t.Errorf("the owner's caller got (%q, %v, %v); want answer-1 as owner", out.body, out.role, out.err)
			}
			c.check(t, "the request that joined after the answer", <-lateOut, n)
		})
	}
}

type atomicOnce struct{ done atomic.Bool }

func (o *atomicOnce) do(fn func()) {
	if o.done.CompareAndSwap(false, true) {
		fn()
	}
}

// following waits until g's flight of key follows another attempt in Redis, or out has
// come.
func following(t *testing.T, g *Group, key string, out <-chan outcome) {
	t.Helper()
	waitCond(t, 10*time.Second, "the request following the running flight", func() bool {
		return len(out) > 0 || g.flightRole(key) == RoleFollower || g.flightRole(key+"\x00nocache") == RoleFollower
	})
}

// The owner's final write runs on Redis (a follower elsewhere reads the done entry, and its
// client has the answer) but its reply is lost, and the owner is cut off from Redis from
// then on. While it makes the write again, its flight takes callers: one sent after the
// client elsewhere had the answer must not be given it (answered.go). The landing gate is set
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

var errPartitioned = errors.New("read tcp: connection reset by peer (test partition)")
