package charttest

import (
	"strings"
	"testing"

	"sigs.k8s.io/yaml"
)

// setJSON sets path (dotted) in vals to the YAML value after "=", as helm's --set-json does.
func setJSON(t *testing.T, vals map[string]any, assignment string) {
	t.Helper()
	path, raw, ok := strings.Cut(assignment, "=")
	if !ok {
		t.Fatalf("bad assignment %q", assignment)
	}
	var v any
	if err := yaml.Unmarshal([]byte(raw), &v); err != nil {
		t.Fatalf("%s: %v", assignment, err)
	}
	keys := strings.Split(path, ".")
	m := vals
	for _, k := range keys[:len(keys)-1] {
		sub, ok := m[k].(map[string]any)
		if !ok {
			sub = map[string]any{}
			m[k] = sub
		}
		m = sub
	}
	m[keys[len(keys)-1]] = v
}
