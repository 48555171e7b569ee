// Command llm-dedupe-proxy is an OpenAI-compatible reverse proxy that deduplicates identical
// in-flight requests across instances.
//
// Usage:
//
//	llm-dedupe-proxy [serve] [flags]          run the proxy (the default)
//	llm-dedupe-proxy fake-upstream [flags]    serve a fake OpenAI API, to try the proxy without a key
//	llm-dedupe-proxy key [flags] [FILE|-]     print a request body's canonical form and key
//	llm-dedupe-proxy flights [flags]          list the flights in progress (admin API)
//	llm-dedupe-proxy healthcheck [flags]      exit 0 if the running proxy answers /healthz
//	llm-dedupe-proxy version                  print the version
//	llm-dedupe-proxy help [COMMAND]           print the help of the binary or of a command
//
// Configuration comes from defaults < the YAML file given with --config < environment
// variables (LLM_DEDUPE_ + the key path upper-cased with "_") < flags (--KEY=VALUE);
// config.example.yaml lists every key, and an unknown key or variable is refused. Exit
// status: 0 success, 1 failure, 2 usage or invalid configuration.
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

func main() {
	ctx, stop := signal.NotifyContext(context.Background(), os.Interrupt, syscall.SIGTERM)
	go func() {
		<-ctx.Done()
		stop() // a second signal ends the process at once
	}()
	env := map[string]string{}
	for _, kv := range os.Environ() {
		name, value, _ := strings.Cut(kv, "=")
		env[name] = value
	}
	os.Exit(run(ctx, os.Args[1:], env, os.Stdin, os.Stdout, os.Stderr))
}

// app is what one run of the binary reads and writes; tests fill it with buffers and a map.
type app struct {
	ctx    context.Context // serve and fake-upstream stop when it ends
	env    map[string]string
	stdin  io.Reader
	stdout io.Writer
	stderr io.Writer
}

// getenv returns the environment variable name, and whether it is set.
func (a *app) getenv(name string) (string, bool) {
	v, ok := a.env[name]
	return v, ok
}

// run runs the command in args and returns the exit status. env is the whole environment;
// serve stops when ctx ends.
func run(ctx context.Context, args []string, env map[string]string, stdin io.Reader, stdout, stderr io.Writer) int {
	a := &app{ctx: ctx, env: env, stdin: stdin, stdout: stdout, stderr: stderr}
	name, rest := "serve", args
	if len(args) > 0 && !strings.HasPrefix(args[0], "-") {
		name, rest = args[0], args[1:]
	}
	c := lookupCommand(name)
	if c == nil {
		return a.unknownCommand(name)
	}
	return c.run(a, rest)
}

func (a *app) version(args []string) int {
	fmt.Fprintf(a.stdout, "llm-dedupe-proxy %s %s\n", version, runtime.Version())
	return 0
}

// flagSet returns the flags of a command: its own, which the caller adds, and, for a
// command that reads the configuration, --config and one per configuration key.
func (a *app) flagSet(c *command) (*flag.FlagSet, *configFlags) {
	fs := flag.NewFlagSet(c.name, flag.ContinueOnError)
	// Parse's own messages are replaced by parse's: a short one for an error, the whole
	// help for -h.
	fs.SetOutput(io.Discard)
	fs.Usage = func() {}
	var cf *configFlags
	if c.keys == nil || len(c.keys) > 0 {
		cf = newConfigFlags(fs)
	}
	return fs, cf
}

// parse parses args into the flags of c; done is true when the command should stop with
// status code: after its help (-h), or after a usage error, which it reports in a line with
// the flag it may have meant, as kubectl does, rather than with the whole help.
func (a *app) parse(c *command, fs *flag.FlagSet, args []string, maxArgs int) (code int, done bool) {
	err := fs.Parse(args)
	if errors.Is(err, flag.ErrHelp) {
		a.printHelp(a.stdout, c, fs)
		return 0, true
	}
	if err == nil && fs.NArg() > maxArgs {
		err = fmt.Errorf("unexpected argument %q", fs.Arg(maxArgs))
	}
	if err == nil {
		return 0, false
	}
	msg := err.Error()
	if name, ok := strings.CutPrefix(msg, "flag provided but not defined: -"); ok {
		var names []string
		fs.VisitAll(func(f *flag.Flag) { names = append(names, "--"+f.Name) })
		msg = "unknown flag --" + name + didYouMean("--"+name, names, "%s")
	}
	fmt.Fprintf(a.stderr, "llm-dedupe-proxy %s: %s\nRun \"llm-dedupe-proxy %s -h\" for its flags.\n", c.name, msg, c.name)
	return 2, true
}

// invalidConfig reports every error of a configuration, joined errors each on its own line,
// and returns status 2.
func (a *app) invalidConfig(err error) int {
	if j, ok := err.(interface{ Unwrap() []error }); ok {
		for _, e := range j.Unwrap() {
			a.invalidConfig(e)
		}
		return 2
	}
	fmt.Fprintf(a.stderr, "llm-dedupe-proxy: invalid config: %v\n", err)
	return 2
}
