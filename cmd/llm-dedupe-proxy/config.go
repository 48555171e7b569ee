package main

import (
	"time"
)

// Config is the whole configuration of the binary. It is filled by load (defaults < YAML file <
// environment < flags) and checked by validate; every other package gets its own options
// struct made from it. A field's key is the path of its mapstructure tags; fields tagged
// secret are redacted when the configuration is printed.
type Config struct {
	Listen          string         `mapstructure:"listen"`
	Upstream        UpstreamConfig `mapstructure:"upstream"`
	Redis           RedisConfig    `mapstructure:"redis"`
	Flight          FlightConfig   `mapstructure:"flight"`
	Limits          LimitsConfig   `mapstructure:"limits"`
	Hashing         HashingConfig  `mapstructure:"hashing"`
	Dedupe          DedupeConfig   `mapstructure:"dedupe"`
	Store           StoreConfig    `mapstructure:"store"`
	Admin           AdminConfig    `mapstructure:"admin"`
	Log             LogConfig      `mapstructure:"log"`
	ShutdownTimeout time.Duration  `mapstructure:"shutdown_timeout"`
	// ShutdownDelay is how long an instance told to stop goes on serving, with /readyz
	// answering 503, before it stops accepting: the time a load balancer takes to see it.
	ShutdownDelay time.Duration `mapstructure:"shutdown_delay"`
}

// UpstreamConfig is the model API every request is sent to.
type UpstreamConfig struct {
	BaseURL string `mapstructure:"base_url"`
	// APIKey replaces the client's Authorization when set; empty forwards the client's own.
	APIKey      string        `mapstructure:"api_key" secret:"true"`
	Timeout     time.Duration `mapstructure:"timeout"`      // hard limit of one upstream call
	IdleTimeout time.Duration `mapstructure:"idle_timeout"` // longest pause between streamed chunks
}

// RedisConfig says where flights are coordinated. No Addrs means the in-memory backend; one
// address with MasterName empty is a standalone server or a cluster, MasterName selects Sentinel.
type RedisConfig struct {
	Addrs       []string      `mapstructure:"addrs"`
	MasterName  string        `mapstructure:"master_name"`
	Username    string        `mapstructure:"username"`
	Password    string        `mapstructure:"password" secret:"true"`
	DB          int           `mapstructure:"db"`
	TLS         bool          `mapstructure:"tls"`
	TLSCAFile   string        `mapstructure:"tls_ca_file"` // PEM CA certificates to trust instead of the system's
	KeyPrefix   string        `mapstructure:"key_prefix"`
	DialTimeout time.Duration `mapstructure:"dial_timeout"`
	ReadTimeout time.Duration `mapstructure:"read_timeout"`
	PoolSize    int           `mapstructure:"pool_size"` // 0: the client's default
}

// FlightConfig tunes the lease, the takeover and what is kept after a flight.
type FlightConfig struct {
	HeartbeatInterval time.Duration `mapstructure:"heartbeat_interval"`
	LeaseTTL          time.Duration `mapstructure:"lease_ttl"`
	TakeoverJitter    time.Duration `mapstructure:"takeover_jitter"`
	MaxAttempts       int           `mapstructure:"max_attempts"`
	ResultTTL         time.Duration `mapstructure:"result_ttl"` // 0: dedupe only, keep nothing
	Linger            time.Duration `mapstructure:"linger"`
	StreamBatchDelay  time.Duration `mapstructure:"stream_batch_delay"`
	StreamBatchBytes  int           `mapstructure:"stream_batch_bytes"`
	StreamMaxLen      int64         `mapstructure:"stream_maxlen"`
	MemoryMaxEntries  int           `mapstructure:"memory_max_entries"` // answers kept in this process
	MemoryMaxBytes    int64         `mapstructure:"memory_max_bytes"`   // and their bytes
}

// LimitsConfig bounds what a client may send, how long it may take to send it, and what
// the proxy shares of an answer.
type LimitsConfig struct {
	MaxBodyBytes     int64         `mapstructure:"max_body_bytes"`
	BodyReadTimeout  time.Duration `mapstructure:"body_read_timeout"`  // longest wait between two reads of a request body
	SendTimeout      time.Duration `mapstructure:"send_timeout"`       // longest a write to a client may take nothing
	MaxResponseBytes int64         `mapstructure:"max_response_bytes"` // largest answer shared and stored
}

// HashingConfig is how a request key is made; Scope is in the form hashing.ParseScope reads.
type HashingConfig struct {
	Scope        string   `mapstructure:"scope"`
	IgnoreFields []string `mapstructure:"ignore_fields"`
}

// DedupeConfig lists the routes whose POST requests are deduplicated.
type DedupeConfig struct {
	Paths []string `mapstructure:"paths"`
}

// StoreConfig is what is stored of answers beyond flight.result_ttl: rules per route and
// model ("ROUTE MODEL TTL", read by proxy.ParseStoreRule) and whether answers with tool
// calls are stored.
type StoreConfig struct {
	Rules     []string `mapstructure:"rules"`
	ToolCalls bool     `mapstructure:"tool_calls"`
}

// AdminConfig is the operators' API: off while Listen is empty; Token is then required.
type AdminConfig struct {
	Listen string `mapstructure:"listen"`
	Token  string `mapstructure:"token" secret:"true"`
}

// LogConfig selects the log level (debug, info, warn, error) and format (json, text).
type LogConfig struct {
	Level  string `mapstructure:"level"`
	Format string `mapstructure:"format"`
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
		},
		Limits:  LimitsConfig{MaxBodyBytes: 10 << 20, BodyReadTimeout: 30 * time.Second, SendTimeout: 60 * time.Second, MaxResponseBytes: 64 << 20},
		Hashing: HashingConfig{Scope: "credential", IgnoreFields: []string{"user"}},
		Dedupe: DedupeConfig{Paths: []string{
			"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses",
		}},
		Store:           StoreConfig{Rules: []string{}, ToolCalls: true},
		Log:             LogConfig{Level: "info", Format: "json"},
		ShutdownTimeout: 30 * time.Second,
	}
}
