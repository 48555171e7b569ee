package charttest

import (
	"bytes"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"strings"
	"testing"

	monitoringv1 "github.com/prometheus-operator/prometheus-operator/pkg/apis/monitoring/v1"
	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

const dashboardFile = "deploy/grafana/dashboards/llm-dedupe-proxy.json"

// TestDashboardIsDeployGrafanas: a chart reads only files inside it, so it holds a copy of
// the dashboard; the copy, and what the ConfigMap carries, are deploy/grafana's byte for byte.
// After changing the dashboard: cp deploy/grafana/dashboards/llm-dedupe-proxy.json
// deploy/helm/llm-dedupe-proxy/dashboards/.
func TestDashboardIsDeployGrafanas(t *testing.T) {
	want, err := os.ReadFile(filepath.Join(repoRoot, dashboardFile))
	if err != nil {
		t.Fatal(err)
	}
	copyInChart, err := os.ReadFile(filepath.Join(chartDir, "dashboards", "llm-dedupe-proxy.json"))
	if err != nil {
		t.Fatal(err)
	}
	if !bytes.Equal(copyInChart, want) {
		t.Errorf("the chart's dashboards/llm-dedupe-proxy.json differs from %s; copy it again", dashboardFile)
	}
	r := renderSet(t, "everything")
	cm := must[corev1.ConfigMap](t, r, fullname+"-dashboard")
	// Helm trims the end of every manifest, so the file's final newline is not carried.
	if got := cm.Data["llm-dedupe-proxy.json"]; got != strings.TrimSuffix(string(want), "\n") {
		t.Errorf("the dashboard ConfigMap carries %d bytes that differ from %s's %d", len(got), dashboardFile, len(want))
	}
	if cm.Labels["grafana_dashboard"] != "1" {
		t.Errorf("labels %v; want grafana_dashboard: \"1\" for Grafana's sidecar", cm.Labels)
	}
}

// TestAlertsFireOnTheirCause checks the PrometheusRule with promtool: the rules parse, and in
// testdata/alerts_test.yaml each alert fires on the series that mean its cause, for this
// release's job and namespace only, and stays quiet otherwise.
func TestAlertsFireOnTheirCause(t *testing.T) {
	promtool, err := exec.LookPath("promtool")
	if err != nil {
		t.Fatal("promtool not found on PATH: install it (Debian: apt-get install prometheus; or run `make test`, which does)")
	}
	r := renderSet(t, "everything")
	rule := must[monitoringv1.PrometheusRule](t, r, fullname)
	var names []string
	for _, g := range rule.Spec.Groups {
		for _, rl := range g.Rules {
			names = append(names, rl.Alert)
			if rl.Labels["severity"] == "" || rl.Annotations["summary"] == "" || rl.Annotations["description"] == "" {
				t.Errorf("%s: wants a severity label and summary and description annotations", rl.Alert)
			}
		}
	}
	for _, want := range []string{"LLMDedupeProxyDegraded", "LLMDedupeProxyUpstreamErrors",
		"LLMDedupeProxyTakeovers", "LLMDedupeProxyLeasesLost", "LLMDedupeProxyRedisErrors", "LLMDedupeProxyNotScraped"} {
		if !slices.Contains(names, want) {
			t.Errorf("no alert %s", want)
		}
	}

	dir := t.TempDir()
	groups, err := yaml.Marshal(map[string]any{"groups": rule.Spec.Groups})
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "rules.yaml"), groups, 0o600); err != nil {
		t.Fatal(err)
	}
	tests, err := os.ReadFile(filepath.Join("testdata", "alerts_test.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	if err := os.WriteFile(filepath.Join(dir, "alerts_test.yaml"), tests, 0o600); err != nil {
		t.Fatal(err)
	}
	if out, err := exec.Command(promtool, "check", "rules", filepath.Join(dir, "rules.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool check rules: %v\n%s\n%s", err, out, groups)
	}
	if out, err := exec.Command(promtool, "test", "rules", filepath.Join(dir, "alerts_test.yaml")).CombinedOutput(); err != nil {
		t.Fatalf("promtool test rules: %v\n%s", err, out)
	}
}
