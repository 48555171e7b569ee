package e2e

import (
	"bytes"
	"context"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"strings"
	"testing"
	"time"
)

// readmeSDKSection is the README section whose code blocks are whole programs that point an
// OpenAI SDK at the proxy.
const readmeSDKSection = "## Pointing the OpenAI SDKs at it"

// readmeCode returns the code blocks of language lang under heading, in order.
func readmeCode(t *testing.T, heading, lang string) []string {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "README.md"))
	if err != nil {
		t.Fatal(err)
	}
	readme := string(raw)
	i := strings.Index(readme, "\n"+heading+"\n")
	if i < 0 {
		t.Fatalf("README.md has no heading %q", heading)
	}
	section := readme[i+len(heading)+2:]
	if j := regexp.MustCompile("(?m)^## ").FindStringIndex(section); j != nil {
		section = section[:j[0]]
	}
	var out []string
	for _, m := range regexp.MustCompile("(?s)```"+lang+"\n(.*?)```").FindAllStringSubmatch(section, -1) {
		out = append(out, m[1])
	}
	return out
}

// TestReadmeSDKSnippets runs the README's Node and Go programs as written, with no API key
// in the environment, against a proxy in front of the fake upstream (its address for
// localhost:8080): each must print the fake's reply, and every call must have gone through
// the proxy. The Node program runs again with /v1 left out of its base URL, as the README
// says: passed through, logged and counted as a near miss. The Python program is compiled, not run: the official Python SDK cannot be
// installed where the suite runs (no PyPI, and Debian packages none).
func TestReadmeSDKSnippets(t *testing.T) {
	snippets := map[string][]string{}
	for _, lang := range []string{"python", "js", "go"} {
		if snippets[lang] = readmeCode(t, readmeSDKSection, lang); len(snippets[lang]) != 1 {
			t.Fatalf("README.md, %q: %d %s blocks; want one", readmeSDKSection, len(snippets[lang]), lang)
		}
	}
	nodeDir := installNodeSDK(t)
	c := startCluster(t, clusterOpts{n: 1})
	local := func(src string) string {
		if !strings.Contains(src, "http://localhost:8080/v1") {
			t.Fatalf("a README snippet does not point at http://localhost:8080/v1:\n%s", src)
		}
		return strings.ReplaceAll(src, "http://localhost:8080", c.ins[0].URL)
	}
	// Whatever the machine has, the programs get no key and no base URL of their own.
	var env []string
	for _, kv := range os.Environ() {
		if !strings.HasPrefix(kv, "OPENAI_") {
			env = append(env, kv)
		}
	}
	reply := regexp.MustCompile(`^reply \d+\n$`)
	runSnippet := func(lang, dir string, name string, args ...string) {
		t.Helper()
		ctx, cancel := context.WithTimeout(context.Background(), 5*time.Minute)
		defer cancel()
		cmd := exec.CommandContext(ctx, name, args...)
		cmd.Dir, cmd.Env = dir, append(env, "GOPROXY=off", "GOFLAGS=-mod=readonly")
		var stdout, stderr bytes.Buffer
		cmd.Stdout, cmd.Stderr = &stdout, &stderr
		if err := cmd.Run(); err != nil {
			t.Errorf("the README's %s program: %v\n%s", lang, err, stderr.String())
			return
		}
		if !reply.MatchString(stdout.String()) {
			t.Errorf("the README's %s program printed %q; want the fake upstream's reply, as \"reply N\"", lang, stdout.String())
		}
	}

	if err := os.WriteFile(filepath.Join(nodeDir, "hi.mjs"), []byte(local(snippets["js"][0])), 0o644); err != nil {
		t.Fatal(err)
	}
	runSnippet("Node", nodeDir, "node", "hi.mjs")

	// The same program with the base URL's /v1 left out: passed through, still answered by
	// the fake (it answers any path), and the proxy says what happened.
	noV1 := strings.Replace(local(snippets["js"][0]), c.ins[0].URL+"/v1", c.ins[0].URL, 1)
	if err := os.WriteFile(filepath.Join(nodeDir, "hi-no-v1.mjs"), []byte(noV1), 0o644); err != nil {
		t.Fatal(err)
	}
	runSnippet("Node (base URL without /v1)", nodeDir, "node", "hi-no-v1.mjs")
	c.ins[0].waitLine(0, 5*time.Second, "a warning of the near miss", func(l string) bool {
		m := parseLog(l)
		msg, _ := m["msg"].(string)
		return m["level"] == "WARN" && strings.Contains(msg, "base URL missing /v1") && m["path"] == "/chat/completions" &&
			m["route"] == "/v1/chat/completions"
	})
	if n := c.ins[0].metric("llm_dedupe_near_miss_requests_total", map[string]string{"route": "/v1/chat/completions"}); n != 1 {
		t.Errorf("near_miss_requests_total{route=\"/v1/chat/completions\"} = %v; want 1, the program without /v1", n)
	}

	// The Go program in a module of its own that requires what the repository's does: the
	// SDK at the version the suite tests, from the module cache.
	goDir := t.TempDir()
	mod, err := os.ReadFile(filepath.Join(repoRoot, "go.mod"))
	if err != nil {
		t.Fatal(err)
	}
	mod = regexp.MustCompile(`(?m)^module .*$`).ReplaceAll(mod, []byte("module readmesnippet"))
	sum, err := os.ReadFile(filepath.Join(repoRoot, "go.sum"))
	if err != nil {
		t.Fatal(err)
	}
	for name, b := range map[string][]byte{"go.mod": mod, "go.sum": sum, "main.go": []byte(local(snippets["go"][0]))} {
		if err := os.WriteFile(filepath.Join(goDir, name), b, 0o644); err != nil {
			t.Fatal(err)
		}
	}
	runSnippet("Go", goDir, "go", "run", ".")

	if s := c.fake.stats(); s.Calls != 3 {
		t.Errorf("the fake upstream counted %+v; want 3 calls, one per program run", s)
	}
	if n := c.ins[0].metric("llm_dedupe_requests_total", map[string]string{"role": "owner"}); n != 2 {
		t.Errorf("the proxy counted %v owners; want 2, one per program with /v1 (each its own key: the Go program sends no Authorization)", n)
	}

	if _, err := exec.LookPath("python3"); err != nil {
		t.Fatal("python3 not found on PATH: it compiles the README's Python program (Debian: apt-get install python3; or run `make test`, which installs it)")
	}
	py := filepath.Join(t.TempDir(), "hi.py")
	if err := os.WriteFile(py, []byte(snippets["python"][0]), 0o644); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command("python3", "-m", "py_compile", py).CombinedOutput(); err != nil {
		t.Errorf("the README's Python program does not compile: %v\n%s", err, out)
	}
}
