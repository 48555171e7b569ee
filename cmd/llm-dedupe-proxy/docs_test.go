package main

import (
	"os"
	"regexp"
	"slices"
	"strings"
	"testing"

	"go.yaml.in/yaml/v3"
)

// The example configuration and the README's table repeat the keys and defaults of
// defaultConfig; these tests keep them from drifting apart.

const exampleConfig = "../../config.example.yaml"

// keyPaths returns the dotted paths of the leaves of a YAML mapping.
func keyPaths(prefix string, m map[string]any) []string {
	var out []string
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			out = append(out, keyPaths(prefix+k+".", sub)...)
			continue
		}
		out = append(out, prefix+k)
	}
	return out
}

func defaultKeys() []string {
	def := defaultConfig()
	var keys []string
	for _, s := range settings(&def) {
		keys = append(keys, s.key)
	}
	return keys
}

func TestExampleConfigHasEveryKey(t *testing.T) {
	b, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatal(err)
	}
	got, want := keyPaths("", m), defaultKeys()
	for _, k := range want {
		if !slices.Contains(got, k) {
			t.Errorf("config.example.yaml lacks %s", k)
		}
	}
	for _, k := range got {
		if !slices.Contains(want, k) {
			t.Errorf("config.example.yaml has %s, which is not a key", k)
		}
	}
}

func TestExampleConfigHasTheDefaults(t *testing.T) {
	fromFile := runCmd(t, nil, "", "serve", "--print-config", "--config", exampleConfig)
	defaults := runCmd(t, nil, "", "serve", "--print-config")
	if fromFile.code != 0 || fromFile.stdout != defaults.stdout {
		t.Errorf("config.example.yaml (status %d, %s) gives\n%s\nwant the defaults\n%s",
			fromFile.code, fromFile.stderr, fromFile.stdout, defaults.stdout)
	}
}

// exampleLine matches a line of config.example.yaml that sets a key: its indent, name,
// value as written and comment.
var exampleLine = regexp.MustCompile(`^( *)([a-z_]+):( *[^#]*?) *# (.*)$`)

// TestExampleConfigSaysWhatHelpSays: each key's comment in config.example.yaml is its line
// of help, and each value is written as --print-config and the help print it (10m, not
// 600s; 1m, not 60s).
func TestExampleConfigSaysWhatHelpSays(t *testing.T) {
	b, err := os.ReadFile(exampleConfig)
	if err != nil {
		t.Fatal(err)
	}
	comments, values := map[string]string{}, map[string]string{}
	section := ""
	for _, line := range strings.Split(string(b), "\n") {
		if m := regexp.MustCompile(`^([a-z_]+):\s*$`).FindStringSubmatch(line); m != nil {
			section = m[1]
			continue
		}
		m := exampleLine.FindStringSubmatch(line)
		if m == nil {
			continue
		}
		key := m[2]
		if m[1] != "" {
			key = section + "." + key
		}
		comments[key], values[key] = m[4], strings.TrimSpace(m[3])
	}
	def := defaultConfig()
	for _, s := range settings(&def) {
		if comments[s.key] != s.help {
			t.Errorf("config.example.yaml says of %s\n\t%q\nwhile its help says\n\t%q", s.key, comments[s.key], s.help)
		}
		want := formatValue(s.field.Interface())
		switch s.field.Interface().(type) {
		case []string:
			continue // a YAML list; TestExampleConfigHasTheDefaults compares the values
		case string:
			if !strings.HasPrefix(values[s.key], `"`) {
				want = strings.Trim(want, `"`)
			}
		}
		if values[s.key] != want {
			t.Errorf("config.example.yaml writes %s: %s; --print-config and the help write %s", s.key, values[s.key], want)
		}
	}
}

// TestReadmeDefaultsAsPrinted: the README's table gives each default as the help and
// --print-config print it.
func TestReadmeDefaultsAsPrinted(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	def := defaultConfig()
	for _, s := range settings(&def) {
		m := regexp.MustCompile("(?m)^\\| `" + regexp.QuoteMeta(s.key) + "` \\| `[A-Z_]+` \\| ([^|]+) \\|").FindSubmatch(b)
		if m == nil {
			continue // TestReadmeDocumentsEveryKey reports it
		}
		want := "`" + strings.Trim(formatValue(s.field.Interface()), `"`) + "`"
		switch x := s.field.Interface().(type) {
		case string:
			if x == "" {
				want = "empty"
			}
		case []string:
			if len(x) == 0 {
				want = "empty"
			}
		}
		if got := string(m[1]); got != want {
			t.Errorf("README.md gives the default of %s as %s; want %s, as it is printed", s.key, got, want)
		}
	}
}

func TestReadmeDocumentsEveryKey(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	readme := string(b)
	def := defaultConfig()
	for _, s := range settings(&def) {
		row := "| `" + s.key + "` | `" + s.env() + "` |"
		if !strings.Contains(readme, row) {
			t.Errorf("README.md has no table row starting %s", row)
		}
	}
}

// TestReadmeKeyExample runs the key example of the README and checks its output is shown.
func TestReadmeKeyExample(t *testing.T) {
	b, err := os.ReadFile("../../README.md")
	if err != nil {
		t.Fatal(err)
	}
	m := regexp.MustCompile(`\$ echo '(.+)' \\\n\s+\| go run ./cmd/llm-dedupe-proxy key --authorization "(.+)"\n((?:.+\n){2})`).FindSubmatch(b)
	if m == nil {
		t.Fatal("README.md has no key example in the expected form")
	}
	r := runCmd(t, nil, string(m[1])+"\n", "key", "--authorization", string(m[2]))
	if r.code != 0 || r.stdout != string(m[3]) {
		t.Errorf("the README's key example prints\n%s(status %d, %s)\nwhile the README shows\n%s", r.stdout, r.code, r.stderr, m[3])
	}
}
