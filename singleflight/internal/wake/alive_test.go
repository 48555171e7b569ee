package wake

import (
	"slices"
	"testing"
	"time"
)

// TestAliveMessagesWakeOnlyOnNews: an alive message that names no token wakes no watcher
// of its channel and moves its until; one that names a token newly unrenewed, or a token gone,
// wakes them, and the unrenewed token keeps the until of the last message that did not name it.
func TestAliveMessagesWakeOnlyOnNews(t *testing.T) {
	hub := newHub(t)
	ch := hub.AliveChannel("owner")
	w, err := hub.Watch(ch)
	if err != nil {
		t.Fatal(err)
	}
	defer w.Close()
	waitCond(t, 10*time.Second, "the channel confirmed", func() bool { return hub.UnconfirmedSince(ch).IsZero() })
	woken := func() bool {
		select {
		case <-w.Notify():
			return true
		default:
			return false
		}
	}
	woken() // the confirmation's
	hub.Heard(ch, nil)
	first, moving := hub.AliveUntil(ch, "tok")
	if woken() || first.IsZero() || !moving {
		t.Fatalf("a plain alive message: until %v (moving %v), or it woke a watcher; want a moving until, nobody woken", first, moving)
	}
	hub.Heard(ch, []string{UnrenewedMark + "tok"})
	if !woken() {
		t.Error("a token newly unrenewed woke nobody")
	}
	if until, moving := hub.AliveUntil(ch, "tok"); moving || !until.Equal(first) {
		t.Errorf("AliveUntil(unrenewed) = %v, moving %v; want %v, fixed", until, moving, first)
	}
	hub.Heard(ch, []string{UnrenewedMark + "tok"})
	if woken() {
		t.Error("a token still unrenewed woke its watchers again")
	}
	hub.Heard(ch, []string{"gone"})
	if !woken() {
		t.Error("a token gone woke nobody")
	}
	if got := w.TakeGone(); !slices.Equal(got, []string{"gone"}) {
		t.Errorf("TakeGone() = %v; want [gone]", got)
	}
}
