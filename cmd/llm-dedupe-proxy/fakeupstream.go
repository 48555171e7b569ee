package main

import (
	"errors"
	"fmt"
	"net"
	"net/http"
	"syscall"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
)

// fakeUpstream serves the fake OpenAI API of the tests (package fakeupstream) until the
// context ends, so that the proxy can be tried with no API key and with an upstream slow
// enough for identical requests to overlap. It listens on loopback unless told otherwise.
func (a *app) fakeUpstream(args []string) int {
	c := lookupCommand("fake-upstream")
	fs, _ := a.flagSet(c)
	listen := fs.String("listen", "127.0.0.1:9000", "`host:port` to listen on")
	delay := fs.Duration("delay", 2*time.Second, "how long each answer takes (a stream: between its events)")
	if code, done := a.parse(c, fs, args, 0); done {
		return code
	}
	if *delay < 0 {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy fake-upstream: --delay must not be negative, got %s\n", delay)
		return 2
	}
	ln, err := net.Listen("tcp", *listen)
	if errors.Is(err, syscall.EADDRINUSE) {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy fake-upstream: %s is taken (by a fake upstream still running?): stop what holds it,\n"+
			"or listen elsewhere with --listen=127.0.0.1:PORT and start the proxy with --upstream.base_url=http://127.0.0.1:PORT\n", *listen)
		return 1
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy fake-upstream: %v\n", err)
		return 1
	}
	up := fakeupstream.New()
	up.Set(fakeupstream.Behavior{Delay: *delay})
	srv := &http.Server{Handler: up, ReadHeaderTimeout: 10 * time.Second}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	fmt.Fprintf(a.stdout, "fake upstream on http://%s (no API key needed): each answer takes %s; calls counted at /_fake/stats\n",
		ln.Addr(), formatDuration(*delay))
	select {
	case err := <-served:
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy fake-upstream: %v\n", err)
		return 1
	case <-a.ctx.Done():
	}
	if err := srv.Close(); err != nil && !errors.Is(err, http.ErrServerClosed) {
		return 1
	}
	return 0
}
