package main

import (
	"errors"
	"fmt"
	"net"
	"net/url"
	"strconv"
	"strings"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// configError is one invalid configuration value: the key and the rule it breaks, and the
// environment variable that set it, if one did, so that the message names what to change.
type configError struct {
	Key  string
	Rule string
	Env  string
}

func (e *configError) Error() string {
	if e.Env != "" {
		return e.Env + " (" + e.Key + "): " + e.Rule
	}
	return e.Key + ": " + e.Rule
}

// checker collects every configError of a configuration, so a user fixes them in one go.
type checker struct{ errs []error }

func (c *checker) fail(key, format string, args ...any) {
	c.errs = append(c.errs, &configError{Key: key, Rule: fmt.Sprintf(format, args...)})
}

func (c *checker) positive(key string, d time.Duration) {
	if d <= 0 {
		c.fail(key, "must be greater than 0, got %s", d)
	}
}

// redisTTL checks a duration that becomes a Redis millisecond expiry: anything shorter than 1ms
// would round to no expiry at all.
func (c *checker) redisTTL(key string, d time.Duration) {
	if d < time.Millisecond {
		c.fail(key, "must be at least 1ms, got %s", d)
	}
}

func (c *checker) atLeast(key string, n, lowest int64) {
	if n < lowest {
		c.fail(key, "must be at least %d, got %d", lowest, n)
	}
}

func (c *checker) oneOf(key, v string, set ...string) {
	for _, s := range set {
		if v == s {
			return
		}
	}
	c.fail(key, "must be one of %s, got %q", strings.Join(set, ", "), v)
}

// hostPort checks an address to listen on or dial: host:port, the port a number from
// lowest to 65535 (a listen address may ask for any free port with 0, a dialled one not).
func (c *checker) hostPort(key, v string, lowest int) {
	_, port, err := net.SplitHostPort(v)
	n, perr := strconv.Atoi(port)
	if err != nil || v == "" || perr != nil || n < lowest || n > 65535 {
		c.fail(key, "must be host:port with a port from %d to 65535 (like :8080 or 127.0.0.1:6379), got %q", lowest, v)
	}
}

// validate returns every rule cfg breaks, joined, or nil.
func validate(cfg Config) error {
	var c checker
	c.hostPort("listen", cfg.Listen, 0)

	if u, err := url.Parse(cfg.Upstream.BaseURL); err != nil || u.Host == "" ||
		(u.Scheme != "http" && u.Scheme != "https") {
		c.fail("upstream.base_url", "must be an absolute http or https URL, got %q", cfg.Upstream.BaseURL)
	}
	c.positive("upstream.timeout", cfg.Upstream.Timeout)
	c.positive("upstream.idle_timeout", cfg.Upstream.IdleTimeout)

	r := cfg.Redis
	for _, a := range r.Addrs {
		c.hostPort("redis.addrs", a, 1)
	}
	if r.MasterName != "" && len(r.Addrs) == 0 {
		c.fail("redis.master_name", "needs redis.addrs (the Sentinel addresses)")
	}
	c.atLeast("redis.db", int64(r.DB), 0)
	if r.KeyPrefix == "" {
		c.fail("redis.key_prefix", "must not be empty")
	}
	c.positive("redis.dial_timeout", r.DialTimeout)
	c.positive("redis.read_timeout", r.ReadTimeout)
	c.atLeast("redis.pool_size", int64(r.PoolSize), 0)
	if r.TLSCAFile != "" && !r.TLS {
		c.fail("redis.tls_ca_file", "needs redis.tls: true")
	}

	f := cfg.Flight
	c.positive("flight.heartbeat_interval", f.HeartbeatInterval)
	if f.LeaseTTL < 2*f.HeartbeatInterval {
		c.fail("flight.lease_ttl", "must be at least 2 × flight.heartbeat_interval (%s), got %s",
			f.HeartbeatInterval, f.LeaseTTL)
	}
	c.redisTTL("flight.lease_ttl", f.LeaseTTL)
	if f.TakeoverJitter < 0 {
		c.fail("flight.takeover_jitter", "must not be negative, got %s", f.TakeoverJitter)
	}
	c.atLeast("flight.max_attempts", int64(f.MaxAttempts), 1)
	if f.ResultTTL != 0 {
		c.redisTTL("flight.result_ttl", f.ResultTTL) // 0 is allowed: dedupe only
	}
	c.redisTTL("flight.linger", f.Linger)
	if f.StreamBatchDelay < 0 {
		c.fail("flight.stream_batch_delay", "must not be negative, got %s", f.StreamBatchDelay)
	}
	c.atLeast("flight.stream_batch_bytes", int64(f.StreamBatchBytes), 1)
	c.atLeast("flight.stream_maxlen", f.StreamMaxLen, 1)
	c.atLeast("flight.memory_max_entries", int64(f.MemoryMaxEntries), 1)
	c.atLeast("flight.memory_max_bytes", f.MemoryMaxBytes, 1)
	if f.Abandoned != "cancel" && f.Abandoned != "finish" {
		c.fail("flight.abandoned", "must be cancel or finish, got %q", f.Abandoned)
	}
	if f.AbandonGrace < 0 {
		c.fail("flight.abandon_grace", "must not be negative, got %s", f.AbandonGrace)
	}

	c.atLeast("limits.max_body_bytes", cfg.Limits.MaxBodyBytes, 1)
	c.positive("limits.body_read_timeout", cfg.Limits.BodyReadTimeout)
	c.positive("limits.send_timeout", cfg.Limits.SendTimeout)
	c.atLeast("limits.max_response_bytes", cfg.Limits.MaxResponseBytes, 1)

	if _, err := hashing.ParseScope(cfg.Hashing.Scope); err != nil {
		c.fail("hashing.scope", "must be credential, header:NAME or global, got %q", cfg.Hashing.Scope)
	}
	for _, name := range cfg.Hashing.IgnoreFields {
		if name == "" {
			c.fail("hashing.ignore_fields", "must not contain an empty name")
		}
	}
	for _, p := range cfg.Dedupe.Paths {
		switch {
		case !strings.HasPrefix(p, "/"):
			c.fail("dedupe.paths", "each path must start with \"/\", got %q", p)
		case p == "/metrics" || p == "/healthz" || p == "/readyz":
			c.fail("dedupe.paths", "%s is the proxy's own endpoint; a route there would shadow it", p)
		case strings.ContainsAny(p, "{}*"):
			c.fail("dedupe.paths", "each path must be a literal path, not a pattern, got %q", p)
		case strings.ContainsAny(p, "?#%\\") || proxy.HasDotSegment(p):
			// No request could match it: a query is not part of a route, and a path
			// with dot segments is refused before routing.
			c.fail("dedupe.paths", "each path must be a plain path, without a query, %%-escapes or . and .. segments, got %q", p)
		}
	}
	if _, err := proxy.ParseSampledSharing(cfg.Dedupe.Sampled); err != nil {
		c.fail("dedupe.sampled", "must be in_flight, store or never, got %q", cfg.Dedupe.Sampled)
	}
	if w := cfg.Dedupe.SampledRetryWindow; w != 0 {
		c.redisTTL("dedupe.sampled_retry_window", w) // 0 is allowed: keep none
	}

	for _, r := range cfg.Store.Rules {
		if _, err := proxy.ParseStoreRule(r); err != nil {
			c.fail("store.rules", "each rule is \"ROUTE MODEL TTL\" (like \"/v1/embeddings * 24h\"), got %q", r)
		}
	}
	if cfg.Admin.Listen != "" {
		c.hostPort("admin.listen", cfg.Admin.Listen, 0)
		if cfg.Admin.Token == "" {
			c.fail("admin.token", "must be set when admin.listen is set (every admin request must carry it)")
		} else if len(cfg.Admin.Token) < 16 {
			c.fail("admin.token", "must be at least 16 characters")
		}
		if cfg.Admin.Listen == cfg.Listen {
			c.fail("admin.listen", "must differ from listen")
		}
	}

	c.oneOf("log.level", cfg.Log.Level, "debug", "info", "warn", "error")
	c.oneOf("log.format", cfg.Log.Format, "json", "text")
	c.positive("shutdown_timeout", cfg.ShutdownTimeout)
	if cfg.ShutdownDelay < 0 {
		c.fail("shutdown_delay", "must not be negative, got %s", cfg.ShutdownDelay)
	}
	return errors.Join(c.errs...)
}
