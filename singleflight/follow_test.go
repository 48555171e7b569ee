package singleflight

import (
	"context"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/faultproxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

func TestStreamLiveAcrossGroups(t *testing.T) {
	for _, b := range backends(t) {
		t.Run(b.name, func(t *testing.T) {
			o := Options{ResultTTL: time.Minute, BatchDelay: time.Millisecond}
			a := b.group(t, o)
			groups := []*Group{a}
			if b.redis != nil {
				groups = append(groups, b.group(t, o), b.group(t, o))
			}
			key := uniqueKey()
			s := newStreamer(5)
			ra, _ := a.Do(key, false, s.fn)
			<-s.first
			// Every caller, on every instance, gets the first event while the owner still
			// holds the last one: fan-out is live, not buffered.
			var readers []*Reader
			for _, g := range groups {
				for range 3 {
					r, _ := g.Do(key, false, s.fn)
					readers = append(readers, r)
				}
			}
			ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
			defer cancel()
			firsts := make([]string, len(readers))
			for i, r := range readers {
				c, err := r.Next(ctx)
				if err != nil || !strings.HasPrefix(string(c), "data: 0\n\n") {
					t.Fatalf("reader %d: first chunk (%q, %v) before the last was released; want data: 0", i, c, err)
				}
				if r.Head().Status != 200 {
					t.Fatalf("reader %d: status %d; want 200", i, r.Head().Status)
				}
				firsts[i] = string(c)
			}
			close(s.hold)
			want := s.transcript()
			if got := readAll(ctx, ra); got.body != want {
				t.Fatalf("owner got %q; want %q", got.body, want)
			}
			for i, r := range readers {
				got := readAll(ctx, r)
				// The first chunk was read above: with the rest, the whole transcript.
				if got.err != nil || firsts[i]+got.body != want || got.role != RoleFollower {
					t.Fatalf("reader %d: got %q then (%q, %v, %v); want the whole transcript as follower", i, firsts[i], got.body, got.role, got.err)
				}
			}
			// A late caller (mid-stream joiner or hit) gets the whole transcript from the start.
			if late := doAll(t, groups[len(groups)-1], key, 1, s.fn)()[0]; late.body != want || late.role != RoleHit {
				t.Fatalf("hit: got (%q, %v); want the whole transcript as hit", late.body, late.role)
			}
		})
	}
}

// A follower whose owner completes between the follower's lookup and its first read gets
// the answer from that read: it misses no entry written before it, and waits for no lease.
func TestFollowerMissesNoEntryWrittenBeforeItsFirstRead(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	// A long lease: a follower that missed the done entry would wait for it to run out.
	o := Options{LeaseTTL: 30 * time.Second, HeartbeatInterval: 10 * time.Second}
	a, f := b.group(t, o), b.group(t, o)
	key := uniqueKey()
	rp := newReply("late")
	running := make(chan struct{}, 1)
	ra, _ := a.Do(key, false, started(running, rp.fn))
	defer ra.Close()
	<-running
	// Between the follower's lookup and its first read, the owner completes.
	f.hooks.beforeFollow = func() {
		rp.release()
		readAll(context.Background(), ra)
	}
	start := time.Now()
	out := doAll(t, f, key, 1, rp.fn)()[0]
	if out.body != "late" || out.role != RoleFollower {
		t.Fatalf("got (%q, %v, %v); want (late, follower)", out.body, out.role, out.err)
	}
	if d := time.Since(start); d > 10*time.Second {
		t.Fatalf("follower took %v: it missed the entry written before its read", d)
	}
}

// The interleavings at a flight's end, each driven on a real Redis with the package's hooks:
// a follower of another instance that already holds bytes of an answer must read that
// answer to its end, whatever happens to the key around it, and an answer that completed
// must never be asked of the upstream a second time.

// silentOwner makes g's heartbeats, and so its alive messages, stop once the returned
// function is called, as when its process dies after its followers have heard it for a
// while.
func silentOwner(g *Group) (silence func()) {
	var silent atomic.Bool
	g.hooks.beforeRenew = func(ctx context.Context) {
		if silent.Load() {
			<-ctx.Done()
		}
	}
	return func() { silent.Store(true) }
}

// A follower that heard its owner's instance say it is alive after its look-up, so that the
// last alive message's lease ends after the lease the look-up gave it, and then heard no
// more: the hub's silence timer wakes it a lease after the last message, and it must look
// its flight up then and take over, not park again until its trust runs out. The follow is
// made ten leases old first, so that the trust outlasts a lease by ten (ADR 0082).
func TestFollowerTakesOverWhenOwnerFallsSilent(t *testing.T) {
	b := backend{name: "redis", redis: redistest.Start(t)}
	o := Options{LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, Timeout: time.Minute}
	a, fg := b.group(t, o), b.group(t, o)
	silence := silentOwner(a)
	key := uniqueKey()
	first := newReply("first")
	defer first.release()
	running := make(chan struct{}, 1)
	ra, _ := a.Do(key, false, started(running, first.fn))
	defer ra.Close()
	<-running

	heard := make(chan struct{}, 1)
	fg.hooks.aliveHeard = func() {
		select {
		case heard <- struct{}{}:
		default:
		}
	}
	looked := make(chan decision, 16)
	fg.hooks.looked = func(d decision) {
		select {
		case looked <- d:
		default:
		}
	}
	second := newReply("second")
	second.release()
	followed := time.Now()
	rf, _ := fg.Do(key, false, second.fn)
	waitCond(t, 5*time.Second, "following", func() bool { return fg.flightRole(key) == RoleFollower })
	// Each look that finds the attempt running trusts the alive messages for the follow's
	// age: the first look once the follow is ten leases old trusts them ten leases on.
	for {
		select {
		case d := <-looked:
			if d.verdict != verdictFollow {
				t.Fatalf("look found %v; want the attempt running", d.verdict)
			}
		case <-time.After(10 * o.LeaseTTL):
			t.Fatal("no look within ten leases")
		}
		if time.Since(followed) >= 10*o.LeaseTTL {
			break
		}
	}
	channel := fg.rem().wake.AliveChannel(a.opts.InstanceID)
	waitCond(t, 5*time.Second, "alive recorded", func() bool {
		until, _ := fg.rem().wake.AliveUntil(channel, "")
		return !until.IsZero()
	})
	<-heard
	<-heard
	silence()
	start := time.Now()
	if got := readWithin(rf, 5*o.LeaseTTL); got.body != "second" {
		t.Fatalf("follower of a silent owner got (%q, %v) after %v; want a takeover once a lease passed without alive messages (~%v), not once its trust of %v ran out",
			got.body, got.err, time.Since(start).Round(time.Millisecond), o.LeaseTTL, 10*o.LeaseTTL)
	}
}

// stillStreaming fails t if the stream read by s has ended.
func stillStreaming(t *testing.T, who string, s *streamReader) {
	t.Helper()
	select {
	case out := <-s.done:
		t.Fatalf("%s ended while Redis was out of reach: (%q, %v); want it to wait for Redis", who, out.body, out.err)
	default:
	}
}

// wantWhole waits for the stream read by s and checks it is want, without an error.
func wantWhole(t *testing.T, who string, s *streamReader, want string) {
	t.Helper()
	select {
	case out := <-s.done:
		if out.err != nil || out.body != want {
			t.Fatalf("%s got (%q, %v); want the whole stream %q", who, out.body, out.err, want)
		}
	case <-time.After(10 * time.Second):
		t.Fatalf("%s: no end within 10s of Redis answering again", who)
	}
}

// A follower whose callers have bytes of a stream cannot use a call of its own when its
// instance loses Redis: it waits for Redis to answer again, however long past the lease,
// then reads the stream on from where it was. Here its instance alone is cut off (a
// partition): the owner ends and writes its answer meanwhile (ADR 0060).
func TestFollowerWithBytesOutlastsItsInstancesPartition(t *testing.T) {
	srv := redistest.Start(t)
	a := backend{redis: srv}.group(t, outageOpts)
	f, link, confirmed := behindLink(t, srv, outageOpts)
	key := uniqueKey()
	s := newStreamer(3)
	ra, err := a.Do(key, false, s.fn)
	if err != nil {
		t.Fatal(err)
	}
	<-s.first
	rf, err := f.Do(key, false, s.fn)
	if err != nil {
		t.Fatal(err)
	}
	sf := readStream(context.Background(), rf)
	<-sf.first

	link.Set(faultproxy.Fault{Mode: faultproxy.Hang})
	findsHanging(t, f, key, confirmed)
	close(s.hold)
	if out := readWithin(ra, 5*time.Second); out.err != nil || out.body != s.transcript() {
		t.Fatalf("owner got (%q, %v); want the whole stream", out.body, out.err)
	}
	time.Sleep(2 * outageOpts.LeaseTTL) // the fault itself: cut off past the owner's lease
	stillStreaming(t, "follower", sf)
	link.Set(faultproxy.Fault{})
	wantWhole(t, "follower", sf, s.transcript())
	if n := s.calls.Load(); n != 1 {
		t.Fatalf("%d upstream calls; want 1", n)
	}
}

// A follower that waited an outage out for its callers with bytes does not wait for its
// whole bound when its owner did not outlast the outage: a lease after Redis answers
// again, with no renewal nor final write from the owner, its stream ends (ADR 0060).
func TestFollowerWithBytesEndsALeaseAfterAnOutageItsOwnerDidNotOutlast(t *testing.T) {
	srv := redistest.Start(t)
	a := backend{redis: srv}.group(t, outageOpts)
	silence := silentOwner(a)
	f, link, confirmed := behindLink(t, srv, outageOpts)
	key := uniqueKey()
	s := newStreamer(3)
	defer close(s.hold)
	ra, err := a.Do(key, false, s.fn)
	if err != nil {
		t.Fatal(err)
	}
	defer ra.Close()
	<-s.first
	rf, err := f.Do(key, false, s.fn)
	if err != nil {
		t.Fatal(err)
	}
	sf := readStream(context.Background(), rf)
	<-sf.first

	silence() // the owner stops renewing, and writes nothing more
	link.Set(faultproxy.Fault{Mode: faultproxy.Hang})
	findsHanging(t, f, key, confirmed)
	time.Sleep(2 * outageOpts.LeaseTTL) // the fault itself: cut off past the owner's lease
	stillStreaming(t, "follower", sf)
	link.Set(faultproxy.Fault{})
	healed := time.Now()
	limit := 3*outageOpts.LeaseTTL + time.Second
	select {
	case out := <-sf.done:
		if out.err == nil {
			t.Fatalf("follower got (%q) whole; want its stream cut short, its owner gone", out.body)
		}
	case <-time.After(limit):
		t.Fatalf("follower still waiting %v after Redis answered; want its stream ended about a lease after", limit)
	}
	t.Logf("ended %v after Redis answered", time.Since(healed).Round(time.Millisecond))
}
