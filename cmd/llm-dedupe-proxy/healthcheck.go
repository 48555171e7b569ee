package main

import (
	"encoding/json"
	"fmt"
	"net"
	"net/http"
	"time"
)

// healthcheck asks the running proxy's /healthz (on the configured listen address) and exits
// 0 when it answers 200. It lets a container image without a shell or curl have a
// HEALTHCHECK. With --require-redis it asks /readyz instead and exits 0 only when the
// instance deduplicates through Redis: a check of a deployment (the Helm chart's `helm
// test`), not a probe, since an instance without Redis still serves (ADR 0072).
func (a *app) healthcheck(args []string) int {
	c := lookupCommand("healthcheck")
	fs, cf := a.flagSet(c)
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
	requireRedis := fs.Bool("require-redis", false, "ask /readyz, and fail unless the instance is ready and deduplicates through Redis")
	if code, done := a.parse(c, fs, args, 0); done {
		return code
	}
	cfg, err := cf.load(a.env)
	if err != nil {
		return a.invalidConfig(err)
	}
	base, err := localBase(cfg.Listen)
	if err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy healthcheck: listen %q: %v\n", cfg.Listen, err)
		return 1
	}
	client := &http.Client{Timeout: *timeout}
	if *requireRedis {
		return a.checkRedis(client, base)
	}
	resp, err := client.Get(base + "/healthz")
	if err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy healthcheck: %v\n", err)
		return 1
	}
	resp.Body.Close()
	if resp.StatusCode != http.StatusOK {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy healthcheck: /healthz answered %d\n", resp.StatusCode)
		return 1
	}
	return 0
}

// checkRedis asks /readyz and returns 0 when the instance is ready on the Redis backend and
// not degraded.
func (a *app) checkRedis(client *http.Client, base string) int {
	resp, err := client.Get(base + "/readyz")
	if err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy healthcheck: %v\n", err)
		return 1
	}
	defer resp.Body.Close()
	var ready struct {
		Status   string `json:"status"`
		Backend  string `json:"backend"`
		Degraded bool   `json:"degraded"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&ready); err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy healthcheck: /readyz answered %d, %v\n", resp.StatusCode, err)
		return 1
	}
	switch {
	case resp.StatusCode != http.StatusOK:
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy healthcheck: /readyz answered %d (%s)\n", resp.StatusCode, ready.Status)
	case ready.Backend != "redis":
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy healthcheck: backend %q: no Redis configured, each instance deduplicates alone\n", ready.Backend)
	case ready.Degraded:
		fmt.Fprintln(a.stderr, "llm-dedupe-proxy healthcheck: degraded: the instance does not reach its Redis and deduplicates alone (its log names the cause: address, password, ACL, TLS)")
	default:
		return 0
	}
	return 1
}

// localBase is the URL to reach, from this machine, a server listening on listen: a
// wildcard or empty host is reached on the loopback address.
func localBase(listen string) (string, error) {
	host, port, err := net.SplitHostPort(listen)
	if err != nil {
		return "", err
	}
	if host == "" || host == "0.0.0.0" || host == "::" {
		host = "127.0.0.1"
	}
	return "http://" + net.JoinHostPort(host, port), nil
}
