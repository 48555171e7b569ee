package singleflight

import (
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// A short Redis outage (a restart without persistence) costs no call, however long the
// follower had been waiting when it came. Before, a follower that had waited past the lease
// its lookup gave it (its owner's alive messages extending the wait) forgot those messages
// as soon as Redis stopped answering: it knew only the lease of its lookup, long run out, and
// took the flight over at once, on every following instance.
func TestFollowerWaitsOutARedisRestartLateInItsWait(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	recA, recB := newRecorder(), newRecorder()
	o := Options{LeaseTTL: 1500 * time.Millisecond, HeartbeatInterval: 300 * time.Millisecond, ResultTTL: time.Minute}
	oa, ob := o, o
	oa.Observer, ob.Observer = recA, recB
	a, other := b.group(t, oa), b.group(t, ob)
	key := uniqueKey()
	rp := newReply("call 1")
	running := make(chan struct{}, 2)
	fn := started(running, rp.fn)
	led := doAsync(t, a, key, CallOptions{Inline: true}, fn)
	<-running
	follower, err := other.Do(key, false, fn)
	if err != nil {
		t.Fatal(err)
	}
	recB.waitMatch(t, "the other instance follows", func(e Event) bool { return e.Kind == EventRole && e.Role == RoleFollower }, 5*time.Second)
	// Renewal rounds for more than the lease the follower's lookup gave it: from then on
	// only the owner's alive messages keep it waiting.
	from := a.remote.renewer.round.Load()
	waitCond(t, 10*time.Second, "renewals past the follower's first lease", func() bool {
		return a.remote.renewer.round.Load() >= from+int64(o.LeaseTTL/o.HeartbeatInterval)+2
	})

	srv.Stop()
	recB.waitFor(t, EventDegraded, 1, 5*time.Second) // the follower's instance saw it
	srv.Restart()
	recB.waitFor(t, EventRecovered, 1, 10*time.Second)
	rp.release()

	if out := readWithin(<-led, 10*time.Second); out.err != nil || out.body != "call 1" {
		t.Fatalf("owner got (%q, %v); want call 1", out.body, out.err)
	}
	if out := readWithin(follower, 10*time.Second); out.err != nil || out.body != "call 1" || out.role != RoleFollower {
		t.Fatalf("follower got (%q, %v, %v); want call 1 as a follower", out.body, out.role, out.err)
	}
	if n, tk := rp.calls.Load(), recB.count(EventTakeover); n != 1 || tk != 0 {
		t.Fatalf("%d upstream calls, %d takeovers by the follower's instance; want 1 and 0", n, tk)
	}
}
