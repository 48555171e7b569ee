package proxy

import (
	"context"
	"encoding/json"
	"errors"
	"log/slog"
	"net/http"
	"net/url"
	"strings"
	"sync/atomic"
	"time"

	"github.com/go-chi/chi/v5"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/tracing"
)

// Flights is the single-flight coordinator the proxy needs; *singleflight.Group is one.
type Flights interface {
	DoWith(key string, o singleflight.CallOptions, fn singleflight.Func) (*singleflight.Reader, error)
	// Generation is a namespace's current generation, part of its requests' keys.
	NamespaceGeneration(ctx context.Context, ns string) (uint64, error)
	Backend() string
	Degraded() bool
}

var _ Flights = (*singleflight.Group)(nil)

// Recorder receives the proxy's measurements; *metrics.Metrics is one.
type Recorder interface {
	// Request and Upstream take the context of the request's or the call's span, whose
	// trace ID a histogram may keep as an exemplar.
	Request(ctx context.Context, route, role string, code int, d time.Duration)
	Upstream(ctx context.Context, route string, code int, d time.Duration)
	Saved(route, model string, promptTokens, completionTokens int64)
	WaitingAdd(delta int)
	// NearMiss counts a POST passed through whose path ends like the deduplicated route
	// (nearmiss.go).
	NearMiss(route string)
	// Sampled counts a finished request that samples: what was done with it (HeaderSampled)
	// and the role it was given. See ADR 0078.
	Sampled(route, sampling, role string)
}

// Config configures a Proxy. Upstream, Flights and Hasher are required.
type Config struct {
	// Upstream is the base URL of the OpenAI-compatible API; its path is a prefix.
	Upstream *url.URL
	// APIKey, if set, replaces the client's Authorization on upstream calls.
	APIKey string
	// Transport makes every upstream call, owners' and passed-through. If nil,
	// NewTransport() is used.
	Transport http.RoundTripper
	// Timeout bounds a passed-through or bypassing request (deduplicated calls are bounded
	// by the Flights' own timeout). If zero, 10m is used.
	Timeout time.Duration
	// IdleTimeout ends a streamed upstream answer that sends nothing for this long. If
	// zero, 60s is used.
	IdleTimeout time.Duration
	// BodyReadTimeout is the longest wait for the next bytes of a request body. If zero,
	// 30s is used.
	BodyReadTimeout time.Duration
	// SendTimeout ends an answer whose client takes nothing for this long: each write to
	// the client must make progress within it (nginx's send_timeout). If zero, 60s is
	// used; negative: no limit.
	SendTimeout time.Duration
	// MaxBodyBytes bounds a request body. If zero, 10 MiB is used.
	MaxBodyBytes int64
	// MaxResponseBytes bounds an upstream answer that is shared with other requests and
	// stored; a larger one goes to the client whose request made the call only (see
	// handoff). It also bounds what a flight of this process holds. If zero, 64 MiB is used.
	MaxResponseBytes int64
	// Paths are the POST routes that are deduplicated. If nil, DefaultPaths.
	Paths []string
	// Flights coordinates identical requests.
	Flights Flights
	// InstanceID names this instance in /readyz: the owner the admin API lists for the
	// flights it runs.
	InstanceID string
	// Hasher makes request keys.
	Hasher *hashing.Hasher
	// Recorder receives measurements. If nil, none are taken.
	Recorder Recorder
	// Tracing, if set, traces requests and upstream calls (ADR 0061); nil traces nothing.
	Tracing *tracing.Tracing
	// Metrics, if set, is served at /metrics.
	Metrics http.Handler
	// Logger logs one line per request. If nil, slog.Default().
	Logger *slog.Logger
	// StoreRules decide by route and model how long answers are stored; the first that
	// matches wins, and one with TTL 0 stores nothing. If none matches, the Flights' own
	// result TTL applies.
	StoreRules []StoreRule
	// NoStoreToolCalls shares answers that ask the client to call a tool with their
	// flight, but does not store them.
	NoStoreToolCalls bool
	// FinishAbandoned runs a call to its end, and keeps its answer, when no client waits for
	// it any more, for requests that do not say otherwise (HeaderAbandoned). If false, such
	// a call is cut after the Flights' grace. See ADR 0074.
	FinishAbandoned bool
	// Sampled is how requests that sample are shared and stored; the zero value is
	// ShareInFlight. See ADR 0078.
	Sampled SampledSharing
	// SampledRetryWindow, under ShareInFlight, is how long a sampled request's answer is
	// stored, and how old it may be when a client's retry is served it. If zero, 10s is
	// used; negative: none is stored, and a retry after its call ended makes another.
	SampledRetryWindow time.Duration
	// ResultTTL is the Flights' own (singleflight.Options.ResultTTL), which a sampled
	// request's answer never outlives: with zero, as there, an answer that no StoreRule
	// keeps is not stored.
	ResultTTL time.Duration
}

// DefaultPaths are the OpenAI routes whose identical requests give interchangeable answers.
var DefaultPaths = []string{"/v1/chat/completions", "/v1/completions", "/v1/embeddings", "/v1/responses"}

// Proxy is the deduplicating reverse proxy.
type Proxy struct {
	cfg      Config
	router   chi.Router
	posts    map[string]http.Handler // the deduplicated routes, by literal path
	near     []*nearMiss             // what a POST that nearly reaches one of them ends with
	pass     http.Handler
	draining atomic.Bool
}

var _ http.Handler = (*Proxy)(nil)

// New returns a Proxy.
func New(cfg Config) (*Proxy, error) {
	if cfg.Upstream == nil || cfg.Flights == nil || cfg.Hasher == nil {
		return nil, errors.New("proxy: Upstream, Flights and Hasher are required")
	}
	if cfg.Transport == nil {
		cfg.Transport = NewTransport()
	}
	if cfg.Timeout <= 0 {
		cfg.Timeout = 10 * time.Minute
	}
	if cfg.IdleTimeout <= 0 {
		cfg.IdleTimeout = 60 * time.Second
	}
	if cfg.BodyReadTimeout <= 0 {
		cfg.BodyReadTimeout = 30 * time.Second
	}
	if cfg.MaxBodyBytes <= 0 {
		cfg.MaxBodyBytes = 10 << 20
	}
	if cfg.SendTimeout == 0 {
		cfg.SendTimeout = 60 * time.Second
	}
	if cfg.MaxResponseBytes <= 0 {
		cfg.MaxResponseBytes = 64 << 20
	}
	if cfg.Paths == nil {
		cfg.Paths = DefaultPaths
	}
	if cfg.SampledRetryWindow == 0 {
		cfg.SampledRetryWindow = DefaultSampledRetryWindow
	}
	if cfg.Recorder == nil {
		cfg.Recorder = nopRecorder{}
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	p := &Proxy{cfg: cfg}
	passT := cfg.Transport
	if cfg.Tracing != nil {
		passT = tracedTransport{next: passT, t: cfg.Tracing}
	}
	pass := NewPassthrough(cfg.Upstream, cfg.APIKey, passT)
	pass.ErrorLog = slog.NewLogLogger(cfg.Logger.Handler(), slog.LevelWarn)
	p.pass = Timeout(cfg.Timeout)(fullDuplex(pass))

	r := chi.NewRouter()
	r.Get("/healthz", p.healthz)
	r.Get("/readyz", p.readyz)
	if cfg.Metrics != nil {
		r.Handle("/metrics", cfg.Metrics)
	}
	p.posts = map[string]http.Handler{}
	for _, path := range cfg.Paths {
		h := p.logRequests(path)(p.dedupe(path))
		r.Method(http.MethodPost, path, h)
		if !strings.ContainsAny(path, "{*") { // a literal path: chi would match it exactly
			p.posts[path] = h
		}
	}
	p.near = newNearMisses(cfg.Paths)
	passed := p.logRequests("passthrough")(p.pass)
	r.Handle("/*", passed)
	// chi answers a method it does not know (an extension such as PROPFIND) 405 with no
	// body, before looking at routes: it is passed through, as every method is.
	r.MethodNotAllowed(passed.ServeHTTP)
	p.router = r
	return p, nil
}

// ServeHTTP routes a request, after guard has refused what no route may see. A POST to a
// deduplicated path goes straight to its handler, the one chi would choose (chi matches
// the raw path when the URL has one, and so does this): chi adds a context value, and a
// copy of the Request, to every request it routes.
func (p *Proxy) ServeHTTP(w http.ResponseWriter, r *http.Request) {
	r, ok := p.guard(w, r)
	if !ok {
		return
	}
	if r.Method == http.MethodPost {
		path := r.URL.RawPath
		if path == "" {
			path = r.URL.Path
		}
		if h, ok := p.posts[path]; ok {
			h.ServeHTTP(w, r)
			return
		}
		p.checkNearMiss(r)
	}
	p.router.ServeHTTP(w, r)
}

func writeJSON(w http.ResponseWriter, status int, v any) {
	w.Header().Set("Content-Type", "application/json")
	w.Header().Set("Cache-Control", "no-store")
	w.WriteHeader(status)
	_ = json.NewEncoder(w).Encode(v)
}

// upstreamURL is the upstream address of a request path: the base URL's path is a prefix.
func (p *Proxy) upstreamURL(path, rawQuery string) string {
	u := *p.cfg.Upstream
	u.Path = strings.TrimSuffix(u.Path, "/") + path
	u.RawPath = ""
	switch {
	case u.RawQuery == "":
		u.RawQuery = rawQuery
	case rawQuery != "":
		u.RawQuery += "&" + rawQuery
	}
	return u.String()
}

type nopRecorder struct{}

var _ Recorder = nopRecorder{}

func (nopRecorder) Request(context.Context, string, string, int, time.Duration) {}
func (nopRecorder) Upstream(context.Context, string, int, time.Duration)        {}
func (nopRecorder) Saved(string, string, int64, int64)                          {}
func (nopRecorder) WaitingAdd(int)                                              {}
func (nopRecorder) NearMiss(string)                                             {}
func (nopRecorder) Sampled(string, string, string)                              {}
