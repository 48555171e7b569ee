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

// Redis loses a running flight (a restart without persistence, a failover to a replica that
// had not received the claim): the owner puts its meta back with its next renewal, while
// its lease runs, so that a new identical request follows it instead of calling again, and
// a follower that already streams bytes of it reads on. (The new request cannot read the
// lost entries: it gets the answer whole, when it is stored.)
func TestOwnerRestoresLostFlight(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	o := Options{LeaseTTL: 600 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, BatchDelay: time.Millisecond, ResultTTL: time.Minute}
	a, bg, cg := b.group(t, o), b.group(t, o), b.group(t, o)
	key := uniqueKey()
	s := newStreamer(3)
	fn := s.fn
	ra, _ := a.Do(key, false, fn)
	ownerOut := readStream(context.Background(), ra)
	<-s.first
	rc, _ := cg.Do(key, false, fn)
	early := readStream(context.Background(), rc)
	<-early.first

	ctx := context.Background()
	rdb := srv.Client()
	if err := rdb.FlushAll(ctx).Err(); err != nil {
		t.Fatalf("FLUSHALL: %v", err)
	}
	meta := "ai:flight:meta:{" + key + "}"
	// No event tells a test that a script ran.
	waitCond(t, 5*time.Second, "the owner puts its lost flight back", func() bool { return rdb.Exists(ctx, meta).Val() == 1 })
	late := readStream(ctx, func() *Reader { r, _ := bg.Do(key, false, fn); return r }())
	close(s.hold)
	for name, sr := range map[string]*streamReader{"owner": ownerOut, "early follower": early, "late follower": late} {
		if out := <-sr.done; out.err != nil || out.body != s.transcript() {
			t.Errorf("%s got (%q, %v); want (%q, nil)", name, out.body, out.err, s.transcript())
		}
	}
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("%d upstream calls; want 1", n)
	}
}

// A Redis that restarts empty after being down longer than an owner's lease: the flight's
// meta is gone and the owner cannot put it back (its lease ran out: another might have
// taken the flight over and finished it meanwhile). Its call goes on for the callers in
// its process, which get its answer, and its final write is refused. (The owner used to
// take the missing meta for another owner's and cancel its call: its callers then waited
// for a second call, and the log said another instance took over when none had.)
func TestOwnerKeepsItsCallWhenRedisLostFlightPastLease(t *testing.T) {
	srv := redistest.Start(t)
	for _, stream := range []bool{false, true} {
		t.Run(map[bool]string{false: "unary", true: "stream"}[stream], func(t *testing.T) {
			o := Options{LeaseTTL: 600 * time.Millisecond, HeartbeatInterval: 200 * time.Millisecond, ResultTTL: time.Minute, BatchDelay: time.Millisecond}
			rec := newRecorder()
			o.Observer = rec
			a := backend{redis: srv}.group(t, o)
			key := uniqueKey()
			s := newStreamer(3) // a stream: its last event waits for s.hold
			gate, want := s.hold, s.transcript()
			if !stream {
				want = "call 1"
			}
			running := make(chan struct{}, 2)
			var calls atomic.Int32
			cancelled := make(chan error, 2)
			fn := func(ctx context.Context, w *Writer) (res Result, err error) {
				n := calls.Add(1)
				running <- struct{}{}
				// Seen however late: a fenced append cancels the call as its last
				// batch is flushed, after the function returned.
				context.AfterFunc(ctx, func() {
					if cause := context.Cause(ctx); errors.Is(cause, ErrLeaseLost) {
						cancelled <- cause
					}
				})
				if stream {
					return s.fn(ctx, w)
				}
				select {
				case <-gate:
					return Result{Head: Head{Status: 200}, Body: []byte(fmt.Sprintf("call %d", n))}, nil
				case <-ctx.Done():
					return Result{}, context.Cause(ctx)
				}
			}
			led := doAsync(t, a, key, CallOptions{Inline: !stream}, fn)
			<-running
			local, err := a.Do(key, false, fn)
			if err != nil {
				t.Fatal(err)
			}
			srv.Stop()
			time.Sleep(2 * o.LeaseTTL) // the outage: longer than the lease
			srv.Restart()
			// The owner's first renewal to reach the restarted Redis finds the flight gone.
			rec.waitMatch(t, "a renewal finds the flight gone", func(e Event) bool {
				return e.Kind == EventHeartbeatFailed && errors.Is(e.Err, ErrFlightGone)
			}, 5*time.Second)
			select {
			case err := <-cancelled:
				t.Fatalf("the owner's call was cancelled (%v); want it to go on", err)
			default:
			}
			close(gate)
			roles := map[string]Role{"owner": RoleOwner, "owner's local caller": RoleFollower}
			for name, r := range map[string]*Reader{"owner": <-led, "owner's local caller": local} {
				if out := readWithin(r, 5*time.Second); out.err != nil || out.body != want || out.role != roles[name] {
					t.Errorf("%s got (%q, %v, %v); want (%q, %v)", name, out.body, out.role, out.err, want, roles[name])
				}
			}
			select {
			case err := <-cancelled:
				t.Fatalf("the owner's call was cancelled (%v); want it to go on", err)
			default:
			}
			if n := calls.Load(); n != 1 {
				t.Fatalf("%d upstream calls; want 1", n)
			}
			if srv.Client().Exists(context.Background(), "ai:flight:result:{"+key+"}").Val() != 0 {
				t.Fatal("the owner stored its answer in a flight it no longer held")
			}
		})
	}
}
