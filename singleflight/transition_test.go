package singleflight

import (
	"strings"
	"testing"
)

// TestTransitionOutsideTheTablePanics: a move a transition table does not list panics
// where the state changes, and one it lists does not, for every pair of states of the
// lead and of the follower. The machines' own tests run with the same check.
func TestTransitionOutsideTheTablePanics(t *testing.T) {
	panics := func(fn func()) (msg string) {
		defer func() {
			if r := recover(); r != nil {
				msg, _ = r.(string)
				if msg == "" {
					msg = "panic"
				}
			}
		}()
		fn()
		return ""
	}
	for from := range leadDetached + 1 {
		for next := range leadDetached + 1 {
			msg := panics(func() { leadMoves.check("lead", from, next) })
			if allowed := leadMoves.allows(from, next); allowed != (msg == "") {
				t.Errorf("lead %d → %d: in the table %v, panicked %q", from, next, allowed, msg)
			}
		}
	}
	for from := range followHeld + 1 {
		for next := range followHeld + 1 {
			msg := panics(func() { followMoves.check("follow", from, next) })
			if allowed := followMoves.allows(from, next); allowed != (msg == "") {
				t.Errorf("follow %d → %d: in the table %v, panicked %q", from, next, allowed, msg)
			}
		}
	}
	if msg := panics(func() { leadMoves.check("lead", leadEnded, leadLookup) }); !strings.Contains(msg, "may not follow") {
		t.Errorf("a move out of leadEnded panicked %q; want the table's refusal", msg)
	}
	if msg := panics(func() { followMoves.check("follow", followAlive, followEnded) }); !strings.Contains(msg, "may not follow") {
		t.Errorf("followAlive → followEnded panicked %q; want the table's refusal", msg)
	}
}

// TestTransitionTablesCoverEveryState: each table has a row for every state of its enum,
// and every state but the first is reached from some other.
func TestTransitionTablesCoverEveryState(t *testing.T) {
	if got, want := len(leadMoves), int(leadDetached)+1; got != want {
		t.Errorf("leadMoves has %d rows; want %d", got, want)
	}
	if got, want := len(followMoves), int(followHeld)+1; got != want {
		t.Errorf("followMoves has %d rows; want %d", got, want)
	}
	for next := leadClaim; next <= leadDetached; next++ {
		reached := false
		for from := range leadDetached + 1 {
			reached = reached || leadMoves.allows(from, next)
		}
		if !reached {
			t.Errorf("lead state %d follows no state", next)
		}
	}
	for next := followRead; next <= followHeld; next++ {
		reached := false
		for from := range followHeld + 1 {
			reached = reached || followMoves.allows(from, next)
		}
		if !reached {
			t.Errorf("follow state %d follows no state", next)
		}
	}
}
