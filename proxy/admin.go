package proxy

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"errors"
	"log/slog"
	"net/http"
	"strconv"
	"strings"

	"github.com/go-chi/chi/v5"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// AdminFlights is what the admin API needs of the coordinator; *singleflight.Group is one.
type AdminFlights interface {
	Flights(ctx context.Context, limit int) ([]singleflight.FlightInfo, bool, error)
	Forget(ctx context.Context, key string) (bool, error)
	PurgeNamespace(ctx context.Context, ns string) (uint64, error)
	Backend() string
}

var _ AdminFlights = (*singleflight.Group)(nil)

// AdminConfig configures the admin API. Token and Flights are required.
type AdminConfig struct {
	// Token is the bearer token every request must carry.
	Token string
	// Flights is the coordinator to inspect and purge.
	Flights AdminFlights
	// Logger logs each admin action. If nil, slog.Default().
	Logger *slog.Logger
}

// FlightJSON is one flight as GET /admin/flights answers it.
type FlightJSON struct {
	Key         string `json:"key"`
	State       string `json:"state"`
	Owner       string `json:"owner"`
	Attempt     int    `json:"attempt"`
	AgeMs       int64  `json:"age_ms"`
	LeaseLeftMs int64  `json:"lease_left_ms"`
	Route       string `json:"route"`
	Model       string `json:"model"`
	// Waiting is how many clients wait for the flight, by instance id (ADR 0074).
	Waiting map[string]int `json:"waiting"`
}

// FlightsJSON is the answer of GET /admin/flights.
type FlightsJSON struct {
	Backend   string       `json:"backend"`
	Flights   []FlightJSON `json:"flights"`
	Truncated bool         `json:"truncated"`
}

// NewAdmin returns the operators' API, to be served on a listener of its own:
//
//	GET    /admin/flights[?limit=N]      flights in progress on every instance
//	DELETE /admin/answers/{key}          drop a stored answer everywhere
//	POST   /admin/purge?namespace=NAME   drop every stored answer of a namespace
//
// Every request must carry Authorization: Bearer <Token>; anything else is answered 401.
func NewAdmin(cfg AdminConfig) (http.Handler, error) {
	if cfg.Token == "" || cfg.Flights == nil {
		return nil, errors.New("proxy: admin needs a Token and Flights")
	}
	if cfg.Logger == nil {
		cfg.Logger = slog.Default()
	}
	a := &admin{cfg: cfg, want: sha256.Sum256([]byte(cfg.Token))}
	r := chi.NewRouter()
	r.Use(a.authorize)
	r.NotFound(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusNotFound, "invalid_request_error", "not_found",
			"no such admin endpoint: there are GET /admin/flights, DELETE /admin/answers/KEY and POST /admin/purge?namespace=NAME")
	})
	r.MethodNotAllowed(func(w http.ResponseWriter, _ *http.Request) {
		writeError(w, http.StatusMethodNotAllowed, "invalid_request_error", "method_not_allowed", "method not allowed on this admin endpoint")
	})
	r.Get("/admin/flights", a.flights)
	r.Delete("/admin/answers/{key}", a.forget)
	r.Delete("/admin/answers/", a.forget) // no key: said so by forget, not taken for another endpoint
	r.Delete("/admin/answers", a.forget)
	r.Post("/admin/purge", a.purge)
	return r, nil
}

type admin struct {
	cfg  AdminConfig
	want [sha256.Size]byte
}

// authorize lets through requests with the right bearer token. Both sides are hashed
// first, so that the comparison takes the same time whatever the length of the guess.
func (a *admin) authorize(next http.Handler) http.Handler {
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		auth := r.Header.Get("Authorization")
		scheme, tok, ok := strings.Cut(auth, " ")
		got := sha256.Sum256([]byte(strings.TrimSpace(tok)))
		if !ok || !strings.EqualFold(scheme, "Bearer") || subtle.ConstantTimeCompare(got[:], a.want[:]) != 1 {
			w.Header().Set("WWW-Authenticate", `Bearer realm="llm-dedupe-proxy admin"`)
			msg := "the admin API needs Authorization: Bearer <admin.token>"
			if auth != "" {
				msg = "the admin token is wrong"
			}
			writeError(w, http.StatusUnauthorized, "invalid_request_error", "invalid_admin_token", msg)
			return
		}
		next.ServeHTTP(w, r)
	})
}

func (a *admin) flights(w http.ResponseWriter, r *http.Request) {
	limit := 1000
	if s := r.URL.Query().Get("limit"); s != "" {
		n, err := strconv.Atoi(s)
		if err != nil || n < 1 || n > 10000 {
			writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_limit", "limit must be a number from 1 to 10000")
			return
		}
		limit = n
	}
	list, more, err := a.cfg.Flights.Flights(r.Context(), limit)
	if err != nil {
		a.unavailable(w, "list flights", err)
		return
	}
	out := FlightsJSON{Backend: a.cfg.Flights.Backend(), Flights: make([]FlightJSON, 0, len(list)), Truncated: more}
	for _, f := range list {
		out.Flights = append(out.Flights, FlightJSON{
			Key: f.Key, State: f.State, Owner: f.Owner, Attempt: f.Attempt,
			AgeMs: f.Age.Milliseconds(), LeaseLeftMs: f.LeaseLeft.Milliseconds(), Route: f.Route, Model: f.Model,
			Waiting: f.Waiting,
		})
	}
	writeJSON(w, http.StatusOK, out)
}

func (a *admin) forget(w http.ResponseWriter, r *http.Request) {
	key := chi.URLParam(r, "key")
	if !isKey(key) {
		got := "none"
		if key != "" {
			got = strconv.Quote(key[:min(len(key), 80)])
		}
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_key",
			"DELETE /admin/answers/KEY takes a key of 64 lower-case hex digits (an answer's X-Dedupe-Key, "+
				"or the last line llm-dedupe-proxy key prints), got "+got)
		return
	}
	found, err := a.cfg.Flights.Forget(r.Context(), key)
	if err != nil {
		a.unavailable(w, "purge answer", err)
		return
	}
	a.cfg.Logger.Info("admin: answer purged", "key", key[:12], "found", found)
	writeJSON(w, http.StatusOK, map[string]any{"key": key, "found": found})
}

func (a *admin) purge(w http.ResponseWriter, r *http.Request) {
	q := r.URL.Query()
	ns := q.Get("namespace")
	if !q.Has("namespace") || !ValidNamespace(ns) {
		writeError(w, http.StatusBadRequest, "invalid_request_error", "invalid_namespace",
			"namespace must be given (empty for the default one): at most 64 letters, digits and . _ - :")
		return
	}
	gen, err := a.cfg.Flights.PurgeNamespace(r.Context(), ns)
	if err != nil {
		a.unavailable(w, "purge namespace", err)
		return
	}
	a.cfg.Logger.Info("admin: namespace purged", "namespace", ns, "generation", gen)
	writeJSON(w, http.StatusOK, map[string]any{"namespace": ns, "generation": gen})
}

func (a *admin) unavailable(w http.ResponseWriter, what string, err error) {
	a.cfg.Logger.Warn("admin: "+what, "err", err)
	writeError(w, http.StatusServiceUnavailable, "server_error", "backend_unavailable", "could not "+what+": "+err.Error())
}

func isKey(s string) bool {
	if len(s) != 64 {
		return false
	}
	for i := 0; i < len(s); i++ {
		if c := s[i]; !('0' <= c && c <= '9' || 'a' <= c && c <= 'f') {
			return false
		}
	}
	return true
}
