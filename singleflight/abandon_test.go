package singleflight

import (
	"context"
	"errors"
	"fmt"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// longCall is an owner function that streams a first event, then its second once released,
// and reports why its context ended if it did.
type longCall struct {
	calls   atomic.Int32
	release chan struct{}
	cut     chan error // the cause of a call's end before release
}

func newLongCall() *longCall {
	return &longCall{release: make(chan struct{}), cut: make(chan error, 4)}
}

func (c *longCall) fn(ctx context.Context, w *Writer) (Result, error) {
	n := c.calls.Add(1)
	w.WriteHead(Head{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}})
	fmt.Fprintf(w, "data: call %d first\n\n", n)
	select {
	case <-c.release:
	case <-ctx.Done():
		c.cut <- context.Cause(ctx)
		return Result{}, context.Cause(ctx)
	}
	fmt.Fprintf(w, "data: call %d second\n\n", n)
	return Result{Outcome: Store}, nil
}

func (c *longCall) whole(n int) string {
	return fmt.Sprintf("data: call %d first\n\ndata: call %d second\n\n", n, n)
}

// waitCut waits until a call ended with ErrAbandoned.
func (c *longCall) waitCut(t *testing.T) {
	t.Helper()
	select {
	case err := <-c.cut:
		if !errors.Is(err, ErrAbandoned) {
			t.Fatalf("call ended with %v; want ErrAbandoned", err)
		}
	case <-time.After(10 * time.Second):
		t.Fatal("the abandoned call was not cut")
	}
}

func (c *longCall) notCut(t *testing.T) {
	t.Helper()
	select {
	case err := <-c.cut:
		t.Fatalf("call cut (%v) while a caller waited", err)
	default:
	}
}

// waitRounds waits until g's renewer has begun n more rounds: renewals that would have cut
// a flight nobody waits for have been made.
func waitRounds(t *testing.T, g *Group, n int64) {
	t.Helper()
	rn := g.coord.(*remote).renewer
	from := rn.round.Load()
	waitCond(t, 5*time.Second, fmt.Sprintf("%d renewal rounds", n), func() bool { return rn.round.Load() >= from+n })
}

func abandonEvents(rec *recorder, reason string) int {
	return rec.countWhere(func(e Event) bool { return e.Kind == EventAbandoned && e.Reason == reason })
}

func TestCallNobodyWaitsForIsCut(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			rec := newRecorder()
			grace := 50 * time.Millisecond
			g := b.group(t, Options{AbandonGrace: grace, Observer: rec, ResultTTL: time.Minute})
			c := newLongCall()
			key := uniqueKey()
			r := firstChunk(t, g, key, c.fn)
			left := time.Now()
			r.Close()
			c.waitCut(t)
			if d := time.Since(left); d < grace {
				t.Errorf("cut %v after the caller left; want at least the grace %v", d, grace)
			}
			rec.waitMatch(t, "a cancelled spell", func(e Event) bool { return e.Kind == EventAbandoned && e.Reason == abandonCancelled }, 5*time.Second)

			// The next caller starts a new call at once and gets its whole answer.
			close(c.release)
			r2, err := g.Do(key, false, c.fn)
			if err != nil {
				t.Fatal(err)
			}
			got := readAll(context.Background(), r2)
			if got.err != nil || got.body != c.whole(2) || got.role != RoleOwner {
				t.Fatalf("after the cut: %q %v %v; want the whole second call as owner", got.body, got.role, got.err)
			}
		})
	}
}

func TestCallerBackWithinGraceGetsTheWholeCall(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			rec := newRecorder()
			g := b.group(t, Options{AbandonGrace: time.Hour, Observer: rec})
			c := newLongCall()
			key := uniqueKey()
			firstChunk(t, g, key, c.fn).Close()
			r2, err := g.Do(key, false, c.fn) // an SDK's retry, within the grace
			if err != nil {
				t.Fatal(err)
			}
			close(c.release)
			got := readAll(context.Background(), r2)
			if got.err != nil || got.body != c.whole(1) || c.calls.Load() != 1 {
				t.Fatalf("rejoined: %q %v, %d calls; want the whole first call", got.body, got.err, c.calls.Load())
			}
			c.notCut(t)
			if n := abandonEvents(rec, abandonRejoined); n != 1 {
				t.Errorf("%d rejoined spells; want 1", n)
			}
		})
	}
}

// A call asked to finish runs to its end, its caller gone: it is not cut here nor in Redis,
// and its answer is stored for every instance.
func TestFinishKeepsACallNobodyWaitsFor(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			rec := newRecorder()
			o := Options{AbandonGrace: time.Millisecond, HeartbeatInterval: 20 * time.Millisecond,
				LeaseTTL: time.Second, ResultTTL: time.Minute}
			og := o
			og.Observer = rec
			g := b.group(t, og)
			other := g // an instance that has no copy of its own
			if b.redis != nil {
				other = b.group(t, o)
			}
			c := newLongCall()
			key := uniqueKey()
			r, err := g.DoWith(key, CallOptions{Finish: true}, c.fn)
			if err != nil {
				t.Fatal(err)
			}
			if _, err := r.Next(context.Background()); err != nil {
				t.Fatal(err)
			}
			r.Close()
			if b.redis != nil {
				// Renewals that would cut it, were it not to finish.
				waitRounds(t, g, 3)
				if st := g.rem().rdb.HGet(context.Background(), g.rem().keys(key).meta, "state").Val(); st != "R" {
					t.Fatalf("the flight's state in Redis is %q; want R, running", st)
				}
			} else {
				time.Sleep(50 * time.Millisecond) // fifty graces: nothing to wait on when nothing is to happen
			}
			c.notCut(t)
			close(c.release)
			rec.waitMatch(t, "a finished spell", func(e Event) bool { return e.Kind == EventAbandoned && e.Reason == abandonFinished }, 5*time.Second)
			rec.waitFor(t, EventFlightEnd, 1, 5*time.Second) // after its final write
			got := storeOne(t, other, key, "unused")
			if got.role != RoleHit || got.body != c.whole(1) {
				t.Fatalf("after the finished call: %v %q; want a hit of it", got.role, got.body)
			}
		})
	}
}

// An inline caller cannot close its Reader while it leads: its Context tells that it left.
func TestInlineCallerWhoseContextEndsIsCut(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			g := b.group(t, Options{AbandonGrace: 10 * time.Millisecond})
			c := newLongCall()
			ctx, cancel := context.WithCancel(context.Background())
			running := make(chan struct{}, 1)
			led := doAsync(t, g, uniqueKey(), CallOptions{Inline: true, Context: ctx}, started(running, c.fn))
			<-running
			cancel()
			c.waitCut(t)
			(<-led).Close()
		})
	}
}

// twoInstances returns two Groups on one Redis, with fast renewals unless slow: then only
// the grace's own request asks a's flights to be cut.
func twoInstances(t *testing.T, grace time.Duration, slow bool) (a, b *Group, rec *recorder) {
	return twoInstancesOn(t, redistest.Start(t), grace, slow)
}

// twoInstancesOn is twoInstances on a server of the test's.
func twoInstancesOn(t *testing.T, server *redistest.Server, grace time.Duration, slow bool) (a, b *Group, rec *recorder) {
	srv := backend{name: "redis", redis: server}
	rec = newRecorder()
	o := Options{AbandonGrace: grace, HeartbeatInterval: 50 * time.Millisecond, LeaseTTL: 2 * time.Second, ResultTTL: time.Minute}
	oa := o
	oa.Observer = rec
	if slow {
		oa.HeartbeatInterval, oa.LeaseTTL = time.Hour, 3*time.Hour
	}
	return srv.group(t, oa), srv.group(t, o), rec
}

func TestFollowerElsewhereKeepsTheCallUntilItLeaves(t *testing.T) {
	grace := 100 * time.Millisecond
	a, b, _ := twoInstances(t, grace, false)
	c := newLongCall()
	key := uniqueKey()
	owner := firstChunk(t, a, key, c.fn)
	follower := firstChunk(t, b, key, c.fn)
	owner.Close()
	// The owner's renewals ask for a cut every round; the follower elsewhere refuses it.
	waitRounds(t, a, 5)
	c.notCut(t)

	follower.Close()
	left := time.Now()
	c.waitCut(t)
	if d := time.Since(left); d < grace {
		t.Errorf("cut %v after the last caller left elsewhere; want at least the grace %v", d, grace)
	}
	if n := c.calls.Load(); n != 1 {
		t.Fatalf("%d calls; want 1", n)
	}
	// Redis ended the flight: a caller on either instance starts anew at once.
	close(c.release)
	got := readAll(context.Background(), mustDo(t, b, key, c.fn))
	if got.err != nil || got.body != c.whole(2) || got.role != RoleOwner {
		t.Fatalf("after the cut: %q %v %v; want the whole second call as owner", got.body, got.role, got.err)
	}
}

func TestFollowerElsewhereGetsTheWholeAnswerOfAnAbandonedOwner(t *testing.T) {
	a, b, _ := twoInstances(t, 10*time.Millisecond, false)
	c := newLongCall()
	key := uniqueKey()
	owner := firstChunk(t, a, key, c.fn)
	follower, err := b.Do(key, false, c.fn)
	if err != nil {
		t.Fatal(err)
	}
	waitCond(t, 5*time.Second, "b follows", func() bool { return b.flightRole(key) == RoleFollower })
	owner.Close()
	waitRounds(t, a, 3)
	close(c.release)
	got := readAll(context.Background(), follower)
	if got.err != nil || got.body != c.whole(1) || got.role != RoleFollower {
		t.Fatalf("follower: %q %v %v; want the whole call", got.body, got.role, got.err)
	}
	c.notCut(t)
}

// A caller that joins elsewhere just before the cut is asked keeps the call; one that looks
// after Redis cut it starts a new call: neither gets an error or part of an answer.
func TestJoinElsewhereRacingTheCut(t *testing.T) {
	for _, first := range []string{"join", "cut"} {
		t.Run(first+" first", func(t *testing.T) {
			a, b, _ := twoInstances(t, 20*time.Millisecond, true)
			c := newLongCall()
			key := uniqueKey()
			j := newJoining()
			join := func() {
				j.join(b, key, CallOptions{}, c.fn, "b decides", func() bool { return b.flightRole(key) != RoleUnknown })
			}
			asked := make(chan bool, 1)
			a.hooks.cutAsked = func(cut bool) {
				if first == "cut" {
					join()
				}
				asked <- cut
			}
			owner := firstChunk(t, a, key, c.fn)
			if first == "join" {
				join()
			}
			owner.Close()
			cut := <-asked
			joined := j.take(t)
			if cut != (first == "cut") {
				t.Fatalf("cut = %v; want %v", cut, first == "cut")
			}
			want, role, calls := c.whole(1), RoleFollower, int32(1)
			if first == "cut" {
				want, role, calls = c.whole(2), RoleOwner, 2
				c.waitCut(t)
			}
			close(c.release)
			got := readAll(context.Background(), joined)
			if got.err != nil || got.body != want || got.role != role || c.calls.Load() != calls {
				t.Fatalf("joined: %q %v %v, %d calls; want %q as %v, %d calls", got.body, got.role, got.err, c.calls.Load(), want, role, calls)
			}
		})
	}
}

// A caller that joins here while Redis cuts the flight keeps the call: it is served the
// whole answer by this process alone.
func TestJoinHereRacingTheCutKeepsTheCall(t *testing.T) {
	a, _, _ := twoInstances(t, 20*time.Millisecond, true)
	c := newLongCall()
	key := uniqueKey()
	j := newJoining()
	a.hooks.cutAsked = func(cut bool) {
		if !cut {
			t.Error("Redis did not cut a flight nobody waited for")
		}
		j.join(a, key, CallOptions{}, c.fn, "", nil)
	}
	firstChunk(t, a, key, c.fn).Close()
	r := j.take(t)
	close(c.release)
	got := readAll(context.Background(), r)
	if got.err != nil || got.body != c.whole(1) || c.calls.Load() != 1 {
		t.Fatalf("joined at the cut: %q %v, %d calls; want the whole first call", got.body, got.err, c.calls.Load())
	}
	c.notCut(t)
}

func mustDo(t *testing.T, g *Group, key string, fn Func) *Reader {
	t.Helper()
	r, err := g.Do(key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	return r
}

// Marks of an earlier flight's callers do not keep a new flight of the same key.
func TestNewFlightIsCutDespiteAnEarlierFlightsFollowers(t *testing.T) {
	a, b, _ := twoInstances(t, 10*time.Millisecond, false)
	c := newLongCall()
	key := uniqueKey()
	owner := firstChunk(t, a, key, c.fn)
	defer owner.Close()
	follower := firstChunk(t, b, key, c.fn)
	close(c.release)
	if got := readAll(context.Background(), follower); got.err != nil || got.body != "data: call 1 second\n\n" {
		t.Fatalf("first flight: %q %v; want the rest of it", got.body, got.err)
	}
	// The follower can have the answer before its owner's flight has ended here: a caller
	// until then joins that flight (ADR 0021), not a new one.
	waitCond(t, 5*time.Second, "the first flight ended on its owner's instance", func() bool { return a.flightRole(key) == RoleUnknown })
	c.release = make(chan struct{})
	r, err := a.DoWith(key, CallOptions{NoCache: true}, c.fn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.Close()
	c.waitCut(t)
}

// The flights listing shows how many callers wait on each instance.
func TestFlightsListCallersPerInstance(t *testing.T) {
	a, b, _ := twoInstances(t, time.Hour, false)
	c := newLongCall()
	key := uniqueKey()
	owner := firstChunk(t, a, key, c.fn)
	defer owner.Close()
	follower := firstChunk(t, b, key, c.fn)
	defer follower.Close()
	waitRounds(t, a, 2)
	list, _, err := b.Flights(context.Background(), 0)
	if err != nil || len(list) != 1 {
		t.Fatalf("flights: %+v %v; want one", list, err)
	}
	want := map[string]int{a.opts.InstanceID: 1, b.opts.InstanceID: 1}
	if got := list[0].Waiting; len(got) != 2 || got[a.opts.InstanceID] != 1 || got[b.opts.InstanceID] != 1 {
		t.Errorf("waiting %v; want %v", got, want)
	}
	close(c.release)
}

// The callers of an instance's flight leave and a new caller there starts another flight of
// the key, which marks the flight before the first one's unwait lands: the new mark stays,
// and the call is not cut while the new caller waits.
func TestUnwaitOfAnOlderFlightLeavesANewerMark(t *testing.T) {
	a, b, _ := twoInstances(t, 20*time.Millisecond, false)
	c := newLongCall()
	key := uniqueKey()
	firstChunk(t, a, key, c.fn).Close() // nobody waits on the owner's instance
	j, unwaited := newJoining(), make(chan struct{})
	b.hooks.unwaiting = func(sent bool) {
		if sent {
			close(unwaited)
			return
		}
		j.join(b, key, CallOptions{}, c.fn, "b's second flight follows", func() bool { return b.flightRole(key) == RoleFollower })
	}
	firstChunk(t, b, key, c.fn).Close()
	second := j.take(t)
	<-unwaited
	waitRounds(t, a, 5)
	c.notCut(t)
	close(c.release)
	got := readAll(context.Background(), second)
	if got.err != nil || got.body != c.whole(1) || c.calls.Load() != 1 {
		t.Fatalf("second caller: %q %v, %d calls; want the whole first call", got.body, got.err, c.calls.Load())
	}
}

// A caller elsewhere that asked the call to finish makes it finish, even once it has left.
func TestFinishAskedElsewhereOutlastsItsCaller(t *testing.T) {
	a, b, _ := twoInstances(t, 10*time.Millisecond, false)
	c := newLongCall()
	key := uniqueKey()
	owner := firstChunk(t, a, key, c.fn)
	r, err := b.DoWith(key, CallOptions{Finish: true}, c.fn)
	if err != nil {
		t.Fatal(err)
	}
	if _, err := r.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	unwaited := make(chan struct{})
	b.hooks.unwaiting = func(sent bool) {
		if sent {
			close(unwaited)
		}
	}
	r.Close()
	<-unwaited
	owner.Close()
	waitRounds(t, a, 5)
	c.notCut(t)
	close(c.release)
	waitCond(t, 5*time.Second, "the answer stored", func() bool { return storedIn(a, key) })
	if got := readAll(context.Background(), mustDo(t, b, key, c.fn)); got.role != RoleHit || got.body != c.whole(1) {
		t.Fatalf("next caller: %v %q %v; want a hit of the finished call", got.role, got.body, got.err)
	}
}

// storedIn reports whether g has an answer of key stored in its memory.
func storedIn(g *Group, key string) bool {
	_, ok := g.cachedWithin(key, 0)
	return ok
}

// Redis lost the meta and the owner put it back (ADR 0010) without the marks of the
// followers elsewhere: a restored flight finishes, never cut while they may wait.
func TestRestoredFlightIsNotCutUnderItsFollowers(t *testing.T) {
	a, b, _ := twoInstances(t, 20*time.Millisecond, false)
	c := newLongCall()
	key := uniqueKey()
	owner := firstChunk(t, a, key, c.fn)
	follower := firstChunk(t, b, key, c.fn)
	owner.Close() // only b's mark keeps the call
	r := a.coord.(*remote)
	if err := r.rdb.Del(context.Background(), r.keys(key).meta).Err(); err != nil {
		t.Fatal(err)
	}
	waitRounds(t, a, 3)
	c.notCut(t)
	close(c.release)
	got := readAll(context.Background(), follower) // its first chunk was read
	if got.err != nil || got.body != "data: call 1 second\n\n" {
		t.Fatalf("follower elsewhere after a restore: %q %v; want the rest of the call", got.body, got.err)
	}
}

// The followers of a flight whose attempts ran out leave no mark on the next flight of the
// key: a call nobody waits for is cut.
func TestMarksOfAFailedFlightDoNotKeepTheNext(t *testing.T) {
	srv := backend{name: "redis", redis: redistest.Start(t)}
	o := Options{AbandonGrace: 20 * time.Millisecond, HeartbeatInterval: 50 * time.Millisecond,
		LeaseTTL: 2 * time.Second, ResultTTL: time.Minute, MaxAttempts: 1}
	a, b := srv.group(t, o), srv.group(t, o)
	key := uniqueKey()
	gate := make(chan struct{})
	failing := failsAt(gate)
	ra := mustDo(t, a, key, failing)
	waitCond(t, 5*time.Second, "a owns", func() bool { return a.flightRole(key) == RoleOwner })
	rb := mustDo(t, b, key, failing)
	waitCond(t, 5*time.Second, "b follows", func() bool { return b.flightRole(key) == RoleFollower })
	close(gate)
	for _, r := range []*Reader{ra, rb} {
		if got := readAll(context.Background(), r); got.head.Status != 500 {
			t.Fatalf("failed flight: %d %v; want its 500", got.head.Status, got.err)
		}
	}
	c := newLongCall()
	firstChunk(t, a, key, c.fn).Close() // a client's retry, which leaves in turn
	c.waitCut(t)
	close(c.release)
}

// Two local flights of one key on a follower's instance (a no-cache caller came while the
// first one's lookup was out) each have a mark of their own: once both have left, the call
// is cut.
func TestTwoLocalFlightsOfAKeyEachUnmark(t *testing.T) {
	a, b, _ := twoInstances(t, 20*time.Millisecond, false)
	c := newLongCall()
	key := uniqueKey()
	owner := firstChunk(t, a, key, c.fn)
	j := newJoining()
	b.hooks.lookingUp = once(func() {
		j.join(b, key, CallOptions{NoCache: true}, c.fn, "", nil) // the first flight's role is not known yet
	})
	x := mustDo(t, b, key, c.fn)
	y := j.take(t)
	if x.f == y.f {
		t.Fatal("the no-cache caller joined the first flight before its lookup")
	}
	for _, rd := range []*Reader{x, y} {
		if _, err := rd.Next(context.Background()); err != nil {
			t.Fatal(err)
		}
	}
	x.Close()
	owner.Close()
	waitRounds(t, a, 3)
	c.notCut(t) // y waits
	y.Close()
	c.waitCut(t)
	close(c.release)
}

// A call kept for a caller that joined here as Redis cut it is cut once that caller leaves.
func TestCallKeptAtTheCutIsCutWhenItsCallerLeaves(t *testing.T) {
	a, _, _ := twoInstances(t, 20*time.Millisecond, true)
	c := newLongCall()
	key := uniqueKey()
	j := newJoining()
	join := once(func() { j.join(a, key, CallOptions{}, c.fn, "", nil) })
	a.hooks.cutAsked = func(bool) { join() }
	firstChunk(t, a, key, c.fn).Close()
	r := j.take(t)
	if _, err := r.Next(context.Background()); err != nil {
		t.Fatal(err)
	}
	r.Close() // the call is for nobody again
	c.waitCut(t)
	close(c.release)
}

// failsAt is an owner function whose call fails with a 500 once gate is closed.
func failsAt(gate <-chan struct{}) Func {
	return func(ctx context.Context, w *Writer) (Result, error) {
		<-gate
		return Result{Outcome: Retry, Head: Head{Status: 500}}, nil
	}
}

// A follower that takes its flight over takes off the mark it left while it followed: that
// mark is its own, not a caller elsewhere's, and once its callers all left the call is cut
// a grace later.
func TestOwnMarkFromFollowingDoesNotKeepTheCall(t *testing.T) {
	a, b, _ := twoInstances(t, 20*time.Millisecond, false)
	key := uniqueKey()
	gate := make(chan struct{})
	ra := mustDo(t, a, key, failsAt(gate))
	waitCond(t, 5*time.Second, "a owns", func() bool { return a.flightRole(key) == RoleOwner })
	c := newLongCall()
	rb := mustDo(t, b, key, c.fn)
	waitCond(t, 5*time.Second, "b follows", func() bool { return b.flightRole(key) == RoleFollower })
	close(gate) // a's call fails: b takes over
	if got := readAll(context.Background(), ra); got.head.Status != 500 {
		t.Fatalf("a's caller: %d %v; want its own call's 500", got.head.Status, got.err)
	}
	if _, err := rb.Next(context.Background()); err != nil {
		t.Fatalf("b's caller: %v; want the first chunk of b's call", err)
	}
	if c.calls.Load() != 1 || b.flightRole(key) != RoleOwner {
		t.Fatalf("b %v with %d calls; want owner of the one call", b.flightRole(key), c.calls.Load())
	}
	b.mu.Lock()
	mark := "w:" + b.rem().markOf(b.flights[key])
	b.mu.Unlock()
	if ok, err := b.rem().rdb.HExists(context.Background(), b.rem().keys(key).meta, mark).Result(); ok || err != nil {
		t.Fatalf("b's mark %s in the meta: %v %v; want it taken off by b's claim", mark, ok, err)
	}
	rb.Close()
	c.waitCut(t)
	close(c.release)
}
