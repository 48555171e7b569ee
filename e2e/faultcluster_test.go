package e2e

import (
	"context"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/faultproxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// faultCluster is a cluster whose proxies each reach Redis through a fault proxy of their
// own, so that Redis can hang, crawl or reset for one instance or for all of them.
type faultCluster struct {
	*cluster
	faults []*faultproxy.Proxy // faults[i] stands between ins[i] and Redis
}

// startFaultCluster starts Redis, n fault proxies to it, the fake upstream and n proxies,
// the i-th through the i-th fault proxy, with the cluster's settings and env over them.
func startFaultCluster(t *testing.T, n int, env map[string]string) *faultCluster {
	t.Helper()
	srv := redistest.Start(t)
	fc := &faultCluster{}
	for range n {
		fp, err := faultproxy.Listen(srv.Addr)
		if err != nil {
			t.Fatal(err)
		}
		t.Cleanup(func() { fp.Close() }) // after the proxies: cleanups run last in, first out
		fc.faults = append(fc.faults, fp)
	}
	fc.cluster = startCluster(t, clusterOpts{n: 1, env: env, redisAddrs: []string{fc.faults[0].Addr()}})
	fc.redis = srv
	for _, fp := range fc.faults[1:] {
		fc.startVia(fp.Addr())
	}
	return fc
}

// startVia starts one more proxy that reaches Redis at addr.
func (c *cluster) startVia(addr string) *instance {
	c.t.Helper()
	env := c.env
	defer func() { c.env = env }()
	c.env = nil
	for _, kv := range env {
		if strings.HasPrefix(kv, "LLM_DEDUPE_REDIS_ADDRS=") {
			kv = "LLM_DEDUPE_REDIS_ADDRS=" + addr
		}
		c.env = append(c.env, kv)
	}
	return c.start()
}

// set gives the fault proxies of the instances in which (all if none) fault f.
func (fc *faultCluster) set(f faultproxy.Fault, which ...int) {
	if len(which) == 0 {
		for i := range fc.faults {
			which = append(which, i)
		}
	}
	for _, i := range which {
		fc.faults[i].Set(f)
	}
}

// silentUntilClaim holds Redis's replies to the instances in which until Redis has a
// flight it did not have before: the next prompt's claim, when its first request went to
// one of them (startMixedLoad sends prompt k first to instance k mod n).
func (fc *faultCluster) silentUntilClaim(which ...int) {
	t := fc.t
	t.Helper()
	ctx := context.Background()
	rdb := fc.redis.Client()
	metas := func() map[string]bool {
		keys, err := rdb.Keys(ctx, "ai:flight:meta:*").Result()
		if err != nil {
			t.Fatal(err)
		}
		m := map[string]bool{}
		for _, k := range keys {
			m[k] = true
		}
		return m
	}
	before := metas()
	fc.set(faultproxy.Fault{Mode: faultproxy.Silent}, which...)
	redistest.WaitUntil(t, 5*time.Second, "a new flight in Redis", func() (bool, string) {
		for k := range metas() { // no event says a script ran
			if !before[k] {
				return true, ""
			}
		}
		return false, "none"
	})
}

// The proxy's log messages for a degrade and a recovery (cmd/llm-dedupe-proxy/wire.go).
const (
	msgDegraded = "redis unavailable: serving with local-only dedupe until it answers (each instance calls the upstream for its own requests); " +
		"if it does not, check redis.addrs and that Redis runs there"
	msgRecovered = "redis answers again: distributed dedupe resumed"
)

// lineCount is how many lines the process has written so far: a mark to count from.
func (p *proc) lineCount() int {
	p.mu.Lock()
	defer p.mu.Unlock()
	return len(p.lines)
}

// logged returns the times (the log's own) of the lines from index from on whose msg is msg.
func (p *proc) logged(from int, msg string) []time.Time {
	p.mu.Lock()
	defer p.mu.Unlock()
	var at []time.Time
	for _, l := range p.lines[min(from, len(p.lines)):] {
		if m := parseLog(l); m["msg"] == msg {
			at = append(at, logTime(m))
		}
	}
	return at
}

// logTime is when a JSON log line was written (slog's "time", RFC 3339).
func logTime(m logLine) time.Time {
	s, _ := m["time"].(string)
	t, _ := time.Parse(time.RFC3339Nano, s)
	return t
}

// writeLogs writes each proxy's whole output to dir/<name>.log, for a scenario's figures
// to be traced to the operation that stalled (E2E_FAULT_LOGS=dir).
func (fc *faultCluster) writeLogs(t *testing.T, dir string) {
	if err := os.MkdirAll(dir, 0o755); err != nil {
		t.Error(err)
		return
	}
	for _, in := range fc.ins {
		in.mu.Lock()
		text := strings.Join(in.lines, "\n") + "\n"
		in.mu.Unlock()
		if err := os.WriteFile(filepath.Join(dir, in.name+".log"), []byte(text), 0o644); err != nil {
			t.Error(err)
		}
	}
	t.Logf("proxy logs in %s", dir)
}
