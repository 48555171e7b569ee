package wake

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// newHub returns a hub on a redis-server of its own, of string entries, stopped with the test.
func newHub(t *testing.T) *Hub[string] {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { cancel(); wg.Wait() })
	return New(Config[string]{Redis: redistest.Start(t).Client(), Ctx: ctx, WG: &wg, AlivePrefix: "test:alive:",
		Lease: time.Second, KeepIdle: 5 * time.Second, Decode: func(p string) (string, bool) { return p, true }})
}

func waitCond(t *testing.T, within time.Duration, what string, cond func() bool) {
	t.Helper()
	redistest.WaitUntil(t, within, what, func() (bool, string) { return cond(), "" })
}

// TestWatchHandsOverWhatCameOnce: a watch hands over the entries pushed and the tokens
// said gone once each, asks a watcher of a channel already subscribed to read the stream
// first, and its channel leaves the hub's books when its last watcher closes.
func TestWatchHandsOverWhatCameOnce(t *testing.T) {
	hub := newHub(t)
	ch := "test:stream:{k}"
	first, err := hub.Watch(ch)
	if err != nil {
		t.Fatal(err)
	}
	waitCond(t, 10*time.Second, "the channel confirmed", func() bool { return hub.UnconfirmedSince(ch).IsZero() })
	second, err := hub.Watch(ch)
	if err != nil {
		t.Fatal(err)
	}
	if resync, _ := second.Take(); !resync {
		t.Error("a watch of a channel already subscribed was not asked to read the stream")
	}
	e := "1-1 chunk x"
	hub.each(ch, func(w *Watch[string]) {
		w.mu.Lock()
		w.queue = append(w.queue, e)
		w.gone = append(w.gone, "1-a-1")
		w.mu.Unlock()
	})
	for _, w := range []*Watch[string]{first, second} {
		select {
		case <-w.Notify():
		default:
			t.Error("a watch was not woken by what came")
		}
		if _, got := w.Take(); len(got) != 1 || got[0] != e {
			t.Errorf("Take() = %v; want the one entry pushed", got)
		}
		if _, got := w.Take(); len(got) != 0 {
			t.Errorf("Take() again = %v; want nothing", got)
		}
		if got := w.TakeGone(); !slices.Equal(got, []string{"1-a-1"}) || len(w.TakeGone()) != 0 {
			t.Errorf("TakeGone() = %v, then more; want the token once", got)
		}
	}
	first.Close()
	if !hub.Watched(ch) {
		t.Error("the channel has no watcher while one is open")
	}
	second.Close()
	if hub.Watched(ch) {
		t.Error("the channel is still watched after its last watch closed")
	}
}
