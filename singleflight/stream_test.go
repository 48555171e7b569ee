package singleflight

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

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
			for i, r := range readers {
				c, err := r.Next(ctx)
				if err != nil || !strings.HasPrefix(string(c), "data: 0\n\n") {
					t.Fatalf("reader %d: first chunk (%q, %v) before the last was released; want data: 0", i, c, err)
				}
				if r.Head().Status != 200 {
					t.Fatalf("reader %d: status %d; want 200", i, r.Head().Status)
				}
			}
			close(s.hold)
			want := s.transcript()
			if got := readAll(ctx, ra); got.body != want {
				t.Fatalf("owner got %q; want %q", got.body, want)
			}
			for i, r := range readers {
				got := readAll(ctx, r)
				// the first chunk was read above; reassemble
				if got.err != nil || !strings.HasSuffix(want, got.body) || got.role != RoleFollower {
					t.Fatalf("reader %d: got (%q, %v, %v); want the rest of the transcript as follower", i, got.body, got.role, got.err)
				}
			}
			// A late caller (mid-stream joiner or hit) gets the whole transcript from the start.
			if late := doAll(t, groups[len(groups)-1], key, 1, s.fn)()[0]; late.body != want || late.role != RoleHit {
				t.Fatalf("hit: got (%q, %v); want the whole transcript as hit", late.body, late.role)
			}
		})
	}
}

func TestStreamGenerationChange(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{name: "redis", redis: srv}
	o := Options{LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, BatchDelay: time.Millisecond}
	a, f := b.group(t, o), b.group(t, o)
	revive := deadOwner(a)
	defer revive()
	key := uniqueKey()
	dead := newStreamer(3) // writes event 0 and 1, then hangs: the owner "dies"
	ra, _ := a.Do(key, false, dead.fn)
	defer ra.Close()
	<-dead.first

	second := newStreamer(2)
	close(second.hold)
	early, _ := f.Do(key, false, second.fn) // reads a chunk of the dead generation
	ctx, cancel := context.WithTimeout(context.Background(), 10*time.Second)
	defer cancel()
	if c, err := early.Next(ctx); err != nil || !strings.HasPrefix(string(c), "data: 0\n\n") {
		t.Fatalf("early reader: (%q, %v); want data: 0", c, err)
	}
	fresh, _ := f.Do(key, false, second.fn) // joins but reads nothing before the takeover
	f.mu.Lock()
	fl := f.flights[key]
	f.mu.Unlock()
	// Wait until the flight has moved to the new generation before fresh reads.
	for {
		fl.mu.Lock()
		done, ch := fl.ended, fl.changed
		fl.mu.Unlock()
		if done {
			break
		}
		<-ch
	}
	var err error
	for err == nil {
		_, err = early.Next(ctx)
	}
	early.Close()
	if !errors.Is(err, ErrGenerationChanged) {
		t.Fatalf("early reader: %v; want ErrGenerationChanged", err)
	}
	if got := readAll(ctx, fresh); got.err != nil || got.body != second.transcript() {
		t.Fatalf("fresh reader: (%q, %v); want the new generation %q", got.body, got.err, second.transcript())
	}
}
