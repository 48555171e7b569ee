package proxy_test

import (
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// An owner shut down mid-flight releases its flight: a follower on another instance takes
// over at once, well before the lease would have run out.
func TestShutdownReleasesToFollowers(t *testing.T) {
	rs := redistest.Start(t)
	up := startUpstream(t)
	up.Set(fakeBehavior{Hold: true}) // the owner's call never answers
	lease := 3 * time.Second
	s := setup{redis: rs, flight: singleflight.Options{LeaseTTL: lease, HeartbeatInterval: time.Second, TakeoverJitter: 50 * time.Millisecond}}
	a, b := newInstance(t, up, s), newInstance(t, up, s)

	started := up.Started()
	ownerDone := make(chan answer, 1)
	go func() { ownerDone <- post(t, a.URL, "/v1/chat/completions", chatBody) }()
	<-started
	followers := make(chan []answer, 1)
	go func() { followers <- burst(t, []*instance{b}, 5, "/v1/chat/completions", chatBody) }()
	waitWaiting(t, []*instance{b}, 5)

	up.Set(fakeBehavior{}) // calls from now on answer at once
	stop := time.Now()
	a.close() // SIGTERM with a short shutdown_timeout: the flight is released
	as := <-followers
	took := time.Since(stop)
	for _, f := range as {
		if f.status != 200 || f.body == "" {
			t.Fatalf("follower got (%d, %q); want 200", f.status, f.body)
		}
	}
	if took >= lease {
		t.Fatalf("followers answered %v after the owner's shutdown; want before the lease (%v) ran out", took, lease)
	}
	if up.Calls() != 2 {
		t.Fatalf("%d upstream calls; want 2 (the released one and the takeover)", up.Calls())
	}
	if v := value(t, b.Reg, "llm_dedupe_takeovers_total", map[string]string{"reason": "shutdown"}); v != 1 {
		t.Fatalf("takeovers_total{reason=shutdown} = %v on the follower's instance; want 1", v)
	}
	<-ownerDone // the owner's own client is answered (with an error) and not left hanging
	t.Logf("takeover after shutdown: %v (lease %v)", took, lease)
}
