package proxy_test

import (
	"bufio"
	"bytes"
	"context"
	"fmt"
	"io"
	"net/http"
	"net/http/httptest"
	"strings"
	"sync/atomic"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

const streamBody = `{"model":"gpt-test","temperature":0,"stream":true,"stream_options":{"include_usage":true},"messages":[{"role":"user","content":"stream please"}]}`

// sseClient is a streaming request whose events are read as they arrive.
type sseClient struct {
	t      *testing.T
	resp   *http.Response
	r      *bufio.Reader
	got    bytes.Buffer
	err    error
	cancel context.CancelFunc
}

func openStream(t *testing.T, base, body string) *sseClient {
	t.Helper()
	c, err := dialStream(t, base, body)
	if err != nil {
		t.Fatal(err)
	}
	return c
}

// dialStream is openStream for a goroutine other than the test's, which must not call
// t.Fatal: it returns the error, for the test to fail on.
func dialStream(t *testing.T, base, body string) (*sseClient, error) {
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, base+"/v1/chat/completions", strings.NewReader(body))
	req.Header.Set("Authorization", "Bearer sk-test-1")
	resp, err := http.DefaultClient.Do(req)
	if err != nil {
		cancel()
		return nil, fmt.Errorf("stream request: %w", err)
	}
	c := &sseClient{t: t, resp: resp, r: bufio.NewReader(resp.Body), cancel: cancel}
	t.Cleanup(func() { resp.Body.Close(); cancel() })
	return c, nil
}

// ownerStream opens a stream in its own goroutine and waits until the upstream call it
// makes has started; a stream that fails first fails the test.
func ownerStream(t *testing.T, base string, started <-chan struct{}) {
	t.Helper()
	failed := make(chan error, 1)
	go func() {
		c, err := dialStream(t, base, streamBody)
		if err == nil {
			c.rest()
			err = fmt.Errorf("the stream ended before its upstream call started: %v", c.err)
		}
		failed <- err
	}()
	select {
	case <-started:
	case err := <-failed:
		t.Fatalf("owner's stream: %v", err)
	}
}

// event reads one SSE event (up to its blank line); false at the end of the stream.
func (c *sseClient) event() (string, bool) {
	var ev strings.Builder
	for {
		line, err := c.r.ReadString('\n')
		ev.WriteString(line)
		c.got.WriteString(line)
		if err != nil {
			if err != io.EOF {
				c.err = err
			}
			return ev.String(), false
		}
		if line == "\n" {
			return ev.String(), true
		}
	}
}

// rest reads the stream to its end and returns the whole transcript.
func (c *sseClient) rest() string {
	for {
		if _, ok := c.event(); !ok {
			return c.got.String()
		}
	}
}

func (c *sseClient) role() string { return c.resp.Header.Get("X-Dedupe-Role") }

func TestStreamFanOutAcrossInstances(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			up.Set(fakeBehavior{Hold: true, Chunks: 5})
			s := setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute, BatchDelay: 2 * time.Millisecond}}
			ins := []*instance{newInstance(t, up, s)}
			if rs != nil {
				ins = append(ins, newInstance(t, up, s), newInstance(t, up, s))
			}
			started := up.Started()
			owner := openStream(t, ins[0].URL, streamBody)
			<-started
			if ev, _ := owner.event(); !strings.Contains(ev, "tok0") {
				t.Fatalf("owner's first event %q; want tok0", ev)
			}
			var clients []*sseClient
			for _, in := range ins {
				for range 10 {
					clients = append(clients, openStream(t, in.URL, streamBody))
				}
			}
			// Every follower, on every instance, has the first event while the upstream
			// still holds the last one: fan-out is live, not buffered. (Each joined
			// mid-stream, so this also shows a late joiner gets the stream from its start.)
			for i, c := range clients {
				if ev, ok := c.event(); !ok || !strings.Contains(ev, "tok0") {
					t.Fatalf("client %d: first event %q before the release; want tok0", i, ev)
				}
			}
			up.Release()
			want := fakeupstream.Transcript("/v1/chat/completions", 1, "gpt-test", 5, true)
			if got := owner.rest(); got != want || owner.role() != "owner" {
				t.Fatalf("owner (%s) got %q; want %q", owner.role(), got, want)
			}
			for i, c := range clients {
				if got := c.rest(); got != want || c.role() != "follower" {
					t.Fatalf("client %d (%s): transcript differs from the upstream's:\n%q\nwant\n%q", i, c.role(), got, want)
				}
				if ct := c.resp.Header.Get("Content-Type"); !strings.HasPrefix(ct, "text/event-stream") {
					t.Fatalf("client %d: Content-Type %q", i, ct)
				}
			}
			if up.Calls() != 1 {
				t.Fatalf("%d upstream calls; want 1", up.Calls())
			}
			// A hit after completion is replayed as SSE, byte for byte.
			hit := openStream(t, ins[len(ins)-1].URL, streamBody)
			if got := hit.rest(); got != want || hit.role() != "hit" || !strings.HasPrefix(hit.resp.Header.Get("Content-Type"), "text/event-stream") {
				t.Fatalf("hit (%s, %s): %q", hit.role(), hit.resp.Header.Get("Content-Type"), got)
			}
			// Streamed usage counts as saved tokens: 30 followers + 1 hit, 11 prompt tokens each.
			prompt := 0.0
			for _, in := range ins {
				prompt += value(t, in.Reg, "llm_dedupe_saved_tokens_total", map[string]string{"kind": "prompt"})
			}
			if want := float64(len(clients)+1) * 11; prompt != want {
				t.Fatalf("saved prompt tokens %v; want %v", prompt, want)
			}
		})
	}
}

func TestStreamTakeoverBeforeFirstChunk(t *testing.T) {
	rs := redistest.Start(t)
	up := startUpstream(t)
	up.Set(fakeBehavior{Delay: time.Minute}) // headers, then nothing for a minute
	s := setup{redis: rs, flight: singleflight.Options{TakeoverJitter: 10 * time.Millisecond}}
	a, b := newInstance(t, up, s), newInstance(t, up, s)
	started := up.Started()
	ownerStream(t, a.URL, started)
	type opening struct {
		c   *sseClient
		err error
	}
	opened := make(chan opening, 5)
	for range 5 {
		// Headers come with the first chunk, so each client waits in its own goroutine.
		go func() {
			c, err := dialStream(t, b.URL, streamBody)
			opened <- opening{c, err}
		}()
	}
	waitWaiting(t, []*instance{b}, 5)
	up.Set(fakeBehavior{}) // the next owner's call answers at once
	a.close()              // the owner goes away before its first chunk
	want := fakeupstream.Transcript("/v1/chat/completions", 2, "gpt-test", 5, true)
	for i := range 5 {
		o := <-opened
		if o.err != nil {
			t.Fatalf("client %d: %v", i, o.err)
		}
		if got := o.c.rest(); got != want {
			t.Fatalf("client %d: %q; want the new generation seamlessly: %q", i, got, want)
		}
	}
}

func TestStreamTakeoverAfterChunksEndsWithError(t *testing.T) {
	rs := redistest.Start(t)
	up := startUpstream(t)
	up.Set(fakeBehavior{Hold: true})
	s := setup{redis: rs, flight: singleflight.Options{TakeoverJitter: 10 * time.Millisecond, BatchDelay: time.Millisecond}}
	a, b := newInstance(t, up, s), newInstance(t, up, s)
	started := up.Started()
	ownerStream(t, a.URL, started)
	c := openStream(t, b.URL, streamBody)
	if ev, ok := c.event(); !ok || !strings.Contains(ev, "tok0") {
		t.Fatalf("first event %q", ev)
	}
	up.Set(fakeBehavior{})
	a.close()
	got := c.rest()
	if !strings.HasSuffix(got, "\n\n") || !strings.Contains(got, "event: error\n") || strings.Contains(got, "chatcmpl-2") {
		t.Fatalf("transcript %q; want the old generation's events, then an error event, never the new one's", got)
	}
	if c.err != nil {
		t.Fatalf("stream did not close cleanly: %v", c.err)
	}
}

// The owner's own client leaving does not stop the stream the others are reading.
func TestStreamOwnerClientLeaves(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			up.Set(fakeBehavior{Hold: true})
			s := setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}}
			ins := []*instance{newInstance(t, up, s)}
			if rs != nil {
				ins = append(ins, newInstance(t, up, s))
			}
			started := up.Started()
			owner := openStream(t, ins[0].URL, streamBody)
			<-started
			follower := openStream(t, ins[len(ins)-1].URL, streamBody)
			if ev, ok := follower.event(); !ok || !strings.Contains(ev, "tok0") {
				t.Fatalf("follower's first event %q", ev)
			}
			owner.cancel() // the owner's client hangs up mid-stream
			owner.resp.Body.Close()
			up.Release()
			want := fakeupstream.Transcript("/v1/chat/completions", 1, "gpt-test", 5, true)
			if got := follower.rest(); got != want {
				t.Fatalf("follower got %q; want the whole transcript %q", got, want)
			}
			if up.Calls() != 1 || up.Abandoned() != 0 {
				t.Fatalf("%d calls, %d abandoned; want 1 call, run to its end", up.Calls(), up.Abandoned())
			}
		})
	}
}

// A Responses API stream that ends without response.completed is shared with the flight
// but never stored: the next identical request calls again.
func TestIncompleteResponsesStreamNotStored(t *testing.T) {
	for _, last := range []string{"", "response.failed", "response.incomplete", "response.completed"} {
		t.Run("last="+last, func(t *testing.T) {
			var calls atomic.Int32
			up := httptest.NewServer(http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
				calls.Add(1)
				w.Header().Set("Content-Type", "text/event-stream")
				io.WriteString(w, "event: response.created\ndata: {\"type\":\"response.created\"}\n\n")
				io.WriteString(w, "event: response.output_text.delta\ndata: {\"type\":\"response.output_text.delta\",\"delta\":\"par\"}\n\n")
				if last != "" {
					fmt.Fprintf(w, "event: %s\ndata: {\"type\":%q,\"response\":{\"usage\":{\"input_tokens\":3,\"output_tokens\":1}}}\n\n", last, last)
				}
			}))
			defer up.Close()
			in := newInstance(t, nil, setup{base: up.URL, flight: singleflight.Options{ResultTTL: time.Minute}})
			body := `{"model":"m","temperature":0,"stream":true,"input":"hi"}`
			post(t, in.URL, "/v1/responses", body)
			a := post(t, in.URL, "/v1/responses", body)
			wantStored := last == "response.completed"
			if stored := a.header.Get("X-Dedupe-Role") == "hit"; stored != wantStored {
				t.Fatalf("second request role %q (calls %d); stored %v, want %v", a.header.Get("X-Dedupe-Role"), calls.Load(), stored, wantStored)
			}
		})
	}
}
