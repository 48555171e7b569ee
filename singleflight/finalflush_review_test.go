package singleflight

import (
	"context"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// A complete refused at the end still serves the owner's local readers: they hold a whole
// answer (doc.go, "Owner suicide"). The same answer is cut off when what gets refused is
// the final flush of the bytes still pending as the owner function returned: own() takes
// the Writer's ErrLeaseLost for a lost attempt, abandons the generation, and the local
// reader that already has bytes of it gets ErrGenerationChanged, although its upstream
// call returned the whole answer. Whether a reader is served then depends only on whether
// the last write was still waiting for its batch.
//
// Interleaving: the owner streams "A" (appended at once) and "B" (waiting for the batch
// delay); its renewals stall; its lease runs out and another instance takes over; the
// owner function then returns; the final flush of "B" is fenced.
func TestFencedFinalFlushStillServesLocalReaders(t *testing.T) {
	srv := redistest.Start(t)
	b := backend{redis: srv}
	o := Options{LeaseTTL: 400 * time.Millisecond, HeartbeatInterval: 100 * time.Millisecond, BatchDelay: 3 * time.Second}
	a, c := b.group(t, o), b.group(t, o)
	stall := make(chan struct{})
	a.hooks.beforeRenew = func(ctx context.Context) {
		select {
		case <-stall:
		case <-ctx.Done():
		}
	}
	defer close(stall)
	key := uniqueKey()
	wrote, proceed := make(chan struct{}), make(chan struct{})
	ra, _ := a.Do(key, false, func(ctx context.Context, w *Writer) (Result, error) {
		w.WriteHead(Head{Status: 200})
		_, _ = w.Write([]byte("A"))
		time.Sleep(100 * time.Millisecond) // "A" is appended alone, at once
		_, _ = w.Write([]byte("B"))        // waits for the batch
		close(wrote)
		<-proceed
		return Result{Outcome: Share}, nil
	})
	<-wrote
	owner := readStream(context.Background(), ra)
	<-owner.first

	// Another instance follows, and takes over once a's lease ran out (its reader has
	// delivered nothing, so it can use a new attempt).
	took := make(chan struct{})
	second := newReply("second")
	defer second.release()
	rc, _ := c.Do(key, false, started(took, second.fn))
	defer rc.Close()
	select {
	case <-took:
	case <-time.After(3 * time.Second):
		t.Fatal("no takeover within 3s")
	}
	close(proceed) // the owner function returns its whole answer; the flush of "B" is fenced
	select {
	case out := <-owner.done:
		if out.err != nil || out.body != "AB" {
			t.Fatalf("owner's reader got (%q, %v); want the whole answer it was streaming, (\"AB\", nil)", out.body, out.err)
		}
	case <-time.After(3 * time.Second):
		t.Fatal("owner's reader still waiting after 3s")
	}
}
