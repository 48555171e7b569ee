// Command llm-dedupe-proxy is an OpenAI-compatible reverse proxy that deduplicates identical
// in-flight requests across instances.
//
// Usage:
//
//	llm-dedupe-proxy [serve] [flags]          run the proxy (the default)
//	llm-dedupe-proxy key [flags] [FILE|-]     print a request body's canonical form and key
//	llm-dedupe-proxy healthcheck [flags]      exit 0 if the running proxy answers /healthz
//	llm-dedupe-proxy flights [flags]          list the flights in progress (admin API)
//	llm-dedupe-proxy version                  print the version
//
// Configuration comes from defaults < the YAML file given with --config < environment
// variables (LLM_DEDUPE_ + the key path upper-cased with "_") < flags (--KEY=VALUE);
// config.example.yaml lists every key. Exit status: 0 success, 1 failure, 2 usage or invalid
// configuration.
package main

import (
	"context"
	"errors"
	"flag"
	"fmt"
	"io"
	"os"
	"os/signal"
	"runtime"
	"strings"
	"syscall"
)

// version is set at build time with -ldflags "-X main.version=…".
var version = "dev"

const usage = `usage: llm-dedupe-proxy [command] [flags]

commands:
  serve     run the proxy (the default command)
  key       print the canonical form and the key of a request body
  healthcheck  exit 0 if the proxy on the configured listen address is healthy
  flights   list the flights in progress on every instance (needs admin.listen and admin.token)
  version   print the version

Run "llm-dedupe-proxy COMMAND -h" for the flags of a command.
`

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	os.Exit(run(ctx, os.Args[1:], os.LookupEnv, os.Stdin, os.Stdout, os.Stderr))
}

// app is what one run of the binary reads and writes; tests fill it with buffers and a map.
type app struct {
	getenv  func(string) (string, bool)
	environ func() []string // NAME=value of every variable, to warn of unknown LLM_DEDUPE_ ones
	stdin   io.Reader
	stdout  io.Writer
	stderr  io.Writer
}

// run runs the command in args and returns the exit status. serve stops when ctx ends.
func run(ctx context.Context, args []string, getenv func(string) (string, bool),
	stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{getenv: getenv, environ: os.Environ, stdin: stdin, stdout: stdout, stderr: stderr}
	cmd, rest := "serve", args
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		cmd, rest = args[0], args[1:]
	}
	switch cmd {
	case "serve":
		return a.serve(ctx, rest)
	case "key":
		return a.key(rest)
	case "healthcheck":
		return a.healthcheck(rest)
	case "flights":
		return a.flights(rest)
	case "version":
		fmt.Fprintf(stdout, "llm-dedupe-proxy %s %s\n", version, runtime.Version())
		return 0
	case "help":
		fmt.Fprint(stdout, usage)
		return 0
	}
	fmt.Fprintf(stderr, "llm-dedupe-proxy: unknown command %q\n\n%s", cmd, usage)
	return 2
}

// flagSet returns the flags of a subcommand: --config and one per configuration key, to which
// the caller adds its own.
func (a *app) flagSet(name, synopsis string) (*flag.FlagSet, *configFlags) {
	fs := flag.NewFlagSet(name, flag.ContinueOnError)
	fs.SetOutput(a.stderr)
	fs.Usage = func() {
		fmt.Fprintf(fs.Output(), "usage: llm-dedupe-proxy %s\n\nflags:\n", synopsis)
		fs.PrintDefaults()
	}
	return fs, newConfigFlags(fs)
}

// parse parses args into fs; done is true when the command should stop with status code.
func (a *app) parse(fs *flag.FlagSet, args []string, maxArgs int) (code int, done bool) {
	if err := fs.Parse(args); err != nil {
		if errors.Is(err, flag.ErrHelp) {
			return 0, true
		}
		return 2, true
	}
	if fs.NArg() > maxArgs {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy %s: unexpected argument %q\n", fs.Name(), fs.Arg(maxArgs))
		fs.Usage()
		return 2, true
	}
	return 0, false
}

// invalidConfig reports every error of a configuration on its own line and returns status 2.
func (a *app) invalidConfig(err error) int {
	errs := []error{err}
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		errs = j.Unwrap()
	}
	for _, e := range errs {
		fmt.Fprintf(a.stderr, "llm-dedupe-proxy: invalid config: %v\n", e)
	}
	return 2
}
