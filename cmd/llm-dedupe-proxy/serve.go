package main

import (
	"context"
	"errors"
	"fmt"
	"io"
	"log/slog"
	"net"
	"net/http"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/tracing"
)

// serve runs the HTTP server until ctx ends, then shuts it down gracefully: requests in
// progress get shutdown_timeout to finish. Status 0 when all of them did.
func (a *app) serve(args []string) int {
	ctx := a.ctx
	c := lookupCommand("serve")
	fs, cf := a.flagSet(c)
	printCfg := fs.Bool("print-config", false, "print the configuration in effect, secrets redacted, and exit")
	if code, done := a.parse(c, fs, args, 0); done {
		return code
	}
	cfg, err := cf.load(a.env)
	// The OTEL_* variables are configuration too: see ADR 0079.
	if err := errors.Join(err, tracing.Check(func(name string) string { return a.env[name] })); err != nil {
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
	if cfg.Upstream.APIKey != "" && everyInterface(cfg.Listen) {
		logger.Warn(exposedKey, "listen", cfg.Listen)
	}
	// Both addresses are taken before Redis is dialled: one in use is said like an invalid
	// value, not after log lines about the backend. See ADR 0079.
	ln, err := listenOn("listen", cfg.Listen, cf.fromEnv(a.env, "listen"))
	if err != nil {
		return a.invalidConfig(err)
	}
	var adminLn net.Listener
	if cfg.Admin.Listen != "" {
		if adminLn, err = listenOn("admin.listen", cfg.Admin.Listen, cf.fromEnv(a.env, "admin.listen")); err != nil {
			_ = ln.Close()
			return a.invalidConfig(err)
		}
	}

	defer startPprof(a, logger)()
	wired, err := wire(cfg, logger)
	if err != nil {
		_ = ln.Close()
		if adminLn != nil {
			_ = adminLn.Close()
		}
		var ce *configError
		if errors.As(err, &ce) { // a file a key names, read only now
			ce.Env = cf.fromEnv(a.env, ce.Key)
			return a.invalidConfig(ce)
		}
		logger.Error("start", "err", err)
		return 1
	}
	srv := &http.Server{
		Handler:           wired.handler,
		ReadHeaderTimeout: 10 * time.Second,
		IdleTimeout:       2 * time.Minute,
		// No WriteTimeout: a streamed answer may take as long as upstream.timeout. A client
		// that stops reading is cut off by limits.send_timeout instead (a deadline per
		// write, which the server lifts after each answer).
		ErrorLog: slog.NewLogLogger(logger.Handler(), slog.LevelWarn),
	}
	stopAdmin := serveAdmin(adminLn, wired.admin, logger)
	defer stopAdmin()
	served := make(chan error, 1)
	go func() { served <- srv.Serve(ln) }()
	logger.Info("listening", "addr", ln.Addr().String(), "upstream", proxy.RedactURL(cfg.Upstream.BaseURL), "version", version,
		"instance", wired.id)

	code := 0
	select {
	case err := <-served:
		logger.Error("serve", "err", err)
		code = 1
	case <-ctx.Done():
		logger.Info("shutting down", "timeout", cfg.ShutdownTimeout.String())
	}
	// Say not ready, and close each connection after its next answer (Connection: close,
	// added by the proxy; not SetKeepAlivesEnabled, which would close idle connections at
	// once, under requests already on their way). With shutdown_delay, go on serving for
	// that long, so that a load balancer that sees the 503 stops sending before the
	// listener closes. Then stop accepting and let requests in progress finish within
	// shutdown_timeout. Flights still owned when it runs out are released to the other
	// instances, which take them over at once instead of waiting for the lease to expire;
	// the requests still waiting here then end, and the server closes.
	wired.drain()
	if cfg.ShutdownDelay > 0 && code == 0 {
		logger.Info("draining: serving on, ready no more", "delay", cfg.ShutdownDelay.String())
		select {
		case <-time.After(cfg.ShutdownDelay):
		case err := <-served:
			logger.Error("serve", "err", err)
			code = 1
		}
	}
	sctx, cancel := context.WithTimeout(context.Background(), cfg.ShutdownTimeout)
	defer cancel()
	serr := srv.Shutdown(sctx) // returns when requests are done or sctx ends
	if err := wired.close(sctx); err != nil {
		logger.Error("shutdown", "err", err)
		code = 1
	}
	if serr != nil && !errors.Is(serr, context.DeadlineExceeded) {
		logger.Error("shutdown", "err", serr)
		code = 1
	}
	if serr != nil {
		// Requests that waited on released flights are answering 503 now: give them a
		// moment to be written before the connections close.
		gctx, gcancel := context.WithTimeout(context.Background(), time.Second)
		_ = srv.Shutdown(gctx)
		gcancel()
	}
	_ = srv.Close()
	logger.Info("stopped")
	return code
}

// exposedKey is logged at start-up when upstream.api_key is set and the proxy listens on
// every interface: the proxy authenticates no client, so the key is anyone's who can reach
// the port.
const exposedKey = "upstream.api_key is set and listen is on every interface: whoever reaches this port calls the upstream with that key; " +
	"let only trusted clients reach it (a firewall, a network policy, an authenticating gateway in front) or listen on 127.0.0.1"

// everyInterface reports whether a listen address takes connections on every interface:
// its host is empty or unspecified (0.0.0.0, ::).
func everyInterface(listen string) bool {
	host, _, err := net.SplitHostPort(listen)
	if err != nil {
		return false
	}
	ip := net.ParseIP(host)
	return host == "" || ip != nil && ip.IsUnspecified()
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
