package charttest

import (
	"bytes"
	"encoding/json"
	"os"
	"os/exec"
	"path/filepath"
	"slices"
	"sort"
	"strings"
	"sync"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
	"sigs.k8s.io/yaml"
)

var (
	proxyOnce sync.Once
	proxyBin  string
	proxyErr  error
	proxyDir  string
)

// proxyBinary builds the proxy from this repository once per test run.
func proxyBinary(t *testing.T) string {
	t.Helper()
	proxyOnce.Do(func() {
		proxyDir, proxyErr = os.MkdirTemp("", "charttest-proxy-")
		if proxyErr != nil {
			return
		}
		proxyBin = filepath.Join(proxyDir, "llm-dedupe-proxy")
		cmd := exec.Command("go", "build", "-o", proxyBin, "./cmd/llm-dedupe-proxy")
		cmd.Dir = repoRoot
		if out, err := cmd.CombinedOutput(); err != nil {
			proxyErr = &buildError{err: err, out: string(out)}
		}
	})
	if proxyErr != nil {
		t.Fatalf("building the proxy: %v", proxyErr)
	}
	return proxyBin
}

type buildError struct {
	err error
	out string
}

func (e *buildError) Error() string { return e.err.Error() + "\n" + e.out }

func TestMain(m *testing.M) {
	code := m.Run()
	if proxyDir != "" {
		os.RemoveAll(proxyDir)
	}
	os.Exit(code)
}

// placeholderSecret stands for a value of a Secret made outside the chart.
const placeholderSecret = "placeholder-secret-0123456789"

// podEnv is the environment the proxy's container gets: values from the chart's Secret, or a
// placeholder for a Secret made outside the chart.
func podEnv(t *testing.T, p *proxyParts) []string {
	t.Helper()
	secret := find[corev1.Secret](p.r, fullname)
	var env []string
	for _, e := range p.container.Env {
		switch {
		case e.ValueFrom == nil:
			env = append(env, e.Name+"="+e.Value)
		case e.ValueFrom.SecretKeyRef != nil && secret != nil:
			v, ok := secret.Data[e.ValueFrom.SecretKeyRef.Key]
			if !ok && (e.ValueFrom.SecretKeyRef.Optional == nil || !*e.ValueFrom.SecretKeyRef.Optional) {
				t.Errorf("%s: the Secret has no key %s", e.Name, e.ValueFrom.SecretKeyRef.Key)
			}
			env = append(env, e.Name+"="+string(v))
		case e.ValueFrom.SecretKeyRef != nil:
			env = append(env, e.Name+"="+placeholderSecret)
		default:
			t.Fatalf("%s: unexpected source %+v", e.Name, e.ValueFrom)
		}
	}
	return env
}

// checkConfig runs the proxy's own configuration check, `serve --print-config`, on the
// rendered config.yaml with the pod's environment, as the pod would start.
func checkConfig(t *testing.T, p *proxyParts) (printed map[string]any, stderr string, ok bool) {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(p.cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	cmd := exec.Command(proxyBinary(t), "serve", "--print-config", "--config", file)
	cmd.Env = podEnv(t, p)
	var out, errb bytes.Buffer
	cmd.Stdout, cmd.Stderr = &out, &errb
	if err := cmd.Run(); err != nil {
		return nil, errb.String(), false
	}
	if err := yaml.Unmarshal(out.Bytes(), &printed); err != nil {
		t.Fatalf("--print-config: %v\n%s", err, out.String())
	}
	return printed, errb.String(), true
}

func lookup(m map[string]any, key string) any {
	var x any = m
	for _, k := range strings.Split(key, ".") {
		mm, _ := x.(map[string]any)
		x = mm[k]
	}
	return x
}

// TestRenderedConfigPassesTheProxysCheck: the proxy accepts the configuration the chart
// renders, with the secrets the pod gets, and reads from it what the chart meant.
func TestRenderedConfigPassesTheProxysCheck(t *testing.T) {
	forEachSet(t, func(t *testing.T, p *proxyParts) {
		printed, stderr, ok := checkConfig(t, p)
		if !ok {
			t.Fatalf("the proxy refuses the rendered configuration:\n%s\n%s", stderr, p.cfgText)
		}
		for key, want := range map[string]any{
			"listen":            p.cfg.Listen,
			"admin.listen":      p.cfg.Admin.Listen,
			"shutdown_delay":    p.cfg.ShutdownDelay,
			"shutdown_timeout":  p.cfg.ShutdownTimeout,
			"redis.master_name": p.cfg.Redis.MasterName,
		} {
			if got := lookup(printed, key); !sameDuration(got, want) {
				t.Errorf("the proxy reads %s = %v; the chart rendered %v", key, got, want)
			}
		}
		gotAddrs, _ := json.Marshal(lookup(printed, "redis.addrs"))
		wantAddrs, _ := json.Marshal(p.cfg.Redis.Addrs)
		if !bytes.Equal(gotAddrs, wantAddrs) {
			t.Errorf("the proxy reads redis.addrs %s; the chart rendered %s", gotAddrs, wantAddrs)
		}
		// A secret the pod gets is one the proxy reads (and redacts when printing).
		for _, e := range podEnv(t, p) {
			name, val, _ := strings.Cut(e, "=")
			key := map[string]string{
				"LLM_DEDUPE_UPSTREAM_API_KEY": "upstream.api_key",
				"LLM_DEDUPE_REDIS_PASSWORD":   "redis.password",
				"LLM_DEDUPE_ADMIN_TOKEN":      "admin.token",
			}[name]
			if key != "" && val != "" && lookup(printed, key) != "<redacted>" {
				t.Errorf("%s is set but the proxy reads %s = %v", name, key, lookup(printed, key))
			}
		}
	})
}

// sameDuration compares what --print-config prints with what the chart rendered: durations
// in their shortest form (120s is printed 2m).
func sameDuration(got, want any) bool {
	if got == want {
		return true
	}
	g, gok := got.(string)
	w, wok := want.(string)
	if !gok || !wok {
		return false
	}
	gd, gerr := time.ParseDuration(g)
	wd, werr := time.ParseDuration(w)
	return gerr == nil && werr == nil && gd == wd
}

// TestProxysCheckCatchesWhatTheSchemaCannot: a rule between two keys, which the schema does
// not state, passes the install but is refused by the proxy's check, which the test runs.
func TestProxysCheckCatchesWhatTheSchemaCannot(t *testing.T) {
	vals := readValues(t, "defaults")
	vals["config"] = map[string]any{"flight": map[string]any{"heartbeat_interval": "1s", "lease_ttl": "1s"}}
	p := proxyOf(t, newRelease(t, "lease", vals))
	if _, stderr, ok := checkConfig(t, p); ok || !strings.Contains(stderr, "flight.lease_ttl") {
		t.Errorf("the proxy's check passed a lease_ttl below 2 × heartbeat_interval (stderr %q)", stderr)
	}
}

// chartOwnedKeys are the configuration keys the chart sets from its own values and refuses in
// .Values.config.
var chartOwnedKeys = []string{
	"listen",
	"upstream.api_key",
	"redis.addrs", "redis.master_name", "redis.username", "redis.password", "redis.db",
	"redis.tls", "redis.tls_ca_file",
	"admin.listen", "admin.token",
	"shutdown_delay", "shutdown_timeout",
}

// TestSchemaCoversEveryConfigKey: every key of config.example.yaml is either in the schema of
// .Values.config or set by the chart, so a key the proxy gains cannot be left out unnoticed.
func TestSchemaCoversEveryConfigKey(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, "config.example.yaml"))
	if err != nil {
		t.Fatal(err)
	}
	var example map[string]any
	if err := yaml.Unmarshal(raw, &example); err != nil {
		t.Fatal(err)
	}
	want := leafKeys("", example)

	raw, err = os.ReadFile(filepath.Join(chartDir, "values.schema.json"))
	if err != nil {
		t.Fatal(err)
	}
	var schema struct {
		Properties map[string]json.RawMessage `json:"properties"`
	}
	if err := json.Unmarshal(raw, &schema); err != nil {
		t.Fatal(err)
	}
	var config schemaNode
	if err := json.Unmarshal(schema.Properties["config"], &config); err != nil {
		t.Fatal(err)
	}
	got := append(config.leaves(""), chartOwnedKeys...)
	sort.Strings(got)
	for _, k := range want {
		if !slices.Contains(got, k) {
			t.Errorf("config.example.yaml has %s; the chart neither sets it nor admits it in config", k)
		}
	}
	for _, k := range got {
		if !slices.Contains(want, k) {
			t.Errorf("the chart knows %s, which config.example.yaml does not have", k)
		}
	}
	if config.AdditionalProperties == nil || *config.AdditionalProperties {
		t.Error("the schema of config admits keys it does not list")
	}
}

type schemaNode struct {
	Type                 any                    `json:"type"`
	AdditionalProperties *bool                  `json:"additionalProperties"`
	Properties           map[string]*schemaNode `json:"properties"`
}

func (n *schemaNode) leaves(prefix string) []string {
	var out []string
	for k, sub := range n.Properties {
		if sub.Type == "object" && sub.Properties != nil {
			if sub.AdditionalProperties == nil || *sub.AdditionalProperties {
				out = append(out, prefix+k+".*")
			}
			out = append(out, sub.leaves(prefix+k+".")...)
			continue
		}
		out = append(out, prefix+k)
	}
	return out
}

func leafKeys(prefix string, m map[string]any) []string {
	var out []string
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			out = append(out, leafKeys(prefix+k+".", sub)...)
			continue
		}
		out = append(out, prefix+k)
	}
	sort.Strings(out)
	return out
}
