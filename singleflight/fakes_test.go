package singleflight

import (
	"context"
	"errors"
	"fmt"
	"strings"
	"sync"
	"sync/atomic"
	"testing"
)

// reply is an owner function that counts its calls and answers body once gate is closed.
type reply struct {
	calls atomic.Int32
	gate  chan struct{}
	body  string
}

func newReply(body string) *reply { return &reply{gate: make(chan struct{}), body: body} }

func (rp *reply) fn(ctx context.Context, w *Writer) (Result, error) {
	rp.calls.Add(1)
	select {
	case <-rp.gate:
	case <-ctx.Done():
		return Result{}, context.Cause(ctx)
	}
	return Result{Head: Head{Status: 200, Header: map[string][]string{"Content-Type": {"application/json"}}}, Body: []byte(rp.body)}, nil
}

func (rp *reply) release() { close(rp.gate) }

// started returns an owner function that signals each call on a channel, then runs next.
func started(ch chan<- struct{}, next Func) Func {
	return func(ctx context.Context, w *Writer) (Result, error) {
		ch <- struct{}{}
		return next(ctx, w)
	}
}

// stuckOwner starts key's flight on g with an owner function that ignores its context and
// returns only when the test ends, and waits until it runs.
func stuckOwner(t *testing.T, g *Group, key string) {
	t.Helper()
	stuck := make(chan struct{})
	running := make(chan struct{}, 1)
	r, err := g.Do(key, false, started(running, func(ctx context.Context, w *Writer) (Result, error) {
		<-stuck // ignores ctx
		return Result{}, errors.New("stuck")
	}))
	if err != nil {
		t.Fatal(err)
	}
	<-running
	t.Cleanup(func() { r.Close(); close(stuck) })
}

// instant is an owner function that answers at once.
func instant(ctx context.Context, w *Writer) (Result, error) {
	return Result{Head: Head{Status: 200}, Body: []byte(`{"ok":true}`)}, nil
}

// deadOwner makes g's heartbeats stop until the returned function is called: to the other
// instances g looks dead (or paused) for that long.
func deadOwner(g *Group) (revive func()) {
	stop := make(chan struct{})
	g.hooks.beforeRenew = func(context.Context) { <-stop }
	var once sync.Once
	return func() { once.Do(func() { close(stop) }) }
}

// streamer is an owner function that writes numbered SSE events, holding the last one
// until hold is closed.
type streamer struct {
	events int
	hold   chan struct{}
	first  chan struct{} // closed once the first event was written
	calls  atomic.Int32  // calls of fn
}

func newStreamer(events int) *streamer {
	return &streamer{events: events, hold: make(chan struct{}), first: make(chan struct{})}
}

func (s *streamer) transcript() string {
	var b strings.Builder
	for i := range s.events {
		fmt.Fprintf(&b, "data: %d\n\n", i)
	}
	return b.String()
}

func (s *streamer) fn(ctx context.Context, w *Writer) (Result, error) {
	s.calls.Add(1)
	w.WriteHead(Head{Status: 200, Header: map[string][]string{"Content-Type": {"text/event-stream"}}})
	for i := range s.events {
		if i == s.events-1 {
			select {
			case <-s.hold:
			case <-ctx.Done():
				return Result{}, context.Cause(ctx)
			}
		}
		if _, err := fmt.Fprintf(w, "data: %d\n\n", i); err != nil {
			return Result{}, err
		}
		if i == 0 {
			close(s.first)
		}
	}
	return Result{Outcome: Store}, nil
}
