package main

import (
	"bytes"
	"context"
	"errors"
	"fmt"
	"io"
	"net/http"
	"net/url"
	"os"
	"slices"
	"strconv"
	"strings"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// headerFlags collects repeated --header "Name: value" flags.
type headerFlags http.Header

func (h headerFlags) String() string { return "" }

func (h headerFlags) Set(s string) error {
	name, value, ok := strings.Cut(s, ":")
	if !ok || strings.TrimSpace(name) == "" {
		return errors.New(`want "Name: value"`)
	}
	http.Header(h).Add(strings.TrimSpace(name), strings.TrimSpace(value))
	return nil
}

// key prints the canonical form of a request body and, as the last line, its request key, so
// a user can see why two requests did or did not deduplicate. It makes the key as the proxy
// does (proxy/dedupe.go): the scope and the ignored fields from the configuration, the path
// with its query sorted, and the namespace with its generation; a request the proxy gives
// no key (another route, X-Dedupe-Bypass, a compressed body) or refuses is said to be so.
func (a *app) key(args []string) int {
	c := lookupCommand("key")
	fs, cf := a.flagSet(c)
	path := fs.String("path", "/v1/chat/completions", "the request's `PATH`, with its query string if it has one (method POST)")
	auth := fs.String("authorization", "", "the client's Authorization header `VALUE` (\"Bearer sk-…\"), which the credential scope hashes")
	header := headerFlags{}
	fs.Var(header, "header", "a request header, as `\"Name: value\"` (repeatable): X-Dedupe-Namespace, or a header:NAME scope's")
	genFlag := fs.String("generation", "", "the namespace's generation `N`, as its last purge answered it; unset: read from Redis with\n"+
		"        redis.addrs, else 0 (never purged)")
	if code, done := a.parse(c, fs, args, 1); done {
		return code
	}
	cfg, err := cf.load(a.env)
	if err != nil {
		return a.invalidConfig(err)
	}
	fail := func(code int, format string, args ...any) int {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy key: "+format+"\n", args...)
		return code
	}

	u, err := url.Parse(*path)
	if err != nil || !strings.HasPrefix(u.Path, "/") {
		return fail(2, "--path %q: want a path such as /v1/chat/completions", *path)
	}
	if !slices.Contains(cfg.Dedupe.Paths, u.Path) {
		return fail(1, "%s is not a deduplicated route (dedupe.paths): the proxy passes its requests through and gives them no key", u.Path)
	}
	h := http.Header(header)
	if *auth != "" {
		h.Set("Authorization", *auth)
	}
	if h.Get(proxy.HeaderBypass) == "1" {
		return fail(1, "with %s: 1 the proxy sends the request straight upstream and gives it no key", proxy.HeaderBypass)
	}
	if proxy.Encoded(h) {
		return fail(1, "with Content-Encoding the proxy sends the request straight upstream (the key cannot see into a compressed body) and gives it no key")
	}
	names := h.Values(proxy.HeaderNamespace)
	if len(names) > 1 {
		return fail(1, "the proxy refuses two %s headers (400 invalid_namespace)", proxy.HeaderNamespace)
	}
	ns := h.Get(proxy.HeaderNamespace)
	if !proxy.ValidNamespace(ns) {
		return fail(1, "the proxy refuses %s %q (400 invalid_namespace): at most 64 letters, digits and . _ - :", proxy.HeaderNamespace, ns)
	}

	var body []byte
	name := fs.Arg(0)
	if name == "" || name == "-" {
		body, err = io.ReadAll(a.stdin)
	} else {
		body, err = os.ReadFile(name)
	}
	if err != nil {
		return fail(1, "%v", err)
	}
	if len(bytes.TrimSpace(body)) == 0 { // an unset shell variable, most often: say so, not "invalid JSON"
		if name == "" || name == "-" {
			return fail(1, "no request body on standard input: give it there (echo '{\"model\":…}' | llm-dedupe-proxy key) or name a file that holds it")
		}
		return fail(1, "%s holds no request body", name)
	}

	var gen uint64
	switch {
	case *genFlag != "":
		if gen, err = strconv.ParseUint(*genFlag, 10, 64); err != nil {
			return fail(2, "--generation %q: want the number a purge answered", *genFlag)
		}
	case len(cfg.Redis.Addrs) > 0:
		if gen, err = redisGeneration(cfg, ns); err != nil {
			fmt.Fprintf(a.stderr, "llm-dedupe-proxy key: warning: the generation of namespace %q could not be read from Redis, 0 assumed, as an instance that cannot reach Redis does: %v\n", ns, err)
		}
	case ns != "":
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy key: note: without Redis, namespace %q's generation lives in the running instance's memory: 0 (never purged) assumed; after a purge, give --generation\n", ns)
	}

	scope, err := hashing.ParseScope(cfg.Hashing.Scope)
	if err != nil { // validate already checked it
		return fail(2, "%v", err)
	}
	hasher := hashing.New(hashing.Options{Scope: scope, IgnoreFields: cfg.Hashing.IgnoreFields})
	req, err := hasher.KeyIn(hashing.Namespace{Name: ns, Gen: gen}, http.MethodPost, proxy.KeyPath(u), h, body)
	if err != nil {
		return fail(1, "%v", err)
	}
	fmt.Fprintf(a.stdout, "%s\n%s\n", req.Canonical, req.Key)
	return 0
}

// redisGeneration reads the generation of namespace ns from the Redis of cfg, as an
// instance does for a request in it.
func redisGeneration(cfg Config, ns string) (uint64, error) {
	tlsCfg, err := redisTLS(cfg.Redis)
	if err != nil {
		return 0, err
	}
	client := newRedis(cfg.Redis, tlsCfg)
	defer client.Close()
	g := singleflight.New(singleflight.Options{Redis: client, KeyPrefix: cfg.Redis.KeyPrefix})
	ctx, cancel := context.WithTimeout(context.Background(), 2*cfg.Redis.DialTimeout+cfg.Redis.ReadTimeout)
	defer cancel()
	defer g.Close(ctx)
	return g.NamespaceGeneration(ctx, ns)
}
