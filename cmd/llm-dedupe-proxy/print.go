package main

import (
	"fmt"
	"io"
	"strings"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// formatValue writes a value as a user would: durations in their shortest Go syntax.
func formatValue(x any) string {
	switch x := x.(type) {
	case time.Duration:
		return formatDuration(x)
	case string:
		return fmt.Sprintf("%q", x)
	case []string:
		if len(x) == 0 {
			return "[]"
		}
		return strings.Join(x, ",")
	}
	return fmt.Sprint(x)
}

// formatDuration is time.Duration.String without the zero tails: 10m, not 10m0s.
func formatDuration(d time.Duration) string {
	s := d.String()
	if strings.HasSuffix(s, "m0s") {
		s = s[:len(s)-2]
	}
	if strings.HasSuffix(s, "h0m") {
		s = s[:len(s)-2]
	}
	return s
}

// printConfig writes cfg as YAML in the layout of config.example.yaml, with every secret that
// is set replaced by "<redacted>".
func printConfig(w io.Writer, cfg Config) error {
	root := &yaml.Node{Kind: yaml.MappingNode}
	sections := map[string]*yaml.Node{}
	for _, s := range settings(&cfg) {
		parent, name := root, s.key
		if section, rest, ok := strings.Cut(s.key, "."); ok {
			if sections[section] == nil {
				sections[section] = &yaml.Node{Kind: yaml.MappingNode}
				root.Content = append(root.Content, scalar(section), sections[section])
			}
			parent, name = sections[section], rest
		}
		x := s.field.Interface()
		if d, ok := x.(time.Duration); ok {
			x = formatDuration(d)
		}
		if s.secret && x != "" {
			x = "<redacted>"
		}
		if s.key == "upstream.base_url" {
			x = proxy.RedactURL(x.(string))
		}
		val := &yaml.Node{}
		if err := val.Encode(x); err != nil {
			return err
		}
		parent.Content = append(parent.Content, scalar(name), val)
	}
	enc := yaml.NewEncoder(w)
	enc.SetIndent(2)
	if err := enc.Encode(root); err != nil {
		return err
	}
	return enc.Close()
}

func scalar(s string) *yaml.Node { return &yaml.Node{Kind: yaml.ScalarNode, Value: s} }
