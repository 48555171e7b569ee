package main

import (
	"context"
	"crypto/rand"
	"crypto/tls"
	"crypto/x509"
	"encoding/hex"
	"errors"
	"fmt"
	"log/slog"
	"net/http"
	"net/url"
	"os"
	"strings"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/promhttp"
	"github.com/redis/go-redis/v9"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/clusterclient"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/metrics"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/tracing"
)

// wiring is what serve runs: the handler, and the steps of a graceful stop.
type wiring struct {
	id      string // the instance id: owner of its flights in the admin API, in /readyz and /metrics
	handler http.Handler
	admin   http.Handler                    // the admin API; nil when admin.listen is empty
	drain   func()                          // readiness goes 503 while requests finish
	close   func(ctx context.Context) error // after the server stopped: release flights, close clients
}

// wire builds the proxy from the configuration: Redis clients (or none: in-memory), the
// single-flight group, metrics, the hasher and the HTTP proxy.
func wire(cfg Config, logger *slog.Logger) (*wiring, error) {
	target, err := url.Parse(cfg.Upstream.BaseURL)
	if err != nil {
		return nil, err
	}
	scope, err := hashing.ParseScope(cfg.Hashing.Scope)
	if err != nil {
		return nil, err
	}
	reg := prometheus.NewRegistry()
	m := metrics.New(reg)
	id := newInstanceID()
	metrics.RegisterInstance(reg, id, version)
	tr, err := tracing.New(context.Background(), version)
	if err != nil {
		return nil, err
	}

	var rules []proxy.StoreRule
	maxTTL := cfg.Flight.ResultTTL
	for _, s := range cfg.Store.Rules {
		r, err := proxy.ParseStoreRule(s)
		if err != nil {
			return nil, err
		}
		rules = append(rules, r)
		maxTTL = max(maxTTL, r.TTL)
	}

	jitter := cfg.Flight.TakeoverJitter
	if jitter == 0 {
		jitter = -1 // configured as none; singleflight reads zero as "default"
	}
	grace := cfg.Flight.AbandonGrace
	if grace == 0 {
		grace = -1 // configured as none: cut at once
	}
	sampled, err := proxy.ParseSampledSharing(cfg.Dedupe.Sampled)
	if err != nil {
		return nil, err
	}
	window := cfg.Dedupe.SampledRetryWindow
	if window == 0 {
		window = -1 // configured as none: the proxy reads zero as "default"
	}
	opts := singleflight.Options{
		KeyPrefix:         cfg.Redis.KeyPrefix,
		HeartbeatInterval: cfg.Flight.HeartbeatInterval,
		LeaseTTL:          cfg.Flight.LeaseTTL,
		TakeoverJitter:    jitter,
		MaxAttempts:       cfg.Flight.MaxAttempts,
		ResultTTL:         cfg.Flight.ResultTTL,
		Linger:            cfg.Flight.Linger,
		Timeout:           cfg.Upstream.Timeout,
		RedisTimeout:      cfg.Redis.ReadTimeout,
		BatchDelay:        cfg.Flight.StreamBatchDelay,
		BatchBytes:        cfg.Flight.StreamBatchBytes,
		StreamMaxLen:      int(cfg.Flight.StreamMaxLen),
		MemoryMaxEntries:  cfg.Flight.MemoryMaxEntries,
		MaxResultTTL:      maxTTL,
		MemoryMaxBytes:    cfg.Flight.MemoryMaxBytes,
		AbandonGrace:      grace,
		Observer:          &logObserver{next: m, log: logger, addrs: cfg.Redis.Addrs},
		Annotate:          proxy.AnnotateUsage,
		InstanceID:        id,
	}
	if tr != nil {
		opts.Tracer = tr.Tracer
		logger.Info("tracing", "exporter", tr.Exporters)
	}
	var clients []redis.UniversalClient
	if len(cfg.Redis.Addrs) > 0 {
		redis.SetLogger(redisLogger{logger})
		tlsCfg, err := redisTLS(cfg.Redis)
		if err != nil {
			return nil, err
		}
		opts.Redis = newRedis(cfg.Redis, tlsCfg)
		clients = append(clients, opts.Redis)
	}
	group := singleflight.New(opts)

	p, err := proxy.New(proxy.Config{
		Upstream:         target,
		APIKey:           cfg.Upstream.APIKey,
		Timeout:          cfg.Upstream.Timeout,
		IdleTimeout:      cfg.Upstream.IdleTimeout,
		MaxBodyBytes:     cfg.Limits.MaxBodyBytes,
		BodyReadTimeout:  cfg.Limits.BodyReadTimeout,
		SendTimeout:      cfg.Limits.SendTimeout,
		MaxResponseBytes: cfg.Limits.MaxResponseBytes,
		Paths:            cfg.Dedupe.Paths,
		Flights:          group,
		InstanceID:       id,
		Hasher:           hashing.New(hashing.Options{Scope: scope, IgnoreFields: cfg.Hashing.IgnoreFields, SkipCanonical: true}),
		Recorder:         m,
		Tracing:          tr,
		// OpenMetrics when the scraper asks for it: the format that carries exemplars.
		Metrics:    promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg, EnableOpenMetrics: true}),
		Logger:     logger,
		StoreRules: rules,
		// Stored by default: see ADR 0049.
		NoStoreToolCalls:   !cfg.Store.ToolCalls,
		FinishAbandoned:    cfg.Flight.Abandoned == "finish",
		Sampled:            sampled,
		SampledRetryWindow: window,
		ResultTTL:          cfg.Flight.ResultTTL,
	})
	if err != nil {
		return nil, err
	}
	var admin http.Handler
	if cfg.Admin.Listen != "" {
		if admin, err = proxy.NewAdmin(proxy.AdminConfig{Token: cfg.Admin.Token, Flights: group, Logger: logger}); err != nil {
			return nil, err
		}
	}
	logger.Info("backend", "kind", group.Backend(), "redis", cfg.Redis.Addrs)
	if len(clients) > 0 {
		// A refused password or certificate shows now, as degraded, not at the first
		// request; an unreachable Redis is no reason not to start (fail open).
		ctx, cancel := context.WithTimeout(context.Background(), 2*cfg.Redis.DialTimeout+cfg.Redis.ReadTimeout)
		_ = group.Check(ctx)
		cancel()
	}
	return &wiring{
		id: id,
		// Probes and scrapes are not load: see ADR 0073.
		handler: m.CountOpen("/healthz", "/readyz", "/metrics")(p),
		admin:   admin,
		drain:   p.Drain,
		close: func(ctx context.Context) error {
			// Owned flights may finish until ctx ends; then they are released as
			// FAILED("shutdown"), so followers elsewhere take over at once.
			err := group.Close(ctx)
			if err != nil {
				logger.Warn("shutdown: flights released to other instances", "err", err)
				err = nil
			}
			p.CloseIdleConnections()
			for _, c := range clients {
				err = errors.Join(err, c.Close())
			}
			return errors.Join(err, tr.Shutdown(ctx))
		},
	}, nil
}

// newRedis returns a client for standalone (one address), Sentinel (master_name set) or
// Cluster (several addresses). Followers wait on one pub/sub connection it opens besides
// its pool, however many flights they wait for. A Cluster's client learns the layout from
// whichever node answers first (ADR 0081).
func newRedis(c RedisConfig, tlsCfg *tls.Config) redis.UniversalClient {
	o := &redis.UniversalOptions{
		Addrs:        c.Addrs,
		MasterName:   c.MasterName,
		Username:     c.Username,
		Password:     c.Password,
		DB:           c.DB,
		DialTimeout:  c.DialTimeout,
		ReadTimeout:  c.ReadTimeout,
		WriteTimeout: c.ReadTimeout,
		PoolSize:     c.PoolSize,
		// One deadline per operation, retries included, also cuts a read in progress
		// (ADR 0056).
		ContextTimeoutEnabled: true,
		MaxRetries:            2,
		// One dial per attempt: go-redis's default (5 dials, 100 ms apart) made the first
		// requests after Redis died wait over a second before the instance degraded.
		DialerRetries: 1,
	}
	o.TLSConfig = tlsCfg
	if c.MasterName == "" && len(c.Addrs) > 1 {
		return clusterclient.New(o.Cluster())
	}
	return redis.NewUniversalClient(o)
}

// redisTLS is the TLS configuration of the Redis clients: nil without redis.tls; the
// system's roots, or the CA certificates of redis.tls_ca_file for a private CA.
func redisTLS(c RedisConfig) (*tls.Config, error) {
	if !c.TLS {
		return nil, nil
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12}
	if c.TLSCAFile == "" {
		return cfg, nil
	}
	pem, err := os.ReadFile(c.TLSCAFile)
	if err != nil {
		return nil, &configError{Key: "redis.tls_ca_file", Rule: err.Error()}
	}
	cfg.RootCAs = x509.NewCertPool()
	if !cfg.RootCAs.AppendCertsFromPEM(pem) {
		return nil, &configError{Key: "redis.tls_ca_file", Rule: "no PEM certificate in " + c.TLSCAFile}
	}
	return cfg, nil
}

// logObserver logs what an operator should see, and passes every event on to metrics.
type logObserver struct {
	next  singleflight.Observer
	log   *slog.Logger
	addrs []string // redis.addrs, named where Redis cannot be used
}

// flightGoneRunning is logged when a renewal or an append finds the flight gone from Redis
// (singleflight.ErrFlightGone) while its call runs.
const flightGoneRunning = "redis lost a running flight after its lease ran out: its call goes on for this instance's requests only"

func (o *logObserver) Observe(e singleflight.Event) {
	o.next.Observe(e)
	switch e.Kind {
	case singleflight.EventShardDown:
		msg, level := degradedMessage(e.Err)
		if e.Op == "" {
			o.log.Log(context.Background(), level, msg, "err", e.Err, "redis.addrs", o.addrs)
		} else {
			if level < slog.LevelError {
				msg = "redis cluster shard unavailable: its keys get local-only dedupe until it answers or fails over"
			}
			o.log.Log(context.Background(), level, msg, "shard", e.Op, "err", e.Err)
		}
	case singleflight.EventShardUp:
		if e.Op != "" {
			o.log.Info("redis cluster shard usable again", "shard", e.Op)
		}
	case singleflight.EventRecovered:
		o.log.Info("redis answers again: distributed dedupe resumed")
	case singleflight.EventTakeover:
		o.log.Info("takeover", "reason", e.Reason, "key", short(e.Key))
	case singleflight.EventLeaseLost:
		o.log.Warn("lease lost: another owner holds the flight; upstream call cancelled", "key", short(e.Key))
	case singleflight.EventHeartbeatFailed:
		if errors.Is(e.Err, singleflight.ErrFlightGone) {
			o.log.Warn(flightGoneRunning, "key", short(e.Key))
		}
	case singleflight.EventFencedWrite:
		if errors.Is(e.Err, singleflight.ErrFlightGone) {
			if e.Op == "append" {
				o.log.Warn(flightGoneRunning, "op", e.Op, "key", short(e.Key))
			} else {
				o.log.Warn("redis lost a running flight after its lease ran out: its answer went to this instance's requests only, and was not stored", "op", e.Op, "key", short(e.Key))
			}
			break
		}
		o.log.Warn("stale owner's write refused", "op", e.Op, "key", short(e.Key))
	case singleflight.EventRedisError:
		o.log.Debug("redis error", "op", e.Op, "err", e.Err)
	}
}

// degradedMessage says why Redis cannot be used, and how loud: a refused password or an
// untrusted certificate is a configuration to fix, not an outage to wait out.
func degradedMessage(err error) (string, slog.Level) {
	const local = "; serving with local-only dedupe"
	switch singleflight.Refused(err) {
	case singleflight.RefusedAuth:
		return "redis authentication failed: check redis.username and redis.password" + local, slog.LevelError
	case singleflight.RefusedPermission:
		return "redis refused a command: the ACL user lacks a permission the proxy needs" + local, slog.LevelError
	case singleflight.RefusedDB:
		return "redis refused redis.db: the server has fewer databases" + local, slog.LevelError
	case singleflight.RefusedNotCluster:
		return "several redis.addrs make a Redis Cluster client, but the server is no Cluster: give one address for a standalone server" + local, slog.LevelError
	case singleflight.RefusedReadOnly:
		return "redis refuses writes (a read-only replica): if this lasts beyond a failover, point redis.addrs at the master or set redis.master_name" + local, slog.LevelWarn
	}
	var (
		unknownCA *x509.UnknownAuthorityError
		hostname  x509.HostnameError
		invalid   x509.CertificateInvalidError
		verify    *tls.CertificateVerificationError
		record    tls.RecordHeaderError
	)
	switch {
	case errors.As(err, &unknownCA), errors.As(err, &hostname), errors.As(err, &invalid), errors.As(err, &verify):
		return "redis TLS certificate not trusted: check redis.tls_ca_file and the server's certificate" + local, slog.LevelError
	case errors.As(err, &record):
		return "redis TLS handshake failed: does the server speak TLS? check redis.tls" + local, slog.LevelError
	case notRedis(err):
		return "the server at redis.addrs does not answer as Redis does (another service on that port?): check redis.addrs" + local, slog.LevelError
	}
	// Not a refusal: a Redis that is down or restarting, or an address where none listens.
	return "redis unavailable: serving with local-only dedupe until it answers (each instance calls the upstream for its own requests); " +
		"if it does not, check redis.addrs and that Redis runs there", slog.LevelWarn
}

// notRedis reports whether err is go-redis failing to read a reply as RESP: what another
// kind of server (HTTP, most often) answers. go-redis gives these errors no type.
func notRedis(err error) bool {
	msg := err.Error()
	return strings.Contains(msg, "redis: invalid reply") || strings.Contains(msg, "redis: can't parse")
}

func short(key string) string {
	if len(key) > 12 {
		return key[:12]
	}
	return key
}

// redisLogger sends go-redis's own messages (dial retries and the like) to the debug log:
// what matters of them is reported once, as the degraded state.
type redisLogger struct{ log *slog.Logger }

func (l redisLogger) Printf(ctx context.Context, format string, v ...any) {
	l.log.Debug("redis client: " + fmt.Sprintf(format, v...))
}

// newInstanceID returns 12 random hex digits naming this process: in its flights' tokens
// and meta (the owner the admin API lists), and in its start-up log, /readyz and /metrics.
func newInstanceID() string {
	var b [6]byte
	_, _ = rand.Read(b[:])
	return hex.EncodeToString(b[:])
}
