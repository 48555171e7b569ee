package hashing

import (
	"bufio"
	"bytes"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
)

// The golden files in testdata use a txtar-like format: free text (the case's description,
// and optional "scope: …" and "ignore: a,b" lines), then sections, each opening with a
// line "-- name --" and holding the rest up to the next such line.

type section struct {
	name string
	data []byte
}

type goldenFile struct {
	comment  string
	sections []section
}

func readGolden(t *testing.T, path string) goldenFile {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	var g goldenFile
	cur := -1
	for line := range bytes.Lines(b) {
		s := strings.TrimRight(string(line), "\n")
		if strings.HasPrefix(s, "-- ") && strings.HasSuffix(s, " --") && len(s) >= 6 {
			g.sections = append(g.sections, section{name: s[3 : len(s)-3]})
			cur++
			continue
		}
		if cur < 0 {
			g.comment += string(line)
		} else {
			g.sections[cur].data = append(g.sections[cur].data, line...)
		}
	}
	if len(g.sections) == 0 {
		t.Fatalf("%s: no sections", path)
	}
	return g
}

// option returns the value of a "name: value" line in the comment.
func (g goldenFile) option(name string) (string, bool) {
	for line := range strings.Lines(g.comment) {
		if v, ok := strings.CutPrefix(strings.TrimSpace(line), name+":"); ok {
			return strings.TrimSpace(v), true
		}
	}
	return "", false
}

// hasher returns the Hasher a golden file asks for: by default the proxy's default
// configuration (credential scope, "user" ignored).
func (g goldenFile) hasher(t *testing.T) *Hasher {
	t.Helper()
	o := Options{IgnoreFields: []string{"user"}}
	if s, ok := g.option("scope"); ok {
		sc, err := ParseScope(s)
		if err != nil {
			t.Fatal(err)
		}
		o.Scope = sc
	}
	if s, ok := g.option("ignore"); ok {
		o.IgnoreFields = strings.Split(s, ",")
	}
	return New(o)
}

// httpRequest is a golden request section: "METHOD PATH", header lines, a blank line, body.
type httpRequest struct {
	method, path string
	header       http.Header
	body         []byte
}

func parseRequest(t *testing.T, data []byte) httpRequest {
	t.Helper()
	r := bufio.NewReader(bytes.NewReader(data))
	line, err := r.ReadString('\n')
	if err != nil {
		t.Fatalf("request section has no request line: %q", data)
	}
	method, path, ok := strings.Cut(strings.TrimSpace(line), " ")
	if !ok {
		t.Fatalf("bad request line %q", line)
	}
	req := httpRequest{method: method, path: path, header: http.Header{}}
	for {
		line, err := r.ReadString('\n')
		if err != nil {
			t.Fatalf("request section has no blank line before the body: %q", data)
		}
		line = strings.TrimRight(line, "\r\n")
		if line == "" {
			break
		}
		name, value, ok := strings.Cut(line, ":")
		if !ok {
			t.Fatalf("bad header line %q", line)
		}
		req.header.Add(name, strings.TrimSpace(value))
	}
	var body bytes.Buffer
	body.ReadFrom(r)
	req.body = body.Bytes()
	return req
}

func goldenFiles(t *testing.T, dir string) []string {
	t.Helper()
	files, err := filepath.Glob(filepath.Join("testdata", dir, "*.txt"))
	if err != nil || len(files) == 0 {
		t.Fatalf("no golden files in testdata/%s (%v)", dir, err)
	}
	return files
}
