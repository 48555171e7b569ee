//go:build pprof

package main

import (
	"errors"
	"log/slog"
	"net/http"
	"net/http/pprof"
	"time"
)

// startPprof serves net/http/pprof on LLM_DEDUPE_PPROF_LISTEN, when it is set, and returns
// the function that stops it. It exists only in a binary built with -tags pprof: the
// benchmark harness profiles the real binary that way, and the shipped one has no debug
// endpoint at all.
func startPprof(a *app, logger *slog.Logger) (stop func()) {
	addr, ok := a.getenv("LLM_DEDUPE_PPROF_LISTEN")
	if !ok || addr == "" {
		return func() {}
	}
	mux := http.NewServeMux()
	mux.HandleFunc("/debug/pprof/", pprof.Index)
	mux.HandleFunc("/debug/pprof/profile", pprof.Profile)
	srv := &http.Server{Addr: addr, Handler: mux, ReadHeaderTimeout: 10 * time.Second}
	go func() {
		if err := srv.ListenAndServe(); !errors.Is(err, http.ErrServerClosed) {
			logger.Error("pprof", "err", err)
		}
	}()
	return func() { _ = srv.Close() }
}
