package e2e

import (
	"fmt"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
)

// TestFlightBoundaries: a flight ends and a new identical request starts the next one while
// a follower on another instance is still reading the first one's stream. That follower is
// the slow reader: its instance is stalled (SIGSTOP, as a long GC pause or a starved CPU
// would) after it passed on every chunk so far, and it wakes up only after a lease, the
// flight's end and the next flight's claim: what Redis pushed meanwhile waits in its socket,
// and its wait for the owner has run out, so it may look the flight up before it reads
// them, and find the next flight there. It must still finish the answer it was following:
// no stream_interrupted, no answer of the next call, no call of its own.
//
// Arrivals decide the upstream calls: the requests sent while call 1 is held join flight 1;
// the one sent after call 1 completed starts flight 2 (nothing stored may serve it), and
// those sent while call 2 is held join flight 2. So exactly 2 calls.
func TestFlightBoundaries(t *testing.T) {
	const chunks = 5
	noCache := []string{"Cache-Control", "no-cache"}
	cases := []struct {
		name  string
		env   map[string]string
		call1 fakeupstream.Behavior
		// Headers of the requests of flight 1 on A and C, and of those that start and join
		// flight 2. The requests on the stalled instance B have none.
		hdr1, hdr2 []string
	}{
		// Nothing is stored: the request after the end claims the DONE flight.
		{name: "result_ttl=0", env: map[string]string{"LLM_DEDUPE_FLIGHT_RESULT_TTL": "0s"},
			call1: fakeupstream.Behavior{Hold: true, Chunks: chunks}},
		// The answer is stored, but the next requests ask for a fresh one: they claim the
		// DONE flight. The stalled follower asked for nothing special: when it checks
		// again, the flight's stored answer is there.
		{name: "no-cache", call1: fakeupstream.Behavior{Hold: true, Chunks: chunks},
			hdr1: noCache, hdr2: noCache},
		// A 400 is shared with the flight's followers and never stored: the request after
		// it claims the DONE flight.
		{name: "4xx", call1: fakeupstream.Behavior{Hold: true, Fail: []int{http.StatusBadRequest}}},
	}
	for _, tc := range cases {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t, clusterOpts{env: tc.env})
			a, b, cc := c.ins[0], c.ins[1], c.ins[2]
			model := "e2e-boundary-" + strings.NewReplacer("=", "", "-", "").Replace(tc.name)
			body := streamBody(model, "a flight ends while a follower reads it")
			streamed := len(tc.call1.Fail) == 0
			want1 := func(who string, r streamResult) {
				t.Helper()
				if streamed {
					if n, broken := checkStream(t, who, r, model, chunks); n != 1 || broken {
						t.Errorf("%s: call %d, interrupted %v; want the whole stream of call 1", who, n, broken)
					}
					return
				}
				wantFailure(t, who, r, http.StatusBadRequest, 1)
			}

			// Flight 1: an owner on A, followers on A, B and C, the upstream holding its
			// last event (or its whole 400).
			c.fake.set(tc.call1)
			owner := openSSE(a.URL, body, apiKeyA, tc.hdr1...)
			c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second)
			others := []*sseClient{owner, openSSE(a.URL, body, apiKeyA, tc.hdr1...),
				openSSE(cc.URL, body, apiKeyA, tc.hdr1...), openSSE(cc.URL, body, apiKeyA, tc.hdr1...)}
			onB := []*sseClient{openSSE(b.URL, body, apiKeyA), openSSE(b.URL, body, apiKeyA)}
			if streamed {
				for i, s := range append(append([]*sseClient{}, others...), onB...) {
					s.waitEvents(t, fmt.Sprintf("flight 1 client %d", i), chunks-1) // all but the held one
				}
			} else {
				waitWaiting(t, c.ins, len(others)+len(onB))
			}

			// B has passed on all it read and waits for what is pushed to it. Stall it:
			// what Redis pushes meanwhile (flight 1's end, flight 2's start) waits for it
			// in its socket.
			stalled := time.Now()
			b.pause()

			// Flight 1 ends: A's clients and C's (which read its end from Redis) have it.
			c.fake.release()
			c.fake.waitFor(fakeupstream.Stats{Calls: 1, Completed: 1}, 10*time.Second)
			for i, s := range others {
				want1(fmt.Sprintf("flight 1 client %d on %s", i, []string{"A", "A", "C", "C"}[i]), s.result())
			}

			// The next identical request starts flight 2; more join it on A and C.
			c.fake.set(fakeupstream.Behavior{Hold: true, Chunks: chunks})
			flight2 := []*sseClient{openSSE(cc.URL, body, apiKeyA, tc.hdr2...)}
			c.fake.waitFor(fakeupstream.Stats{Calls: 2}, 10*time.Second)
			flight2[0].waitEvents(t, "flight 2 owner", 1)
			flight2 = append(flight2, openSSE(a.URL, body, apiKeyA, tc.hdr2...), openSSE(cc.URL, body, apiKeyA, tc.hdr2...))
			for i, s := range flight2 {
				s.waitEvents(t, fmt.Sprintf("flight 2 client %d", i), 1)
			}

			// B wakes up while flight 2 runs, after a stall longer than a lease: besides
			// what was pushed, its wait for the owner has run out, so it may look the
			// flight up first and find flight 2 there. Its clients finish flight 1's answer.
			if d := leaseTTL + 200*time.Millisecond - time.Since(stalled); d > 0 {
				time.Sleep(d) // the fault is a stall of this length, not a wait for an event
			}
			b.resume()
			t.Logf("B stalled %dms; flight 1 ended and flight 2 started meanwhile", ms(time.Since(stalled)))
			woke := time.Now()
			var waiting []int // B's clients with no end yet: they wait for flight 2
			for i, s := range onB {
				r, ok := s.resultWithin(5*time.Second - time.Since(woke))
				if !ok {
					waiting = append(waiting, i)
					continue
				}
				want1(fmt.Sprintf("flight 1 client %d on B", i), r)
			}

			c.fake.release()
			for i, s := range flight2 {
				if n, broken := checkStream(t, fmt.Sprintf("flight 2 client %d", i), s.result(), model, chunks); n != 2 || broken {
					t.Errorf("flight 2 client %d: call %d, interrupted %v; want the whole stream of call 2", i, n, broken)
				}
			}
			for _, i := range waiting {
				r := onB[i].result()
				t.Errorf("flight 1 client %d on B: no end 5s after B woke, though flight 1 had ended; once call 2 was released it got %d with call %d's answer (%q…); want call 1's",
					i, r.status, streamCall(r.transcript), r.transcript[:min(len(r.transcript), 60)])
			}
			if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 2, Completed: 2}) {
				t.Errorf("upstream %+v; want 2 calls (one per flight), both completed", s)
			}
		})
	}
}

// wantFailure checks a client's copy of the fake's failure of call n: its status, exactly
// its body, and the request id of the same call.
func wantFailure(t testing.TB, who string, r streamResult, status int, n int64) {
	t.Helper()
	want := fmt.Sprintf(`{"error":{"message":"fake failure %d of call %d","type":"fake_error","code":"fake_%d"}}`, status, n, status)
	if r.err != nil || r.status != status || r.transcript != want {
		t.Errorf("%s: status %d, error %v, body %q; want %d %q (call %d's answer)", who, r.status, r.err, r.transcript, status, want, n)
		return
	}
	if id := r.header.Get("X-Request-Id"); id != fmt.Sprintf("req_%d", n) {
		t.Errorf("%s: X-Request-Id %q with the body of call %d: a mixed answer", who, id, n)
	}
}

// TestRequestAgainAfterAnswer: a client sends the same unary request again as soon as it has
// the answer, each time to the next instance. Each was sent after the answer, and where
// nothing stored may serve it (result_ttl 0, or Cache-Control: no-cache) it must get a call
// of its own, never the answer it was sent to replace. (An owner that answered its client
// before its final write landed, tried once, failed this in two runs of three. The
// interleavings with a flight still open elsewhere are driven with hooks in
// singleflight/answered_test.go.)
func TestRequestAgainAfterAnswer(t *testing.T) {
	const rounds = 150
	for _, tc := range []struct {
		name string
		env  map[string]string
		hdr  []string
	}{
		{name: "result_ttl=0", env: map[string]string{"LLM_DEDUPE_FLIGHT_RESULT_TTL": "0s"}},
		{name: "no-cache", hdr: []string{"Cache-Control", "no-cache"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			c := startCluster(t, clusterOpts{env: tc.env})
			model := "e2e-again-" + strings.NewReplacer("=", "", "-", "").Replace(tc.name)
			body := chatBody(model, "the same question, asked again on receipt")
			for i := range int64(rounds) {
				in := c.ins[i%int64(len(c.ins))]
				a := post(in.URL, chatPath, body, apiKeyA, tc.hdr...)
				if n := wantChat(t, fmt.Sprintf("request %d", i+1), a, model, 0); n != i+1 {
					t.Fatalf("request %d, sent after answer %d arrived, got call %d's answer (role %s); want call %d",
						i+1, i, n, a.role(), i+1)
				}
			}
			if s := c.fake.stats(); s.Calls != rounds {
				t.Errorf("upstream %+v; want %d calls, one per request", s, rounds)
			}
		})
	}
}
