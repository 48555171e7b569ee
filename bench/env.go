package main

import (
	"bytes"
	"context"
	"encoding/json"
	"fmt"
	"net/http"
	"os"
	"path/filepath"
	"strconv"
	"strings"
	"time"

	"github.com/redis/go-redis/v9"
)

// env is everything one harness run started: the fake upstream, Redis, three proxy
// instances and three nginx instances, all on loopback.
type env struct {
	dir      string
	ps       procs
	c        *client
	proxyBin string
	fake     *proc
	fakeURL  string
	redis    *proc
	rdb      *redis.Client
	proxies  []*proc
	proxy    []string // base URLs
	memory   string   // base URL of an instance on the in-memory backend (no Redis)
	nginxes  []*proc
	nginx    []string
	runID    string
}

func setup(ctx context.Context, withNginx bool) (*env, error) {
	dir, err := os.MkdirTemp("", "llm-dedupe-bench-")
	if err != nil {
		return nil, err
	}
	e := &env{dir: dir, c: newClient(), runID: strconv.FormatInt(time.Now().UnixNano(), 36)}
	fail := func(err error) (*env, error) { e.close(); return nil, err }

	logf("building the proxy and the fake upstream")
	proxyBin, fakeBin, err := buildBinaries(ctx, filepath.Join(dir, "bin"))
	if err != nil {
		return fail(err)
	}
	e.proxyBin = proxyBin
	if e.fake, e.fakeURL, err = startFake(&e.ps, dir, fakeBin); err != nil {
		return fail(err)
	}
	var redisAddr string
	if e.redis, redisAddr, err = startRedis(ctx, &e.ps, dir); err != nil {
		return fail(err)
	}
	e.rdb = redis.NewClient(&redis.Options{Addr: redisAddr})
	for i := range 3 {
		p, base, err := startProxy(ctx, &e.ps, dir, proxyBin, fmt.Sprintf("proxy-%d", i+1), e.fakeURL, redisAddr)
		if err != nil {
			return fail(err)
		}
		e.proxies, e.proxy = append(e.proxies, p), append(e.proxy, base)
	}
	// One more instance without Redis: the owner path minus its Redis round trips.
	if _, e.memory, err = startProxy(ctx, &e.ps, dir, proxyBin, "proxy-memory", e.fakeURL, ""); err != nil {
		return fail(err)
	}
	if withNginx {
		for i := range 3 {
			p, base, err := startNginx(ctx, &e.ps, dir, fmt.Sprintf("nginx-%d", i+1), e.fakeURL)
			if err != nil {
				return fail(err)
			}
			e.nginxes, e.nginx = append(e.nginxes, p), append(e.nginx, base)
		}
	}
	return e, nil
}

func (e *env) redisAddr() string { return e.rdb.Options().Addr }

func (e *env) close() {
	if e.rdb != nil {
		e.rdb.Close()
	}
	e.ps.stopAll()
	if e.dir != "" {
		os.RemoveAll(e.dir)
	}
}

// behavior is the fake upstream's control document (package internal/fakeupstream).
type behavior struct {
	Delay  time.Duration `json:"delay"`
	Hold   bool          `json:"hold"`
	Chunks int           `json:"chunks"`
}

func (e *env) setFake(ctx context.Context, b behavior) error {
	body, _ := json.Marshal(b)
	return e.fakeControl(ctx, "/_fake/behavior", body)
}

func (e *env) releaseFake(ctx context.Context) error {
	return e.fakeControl(ctx, "/_fake/release", nil)
}

func (e *env) fakeControl(ctx context.Context, path string, body []byte) error {
	req, _ := http.NewRequestWithContext(ctx, http.MethodPost, e.fakeURL+path, bytes.NewReader(body))
	resp, err := e.c.hc.Do(req)
	if err != nil {
		return err
	}
	resp.Body.Close()
	if resp.StatusCode/100 != 2 {
		return fmt.Errorf("fake upstream %s: %s", path, resp.Status)
	}
	return nil
}

// fakeCalls is the number of model calls the fake upstream has received.
func (e *env) fakeCalls(ctx context.Context) (int64, error) {
	b, err := e.c.get(ctx, e.fakeURL+"/_fake/stats")
	if err != nil {
		return 0, err
	}
	var s struct {
		Calls int64 `json:"calls"`
	}
	err = json.Unmarshal(b, &s)
	return s.Calls, err
}

// metric is the sum of the samples of name on a proxy's /metrics, whatever their labels.
func (e *env) metric(ctx context.Context, base, name string) (float64, error) {
	b, err := e.c.get(ctx, base+"/metrics")
	if err != nil {
		return 0, err
	}
	sum, found := 0.0, false
	for _, line := range strings.Split(string(b), "\n") {
		series, value, ok := strings.Cut(line, " ")
		if n, _, _ := strings.Cut(series, "{"); !ok || n != name {
			continue
		}
		v, err := strconv.ParseFloat(strings.TrimSpace(value), 64)
		if err != nil {
			return 0, fmt.Errorf("metric %s: %w", name, err)
		}
		sum, found = sum+v, true
	}
	if !found {
		return 0, fmt.Errorf("metric %s not found", name)
	}
	return sum, nil
}

func chatURL(base string) string { return base + "/v1/chat/completions" }

func chatURLs(bases []string) []string {
	out := make([]string, len(bases))
	for i, b := range bases {
		out[i] = chatURL(b)
	}
	return out
}

func logf(format string, args ...any) {
	fmt.Fprintf(os.Stderr, "bench: "+format+"\n", args...)
}
