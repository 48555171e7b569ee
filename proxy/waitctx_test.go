package proxy

import (
	"context"
	"errors"
	"testing"
	"time"
)

// TestWaitCtx: the lazily made wait context ends when the request's ends, when the
// handoff wakes it (before or after the wait began) and when it is released, and
// context.Cause sees why, as with context.WithCancel.
func TestWaitCtx(t *testing.T) {
	ended := func(c context.Context) bool {
		select {
		case <-c.Done():
			return true
		case <-time.After(10 * time.Millisecond):
			return false
		}
	}
	t.Run("woken before the wait", func(t *testing.T) {
		c := &waitCtx{Context: context.Background()}
		c.wake()
		if !ended(c) || !errors.Is(c.Err(), context.Canceled) {
			t.Fatalf("Done and Err %v after wake; want ended, Canceled", c.Err())
		}
	})
	t.Run("woken during the wait", func(t *testing.T) {
		c := &waitCtx{Context: context.Background()}
		if ended(c) || c.Err() != nil {
			t.Fatal("ended before anything ended it")
		}
		c.wake()
		if !ended(c) {
			t.Fatal("not ended after wake")
		}
	})
	t.Run("request ends", func(t *testing.T) {
		why := errors.New("client left")
		req, cancel := context.WithCancelCause(context.WithValue(context.Background(), stateKey{}, "v"))
		c := &waitCtx{Context: req}
		if c.Value(stateKey{}) != "v" {
			t.Fatal("the request's values are not seen")
		}
		cancel(why)
		if !ended(c) || !errors.Is(context.Cause(c), why) {
			t.Fatalf("cause %v; want %v", context.Cause(c), why)
		}
	})
	t.Run("released", func(t *testing.T) {
		c := &waitCtx{Context: context.Background()}
		c.release() // never waited: nothing to free
		c = &waitCtx{Context: context.Background()}
		done := c.Done()
		c.release()
		select {
		case <-done:
		default:
			t.Fatal("not ended by release")
		}
	})
}
