package main

import (
	"fmt"
	"net"
	"net/http"
	"time"
)

// healthcheck asks the running proxy's /healthz (on the configured listen address) and exits
// 0 when it answers 200. It lets a container image without a shell or curl have a
// HEALTHCHECK.
func (a *app) healthcheck(args []string) int {
	c := lookupCommand("healthcheck")
	fs, cf := a.flagSet(c)
	timeout := fs.Duration("timeout", 2*time.Second, "how long to wait for the answer")
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
