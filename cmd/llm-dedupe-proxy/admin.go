package main

import (
	"errors"
	"log/slog"
	"net"
	"net/http"
	"time"
)

// serveAdmin serves the admin API on its own listener, so that it can be bound to an
// address clients cannot reach; with no handler it does nothing. stop closes it at once:
// admin requests are short, and none should outlive the proxy.
func serveAdmin(ln net.Listener, h http.Handler, logger *slog.Logger) (stop func()) {
	if h == nil {
		if ln != nil {
			_ = ln.Close()
		}
		return func() {}
	}
	srv := &http.Server{
		Handler:           h,
		ReadHeaderTimeout: 5 * time.Second,
		ReadTimeout:       10 * time.Second,
		WriteTimeout:      30 * time.Second,
		ErrorLog:          slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	done := make(chan struct{})
	go func() {
		defer close(done)
		if err := srv.Serve(ln); err != nil && !errors.Is(err, http.ErrServerClosed) {
			logger.Error("admin serve", "err", err)
		}
	}()
	logger.Info("admin listening", "addr", ln.Addr().String())
	return func() {
		_ = srv.Close()
		<-done
	}
}
