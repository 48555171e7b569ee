package charttest

import (
	"fmt"
	"slices"
	"strings"
	"testing"
)

// TestTracingOnlyWithAnEndpoint: no OTEL_ variable unless tracing.otlpEndpoint is set; with
// it, the standard variables say what the values say, and the resource names the namespace.
func TestTracingOnlyWithAnEndpoint(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		got := map[string]string{}
		for _, e := range p.container.Env {
			if strings.HasPrefix(e.Name, "OTEL_") {
				if e.ValueFrom != nil {
					t.Errorf("%s from %+v; want a value", e.Name, e.ValueFrom)
				}
				got[e.Name] = e.Value
			}
		}
		tv := p.r.vals["tracing"].(map[string]any)
		if tv["otlpEndpoint"] == "" {
			if len(got) != 0 {
				t.Errorf("tracing off, yet the pod gets %v", got)
			}
			return
		}
		want := map[string]string{
			"OTEL_EXPORTER_OTLP_ENDPOINT": fmt.Sprint(tv["otlpEndpoint"]),
			"OTEL_EXPORTER_OTLP_PROTOCOL": fmt.Sprint(tv["protocol"]),
			"OTEL_SERVICE_NAME":           "llm-dedupe-proxy",
			"OTEL_RESOURCE_ATTRIBUTES":    "k8s.namespace.name=" + namespace,
		}
		if n := tv["serviceName"]; n != "" {
			want["OTEL_SERVICE_NAME"] = fmt.Sprint(n)
		}
		if s := tv["sampler"]; s != "" {
			want["OTEL_TRACES_SAMPLER"] = fmt.Sprint(s)
		}
		if a := fmt.Sprint(tv["samplerArg"]); a != "" {
			want["OTEL_TRACES_SAMPLER_ARG"] = a
		}
		attrs, _ := tv["resourceAttributes"].(map[string]any)
		for k, v := range attrs {
			want["OTEL_RESOURCE_ATTRIBUTES"] += fmt.Sprintf(",%s=%v", k, v)
		}
		// The order of the attributes aside.
		if g, w := sortedAttrs(got["OTEL_RESOURCE_ATTRIBUTES"]), sortedAttrs(want["OTEL_RESOURCE_ATTRIBUTES"]); g == w {
			got["OTEL_RESOURCE_ATTRIBUTES"] = want["OTEL_RESOURCE_ATTRIBUTES"]
		}
		if fmt.Sprint(got) != fmt.Sprint(want) {
			t.Errorf("OTEL_ variables %v; want %v", got, want)
		}
	})
}

func sortedAttrs(s string) string {
	parts := strings.Split(s, ",")
	slices.Sort(parts)
	return strings.Join(parts, ",")
}
