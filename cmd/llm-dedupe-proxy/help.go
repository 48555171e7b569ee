package main

import (
	"flag"
	"fmt"
	"io"
	"reflect"
	"strings"
)

// command is one subcommand of the binary: what it is called, what its help says, and the
// configuration keys that matter to it.
type command struct {
	name     string
	synopsis string // what follows "llm-dedupe-proxy " in its usage line
	summary  string // its line in the list of commands
	about    string // the paragraph its help opens with
	// keys are the configuration keys its help lists: a key, or a section with its dot
	// ("hashing."). Every key is accepted as a flag whatever this says; nil lists them all.
	keys []string
	run  func(a *app, args []string) int
}

// commands lists the subcommands in the order help shows them. It is a function, not a
// variable, because the help it prints is itself one of them.
func commands() []*command {
	return []*command{
		{
			name: "serve", synopsis: "[serve] [flags]", summary: "run the proxy (the default command)",
			about: "Runs the proxy: an OpenAI-compatible reverse proxy that makes identical requests in flight\n" +
				"share one upstream call, on one instance or, through Redis, on several.",
			run: (*app).serve,
		},
		{
			name: "fake-upstream", synopsis: "fake-upstream [flags]",
			summary: "serve a fake OpenAI API on loopback, to try the proxy without an API key",
			about: "Serves a fake OpenAI-compatible API that needs no API key: Chat Completions, Completions,\n" +
				"Embeddings and Responses, streamed or not, each answer numbered by the call that made it\n" +
				"(\"reply 1\", \"reply 2\", …) and sent after --delay, so that identical requests overlap.\n" +
				"GET /_fake/stats counts its calls. It answers a POST on any path, with\n" +
				"Set-Cookie: session=secret: a fixture of the tests (no cookie may reach another client).\n" +
				"Point the proxy at it with --upstream.base_url=http://127.0.0.1:9000.",
			keys: []string{},
			run:  (*app).fakeUpstream,
		},
		{
			name: "key", synopsis: "key [flags] [FILE|-]", summary: "print the canonical form and the key of a request body",
			about: "Prints the canonical form of a request body and, as its last line, the key the proxy gives\n" +
				"it (its X-Dedupe-Key), so that you can see why two requests did or did not share an\n" +
				"answer. Reads FILE, or standard input when FILE is - or missing. Every header that changes\n" +
				"the key is taken into account: Authorization (or the scope's header), and\n" +
				"X-Dedupe-Namespace, whose generation (changed by each purge) is read from Redis when\n" +
				"redis.addrs is set; without Redis it lives in the running instance's memory, and 0 (never\n" +
				"purged) is assumed unless --generation says otherwise.",
			keys: []string{"hashing.", "dedupe.paths", "redis.addrs", "redis.key_prefix"},
			run:  (*app).key,
		},
		{
			name: "flights", synopsis: "flights [flags]",
			summary: "list the flights in progress on every instance (needs admin.listen and admin.token)",
			about: "Lists the flights in progress, as GET /admin/flights of the running proxy answers them: on\n" +
				"every instance with Redis, on that instance in memory. Keys are printed whole, as\n" +
				"DELETE /admin/answers/{key} takes them.",
			keys: []string{"admin."},
			run:  (*app).flights,
		},
		{
			name: "healthcheck", synopsis: "healthcheck [flags]",
			summary: "exit 0 if the proxy on the configured listen address is healthy",
			about: "Asks /healthz of the proxy listening on the configured address and exits 0 if it answers\n" +
				"200, 1 otherwise: a HEALTHCHECK for an image without a shell or curl. With\n" +
				"--require-redis, asks /readyz and exits 0 only if the instance deduplicates through\n" +
				"Redis (not degraded): a check of a deployment, as `helm test` runs it.",
			keys: []string{"listen"},
			run:  (*app).healthcheck,
		},
		{name: "version", synopsis: "version", summary: "print the version", run: (*app).version},
		{name: "help", synopsis: "help [COMMAND]", summary: "print this help, or a command's", run: (*app).help},
	}
}

// lookupCommand returns the command called name, or nil.
func lookupCommand(name string) *command {
	for _, c := range commands() {
		if c.name == name {
			return c
		}
	}
	return nil
}

// help prints the help of the command named in args, or the binary's (serve's).
func (a *app) help(args []string) int {
	name := "serve"
	if len(args) > 0 {
		name = args[0]
	}
	c := lookupCommand(name)
	if c == nil {
		return a.unknownCommand(name)
	}
	if c.name == "help" || c.name == "version" {
		c = lookupCommand("serve")
	}
	return c.run(a, []string{"-h"}) // a command's own flags are defined where it runs
}

func (a *app) unknownCommand(name string) int {
	var names []string
	for _, c := range commands() {
		names = append(names, c.name)
	}
	fmt.Fprintf(a.stderr, "llm-dedupe-proxy: unknown command %q%s\nRun \"llm-dedupe-proxy --help\" for the commands.\n",
		name, didYouMean(name, names, "%q"))
	return 2
}

// printHelp writes a command's help: usage, what it does, the list of commands (for the
// default command), its own flags, then the configuration keys it reads, each flag with a
// line of meaning and its default.
func (a *app) printHelp(w io.Writer, c *command, fs *flag.FlagSet) {
	fmt.Fprintf(w, "Usage: llm-dedupe-proxy %s\n", c.synopsis)
	if c.name == "serve" {
		fmt.Fprintln(w, "       llm-dedupe-proxy COMMAND [flags]")
	}
	fmt.Fprintf(w, "\n%s\n", c.about)
	if c.name == "serve" {
		fmt.Fprintln(w, "\nCommands:")
		for _, sc := range commands() {
			fmt.Fprintf(w, "  %-14s %s\n", sc.name, sc.summary)
		}
		fmt.Fprintln(w, "\nRun \"llm-dedupe-proxy COMMAND -h\" for a command's flags.")
	}
	def := defaultConfig()
	fmt.Fprintln(w, "\nFlags:")
	fs.VisitAll(func(f *flag.Flag) {
		// A command's own flag may share a key's name (fake-upstream's --listen): what
		// tells them apart is the kind of flag, not the name.
		if _, isKey := f.Value.(*keyFlag); !isKey && f.Name != "config" {
			printFlag(w, f)
		}
	})
	if c.keys != nil && len(c.keys) == 0 {
		return // reads no configuration
	}
	printFlag(w, fs.Lookup("config"))
	if c.keys == nil {
		fmt.Fprintln(w, "\nConfiguration: every key is a flag, an environment variable (LLM_DEDUPE_ and the key\n"+
			"upper-cased, \".\" as \"_\": LLM_DEDUPE_UPSTREAM_BASE_URL) and a key of the --config file;\n"+
			"flags win over the environment, the environment over the file. An unknown key or\n"+
			"LLM_DEDUPE_ variable stops start-up. config.example.yaml lists every key.\n"+
			"Traces: OpenTelemetry's own variables; set OTEL_EXPORTER_OTLP_ENDPOINT to turn them on\n"+
			"(OTEL_EXPORTER_OTLP_PROTOCOL http/protobuf or grpc, OTEL_SERVICE_NAME, OTEL_TRACES_SAMPLER…),\n"+
			"or OTEL_TRACES_EXPORTER=console to write a line per span on standard output.")
	} else {
		fmt.Fprintln(w, "\nConfiguration it reads, as serve does (a flag, LLM_DEDUPE_ and the key upper-cased, or a\n"+
			"key of the --config file; \"llm-dedupe-proxy serve -h\" lists every key, and each is accepted):")
	}
	for _, s := range settings(&def) {
		if c.keys == nil || readsKey(c.keys, s.key) {
			printFlag(w, fs.Lookup(s.key))
		}
	}
}

// readsKey reports whether key is one of keys, or in one of their sections.
func readsKey(keys []string, key string) bool {
	for _, k := range keys {
		if k == key || strings.HasSuffix(k, ".") && strings.HasPrefix(key, k) {
			return true
		}
	}
	return false
}

// printFlag writes one flag in two lines, as Go's flag package does: its name and the kind
// of value it takes, then its meaning and its default, if it has one.
func printFlag(w io.Writer, f *flag.Flag) {
	word, usage := flag.UnquoteUsage(f)
	if kf, ok := f.Value.(*keyFlag); ok {
		word, usage = kf.word, kf.help
	}
	if word != "" {
		word = " " + word
	}
	if d := f.DefValue; d != "" && d != "0" && d != "false" && d != "0s" && d != "[]" && d != `""` {
		usage += " (default " + d + ")"
	}
	fmt.Fprintf(w, "  --%s%s\n        %s\n", f.Name, word, usage)
}

// kindWord names the value a key's flag takes, in help.
func kindWord(t reflect.Type) string {
	switch {
	case t == durationType:
		return "duration"
	case t.Kind() == reflect.Bool:
		return ""
	case t.Kind() == reflect.Slice:
		return "list"
	}
	return t.Kind().String()
}

// didYouMean returns " (did you mean X?)", X printed with format, for the candidate name
// was most likely meant as, or "" when none is close enough: the nearest within a quarter
// of its length in edits (at least one), else the only one that name begins, else the only
// one that ends with name after a "." or "_" (a key given without its section). Dashes
// and the LLM_DEDUPE_ prefix, which every candidate shares, are left out of the comparison.
func didYouMean(name string, candidates []string, format string) string {
	stem := func(s string) string {
		return strings.ToLower(strings.TrimPrefix(strings.TrimLeft(s, "-"), envPrefix))
	}
	n := stem(name)
	best, bestD := "", max(1, len(n)/4)+1
	var begun, ended []string
	for _, c := range candidates {
		cs := stem(c)
		if d := editDistance(n, cs); d < bestD {
			best, bestD = c, d
		}
		if len(n) >= 3 && strings.HasPrefix(cs, n) {
			begun = append(begun, c)
		}
		if strings.HasSuffix(cs, "."+n) || strings.HasSuffix(cs, "_"+n) {
			ended = append(ended, c)
		}
	}
	switch {
	case best != "":
	case len(begun) == 1:
		best = begun[0]
	case len(ended) == 1:
		best = ended[0]
	default:
		return ""
	}
	return " (did you mean " + fmt.Sprintf(format, best) + "?)"
}

// editDistance is the Levenshtein distance between a and b, in bytes: the fewest
// insertions, deletions and substitutions that make one the other.
func editDistance(a, b string) int {
	prev, cur := make([]int, len(b)+1), make([]int, len(b)+1)
	for j := range prev {
		prev[j] = j
	}
	for i := 1; i <= len(a); i++ {
		cur[0] = i
		for j := 1; j <= len(b); j++ {
			cost := 1
			if a[i-1] == b[j-1] {
				cost = 0
			}
			cur[j] = min(prev[j]+1, cur[j-1]+1, prev[j-1]+cost)
		}
		prev, cur = cur, prev
	}
	return prev[len(b)]
}
