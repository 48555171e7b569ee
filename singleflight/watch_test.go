package singleflight

import (
	"slices"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestWatchHandsOverWhatCameOnce: a watch hands over the entries pushed and the tokens
// said gone once each, asks a watcher of a channel already subscribed to read the stream
// first, and its channel leaves the hub's books when its last watcher closes.
func TestWatchHandsOverWhatCameOnce(t *testing.T) {
	g := backend{name: "redis", redis: redistest.Start(t)}.group(t, Options{})
	hub := g.rem().wake
	ch := g.rem().keys(uniqueKey()).stream
	first, err := hub.watch(ch)
	if err != nil {
		t.Fatal(err)
	}
	waitCond(t, 10*time.Second, "the channel confirmed", func() bool { return hub.unconfirmedSince(ch).IsZero() })
	second, err := hub.watch(ch)
	if err != nil {
		t.Fatal(err)
	}
	if resync, _ := second.take(); !resync {
		t.Error("a watch of a channel already subscribed was not asked to read the stream")
	}
	e := entry{id: "1-1", kind: entryChunk, data: "x"}
	hub.each(ch, func(w *watch) {
		w.mu.Lock()
		w.queue = append(w.queue, e)
		w.gone = append(w.gone, "1-a-1")
		w.mu.Unlock()
	})
	for _, w := range []*watch{first, second} {
		select {
		case <-w.notify:
		default:
			t.Error("a watch was not woken by what came")
		}
		if _, got := w.take(); len(got) != 1 || got[0] != e {
			t.Errorf("take() = %v; want the one entry pushed", got)
		}
		if _, got := w.take(); len(got) != 0 {
			t.Errorf("take() again = %v; want nothing", got)
		}
		if got := w.takeGone(); !slices.Equal(got, []string{"1-a-1"}) || len(w.takeGone()) != 0 {
			t.Errorf("takeGone() = %v, then more; want the token once", got)
		}
	}
	first.close()
	if !hub.watched(ch) {
		t.Error("the channel has no watcher while one is open")
	}
	second.close()
	if hub.watched(ch) {
		t.Error("the channel is still watched after its last watch closed")
	}
}
