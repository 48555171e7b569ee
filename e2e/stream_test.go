package e2e

import (
	"bufio"
	"context"
	"fmt"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
)

// streamBody is a streaming chat request that asks for usage in the stream and does not
// sample (temperature 0).
func streamBody(model, prompt string) string {
	return fmt.Sprintf(`{"model":%q,"temperature":0,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":%q}]}`, model, prompt)
}

// streamResult is what a streaming client received.
type streamResult struct {
	status     int
	header     http.Header
	transcript string
	err        error
}

func (r streamResult) role() string {
	if r.header == nil {
		return ""
	}
	return r.header.Get("X-Dedupe-Role")
}

// sseClient is a streaming request in the background that reports how far it got, so that
// a test knows an instance has passed on every chunk written so far.
type sseClient struct {
	mu       sync.Mutex
	got      string
	changed  chan struct{} // closed and replaced when bytes arrive or the answer ends
	finished chan struct{} // closed when res is set
	res      streamResult
	leave    context.CancelFunc // the client disconnects
}

// openSSE sends a streaming chat request with the given extra header pairs.
func openSSE(base, body, apiKey string, hdr ...string) *sseClient {
	return openSSETimeout(base, body, apiKey, clientTimeout, hdr...)
}

// openSSETimeout is openSSE for an answer that may take up to d.
func openSSETimeout(base, body, apiKey string, d time.Duration, hdr ...string) *sseClient {
	ctx, cancel := context.WithTimeout(context.Background(), d)
	s := &sseClient{changed: make(chan struct{}), finished: make(chan struct{}), leave: cancel}
	go func() {
		defer cancel()
		var r streamResult
		defer func() {
			s.mu.Lock()
			s.res = r
			close(s.finished)
			s.notify()
			s.mu.Unlock()
		}()
		req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+chatPath, strings.NewReader(body))
		req.Header.Set("Content-Type", "application/json")
		req.Header.Set("Authorization", "Bearer "+apiKey)
		for i := 0; i+1 < len(hdr); i += 2 {
			req.Header.Set(hdr[i], hdr[i+1])
		}
		resp, err := client.Do(req)
		if err != nil {
			r.err = err
			return
		}
		defer resp.Body.Close()
		r.status, r.header = resp.StatusCode, resp.Header
		br := bufio.NewReader(resp.Body)
		for {
			line, err := br.ReadString('\n')
			s.mu.Lock()
			s.got += line
			r.transcript = s.got
			s.notify()
			s.mu.Unlock()
			if err != nil {
				if err != io.EOF {
					r.err = err
				}
				return
			}
		}
	}()
	return s
}

// notify wakes waiters; s.mu must be held.
func (s *sseClient) notify() {
	close(s.changed)
	s.changed = make(chan struct{})
}

// waitEvents waits until n whole events have arrived; it fails the test if the answer ends
// first or after 10 s.
func (s *sseClient) waitEvents(t testing.TB, who string, n int) {
	t.Helper()
	if err := s.events(who, n); err != nil {
		t.Fatal(err)
	}
}

// events is waitEvents for a goroutine other than the test's: it says why it gave up.
func (s *sseClient) events(who string, n int) error {
	timer := time.NewTimer(10 * time.Second)
	defer timer.Stop()
	for {
		s.mu.Lock()
		got, ch := strings.Count(s.got, "\n\n"), s.changed
		ended, r := isClosed(s.finished), s.res
		s.mu.Unlock()
		if got >= n {
			return nil
		}
		if ended {
			return fmt.Errorf("%s: answer ended after %d events; want %d first: %d %v %q", who, got, n, r.status, r.err, r.transcript)
		}
		select {
		case <-ch:
		case <-timer.C:
			return fmt.Errorf("%s: %d events in 10s; want %d", who, got, n)
		}
	}
}

// result waits for the whole answer (a client times out after clientTimeout).
func (s *sseClient) result() streamResult {
	<-s.finished
	return s.res
}

// resultWithin is result bounded by d; ok is false if the answer has not ended by then.
func (s *sseClient) resultWithin(d time.Duration) (streamResult, bool) {
	select {
	case <-s.finished:
		return s.res, true
	case <-time.After(d):
		return streamResult{}, false
	}
}

func isClosed(ch chan struct{}) bool {
	select {
	case <-ch:
		return true
	default:
		return false
	}
}

// streamCall is the number of the upstream call whose chunks a transcript carries.
func streamCall(transcript string) int64 {
	var n int64
	if i := strings.Index(transcript, `"id":"chatcmpl-`); i >= 0 {
		fmt.Sscanf(transcript[i+len(`"id":"chatcmpl-`):], "%d", &n)
	}
	return n
}

// sseInterrupted is how the proxy ends a stream whose owner changed after bytes were sent.
const sseInterrupted = "event: error\ndata: "

// checkStream checks a streamed answer: 200, text/event-stream, and either exactly the
// transcript of one upstream call (its number is returned) or a prefix of it ended by the
// proxy's stream_interrupted error event (interrupted). Anything else — bytes of two calls,
// a hole, another request's answer — fails the test.
func checkStream(t testing.TB, who string, r streamResult, model string, chunks int) (n int64, interrupted bool) {
	t.Helper()
	if r.err != nil || r.status != 200 {
		t.Errorf("%s: status %d, error %v, %q; want 200", who, r.status, r.err, r.transcript)
		return 0, false
	}
	if ct := r.header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
		t.Errorf("%s: Content-Type %q; want text/event-stream", who, ct)
	}
	n = streamCall(r.transcript)
	want := fakeupstream.Transcript(chatPath, n, model, chunks, true)
	if r.transcript == want {
		if id := r.header.Get("X-Request-Id"); id != fmt.Sprintf("req_%d", n) {
			t.Errorf("%s: X-Request-Id %q with the stream of call %d: a mixed answer", who, id, n)
		}
		return n, false
	}
	if i := strings.LastIndex(r.transcript, sseInterrupted); i >= 0 && strings.HasPrefix(want, r.transcript[:i]) &&
		strings.Contains(r.transcript[i:], `"code":"stream_interrupted"`) && strings.HasSuffix(r.transcript, "\n\n") {
		return n, true
	}
	t.Errorf("%s: transcript\n%q\nis neither call %d's whole stream nor a prefix of it ended by a stream_interrupted event;\nwant %q", who, r.transcript, n, want)
	return n, false
}

// TestStreamingAcrossInstances: streaming clients on three instances share one upstream
// stream; followers everywhere receive the first chunk while the upstream still holds the
// last, every transcript is byte-identical to the upstream's, and a later request replays it.
func TestStreamingAcrossInstances(t *testing.T) {
	c := startCluster(t, clusterOpts{})
	const chunks = 5
	c.fake.set(fakeupstream.Behavior{Hold: true, Chunks: chunks})
	model := "e2e-stream"
	body := streamBody(model, "stream across instances")

	owner := openSSE(c.ins[0].URL, body, apiKeyA)
	c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second)
	owner.waitEvents(t, "owner", 1)
	clients := []*sseClient{owner}
	for i := range 14 { // joining mid-stream: 4 more on the owner's instance, 5 on each other
		clients = append(clients, openSSE(c.ins[(i+1)%3].URL, body, apiKeyA))
	}
	for i, s := range clients {
		s.waitEvents(t, fmt.Sprintf("client %d", i), 1)
	}
	if s := c.fake.stats(); s.Completed != 0 || s.Calls != 1 {
		t.Fatalf("upstream %+v when every client had its first chunk; want 1 call, still holding its last chunk", s)
	}
	c.fake.release()

	rs := make([]streamResult, len(clients))
	roleCount := map[string]int{}
	for i, s := range clients {
		rs[i] = s.result()
		roleCount[rs[i].role()]++
		if n, broken := checkStream(t, fmt.Sprintf("client %d", i), rs[i], model, chunks); n != 1 || broken {
			t.Errorf("client %d: call %d, interrupted %v; want the whole stream of call 1", i, n, broken)
		}
	}
	if roleCount["owner"] != 1 || roleCount["follower"] != len(clients)-1 {
		t.Errorf("roles %v; want 1 owner, %d followers", roleCount, len(clients)-1)
	}

	// The whole transcript was stored: a later request on another instance replays it.
	hit := openSSE(c.ins[2].URL, body, apiKeyA).result()
	if n, broken := checkStream(t, "hit", hit, model, chunks); n != 1 || broken || hit.role() != "hit" {
		t.Errorf("repeat: role %q, call %d, interrupted %v; want a hit replaying call 1", hit.role(), n, broken)
	}
	if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 1, Completed: 1}) {
		t.Errorf("upstream %+v; want 1 call", s)
	}
	// Streamed usage (11 prompt, 5 completion tokens) counts as saved for 14 followers and the hit.
	saved := len(clients)
	for kind, per := range map[string]int{"prompt": 11, "completion": chunks} {
		if got := sum(c.ins, "llm_dedupe_saved_tokens_total", map[string]string{"model": model, "kind": kind}); got != float64(saved*per) {
			t.Errorf("saved %s tokens %v; want %d", kind, got, saved*per)
		}
	}
}

// TestStreamOwnerKilled: the owner of a streamed flight is killed (kill -9). Followers on
// the other instances that have received nothing yet follow the new owner's stream
// seamlessly; followers that already have chunks get a stream_interrupted error event and a
// clean end, never chunks of two calls.
func TestStreamOwnerKilled(t *testing.T) {
	const chunks = 5
	t.Run("before the first chunk", func(t *testing.T) {
		c := startCluster(t, clusterOpts{})
		model := "e2e-stream-kill-early"
		body := streamBody(model, "killed before a byte")
		c.fake.set(fakeupstream.Behavior{Delay: time.Minute, Chunks: chunks}) // the first event never comes
		owner := openSSE(c.ins[0].URL, body, apiKeyA)
		c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second)
		var followers []*sseClient
		for i := range 6 {
			followers = append(followers, openSSE(c.ins[1+i%2].URL, body, apiKeyA))
		}
		waitWaiting(t, c.ins, 7)
		c.fake.set(fakeupstream.Behavior{Chunks: chunks}) // the next call streams at once
		c.ins[0].killHard()
		if r := owner.result(); r.err == nil && r.status != 0 {
			t.Errorf("owner's client: %d %q; want a broken connection", r.status, r.transcript)
		}
		for i, s := range followers {
			if n, broken := checkStream(t, fmt.Sprintf("follower %d", i), s.result(), model, chunks); n != 2 || broken {
				t.Errorf("follower %d: call %d, interrupted %v; want the whole stream of call 2", i, n, broken)
			}
		}
		if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 2, Abandoned: 1, Completed: 1}) {
			t.Errorf("upstream %+v; want 2 calls, the first abandoned", s)
		}
	})
	t.Run("after chunks were delivered", func(t *testing.T) {
		c := startCluster(t, clusterOpts{})
		model := "e2e-stream-kill-late"
		body := streamBody(model, "killed mid-stream")
		c.fake.set(fakeupstream.Behavior{Hold: true, Chunks: chunks})
		owner := openSSE(c.ins[0].URL, body, apiKeyA)
		c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second)
		owner.waitEvents(t, "owner", 1)
		var followers []*sseClient
		for i := range 6 {
			followers = append(followers, openSSE(c.ins[1+i%2].URL, body, apiKeyA))
		}
		for i, s := range followers {
			s.waitEvents(t, fmt.Sprintf("follower %d", i), 1)
		}
		left := leaseLeft(t, c)
		killed := time.Now()
		c.ins[0].killHard()
		// Every follower already has bytes of call 1: no new call can serve them, so none
		// is made for them. Their streams end with the error event when the lease runs out.
		for i, s := range followers {
			if n, broken := checkStream(t, fmt.Sprintf("follower %d", i), s.result(), model, chunks); n != 1 || !broken {
				t.Errorf("follower %d: call %d, interrupted %v; want call 1's chunks ended by a stream_interrupted event", i, n, broken)
			}
		}
		if s := c.fake.stats(); s.Calls != 1 {
			t.Errorf("upstream %+v after the followers ended; want still 1 call", s)
		}
		// A client that tries again takes the flight over and gets call 2 whole.
		c.fake.release()
		again := openSSE(c.ins[1].URL, body, apiKeyA).result()
		took := time.Since(killed)
		if n, broken := checkStream(t, "request after the kill", again, model, chunks); n != 2 || broken {
			t.Errorf("request after the kill: call %d, interrupted %v; want call 2's whole stream", n, broken)
		}
		t.Logf("TAKEOVER stream-kill=%dms lease=%dms lease_left_at_kill=%dms", ms(took), ms(leaseTTL), ms(left))
		// The new owner's stream is whole and stored: a new request replays it.
		hit := openSSE(c.ins[2].URL, body, apiKeyA).result()
		if n, broken := checkStream(t, "request after the takeover", hit, model, chunks); n != 2 || broken {
			t.Errorf("request after the takeover: call %d, interrupted %v; want call 2's whole stream", n, broken)
		}
		if s := c.fake.stats(); s != (fakeupstream.Stats{Calls: 2, Abandoned: 1, Completed: 1}) {
			t.Errorf("upstream %+v; want 2 calls, the first abandoned", s)
		}
	})
}
