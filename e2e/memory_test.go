package e2e

import (
	"fmt"
	"syscall"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// TestMemoryPerRequestAndAnswer measures one proxy's resident memory (its own
// process_resident_memory_bytes) under requests waiting for a held upstream, distinct ones
// (each its own flight and upstream connection) and identical ones (followers of one
// flight), and with answers kept in its memory; the README's sizing comes from these
// figures (grep MEMORY). The bounds are loose: they catch a cost that grows by an order of
// magnitude, not a drift. See ADR 0072.
func TestMemoryPerRequestAndAnswer(t *testing.T) {
	const n = 1000
	c := startCluster(t, clusterOpts{n: 1, env: map[string]string{"LLM_DEDUPE_FLIGHT_RESULT_TTL": "10m"}})
	// Each measure on a process of its own, from its own start: memory another measure
	// freed would be used again without showing.
	var in *instance
	rss := func() float64 { return in.metric("process_resident_memory_bytes", nil) }
	fresh := func() {
		if in != nil {
			in.signal(syscall.SIGTERM)
			in.wait(10 * time.Second)
		}
		in = c.start()
		// Warm up: pools and code pages in.
		wantChat(t, "warm-up", post(in.URL, chatPath, chatBody("e2e-memory", "warm up"), apiKeyA), "e2e-memory", 0)
		t.Logf("MEMORY base: %.1f MiB resident after start", rss()/(1<<20))
	}

	waiting := func(name string, body func(i int) string, calls int64) float64 {
		fresh()
		before, calls0 := rss(), c.fake.stats().Calls
		c.fake.set(fakeupstream.Behavior{Hold: true})
		chs := make([]<-chan answer, n)
		for i := range n {
			chs[i] = postAsync(in.URL, chatPath, body(i), apiKeyA)
		}
		waitWaiting(t, []*instance{in}, n)
		per := (rss() - before) / n
		c.fake.release()
		for i, a := range collect(chs) {
			if a.err != nil || a.status != 200 {
				t.Fatalf("%s %d: %v", name, i, a)
			}
		}
		if got := c.fake.stats().Calls - calls0; got != calls {
			t.Errorf("%s: %d upstream calls for %d requests; want %d", name, got, n, calls)
		}
		t.Logf("MEMORY %s: %.1f KiB resident per waiting request (%d waiting, %d upstream calls held)", name, per/1024, n, calls)
		return per
	}
	distinct := waiting("distinct", func(i int) string { return chatBody("e2e-memory", fmt.Sprintf("distinct %d", i)) }, n)
	identical := waiting("identical", func(int) string { return chatBody("e2e-memory", "identical") }, 1)

	// Answers kept: streamed answers of about 16 KiB, each its own flight, then stored.
	const chunks = 150
	size := len(fakeupstream.Transcript(chatPath, 1, "e2e-memory", chunks, true))
	c.fake.set(fakeupstream.Behavior{Chunks: chunks})
	fresh()
	beforeCache := rss()
	for i := range n / 100 {
		var batch []*sseClient
		for j := range 100 {
			batch = append(batch, openSSE(in.URL, streamBody("e2e-memory", fmt.Sprintf("kept %d", i*100+j)), apiKeyA))
		}
		for j, s := range batch {
			if _, cut := checkStream(t, fmt.Sprintf("stream %d", i*100+j), s.result(), "e2e-memory", chunks); cut {
				t.Fatalf("stream %d cut", i*100+j)
			}
		}
	}
	// Every answer is stored: a repeat is a hit.
	redistest.WaitUntil(t, 10*time.Second, "a stored answer", func() (bool, string) {
		r := openSSE(in.URL, streamBody("e2e-memory", "kept 0"), apiKeyA).result()
		return r.role() == "hit", r.role()
	})
	kept := (rss() - beforeCache) / n
	t.Logf("MEMORY kept: %.1f KiB resident per answer kept in memory (%d answers of %.1f KiB)", kept/1024, n, float64(size)/1024)

	for name, tc := range map[string]struct{ got, max float64 }{
		"per distinct waiting request":  {distinct, 256 << 10},
		"per identical waiting request": {identical, 128 << 10},
		"per answer kept":               {kept, 8*float64(size) + 64<<10},
	} {
		if tc.got > tc.max {
			t.Errorf("%s: %.0f bytes resident; want at most %.0f", name, tc.got, tc.max)
		}
	}
}
