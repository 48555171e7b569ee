package singleflight

import (
	"context"
	"errors"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// A flight taken over moves to a new generation: its reader that had bytes of the dead one
// gets ErrGenerationChanged; one that had read nothing reads the new generation whole.
func TestGenerationChangeFailsOnlyReadersWithBytes(t *testing.T) {
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
