package poll

import (
	"context"
	"testing"
	"time"
)

// TestSleepEndsWithItsContext: Sleep waits its duration out, and ends early (false) when
// its context ends.
func TestSleepEndsWithItsContext(t *testing.T) {
	if !Sleep(context.Background(), time.Millisecond) {
		t.Fatal("Sleep(background, 1ms) = false; want true")
	}
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if Sleep(ctx, time.Hour) {
		t.Fatal("Sleep(ended, 1h) = true; want false")
	}
}
