package e2e

import (
	"context"
	"errors"
	"fmt"
	"math/rand/v2"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// abandonGrace is the proxies' flight.abandon_grace in these scenarios.
const abandonGrace = 500 * time.Millisecond

// slowStream is a stream of 20 events 200 ms apart: a call that runs 4 s unless cut.
var slowStream = fakeupstream.Behavior{Chunks: 20, Delay: 200 * time.Millisecond}

func abandonCluster(t *testing.T, n int, env map[string]string) *cluster {
	all := map[string]string{"LLM_DEDUPE_FLIGHT_ABANDON_GRACE": abandonGrace.String()}
	for k, v := range env {
		all[k] = v
	}
	return startCluster(t, clusterOpts{n: n, env: all})
}

// cutOf waits until the fake saw its only call cut and returns it; it fails the test if
// the call ran to its end instead.
func cutOf(t *testing.T, c *cluster) fakeupstream.Call {
	t.Helper()
	c.fake.waitFor(fakeupstream.Stats{Calls: 1, Abandoned: 1}, 10*time.Second)
	calls := c.fake.calls()
	if len(calls) != 1 || calls[0].CutAt.IsZero() {
		t.Fatalf("upstream calls %+v; want one, cut", calls)
	}
	return calls[0]
}

// withinCut checks that a call was cut no sooner than the grace after the last client left,
// and reports how long after.
func withinCut(t *testing.T, what string, call fakeupstream.Call, left time.Time, bound time.Duration) {
	t.Helper()
	d := call.CutAt.Sub(left)
	t.Logf("CUT %s: %dms after the last client left (grace %dms, bound %dms), %d of 22 events sent", what, ms(d), ms(abandonGrace), ms(bound), call.Sent)
	if d < abandonGrace-5*time.Millisecond {
		t.Errorf("%s: cut %v after the last client left; want at least the grace %v", what, d, abandonGrace)
	}
	// The bound with a margin for a loaded 2-core machine: a cut that waited for a lease
	// or for the answer's end (4 s) still fails.
	if d > bound+time.Second {
		t.Errorf("%s: cut %v after the last client left; want about %v", what, d, bound)
	}
}

func TestAbandonedStreamIsCut(t *testing.T) {
	for _, backend := range []string{"redis", "memory"} {
		t.Run(backend, func(t *testing.T) {
			env := map[string]string{}
			if backend == "memory" {
				env["LLM_DEDUPE_REDIS_ADDRS"] = ""
			}
			c := abandonCluster(t, 1, env)
			c.fake.set(slowStream)
			body := streamBody("e2e-abandon-"+backend, "leave after the first chunk")
			s := openSSE(c.ins[0].URL, body, apiKeyA)
			s.waitEvents(t, "client", 1)
			s.leave()
			left := time.Now()
			call := cutOf(t, c)
			withinCut(t, "stream, "+backend, call, left, abandonGrace+100*time.Millisecond)
			if call.Sent >= 20 {
				t.Errorf("the cut call sent %d events; want it stopped early", call.Sent)
			}
			if got := c.ins[0].metric("llm_dedupe_abandoned_flights_total", map[string]string{"outcome": "cancelled"}); got != 1 {
				t.Errorf("abandoned_flights_total{outcome=cancelled} = %v; want 1", got)
			}

			// The same request after the cut: a new call at once, and its whole answer.
			c.fake.set(fakeupstream.Behavior{})
			r := openSSE(c.ins[0].URL, body, apiKeyA).result()
			if r.err != nil || r.role() != "owner" || streamCall(r.transcript) != 2 || !strings.HasSuffix(r.transcript, "data: [DONE]\n\n") {
				t.Fatalf("after the cut: %s %v call %d %q; want the whole second call as owner", r.role(), r.err, streamCall(r.transcript), r.transcript)
			}
		})
	}
}

// postUntil sends a unary chat request in the background; the returned function makes its
// client give up (as a client timeout does) and waits until it has.
func postUntil(base, body string) (giveUp func()) {
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan struct{})
	go func() {
		defer close(done)
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+chatPath, strings.NewReader(body))
		req.Header.Set("Authorization", "Bearer "+apiKeyA)
		if resp, err := client.Do(req); err == nil {
			resp.Body.Close()
		}
	}()
	return func() { cancel(); <-done }
}

func TestAbandonedUnaryIsCut(t *testing.T) {
	c := abandonCluster(t, 1, nil)
	c.fake.set(fakeupstream.Behavior{Hold: true})
	giveUp := postUntil(c.ins[0].URL, chatBody("e2e-abandon-unary", "give up"))
	c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second)
	left := time.Now()
	giveUp() // a client timeout
	withinCut(t, "unary", cutOf(t, c), left, abandonGrace+100*time.Millisecond)
}

// ownerLeavesAFollower streams body on the first instance, then on the second, and has the
// first one's client leave once both have an event: the follower elsewhere stays.
func ownerLeavesAFollower(t *testing.T, c *cluster, body string) *sseClient {
	t.Helper()
	owner := openSSE(c.ins[0].URL, body, apiKeyA)
	owner.waitEvents(t, "owner's client", 1)
	follower := openSSE(c.ins[1].URL, body, apiKeyA)
	follower.waitEvents(t, "follower", 1)
	owner.leave()
	return follower
}

// The owner's client leaves while a follower elsewhere stays: the call goes on, and the
// follower gets all of it.
func TestAbandonedOwnerGoesOnForAFollowerElsewhere(t *testing.T) {
	c := abandonCluster(t, 3, nil)
	c.fake.set(fakeupstream.Behavior{Chunks: 10, Delay: 100 * time.Millisecond})
	follower := ownerLeavesAFollower(t, c, streamBody("e2e-abandon-follower", "stay elsewhere"))
	r := follower.result()
	want := fakeupstream.Transcript(chatPath, 1, "e2e-abandon-follower", 10, true)
	if r.err != nil || r.role() != "follower" || r.transcript != want {
		t.Fatalf("follower: %s %v %q; want the whole call", r.role(), r.err, r.transcript)
	}
	if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 1, Completed: 1}) {
		t.Errorf("upstream %+v; want one call, run to its end", s)
	}
}

// The owner's client left; the follower elsewhere leaves too: the call is cut within the
// grace and one heartbeat.
func TestAbandonedByEveryInstanceIsCut(t *testing.T) {
	c := abandonCluster(t, 3, nil)
	c.fake.set(slowStream)
	follower := ownerLeavesAFollower(t, c, streamBody("e2e-abandon-all", "everyone leaves"))
	follower.waitEvents(t, "follower", 4) // the owner, alone elsewhere, goes on
	if s := c.fake.stats(); s.Abandoned != 0 {
		t.Fatalf("upstream %+v while a follower waits; want no cut", s)
	}
	follower.leave()
	left := time.Now()
	withinCut(t, "after the last follower elsewhere", cutOf(t, c), left, abandonGrace+heartbeat)
}

// A client whose request arrives on another instance within the grace joins the running
// call and gets the whole answer: one call in all.
func TestRetryWithinTheGraceJoinsTheCall(t *testing.T) {
	c := abandonCluster(t, 3, map[string]string{"LLM_DEDUPE_FLIGHT_ABANDON_GRACE": "5s"})
	c.fake.set(fakeupstream.Behavior{Chunks: 10, Delay: 100 * time.Millisecond})
	body := streamBody("e2e-abandon-retry", "retry elsewhere")
	first := openSSE(c.ins[0].URL, body, apiKeyA)
	first.waitEvents(t, "first try", 1)
	first.leave()
	r := openSSE(c.ins[2].URL, body, apiKeyA).result() // the SDK's retry, on another instance
	want := fakeupstream.Transcript(chatPath, 1, "e2e-abandon-retry", 10, true)
	if r.err != nil || r.role() != "follower" || r.transcript != want {
		t.Fatalf("retry: %s %v %q; want the whole first call", r.role(), r.err, r.transcript)
	}
	if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 1, Completed: 1}) {
		t.Errorf("upstream %+v; want one call", s)
	}
	if got := c.ins[0].metric("llm_dedupe_abandoned_flights_total", map[string]string{"outcome": "finished"}); got != 1 {
		t.Errorf("abandoned_flights_total{outcome=finished} on the owner = %v; want 1", got)
	}
}

// finish, configured or asked by one request, keeps today's behaviour: the call runs to its
// end, its answer is stored, and the next identical request is a hit.
func TestFinishKeepsTheAbandonedCall(t *testing.T) {
	for _, how := range []string{"configured", "asked"} {
		t.Run(how, func(t *testing.T) {
			env, hdr := map[string]string{}, []string{}
			if how == "configured" {
				env["LLM_DEDUPE_FLIGHT_ABANDONED"] = "finish"
			} else {
				hdr = []string{"X-Dedupe-Abandoned", "finish"}
			}
			c := abandonCluster(t, 2, env)
			c.fake.set(fakeupstream.Behavior{Chunks: 10, Delay: 100 * time.Millisecond})
			body := streamBody("e2e-abandon-finish-"+how, "finish it")
			s := openSSE(c.ins[0].URL, body, apiKeyA, hdr...)
			s.waitEvents(t, "client", 1)
			s.leave()
			c.fake.waitFor(fakeupstream.Stats{Calls: 1, Completed: 1}, 10*time.Second)
			if s := c.fake.stats(); s.Abandoned != 0 {
				t.Fatalf("upstream %+v; want the call finished", s)
			}
			// The owner counts the abandoned call finished once its final write is done.
			redistest.WaitUntil(t, 10*time.Second, "the finished call counted", func() (bool, string) {
				n := c.ins[0].metric("llm_dedupe_abandoned_flights_total", map[string]string{"outcome": "finished"})
				return n == 1, fmt.Sprint(n)
			})
			r := openSSE(c.ins[1].URL, body, apiKeyA).result()
			want := fakeupstream.Transcript(chatPath, 1, "e2e-abandon-finish-"+how, 10, true)
			if r.err != nil || r.role() != "hit" || r.transcript != want {
				t.Fatalf("next request: %s %v %q; want a hit of the finished call", r.role(), r.err, r.transcript)
			}
		})
	}
}

func TestBadAbandonedHeaderIsRefused(t *testing.T) {
	c := abandonCluster(t, 1, nil)
	a := post(c.ins[0].URL, chatPath, chatBody("e2e-abandon-bad", "x"), apiKeyA, "X-Dedupe-Abandoned", "sometimes")
	if a.status != http.StatusBadRequest || !strings.Contains(a.body, `"code":"invalid_abandoned"`) || c.fake.stats().Calls != 0 {
		t.Fatalf("got %d %s; want 400 invalid_abandoned and no call", a.status, a.body)
	}
}

// A herd of streamed clients over three instances that leave at random moments: the call
// goes on while any one waits, and is cut only after the last has gone.
func TestHerdThatLeavesAtRandom(t *testing.T) {
	for _, stay := range []int{10, 0} {
		t.Run(fmt.Sprintf("%d stay", stay), func(t *testing.T) {
			c := abandonCluster(t, 3, nil)
			c.fake.set(fakeupstream.Behavior{Chunks: 20, Delay: 100 * time.Millisecond})
			model := fmt.Sprintf("e2e-abandon-herd-%d", stay)
			body := streamBody(model, "a herd that leaves")
			const n = 100
			clients := make([]*sseClient, n)
			for i := range clients {
				clients[i] = openSSE(c.ins[i%3].URL, body, apiKeyA)
			}
			var (
				mu       sync.Mutex
				lastLeft time.Time
				wg       sync.WaitGroup
			)
			errs := make([]error, n) // each leaver's, reported here on the test's goroutine
			for i, s := range clients[stay:] {
				events := 1 + rand.IntN(12) // leave after 1 to 12 of the 22 events
				wg.Go(func() {
					errs[stay+i] = s.events(fmt.Sprintf("client %d", stay+i), events)
					s.leave()
					mu.Lock()
					lastLeft = time.Now()
					mu.Unlock()
				})
			}
			wg.Wait()
			if err := errors.Join(errs...); err != nil {
				t.Fatal(err)
			}
			want := fakeupstream.Transcript(chatPath, 1, model, 20, true)
			for i, s := range clients[:stay] {
				if r := s.result(); r.err != nil || r.transcript != want {
					t.Errorf("client %d, which stayed: %s %v %q; want the whole call", i, r.role(), r.err, r.transcript)
				}
			}
			if stay > 0 {
				if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 1, Completed: 1}) {
					t.Errorf("upstream %+v; want one call, run to its end", s)
				}
				return
			}
			withinCut(t, "herd", cutOf(t, c), lastLeft, abandonGrace+heartbeat)
		})
	}
}

// An owner whose own client gave up goes on for a follower elsewhere; killed (-9), it is
// taken over as any owner is, and the follower gets the new call's whole answer.
func TestAbandonedOwnerKilledIsTakenOver(t *testing.T) {
	c := abandonCluster(t, 2, nil)
	c.fake.set(fakeupstream.Behavior{Hold: true})
	model := "e2e-abandon-kill"
	body := chatBody(model, "kill the owner nobody waits on")
	giveUp := postUntil(c.ins[0].URL, body)
	c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second)
	follower := postAsync(c.ins[1].URL, chatPath, body, apiKeyA)
	waitWaiting(t, c.ins[1:], 1)
	giveUp()
	// Past the grace, the owner still runs the call for the follower elsewhere.
	rounds := c.ins[0].metric("llm_dedupe_abandoned_flights_total", map[string]string{"outcome": "cancelled"})
	time.Sleep(abandonGrace + 2*heartbeat) // nothing to wait on: the cut must not come
	if s := c.fake.stats(); s.Abandoned != 0 || rounds != 0 {
		t.Fatalf("upstream %+v, %v cut; want the call running for the follower", s, rounds)
	}
	c.ins[0].killHard()
	c.fake.waitFor(fakeupstream.Stats{Calls: 2, Abandoned: 1}, 10*time.Second) // taken over
	c.fake.release()
	wantChat(t, "follower", <-follower, model, 2)
}
