package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"net/url"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// serve runs the HTTP server until ctx ends, then shuts it down gracefully: requests in
// progress get shutdown_timeout to finish. Status 0 when all of them did.
func (a *app) serve(ctx context.Context, args []string) int {
	fs, cf := a.flagSet("serve", "[serve] [flags]")
	printCfg := fs.Bool("print-config", false, "print the effective configuration, secrets redacted, and exit")
	if code, done := a.parse(fs, args, 0); done {
		return code
	}
	cfg, err := cf.load(a.getenv)
	if err != nil {
		return a.invalidConfig(err)
	}
	if *printCfg {
		if err := printConfig(a.stdout, cfg); err != nil {
			fmt.Fprintf(a.stderr, "llm-dedupe-proxy: %v\n", err)
			return 1
		}
		return 0
	}

	logger := newLogger(a.stderr, cfg.Log)
	handler, cleanup, err := newHandler(cfg, logger)
	if err != nil {
		logger.Error("start", "err", err)
		return 1
	}
	ln, err := net.Listen("tcp", cfg.Listen)
	if err != nil {
		logger.Error("listen", "err", err)
		_ = cleanup(context.Background())
		return 1
	}
	srv := &http.Server{
		Handler:           handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// No WriteTimeout: a streamed answer may take as long as upstream.timeout.
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String(), "upstream", cfg.Upstream.BaseURL, "version", version)

	code := 0
	select {
	case err := <-served:
		logger.Error("serve", "err", err)
		code = 1
	case <-ctx.Done():
		logger.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	if err := srv.Shutdown(sctx); err != nil {
		logger.Error("shutdown: requests cut short", "err", err)
		_ = srv.Close()
		code = 1
	}
	if err := cleanup(sctx); err != nil {
		logger.Error("shutdown", "err", err)
		code = 1
	}
	return code
}

// newHandler builds what the server serves and a function that releases what the handler
// holds, called once the server has stopped. /healthz answers while the process runs; every
// other route is passed through to the upstream.
func newHandler(cfg Config, logger *slog.Logger) (http.Handler, func(context.Context) error, error) {
	target, err := url.Parse(cfg.Upstream.BaseURL)
	if err != nil {
		return nil, nil, err
	}
	transport := proxy.NewTransport()
	pass := proxy.NewPassthrough(target, cfg.Upstream.APIKey, transport)
	pass.ErrorLog = slog.NewLogLogger(logger.Handler(), slog.LevelWarn)

	r := chi.NewRouter()
	r.Get("/healthz", healthz)
	r.Head("/healthz", healthz)
	r.Handle("/*", proxy.Timeout(cfg.Upstream.Timeout)(pass))
	cleanup := func(context.Context) error {
		transport.CloseIdleConnections()
		return nil
	}
	return r, cleanup, nil
}

func healthz(w http.ResponseWriter, _ *http.Request) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	_, _ = io.WriteString(w, `{"status":"ok"}`+"\n")
}

// newLogger returns the logger of the server; level and format have been validated.
func newLogger(w io.Writer, c LogConfig) *slog.Logger {
	var level slog.Level
	if err := level.UnmarshalText([]byte(c.Level)); err != nil {
		level = slog.LevelInfo
	}
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "text" {
		return slog.New(slog.NewTextHandler(w, opts))
	}
	return slog.New(slog.NewJSONHandler(w, opts))
}
