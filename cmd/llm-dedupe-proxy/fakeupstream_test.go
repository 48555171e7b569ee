package main

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"net/http"
	"strings"
	"sync"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// startFakeUpstream runs the fake-upstream command in-process on a free loopback port and
// returns its base URL, read from the line it prints; it stops with the test.
func startFakeUpstream(t *testing.T, args ...string) string {
	t.Helper()
	ctx, cancel := context.WithCancel(context.Background())
	out, outw := io.Pipe()
	done := make(chan int, 1)
	go func() {
		args := append([]string{"fake-upstream", "--listen=127.0.0.1:0"}, args...)
		done <- run(ctx, args, nil, strings.NewReader(""), outw, io.Discard)
		outw.Close()
	}()
	t.Cleanup(func() {
		cancel()
		if code := <-done; code != 0 {
			t.Errorf("fake-upstream: status %d after its context ended; want 0", code)
		}
	})
	line, err := bufio.NewReader(out).ReadString('\n')
	go io.Copy(io.Discard, out)
	addr, _, ok := strings.Cut(strings.TrimPrefix(line, "fake upstream on "), " ")
	if err != nil || !ok || !strings.HasPrefix(addr, "http://127.0.0.1:") {
		t.Fatalf("fake-upstream printed %q (%v); want \"fake upstream on http://127.0.0.1:PORT …\"", line, err)
	}
	return addr
}

func fakeStats(t *testing.T, base string) fakeupstream.Stats {
	t.Helper()
	res, err := http.Get(base + "/_fake/stats")
	if err != nil {
		t.Fatal(err)
	}
	defer res.Body.Close()
	var s fakeupstream.Stats
	if err := json.NewDecoder(res.Body).Decode(&s); err != nil {
		t.Fatal(err)
	}
	return s
}

// TestTryWithoutAKey is the README's first steps with no API key: the fake upstream, slow
// enough that identical requests overlap, two instances on one Redis, and a burst of six
// identical requests spread over them, which costs one upstream call; a seventh, later,
// is a hit.
func TestTryWithoutAKey(t *testing.T) {
	const delay = 500 * time.Millisecond
	up := startFakeUpstream(t, "--delay="+delay.String())
	rs := redistest.Start(t)
	var bases []string
	for range 2 {
		base, stop := startServe(t, "--upstream.base_url="+up, "--redis.addrs="+rs.Addr)
		defer stop()
		bases = append(bases, base)
	}

	const body = `{"model":"gpt-4o-mini","temperature":0,"messages":[{"role":"user","content":"Say hi"}]}`
	post := func(base string) (role, answer string) {
		res, err := http.Post(base+"/v1/chat/completions", "application/json", strings.NewReader(body))
		if err != nil {
			t.Error(err)
			return "", ""
		}
		defer res.Body.Close()
		b, _ := io.ReadAll(res.Body)
		return res.Header.Get("X-Dedupe-Role"), string(b)
	}
	var wg sync.WaitGroup
	var mu sync.Mutex
	roles := map[string]int{}
	start := time.Now()
	for i := range 6 {
		wg.Go(func() {
			role, answer := post(bases[i%2])
			mu.Lock()
			defer mu.Unlock()
			roles[role]++
			if want := fakeupstream.Unary("/v1/chat/completions", 1, "gpt-4o-mini"); answer != want {
				t.Errorf("request %d: %s answered %s; want call 1's answer, %s", i, role, answer, want)
			}
		})
	}
	wg.Wait()
	if took := time.Since(start); took < delay {
		t.Errorf("the burst took %s; want at least the fake's delay, %s", took, delay)
	}
	if roles["owner"] != 1 || roles["follower"] != 5 {
		t.Errorf("roles %v; want 1 owner and 5 followers", roles)
	}
	if role, _ := post(bases[1]); role != "hit" {
		t.Errorf("a request after the burst: role %q; want hit", role)
	}
	if s := fakeStats(t, up); s != (fakeupstream.Stats{Calls: 1, Completed: 1}) {
		t.Errorf("the fake upstream counted %+v; want 1 call, completed", s)
	}
}

// TestFakeUpstreamRefuses: a negative delay and an address in use are said, not served.
func TestFakeUpstreamRefuses(t *testing.T) {
	if r := runCmd(t, nil, "", "fake-upstream", "--delay=-1s"); r.code != 2 || !strings.Contains(r.stderr, "--delay must not be negative") {
		t.Errorf("--delay=-1s: status %d, %q; want 2 and why", r.code, r.stderr)
	}
	up := startFakeUpstream(t, "--delay=0s")
	if r := runCmd(t, nil, "", "fake-upstream", "--listen="+strings.TrimPrefix(up, "http://")); r.code != 1 || !strings.Contains(r.stderr, "is taken") ||
		!strings.Contains(r.stderr, "--listen=127.0.0.1:PORT") || !strings.Contains(r.stderr, "--upstream.base_url=http://127.0.0.1:PORT") {
		t.Errorf("an address in use: status %d, %q; want 1, why, and the flags that move it", r.code, r.stderr)
	}
}
