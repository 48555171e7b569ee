package main

import (
	"context"
	"os"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
)

// result is what one run of the binary left behind.
type result struct {
	code           int
	stdout, stderr string
}

// runCmd runs the binary in-process with env as its whole environment and stdin as its input.
func runCmd(t *testing.T, env map[string]string, stdin string, args ...string) result {
	t.Helper()
	var stdout, stderr strings.Builder
	code := run(context.Background(), args, env, strings.NewReader(stdin), &stdout, &stderr)
	return result{code, stdout.String(), stderr.String()}
}

func writeFile(t *testing.T, name, content string) string {
	t.Helper()
	path := filepath.Join(t.TempDir(), name)
	if err := os.WriteFile(path, []byte(content), 0o644); err != nil {
		t.Fatal(err)
	}
	return path
}

func TestVersion(t *testing.T) {
	r := runCmd(t, nil, "", "version")
	if r.code != 0 || !strings.HasPrefix(r.stdout, "llm-dedupe-proxy dev go1.") {
		t.Errorf("version: status %d, output %q; want 0 and \"llm-dedupe-proxy dev go1.…\"", r.code, r.stdout)
	}
}

func TestUsageErrors(t *testing.T) {
	tests := [][]string{
		{"frobnicate"},
		{"serve", "--no-such-flag"},
		{"serve", "extra"},
		{"key", "a.json", "b.json"},
	}
	for _, args := range tests {
		if r := runCmd(t, nil, "", args...); r.code != 2 || r.stderr == "" {
			t.Errorf("%q: status %d, stderr %q; want 2 and a message", args, r.code, r.stderr)
		}
	}
}

// TestHelp: the binary's help lists the commands and gives every flag a line of meaning
// and its default; a command's help shows its own flags first and only the configuration
// keys it reads.
func TestHelp(t *testing.T) {
	serve := runCmd(t, nil, "", "serve", "-h")
	if serve.code != 0 || serve.stderr != "" {
		t.Fatalf("serve -h: status %d, stderr %q; want 0 and the help on stdout", serve.code, serve.stderr)
	}
	for _, c := range commands() {
		if !regexp.MustCompile(`(?m)^  ` + c.name + ` +` + regexp.QuoteMeta(c.summary) + `$`).MatchString(serve.stdout) {
			t.Errorf("serve -h does not list the command %s with its summary:\n%s", c.name, serve.stdout)
		}
	}
	def := defaultConfig()
	for _, s := range settings(&def) {
		if s.help == "" {
			t.Errorf("%s has no help tag", s.key)
			continue
		}
		if !strings.Contains(serve.stdout, "\n  --"+s.key) || !strings.Contains(serve.stdout, "\n        "+s.help) {
			t.Errorf("serve -h lacks --%s with its meaning %q", s.key, s.help)
		}
	}
	for _, want := range []string{
		"  --upstream.timeout duration\n        hard limit of one upstream call, streaming included (default 10m)\n",
		"  --listen string\n        address the HTTP server listens on (host:port); an empty host is every interface (default \":8080\")\n",
		"  --redis.tls\n        connect to Redis over TLS\n",
		"  --print-config\n        print the configuration in effect, secrets redacted, and exit\n",
	} {
		if !strings.Contains(serve.stdout, want) {
			t.Errorf("serve -h lacks\n%s", want)
		}
	}
	for _, args := range [][]string{{"--help"}, {"-h"}, {"help"}, {"help", "serve"}} {
		if r := runCmd(t, nil, "", args...); r.code != 0 || r.stdout != serve.stdout {
			t.Errorf("%q: status %d; want 0 and the help of serve", args, r.code)
		}
	}

	key := runCmd(t, nil, "", "key", "-h")
	own, conf, ok := strings.Cut(key.stdout, "Configuration it reads")
	if key.code != 0 || !ok {
		t.Fatalf("key -h: status %d\n%s", key.code, key.stdout)
	}
	for _, f := range []string{"--path PATH", "--authorization VALUE", "--header \"Name: value\"", "--generation N", "--config FILE"} {
		if !strings.Contains(own, "\n  "+f+"\n") {
			t.Errorf("key -h: its own flags lack %s:\n%s", f, own)
		}
	}
	for _, f := range []string{"--hashing.scope", "--hashing.ignore_fields", "--dedupe.paths", "--redis.addrs"} {
		if !strings.Contains(conf, "\n  "+f+" ") {
			t.Errorf("key -h: the configuration it reads lacks %s", f)
		}
	}
	if strings.Contains(key.stdout, "--flight.lease_ttl") || strings.Contains(key.stdout, "Commands:") {
		t.Errorf("key -h shows serve's keys or the commands:\n%s", key.stdout)
	}
	if r := runCmd(t, nil, "", "help", "key"); r.stdout != key.stdout {
		t.Errorf("help key differs from key -h")
	}
	flights := runCmd(t, nil, "", "flights", "-h")
	if !strings.Contains(flights.stdout, "\n  --admin.token string\n") || strings.Contains(flights.stdout, "--redis.addrs") {
		t.Errorf("flights -h: want admin.token and no redis key:\n%s", flights.stdout)
	}
	fake := runCmd(t, nil, "", "fake-upstream", "-h")
	if !strings.Contains(fake.stdout, "\n  --delay duration\n") || !strings.Contains(fake.stdout, "\n  --listen host:port\n") ||
		strings.Contains(fake.stdout, "--config") {
		t.Errorf("fake-upstream -h: want --delay, --listen and no configuration:\n%s", fake.stdout)
	}
}

// TestDidYouMean: a mistyped command or flag is answered in two lines, the first naming
// what was probably meant, the second where to look; not with the whole help.
func TestDidYouMean(t *testing.T) {
	tests := []struct {
		args []string
		want string
	}{
		{[]string{"flight"}, "llm-dedupe-proxy: unknown command \"flight\" (did you mean \"flights\"?)\nRun \"llm-dedupe-proxy --help\" for the commands.\n"},
		{[]string{"fakeupstream"}, "llm-dedupe-proxy: unknown command \"fakeupstream\" (did you mean \"fake-upstream\"?)\nRun \"llm-dedupe-proxy --help\" for the commands.\n"},
		{[]string{"serve", "--frobnicate"}, "llm-dedupe-proxy serve: unknown flag --frobnicate\nRun \"llm-dedupe-proxy serve -h\" for its flags.\n"},
		{[]string{"frobnicate"}, "llm-dedupe-proxy: unknown command \"frobnicate\"\nRun \"llm-dedupe-proxy --help\" for the commands.\n"},
		{[]string{"--upstream.base_uri=http://x"}, "llm-dedupe-proxy serve: unknown flag --upstream.base_uri (did you mean --upstream.base_url?)\nRun \"llm-dedupe-proxy serve -h\" for its flags.\n"},
		{[]string{"serve", "--print_config"}, "llm-dedupe-proxy serve: unknown flag --print_config (did you mean --print-config?)\nRun \"llm-dedupe-proxy serve -h\" for its flags.\n"},
		{[]string{"key", "--auth", "x"}, "llm-dedupe-proxy key: unknown flag --auth (did you mean --authorization?)\nRun \"llm-dedupe-proxy key -h\" for its flags.\n"},
		{[]string{"flights", "--timeout=soon"}, "llm-dedupe-proxy flights: invalid value \"soon\" for flag -timeout: parse error\nRun \"llm-dedupe-proxy flights -h\" for its flags.\n"},
	}
	for _, tt := range tests {
		if r := runCmd(t, nil, "", tt.args...); r.code != 2 || r.stdout != "" || r.stderr != tt.want {
			t.Errorf("%q: status %d, stdout %q, stderr\n%s\nwant 2, nothing and\n%s", tt.args, r.code, r.stdout, r.stderr, tt.want)
		}
	}
}

var keyLine = regexp.MustCompile(`^[0-9a-f]{64}$`)

// keyOf runs the key subcommand and returns the key from its last line.
func keyOf(t *testing.T, env map[string]string, body string, args ...string) string {
	t.Helper()
	r := runCmd(t, env, body, append([]string{"key"}, args...)...)
	lines := strings.Split(strings.TrimSuffix(r.stdout, "\n"), "\n")
	last := lines[len(lines)-1]
	if r.code != 0 || len(lines) < 2 || !keyLine.MatchString(last) {
		t.Fatalf("key %q: status %d, stdout %q, stderr %q; want 0, the canonical form and a 64-hex last line",
			args, r.code, r.stdout, r.stderr)
	}
	return last
}

func TestKey(t *testing.T) {
	const body = `{"model":"gpt-4o","messages":[{"role":"user","content":"hi"}],"temperature":1}`
	const same = "{\n  \"temperature\": 1.0,\n  \"messages\": [{\"content\": \"hi\", \"role\": \"user\"}],\n  \"model\": \"gpt-4o\", \"user\": \"u1\"\n}"
	base := keyOf(t, nil, body, "--authorization", "Bearer sk-a")

	r := runCmd(t, nil, body, "key", "--authorization", "Bearer sk-a")
	if canon := strings.Split(r.stdout, "\n")[0]; canon != `{"messages":[{"content":"hi","role":"user"}],"model":"gpt-4o","temperature":1}` {
		t.Errorf("canonical form %s; want sorted keys, no spaces, the number 1", canon)
	}
	if got := keyOf(t, nil, same, "--authorization", "Bearer sk-a"); got != base {
		t.Errorf("reordered, re-spaced body with user: key %s; want %s", got, base)
	}
	file := writeFile(t, "body.json", same)
	if got := keyOf(t, nil, "", "--authorization", "Bearer sk-a", file); got != base {
		t.Errorf("body from a file: key %s; want %s", got, base)
	}
	differ := map[string][]string{
		"another credential": {"--authorization", "Bearer sk-b"},
		"another path":       {"--authorization", "Bearer sk-a", "--path", "/v1/completions"},
	}
	for name, args := range differ {
		if got := keyOf(t, nil, body, args...); got == base {
			t.Errorf("%s: key %s; want a different key", name, got)
		}
	}
	other := strings.Replace(body, `"hi"`, `"hi "`, 1)
	if got := keyOf(t, nil, other, "--authorization", "Bearer sk-a"); got == base {
		t.Errorf("different content: key %s; want a different key", got)
	}
}

func TestKeyUsesConfig(t *testing.T) {
	const body = `{"model":"m","metadata":{"run":1}}`
	env := map[string]string{"LLM_DEDUPE_HASHING_IGNORE_FIELDS": "user, metadata"}
	if keyOf(t, env, body) != keyOf(t, env, `{"model":"m","metadata":{"run":2}}`) {
		t.Errorf("with metadata ignored, bodies differing in metadata got different keys")
	}
	a := keyOf(t, nil, body, "--hashing.scope=global", "--authorization", "Bearer sk-a")
	b := keyOf(t, nil, body, "--hashing.scope=global", "--authorization", "Bearer sk-b")
	if a != b {
		t.Errorf("global scope: keys %s and %s for two credentials; want one key", a, b)
	}
	c := keyOf(t, nil, body, "--hashing.scope=header:X-Tenant", "--header", "X-Tenant: t1")
	d := keyOf(t, nil, body, "--hashing.scope=header:X-Tenant", "--header", "X-Tenant: t2")
	if c == d {
		t.Errorf("header scope: same key %s for two tenants; want two keys", c)
	}
}

// TestKeyWithoutABody: an empty body (an unset shell variable echoed) is said to be missing,
// with where key reads it from, rather than reported as invalid JSON.
func TestKeyWithoutABody(t *testing.T) {
	for _, body := range []string{"", "\n"} {
		r := runCmd(t, nil, body, "key")
		if r.code != 1 || r.stdout != "" || !strings.HasPrefix(r.stderr, "llm-dedupe-proxy key: no request body on standard input: give it there") {
			t.Errorf("stdin %q: status %d, stdout %q, stderr %q; want 1 and that no body came", body, r.code, r.stdout, r.stderr)
		}
	}
	empty := writeFile(t, "body.json", " \n")
	if r := runCmd(t, nil, "", "key", empty); r.code != 1 || r.stderr != "llm-dedupe-proxy key: "+empty+" holds no request body\n" {
		t.Errorf("an empty file: status %d, stderr %q; want 1 and that it holds no body", r.code, r.stderr)
	}
}

func TestKeyInvalidJSON(t *testing.T) {
	for _, body := range []string{`{"model":`, `[1,2]`, `hello`} {
		r := runCmd(t, nil, body, "key")
		if r.code != 1 || r.stdout != "" || !strings.HasPrefix(r.stderr, "llm-dedupe-proxy key: ") {
			t.Errorf("body %q: status %d, stdout %q, stderr %q; want 1 and a message on stderr only",
				body, r.code, r.stdout, r.stderr)
		}
	}
}
