package main

import (
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// Config is the whole configuration of the binary. It is filled by load (defaults < YAML file <
// environment < flags) and checked by validate; every other package gets its own options
// struct made from it. A field's key is the path of its mapstructure tags; its help tag is
// the line of meaning its flag shows and config.example.yaml repeats; fields tagged secret
// are redacted when the configuration is printed.
type Config struct {
	Listen          string         `mapstructure:"listen" help:"address the HTTP server listens on (host:port); an empty host is every interface"`
	Upstream        UpstreamConfig `mapstructure:"upstream"`
	Redis           RedisConfig    `mapstructure:"redis"`
	Flight          FlightConfig   `mapstructure:"flight"`
	Limits          LimitsConfig   `mapstructure:"limits"`
	Hashing         HashingConfig  `mapstructure:"hashing"`
	Dedupe          DedupeConfig   `mapstructure:"dedupe"`
	Store           StoreConfig    `mapstructure:"store"`
	Admin           AdminConfig    `mapstructure:"admin"`
	Log             LogConfig      `mapstructure:"log"`
	ShutdownTimeout time.Duration  `mapstructure:"shutdown_timeout" help:"on SIGINT or SIGTERM, time requests in progress get to finish"`
	// ShutdownDelay is how long an instance told to stop goes on serving, with /readyz
	// answering 503, before it stops accepting: the time a load balancer takes to see it.
	ShutdownDelay time.Duration `mapstructure:"shutdown_delay" help:"on SIGINT or SIGTERM, time it goes on serving, /readyz 503, before it stops accepting"`
}

// UpstreamConfig is the model API every request is sent to.
type UpstreamConfig struct {
	BaseURL string `mapstructure:"base_url" help:"the OpenAI-compatible API requests go to; a path is kept as a prefix"`
	// APIKey replaces the client's Authorization when set; empty forwards the client's own.
	APIKey      string        `mapstructure:"api_key" secret:"true" help:"if set, replaces the client's Authorization with \"Bearer <api_key>\"; empty forwards the client's"`
	Timeout     time.Duration `mapstructure:"timeout" help:"hard limit of one upstream call, streaming included"`
	IdleTimeout time.Duration `mapstructure:"idle_timeout" help:"longest pause between two chunks of a streamed answer"`
}

// RedisConfig says where flights are coordinated. No Addrs means the in-memory backend; one
// address with MasterName empty is a standalone server or a cluster, MasterName selects Sentinel.
type RedisConfig struct {
	Addrs       []string      `mapstructure:"addrs" help:"Redis addresses (host:port); empty runs on the in-memory backend, one instance only"`
	MasterName  string        `mapstructure:"master_name" help:"Sentinel master name; set it to use addrs as Sentinel addresses"`
	Username    string        `mapstructure:"username" help:"Redis ACL user name"`
	Password    string        `mapstructure:"password" secret:"true" help:"Redis password"`
	DB          int           `mapstructure:"db" help:"database number (standalone and Sentinel only)"`
	TLS         bool          `mapstructure:"tls" help:"connect to Redis over TLS"`
	TLSCAFile   string        `mapstructure:"tls_ca_file" help:"PEM file of CA certificates to trust for Redis (a private CA); empty: the system's; needs tls: true"`
	KeyPrefix   string        `mapstructure:"key_prefix" help:"prefix of every Redis key the proxy writes"`
	DialTimeout time.Duration `mapstructure:"dial_timeout" help:"time allowed to connect to Redis"`
	ReadTimeout time.Duration `mapstructure:"read_timeout" help:"longest a request waits on one Redis operation, retries included; the first timeout degrades"`
	PoolSize    int           `mapstructure:"pool_size" help:"connections for commands (per Cluster node); 0: the client's default, 10 per CPU"`
}

// FlightConfig tunes the lease, the takeover and what is kept after a flight.
type FlightConfig struct {
	HeartbeatInterval time.Duration `mapstructure:"heartbeat_interval" help:"how often an owner renews its lease"`
	LeaseTTL          time.Duration `mapstructure:"lease_ttl" help:"how long a lease lasts without renewal; at least 2 × heartbeat_interval"`
	TakeoverJitter    time.Duration `mapstructure:"takeover_jitter" help:"most random wait before taking over a flight whose owner is gone"`
	MaxAttempts       int           `mapstructure:"max_attempts" help:"upstream calls per flight before followers get the last error"`
	ResultTTL         time.Duration `mapstructure:"result_ttl" help:"how long a completed answer is served to new identical requests; 0 dedupes only"`
	Linger            time.Duration `mapstructure:"linger" help:"how long a finished flight stays readable for late followers"`
	StreamBatchDelay  time.Duration `mapstructure:"stream_batch_delay" help:"longest wait before streamed bytes are passed on to followers"`
	StreamBatchBytes  int           `mapstructure:"stream_batch_bytes" help:"streamed bytes that are passed on at once, without waiting"`
	StreamMaxLen      int64         `mapstructure:"stream_maxlen" help:"most entries of one answer in its Redis stream; the rest follows in one final entry"`
	MemoryMaxEntries  int           `mapstructure:"memory_max_entries" help:"most answers kept in memory (the store without Redis, a first level with it)"`
	MemoryMaxBytes    int64         `mapstructure:"memory_max_bytes" help:"most bytes of answers kept in memory (128 MiB); least recently used go first"`
	Abandoned         string        `mapstructure:"abandoned" help:"a call no client waits for any more, on any instance: cancel (cut it after abandon_grace) or finish (run it to its end and keep its answer)"`
	AbandonGrace      time.Duration `mapstructure:"abandon_grace" help:"how long a call no client waits for goes on before it is cut, so that a client's retry can join it"`
}

// LimitsConfig bounds what a client may send, how long it may take to send it, and what
// the proxy shares of an answer.
type LimitsConfig struct {
	MaxBodyBytes     int64         `mapstructure:"max_body_bytes" help:"largest request body read to make a request key (10 MiB); a larger Content-Length is refused at once"`
	BodyReadTimeout  time.Duration `mapstructure:"body_read_timeout" help:"longest wait between two reads of a request body; then 408"`
	SendTimeout      time.Duration `mapstructure:"send_timeout" help:"longest a client may take none of its answer; then the answer ends, connection closed"`
	MaxResponseBytes int64         `mapstructure:"max_response_bytes" help:"largest answer shared and stored (64 MiB); a larger one goes to its own client only"`
}

// HashingConfig is how a request key is made; Scope is in the form hashing.ParseScope reads.
type HashingConfig struct {
	Scope        string   `mapstructure:"scope" help:"what keeps tenants apart: credential, header:NAME or global"`
	IgnoreFields []string `mapstructure:"ignore_fields" help:"top-level body fields left out of the request key"`
}

// DedupeConfig lists the routes whose POST requests are deduplicated, and how requests that
// sample are (proxy.ParseSampledSharing reads Sampled).
type DedupeConfig struct {
	Paths              []string      `mapstructure:"paths" help:"routes whose POST requests are deduplicated"`
	Sampled            string        `mapstructure:"sampled" help:"requests that sample (temperature absent or above 0, no seed): in_flight shares a call while it runs, its answer served later only to a client's retry; store, like any other; never, each its own call"`
	SampledRetryWindow time.Duration `mapstructure:"sampled_retry_window" help:"under in_flight, how long a sampled answer is kept for a client's retry of its call (X-Stainless-Retry-Count 1 or more); 0 keeps none"`
}

// StoreConfig is what is stored of answers beyond flight.result_ttl: rules per route and
// model ("ROUTE MODEL TTL", read by proxy.ParseStoreRule) and whether answers with tool
// calls are stored.
type StoreConfig struct {
	Rules     []string `mapstructure:"rules" help:"\"ROUTE MODEL TTL\" rules, first match wins (patterns like /v1/* or gpt-4o*; TTL 0 = dedupe only), e.g. \"/v1/embeddings * 24h\""`
	ToolCalls bool     `mapstructure:"tool_calls" help:"store answers that ask the client to call a tool; false shares them with their flight only"`
}

// AdminConfig is the operators' API: off while Listen is empty; Token is then required.
type AdminConfig struct {
	Listen string `mapstructure:"listen" help:"address of the admin API (host:port, e.g. 127.0.0.1:9091); empty: no admin API"`
	Token  string `mapstructure:"token" secret:"true" help:"bearer token of the admin API; required (16+ characters) when admin.listen is set"`
}

// LogConfig selects the log level (debug, info, warn, error) and format (json, text).
type LogConfig struct {
	Level  string `mapstructure:"level" help:"debug, info, warn or error"`
	Format string `mapstructure:"format" help:"json or text"`
}

// defaultConfig returns the configuration used where nothing else is said. config.example.yaml
// and the README table repeat these values; tests keep them in step.
func defaultConfig() Config {
	return Config{
		Listen: ":8080",
		Upstream: UpstreamConfig{
			BaseURL:     "https://api.openai.com",
			Timeout:     10 * time.Minute,
			IdleTimeout: 60 * time.Second,
		},
		Redis: RedisConfig{
			Addrs:       []string{},
			KeyPrefix:   "ai:flight",
			DialTimeout: time.Second,
			ReadTimeout: time.Second,
		},
		Flight: FlightConfig{
			HeartbeatInterval: time.Second,
			LeaseTTL:          3 * time.Second,
			TakeoverJitter:    500 * time.Millisecond,
			MaxAttempts:       3,
			ResultTTL:         10 * time.Minute,
			Linger:            30 * time.Second,
			StreamBatchDelay:  5 * time.Millisecond,
			StreamBatchBytes:  16 << 10,
			StreamMaxLen:      10000,
			MemoryMaxEntries:  10000,
			MemoryMaxBytes:    128 << 20,
			Abandoned:         "cancel",
			AbandonGrace:      2 * time.Second,
		},
		Limits:  LimitsConfig{MaxBodyBytes: 10 << 20, BodyReadTimeout: 30 * time.Second, SendTimeout: 60 * time.Second, MaxResponseBytes: 64 << 20},
		Hashing: HashingConfig{Scope: "credential", IgnoreFields: []string{"user"}},
		Dedupe: DedupeConfig{
			Paths: []string{
				"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
			},
			Sampled:            "in_flight",
			SampledRetryWindow: proxy.DefaultSampledRetryWindow,
		},
		Store:           StoreConfig{Rules: []string{}, ToolCalls: true},
		Log:             LogConfig{Level: "info", Format: "json"},
		ShutdownTimeout: 30 * time.Second,
	}
}
