package proxy_test

import (
	"bufio"
	"fmt"
	"io"
	"net"
	"net/http"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

func TestBurstCostsOneCall(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			up.Set(fakeHold())
			s := setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}}
			ins := []*instance{newInstance(t, up, s)}
			if rs != nil {
				ins = append(ins, newInstance(t, up, s))
			}
			done := make(chan []answer)
			go func() { done <- burst(t, ins, 100, "/v1/chat/completions", chatBody) }()
			waitWaiting(t, ins, 100)
			up.Release()
			as := <-done
			if up.Calls() != 1 {
				t.Fatalf("%d upstream calls; want 1", up.Calls())
			}
			for i, a := range as {
				if a.err != nil || a.status != 200 || a.body != as[0].body {
					t.Fatalf("answer %d: (%d, %q, %v); want 200 and the same body as the others", i, a.status, a.body, a.err)
				}
				if a.header.Get("X-Request-Id") != "req_1" || a.header.Get("Set-Cookie") != "" {
					t.Fatalf("answer %d headers %v: want the upstream's X-Request-Id and no Set-Cookie", i, a.header)
				}
				if len(a.header.Get("X-Dedupe-Key")) != 64 {
					t.Fatalf("answer %d: X-Dedupe-Key %q; want 64 hex", i, a.header.Get("X-Dedupe-Key"))
				}
			}
			// A request counts as waiting from before it joins the flight (its first byte
			// is what it waits for): one that joins only after the answer landed is a hit.
			if r := roles(as); r["owner"] != 1 || r["follower"]+r["hit"] != 99 {
				t.Fatalf("roles %v; want 1 owner, 99 followers or hits", r)
			}
			hit := post(t, ins[len(ins)-1].URL, "/v1/chat/completions", chatBody)
			if hit.header.Get("X-Dedupe-Role") != "hit" || hit.header.Get("Age") == "" || hit.body != as[0].body || up.Calls() != 1 {
				t.Fatalf("repeat: role %q Age %q calls %d; want hit with Age and still 1 call", hit.header.Get("X-Dedupe-Role"), hit.header.Get("Age"), up.Calls())
			}
			// Metrics: 99 followers and 1 hit saved a call each, 11+7 tokens each.
			saved, prompt, completion := 0.0, 0.0, 0.0
			for _, in := range ins {
				saved += value(t, in.Reg, "llm_dedupe_saved_upstream_requests_total", map[string]string{"route": "/v1/chat/completions"})
				prompt += value(t, in.Reg, "llm_dedupe_saved_tokens_total", map[string]string{"model": "gpt-test", "kind": "prompt"})
				completion += value(t, in.Reg, "llm_dedupe_saved_tokens_total", map[string]string{"model": "gpt-test", "kind": "completion"})
			}
			if saved != 100 || prompt != 100*11 || completion != 100*7 {
				t.Fatalf("saved %v requests, %v prompt and %v completion tokens; want 100, 1100, 700", saved, prompt, completion)
			}
		})
	}
}

// TestOwnersClientGetsItsFailureAtOnce: the client whose request made a call that failed
// (a 500) gets that answer as soon as the call ends, while the call is tried again for the
// requests waiting with it on the same instance; they get the retry's answer.
func TestOwnersClientGetsItsFailureAtOnce(t *testing.T) {
	for name, rs := range backends(t) {
		t.Run(name, func(t *testing.T) {
			up := startUpstream(t)
			up.Set(fakeBehavior{Hold: true, Fail: []int{500}})
			in := newInstance(t, up, setup{redis: rs, flight: singleflight.Options{ResultTTL: time.Minute}})
			body := `{"model":"m","messages":[{"role":"user","content":"own failure, ` + name + `"}]}`
			answers := make(chan answer, 3)
			for range 3 {
				go func() { answers <- post(t, in.URL, "/v1/chat/completions", body) }()
			}
			waitWaiting(t, []*instance{in}, 3)
			waitRoles(t, []*instance{in}, 1)
			up.ReleaseHeld() // the first call answers 500; the retry will be held
			if _, ok := up.Wait(fakeupstream.Stats{Calls: 2}, 10*time.Second); !ok {
				t.Fatalf("%d upstream calls; want the retry for the waiting requests", up.Calls())
			}
			select {
			case a := <-answers:
				if a.status != 500 || a.header.Get("X-Dedupe-Role") != "owner" || !strings.Contains(a.body, "of call 1") {
					t.Fatalf("first answer: %d %q role %q; want the owner's own 500 from call 1", a.status, a.body, a.header.Get("X-Dedupe-Role"))
				}
			case <-time.After(5 * time.Second):
				t.Fatal("the owner's client got nothing while the retry for the others is held")
			}
			up.Release()
			for range 2 {
				if a := <-answers; a.status != 200 || a.header.Get("X-Dedupe-Role") != "follower" {
					t.Fatalf("waiter: %d %q role %q; want the retry's 200 as a follower", a.status, a.body, a.header.Get("X-Dedupe-Role"))
				}
			}
			if n := up.Calls(); n != 2 {
				t.Fatalf("%d upstream calls; want 2", n)
			}
		})
	}
}

// TestOverLimitContentLengthAnsweredAtOnce: a declared Content-Length over max_body_bytes
// is answered 413 before any of the body is sent.
func TestOverLimitContentLengthAnsweredAtOnce(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.MaxBodyBytes = 1000 }})
	res, body, err := rawRequest(t, in.URL, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\n"+
		"Content-Type: application/json\r\nContent-Length: 50000000\r\n\r\n", 5*time.Second)
	if err != nil {
		t.Fatalf("no answer within 5s to a declared 50 MB body, none of it sent: %v", err)
	}
	if res.StatusCode != http.StatusRequestEntityTooLarge || !strings.Contains(body, `"code":"request_too_large"`) {
		t.Errorf("got %d %s; want 413 with code request_too_large", res.StatusCode, body)
	}
}

// TestTruncatedBodyIsABadRequest: a body cut short of its Content-Length, by a client that
// then half-closes (it still reads), is answered 400, as nginx does (and counts it), not
// taken for a client gone.
func TestTruncatedBodyIsABadRequest(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{})
	conn, err := net.Dial("tcp", strings.TrimPrefix(in.URL, "http://"))
	if err != nil {
		t.Fatal(err)
	}
	defer conn.Close()
	io.WriteString(conn, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nContent-Type: application/json\r\nContent-Length: 100\r\n\r\n{\"model\":")
	conn.(*net.TCPConn).CloseWrite()
	conn.SetReadDeadline(time.Now().Add(5 * time.Second))
	res, err := http.ReadResponse(bufio.NewReader(conn), nil)
	if err != nil {
		t.Fatalf("no answer: %v", err)
	}
	b, _ := io.ReadAll(res.Body)
	if res.StatusCode != http.StatusBadRequest || !strings.Contains(string(b), `"code":"body_unreadable"`) || up.Calls() != 0 {
		t.Fatalf("a body cut short of its Content-Length was answered %d %q (%d upstream calls); want 400 body_unreadable", res.StatusCode, b, up.Calls())
	}
}

// TestIdentityContentEncodingIsDeduplicated: Content-Encoding: identity says the body is
// not encoded, so the key can see into it; only a real encoding is passed straight on.
func TestIdentityContentEncodingIsDeduplicated(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{flight: singleflight.Options{ResultTTL: time.Minute}})
	var got []string
	for range 2 {
		a := post(t, in.URL, "/v1/chat/completions", chatBody, "Content-Encoding", "identity")
		if a.status != http.StatusOK {
			t.Fatalf("got %d %s", a.status, a.body)
		}
		got = append(got, a.header.Get("X-Dedupe-Role"))
	}
	if got[0] != "owner" || got[1] != "hit" || up.Calls() != 1 {
		t.Fatalf("roles %v, %d upstream calls; want owner then hit, one call", got, up.Calls())
	}
	// Any encoding named, in any of the header's lines or list items, is one.
	for _, ce := range [][]string{{"identity", "gzip"}, {"identity, gzip"}} {
		h := "Content-Encoding: " + strings.Join(ce, "\r\nContent-Encoding: ") + "\r\n"
		res, _, err := rawRequest(t, in.URL, "POST /v1/chat/completions HTTP/1.1\r\nHost: proxy\r\nAuthorization: Bearer sk-test-1\r\n"+h+
			fmt.Sprintf("Content-Type: application/json\r\nContent-Length: %d\r\n\r\n%s", len(chatBody), chatBody), 5*time.Second)
		if err != nil {
			t.Fatal(err)
		}
		if r := res.Header.Get("X-Dedupe-Role"); r != "bypass" {
			t.Fatalf("Content-Encoding %q: role %q; want bypass", ce, r)
		}
	}
}

func TestBadRequests(t *testing.T) {
	up := startUpstream(t)
	in := newInstance(t, up, setup{proxy: func(c *proxy.Config) { c.MaxBodyBytes = 100 }})
	errorBody(t, post(t, in.URL, "/v1/chat/completions", `{"messages":"`+strings.Repeat("x", 200)+`"}`), 413, "request_too_large")
	errorBody(t, post(t, in.URL, "/v1/chat/completions", `not json`), 400, "invalid_json")
	errorBody(t, post(t, in.URL, "/v1/chat/completions", `[1,2]`), 400, "invalid_json")
	errorBody(t, post(t, in.URL, "/v1/chat/completions", `{"a":1} trailing`), 400, "invalid_json")
	if up.Calls() != 0 {
		t.Fatalf("%d upstream calls for bad requests; want 0", up.Calls())
	}
	// The instance still serves afterwards.
	if a := post(t, in.URL, "/v1/embeddings", `{"model":"e","input":"x"}`); a.status != 200 {
		t.Fatalf("after bad requests: %d %s", a.status, a.body)
	}
}

// TestBodyWithAndWithoutLength: a body is read the same whether the client sends its
// Content-Length or streams it chunked: up to max_body_bytes it is keyed alike, one byte
// more is 413 either way.
func TestBodyWithAndWithoutLength(t *testing.T) {
	up := startUpstream(t)
	const limit = 200
	in := newInstance(t, up, setup{flight: singleflight.Options{ResultTTL: time.Minute},
		proxy: func(c *proxy.Config) { c.MaxBodyBytes = limit }})
	body := func(n int) string { // a JSON object of exactly n bytes
		const open, end = `{"model":"m","input":"`, `"}`
		return open + strings.Repeat("x", n-len(open)-len(end)) + end
	}
	send := func(b string, chunked bool) answer {
		var r io.Reader = strings.NewReader(b)
		if chunked {
			r = io.MultiReader(r) // a reader of unknown length: sent chunked
		}
		req, _ := http.NewRequest(http.MethodPost, in.URL+"/v1/embeddings", r)
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return answer{err: err}
		}
		defer resp.Body.Close()
		rb, _ := io.ReadAll(resp.Body)
		return answer{status: resp.StatusCode, header: resp.Header, body: string(rb)}
	}
	known, unknown := send(body(limit), false), send(body(limit), true)
	if known.status != 200 || unknown.status != 200 {
		t.Fatalf("a body of the limit: %d with Content-Length, %d chunked; want 200", known.status, unknown.status)
	}
	if k, u := known.header.Get("X-Dedupe-Key"), unknown.header.Get("X-Dedupe-Key"); k != u || unknown.header.Get("X-Dedupe-Role") != "hit" {
		t.Fatalf("chunked: key %s role %s; want the key %s and a hit", u, unknown.header.Get("X-Dedupe-Role"), k)
	}
	errorBody(t, send(body(limit+1), false), 413, "request_too_large")
	errorBody(t, send(body(limit+1), true), 413, "request_too_large")
}
