package wake

import (
	"context"
	"slices"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/redis/go-redis/v9"
)

// TestConnectionLeavesAServerThatHangs: where Config.Node chooses, a connection whose
// server hangs (connections accepted, nothing answered) while a follower waits on it leaves
// a PING unanswered, which Config.Unanswered is told; the connection moves to the other
// server, subscribes the channel there, has its watcher read the stream, and delivers what
// is published there. Two servers stand for two masters of a Cluster (ADR 0081).
func TestConnectionLeavesAServerThatHangs(t *testing.T) {
	s1, s2 := redistest.Start(t), redistest.Start(t)
	c1, c2 := s1.Client(), s2.Client()
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	t.Cleanup(func() { s1.Resume(); cancel(); wg.Wait() })
	var mu sync.Mutex
	var unanswered []string
	hub := New(Config[string]{Redis: c1, Ctx: ctx, WG: &wg, AlivePrefix: "test:alive:", Lease: time.Second,
		KeepIdle: 5 * time.Second, Decode: func(p string) (string, bool) { return p, true },
		Node: func(avoid string) (redis.UniversalClient, string) {
			if avoid == s1.Addr {
				return c2, s2.Addr
			}
			return c1, s1.Addr
		},
		Unanswered: func(node string) { mu.Lock(); unanswered = append(unanswered, node); mu.Unlock() },
	})
	ch := "test:stream:{k}"
	w, err := hub.Watch(ch)
	if err != nil {
		t.Fatal(err)
	}
	waitCond(t, 10*time.Second, "the channel confirmed", func() bool { return hub.UnconfirmedSince(ch).IsZero() })
	if n := hub.Node(); n != s1.Addr {
		t.Fatalf("the connection is on %q; want %s, the first Node gave", n, s1.Addr)
	}
	w.Take()

	s1.Pause()
	paused := time.Now()
	waitCond(t, 10*time.Second, "the connection on the other server, the channel confirmed there", func() bool {
		return hub.Node() == s2.Addr && hub.UnconfirmedSince(ch).IsZero()
	})
	if took := time.Since(paused); took > 4*ConfirmWithin {
		t.Errorf("the connection left the hung server %v after it hung; want within a few ConfirmWithin (%v)", took, ConfirmWithin)
	}
	mu.Lock()
	told := slices.Clone(unanswered)
	mu.Unlock()
	if !slices.Equal(told, []string{s1.Addr}) {
		t.Errorf("Unanswered was told %q; want the hung server, %s, once", told, s1.Addr)
	}
	if resync, _ := w.Take(); !resync {
		t.Error("the watcher was not asked to read the stream after the connection moved")
	}
	if err := c2.Publish(context.Background(), ch, "after the move").Err(); err != nil {
		t.Fatal(err)
	}
	deadline := time.After(5 * time.Second)
	for {
		select {
		case <-w.Notify():
		case <-deadline:
			t.Fatal("a message published on the other server did not reach the watcher")
		}
		if _, got := w.Take(); len(got) > 0 {
			if !slices.Equal(got, []string{"after the move"}) {
				t.Fatalf("the watcher took %q; want the message published after the move", got)
			}
			return
		}
	}
}
