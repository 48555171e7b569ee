package main

import (
	"errors"
	"fmt"
	"io"
	"net/http"
	"os"
	"strings"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
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
// a user can see why two requests did or did not deduplicate. The scope and the ignored fields
// come from the configuration, like the server's.
func (a *app) key(args []string) int {
	c := lookupCommand("key")
	fs, cf := a.flagSet(c)
	path := fs.String("path", "/v1/chat/completions", "the request's `PATH` (method POST)")
	auth := fs.String("authorization", "", "the client's Authorization header `VALUE` (\"Bearer sk-…\"), which the credential scope hashes")
	header := headerFlags{}
	fs.Var(header, "header", "a request header, as `\"Name: value\"` (repeatable), for a header:NAME scope")
	if code, done := a.parse(c, fs, args, 1); done {
		return code
	}
	cfg, err := cf.load(a.env)
	if err != nil {
		return a.invalidConfig(err)
	}

	var body []byte
	if name := fs.Arg(0); name == "" || name == "-" {
		body, err = io.ReadAll(a.stdin)
	} else {
		body, err = os.ReadFile(name)
	}
	if err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy key: %v\n", err)
		return 1
	}

	scope, err := hashing.ParseScope(cfg.Hashing.Scope)
	if err != nil { // validate already checked it
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy key: %v\n", err)
		return 2
	}
	if *auth != "" {
		http.Header(header).Set("Authorization", *auth)
	}
	h := hashing.New(hashing.Options{Scope: scope, IgnoreFields: cfg.Hashing.IgnoreFields})
	req, err := h.Key(http.MethodPost, *path, http.Header(header), body)
	if err != nil {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy key: %v\n", err)
		return 1
	}
	fmt.Fprintf(a.stdout, "%s\n%s\n", req.Canonical, req.Key)
	return 0
}
