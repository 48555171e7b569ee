package singleflight

import (
	"crypto/rand"
	"encoding/hex"
	"time"

	"github.com/redis/go-redis/v9"
	"go.opentelemetry.io/otel/trace"
)

// Options configures a Group. Zero values are replaced by the defaults given.
type Options struct {
	// Redis coordinates instances. If nil, the Group is in memory.
	Redis redis.UniversalClient
	// KeyPrefix of every Redis key. If empty, "ai:flight" is used.
	KeyPrefix string
	// HeartbeatInterval between lease renewals. If zero, 1s is used.
	HeartbeatInterval time.Duration
	// LeaseTTL of an owner. If zero, 3s is used.
	LeaseTTL time.Duration
	// TakeoverJitter bounds the random wait before a takeover. If zero, 500ms; negative: none.
	TakeoverJitter time.Duration
	// Jitter, if set, draws each takeover's wait in [0, max), so that a seeded source replays
	// a schedule (the simulator, singleflight/sim). If nil, math/rand/v2 draws it.
	Jitter func(max time.Duration) time.Duration
	// MaxAttempts of upstream calls per flight. If zero, 3 is used.
	MaxAttempts int
	// ResultTTL keeps Store outcomes for later identical requests. Zero stores nothing.
	ResultTTL time.Duration
	// Linger keeps a finished flight's stream readable for late followers. If zero, 30s.
	Linger time.Duration
	// Timeout is the hard limit of one owner function. If zero, 10m is used.
	Timeout time.Duration
	// RedisTimeout bounds one Redis operation on a caller's path, retries included: the
	// longest a caller waits on a Redis that hangs. The client should have
	// ContextTimeoutEnabled, so that the bound also cuts a read in progress. If zero, 1s.
	RedisTimeout time.Duration
	// A batch of streamed bytes is appended BatchDelay after the one before, or as soon as
	// BatchBytes are pending; it holds all that is pending then. If zero, 5ms and 16 KiB.
	BatchDelay time.Duration
	BatchBytes int
	// StreamMaxLen caps the entries of one flight's stream. If zero, 10000 is used.
	StreamMaxLen int
	// MemoryMaxEntries bounds the results kept in this process (ADR 0028). If zero, 10000.
	MemoryMaxEntries int
	// MemoryMaxBytes bounds them in bytes of bodies, headers and keys. If zero, 128 MiB.
	MemoryMaxBytes int64
	// Observer receives the package's events. If nil, they are dropped.
	Observer Observer
	// Tracer, if set, traces the parts of a flight that take time (look-up, wait, takeover)
	// as children of the span of the caller that started it (CallOptions.Trace). ADR 0061.
	Tracer trace.Tracer
	// Annotate, if set, is called once per answer kept in this process, outside the locks;
	// its hits get what it returns as Head.Note (ADR 0034).
	Annotate func(h Head, body []byte) any
	// InstanceID names this process in tokens and meta. If empty, a random one is used.
	InstanceID string
	// MaxResultTTL is the longest TTL any Result asks for, which namespace generations
	// outlive. If zero, ResultTTL.
	MaxResultTTL time.Duration
	// AbandonGrace is how long an owned call goes on once no caller, here or on any
	// instance, waits for it, before it is cut, unless a caller asked it to finish
	// (CallOptions.Finish). If zero, 2s is used; negative: cut at once. See ADR 0074.
	AbandonGrace time.Duration
}

func (o *Options) setDefaults() {
	def := func(d *time.Duration, v time.Duration) {
		if *d == 0 {
			*d = v
		}
	}
	def(&o.HeartbeatInterval, time.Second)
	def(&o.LeaseTTL, 3*time.Second)
	def(&o.TakeoverJitter, 500*time.Millisecond)
	def(&o.Linger, 30*time.Second)
	def(&o.Timeout, 10*time.Minute)
	def(&o.RedisTimeout, time.Second)
	def(&o.BatchDelay, 5*time.Millisecond)
	def(&o.AbandonGrace, 2*time.Second)
	if o.TakeoverJitter < 0 {
		o.TakeoverJitter = 0
	}
	if o.AbandonGrace < 0 {
		o.AbandonGrace = 0
	}
	if o.KeyPrefix == "" {
		o.KeyPrefix = "ai:flight"
	}
	if o.MaxAttempts <= 0 {
		o.MaxAttempts = 3
	}
	if o.BatchBytes <= 0 {
		o.BatchBytes = 16 << 10
	}
	if o.StreamMaxLen <= 0 {
		o.StreamMaxLen = 10000
	}
	if o.MemoryMaxEntries <= 0 {
		o.MemoryMaxEntries = 10000
	}
	if o.MemoryMaxBytes <= 0 {
		o.MemoryMaxBytes = 128 << 20
	}
	if o.Observer == nil {
		o.Observer = nopObserver{}
	}
	if o.InstanceID == "" {
		var b [6]byte
		_, _ = rand.Read(b[:])
		o.InstanceID = hex.EncodeToString(b[:])
	}
}
