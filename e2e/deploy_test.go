package e2e

import (
	"bufio"
	"encoding/json"
	"fmt"
	"net/url"
	"os"
	"os/exec"
	"path/filepath"
	"regexp"
	"slices"
	"sort"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// There is no container engine where the suite runs: these tests check what can be checked
// without one — the files parse, refer to each other and to files that exist, the proxies'
// settings are valid, promtool accepts the Prometheus configuration, and the image's
// HEALTHCHECK command works. TestPrometheus evaluates the dashboard's queries.

// composeFile is the part of docker-compose.yml the tests read.
type composeFile struct {
	Services map[string]composeService `yaml:"services"`
	Volumes  map[string]any            `yaml:"volumes"`
}

type composeService struct {
	Image       string            `yaml:"image"`
	PullPolicy  string            `yaml:"pull_policy"`
	Build       map[string]any    `yaml:"build"`
	Command     []string          `yaml:"command"`
	Environment map[string]string `yaml:"environment"`
	Ports       []string          `yaml:"ports"`
	Volumes     []string          `yaml:"volumes"`
	ExtraHosts  []string          `yaml:"extra_hosts"`
	DependsOn   any               `yaml:"depends_on"`
}

func readCompose(t *testing.T) composeFile {
	t.Helper()
	raw, err := os.ReadFile(filepath.Join(repoRoot, "docker-compose.yml"))
	if err != nil {
		t.Fatal(err)
	}
	var c composeFile
	if err := yaml.Unmarshal(raw, &c); err != nil {
		t.Fatalf("docker-compose.yml: %v", err)
	}
	return c
}

// interpolate applies Compose's ${NAME:-default} with the defaults only, so that the test
// does not depend on the environment it runs in.
func interpolate(s string) string {
	return regexp.MustCompile(`\$\{([A-Za-z_][A-Za-z0-9_]*)(?::?-([^}]*))?\}`).ReplaceAllString(s, "$2")
}

// mount is one volume entry: a host path (bind mount, relative to the repository) or a
// named volume, and where it goes in the container.
type mount struct{ source, target string }

func mounts(s composeService) []mount {
	var out []mount
	for _, v := range s.Volumes {
		parts := strings.Split(v, ":")
		out = append(out, mount{parts[0], parts[1]})
	}
	return out
}

// hostFile is the repository file a container path is mounted from, or "".
func hostFile(s composeService, containerPath string) string {
	for _, m := range mounts(s) {
		if !strings.HasPrefix(m.source, ".") {
			continue
		}
		if rest, ok := strings.CutPrefix(containerPath, m.target); ok && (rest == "" || rest[0] == '/') {
			return filepath.Join(repoRoot, m.source, rest)
		}
	}
	return ""
}

// publishedPort is one entry of a service's ports, with Compose's defaults applied:
// the host address it is published on, the host port and the container's.
type publishedPort struct{ addr, host, container string }

func parsePort(t *testing.T, service, p string) publishedPort {
	t.Helper()
	parts := strings.Split(interpolate(p), ":")
	if len(parts) != 3 {
		t.Fatalf("%s: port %q; want ADDR:HOST:CONTAINER, an address given", service, p)
	}
	return publishedPort{parts[0], parts[1], parts[2]}
}

func TestComposeFile(t *testing.T) {
	c := readCompose(t)
	for _, name := range []string{"redis", "proxy-a", "proxy-b", "fake-upstream", "jaeger", "prometheus", "grafana"} {
		if _, ok := c.Services[name]; !ok {
			t.Fatalf("docker-compose.yml: no service %q", name)
		}
	}
	// Every bind mount's file exists; every named volume is declared.
	for name, s := range c.Services {
		for _, m := range mounts(s) {
			if strings.HasPrefix(m.source, ".") || strings.HasPrefix(m.source, "/") {
				if !fileExists(filepath.Join(repoRoot, m.source)) {
					t.Errorf("service %s mounts %s, which does not exist", name, m.source)
				}
			} else if _, ok := c.Volumes[m.source]; !ok {
				t.Errorf("service %s mounts volume %q, not declared under volumes", name, m.source)
			}
		}
	}
	// No service authenticates its clients: every port is published on loopback unless
	// PUBLISH_ADDR says otherwise.
	for name, s := range c.Services {
		for _, p := range s.Ports {
			if pp := parsePort(t, name, p); pp.addr != "127.0.0.1" || !strings.Contains(p, "${PUBLISH_ADDR:-127.0.0.1}:") {
				t.Errorf("%s: port %q is published on %q; want ${PUBLISH_ADDR:-127.0.0.1}", name, p, pp.addr)
			}
		}
	}

	// The binary's image is built once, by proxy-a; the other services that run it never
	// try to pull it, and so never build it a second time.
	image := c.Services["proxy-a"].Image
	var builders []string
	for name, s := range c.Services {
		if s.Build != nil {
			builders = append(builders, name)
		}
	}
	if !slices.Equal(builders, []string{"proxy-a"}) {
		t.Errorf("services with build: %v; want proxy-a alone", builders)
	}
	if ctx, _ := c.Services["proxy-a"].Build["context"].(string); !fileExists(filepath.Join(repoRoot, ctx, "Dockerfile")) {
		t.Errorf("proxy-a: build context %q has no Dockerfile", ctx)
	}
	for _, name := range []string{"proxy-a", "proxy-b", "fake-upstream"} {
		if s := c.Services[name]; s.Image != image || s.PullPolicy != "never" {
			t.Errorf("%s: image %q, pull_policy %q; want proxy-a's image %q, never pulled", name, s.Image, s.PullPolicy, image)
		}
	}

	// Two proxy instances on different host ports, sharing Redis, calling the fake upstream
	// unless told otherwise, and able to reach the host.
	hostPorts := map[string]bool{}
	for _, name := range []string{"proxy-a", "proxy-b"} {
		s := c.Services[name]
		if len(s.Ports) != 1 || parsePort(t, name, s.Ports[0]).container != "8080" {
			t.Errorf("%s: ports %v; want one host port mapped to the container's 8080", name, s.Ports)
		} else {
			hostPorts[parsePort(t, name, s.Ports[0]).host] = true
		}
		if s.Environment["LLM_DEDUPE_REDIS_ADDRS"] != "redis:6379" {
			t.Errorf("%s: LLM_DEDUPE_REDIS_ADDRS %q; want the redis service, redis:6379", name, s.Environment["LLM_DEDUPE_REDIS_ADDRS"])
		}
		if u := interpolate(s.Environment["LLM_DEDUPE_UPSTREAM_BASE_URL"]); u != "http://fake-upstream:9000" {
			t.Errorf("%s: upstream %q by default; want the fake-upstream service, http://fake-upstream:9000", name, u)
		}
		if !slices.Contains(s.ExtraHosts, "host.docker.internal:host-gateway") {
			t.Errorf("%s: extra_hosts %v; want host.docker.internal:host-gateway (the host, on Linux too)", name, s.ExtraHosts)
		}
		checkProxyEnv(t, name, s.Environment)
		checkTraceExport(t, name, s.Environment)
	}
	if !hostPorts["8080"] || !hostPorts["8081"] {
		t.Errorf("proxy host ports %v; want 8080 and 8081", hostPorts)
	}
	checkComposeFake(t, c.Services["fake-upstream"])

	// Jaeger v2, its UI on the host.
	js := c.Services["jaeger"]
	if !strings.HasPrefix(js.Image, "jaegertracing/jaeger:2.") {
		t.Errorf("jaeger image %q; want jaegertracing/jaeger:2.x (v2: OTLP in, all in one)", js.Image)
	}
	if len(js.Ports) != 1 || parsePort(t, "jaeger", js.Ports[0]) != (publishedPort{"127.0.0.1", "16686", "16686"}) {
		t.Errorf("jaeger ports %v; want the UI's, 127.0.0.1:16686:16686", js.Ports)
	}

	// Prometheus reads the mounted deploy/prometheus/prometheus.yml and scrapes both proxies.
	ps := c.Services["prometheus"]
	var cfgFile string
	for _, a := range ps.Command {
		if v, ok := strings.CutPrefix(a, "--config.file="); ok {
			cfgFile = hostFile(ps, v)
		}
	}
	if cfgFile != filepath.Join(repoRoot, promConfigPath) {
		t.Errorf("prometheus reads %q from the host; want %s", cfgFile, promConfigPath)
	}
	if got, want := scrapeTargets(t), []string{"proxy-a:8080", "proxy-b:8080"}; !slices.Equal(got, want) {
		t.Errorf("%s scrapes %v; want %v", promConfigPath, got, want)
	}

	// Grafana gets the datasource and the dashboard provisioned.
	gs := c.Services["grafana"]
	ds := readYAML(t, hostFile(gs, "/etc/grafana/provisioning/datasources/prometheus.yml"))
	dsList, _ := ds["datasources"].([]any)
	if len(dsList) != 1 {
		t.Fatalf("grafana datasources %v; want one", ds["datasources"])
	}
	d := dsList[0].(map[string]any)
	if u, err := url.Parse(fmt.Sprint(d["url"])); err != nil || u.Host != "prometheus:9090" || d["uid"] != "prometheus" {
		t.Errorf("grafana datasource url %v uid %v; want http://prometheus:9090 and uid prometheus", d["url"], d["uid"])
	}
	prov := readYAML(t, hostFile(gs, "/etc/grafana/provisioning/dashboards/llm-dedupe-proxy.yml"))
	providers, _ := prov["providers"].([]any)
	if len(providers) != 1 {
		t.Fatalf("grafana dashboard providers %v; want one", prov["providers"])
	}
	path := providers[0].(map[string]any)["options"].(map[string]any)["path"].(string)
	if f := hostFile(gs, path+"/llm-dedupe-proxy.json"); f != filepath.Join(repoRoot, dashboardPath) {
		t.Errorf("grafana provider path %s holds %q; want %s", path, f, dashboardPath)
	}
	if f := hostFile(gs, gs.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"]); f != filepath.Join(repoRoot, dashboardPath) {
		t.Errorf("grafana home dashboard %q; want %s", gs.Environment["GF_DASHBOARDS_DEFAULT_HOME_DASHBOARD_PATH"], dashboardPath)
	}
}

// checkComposeFake runs the fake-upstream service's command as the image would (its
// listen address moved to a free loopback port): it must listen on every interface of
// the container on 9000, the port the proxies call and the host's is mapped to, and the
// image's HEALTHCHECK, reading the service's LLM_DEDUPE_LISTEN, must find it healthy.
func checkComposeFake(t *testing.T, s composeService) {
	t.Helper()
	if len(s.Command) == 0 || s.Command[0] != "fake-upstream" || !slices.Contains(s.Command, "--listen=0.0.0.0:9000") {
		t.Fatalf("fake-upstream: command %v; want fake-upstream --listen=0.0.0.0:9000", s.Command)
	}
	if len(s.Ports) != 1 || parsePort(t, "fake-upstream", s.Ports[0]) != (publishedPort{"127.0.0.1", "9000", "9000"}) {
		t.Errorf("fake-upstream: ports %v; want 127.0.0.1:9000:9000", s.Ports)
	}
	if l := s.Environment["LLM_DEDUPE_LISTEN"]; l != ":9000" {
		t.Errorf("fake-upstream: LLM_DEDUPE_LISTEN %q; want :9000, where the image's HEALTHCHECK asks", l)
	}
	addr := redistest.FreeAddr(t)
	p := startProc(t, "compose fake-upstream", proxyBin, nil, append(s.Command, "--listen="+addr)...)
	p.waitLine(0, 15*time.Second, "the fake upstream's first line", func(l string) bool { return strings.HasPrefix(l, "fake upstream on") })
	_, port, _ := strings.Cut(addr, ":")
	hc := exec.Command(proxyBin, "healthcheck")
	hc.Env = []string{"LLM_DEDUPE_LISTEN=" + strings.Replace(s.Environment["LLM_DEDUPE_LISTEN"], "9000", port, 1)}
	if out, err := hc.CombinedOutput(); err != nil {
		t.Errorf("the image's HEALTHCHECK against the fake upstream: %v %s; want healthy", err, out)
	}
}

// checkProxyEnv runs `serve --print-config` with a compose service's environment: every
// LLM_DEDUPE_ variable must name a configuration key, the whole must be valid, and the
// printed values must be the ones set.
func checkProxyEnv(t *testing.T, name string, env map[string]string) {
	t.Helper()
	var vars []string
	for k, v := range env {
		vars = append(vars, k+"="+interpolate(v))
	}
	out, err := exec.Command(proxyBin, "serve", "--print-config").Output()
	if err != nil {
		t.Fatalf("print-config: %v", err)
	}
	keys := map[string]bool{}
	flatten("", yamlMap(t, out), keys)
	cmd := exec.Command(proxyBin, "serve", "--print-config")
	cmd.Env = vars
	got, err := cmd.CombinedOutput()
	if err != nil {
		t.Errorf("%s: serve --print-config with its environment: %v\n%s", name, err, got)
		return
	}
	printed := map[string]bool{}
	flattenValues("", yamlMap(t, got), printed)
	for k, v := range env {
		if !strings.HasPrefix(k, "LLM_DEDUPE_") {
			continue
		}
		key := ""
		for path := range keys {
			if "LLM_DEDUPE_"+strings.ToUpper(strings.ReplaceAll(path, ".", "_")) == k {
				key = path
			}
		}
		if key == "" {
			t.Errorf("%s: %s is not a configuration key", name, k)
			continue
		}
		if !printed[key+"="+interpolate(v)] {
			t.Errorf("%s: %s=%s did not set %s (print-config:\n%s)", name, k, interpolate(v), key, got)
		}
	}
}

// checkTraceExport checks that a proxy's environment sends its traces to the jaeger service,
// on the port of the OTLP protocol it names (Jaeger's defaults: 4318 HTTP, 4317 gRPC), under
// a service name of its own.
func checkTraceExport(t *testing.T, name string, env map[string]string) {
	t.Helper()
	endpoint := interpolate(env["OTEL_EXPORTER_OTLP_ENDPOINT"])
	port := map[string]string{"": "4318", "http/protobuf": "4318", "grpc": "4317"}[interpolate(env["OTEL_EXPORTER_OTLP_PROTOCOL"])]
	if u, err := url.Parse(endpoint); err != nil || u.Scheme != "http" || u.Host != "jaeger:"+port {
		t.Errorf("%s: OTEL_EXPORTER_OTLP_ENDPOINT %q (protocol %q); want http://jaeger:%s, the jaeger service", name, endpoint, env["OTEL_EXPORTER_OTLP_PROTOCOL"], port)
	}
	if interpolate(env["OTEL_SERVICE_NAME"]) == "" {
		t.Errorf("%s: no OTEL_SERVICE_NAME", name)
	}
}

func yamlMap(t *testing.T, b []byte) map[string]any {
	t.Helper()
	var m map[string]any
	if err := yaml.Unmarshal(b, &m); err != nil {
		t.Fatalf("%v in %s", err, b)
	}
	return m
}

func readYAML(t *testing.T, path string) map[string]any {
	t.Helper()
	b, err := os.ReadFile(path)
	if err != nil {
		t.Fatal(err)
	}
	return yamlMap(t, b)
}

// flatten collects the dotted paths of a mapping's leaves.
func flatten(prefix string, m map[string]any, out map[string]bool) {
	for k, v := range m {
		if sub, ok := v.(map[string]any); ok {
			flatten(prefix+k+".", sub, out)
			continue
		}
		out[prefix+k] = true
	}
}

// flattenValues collects "path=value" of a mapping's leaves; a list is comma-joined.
func flattenValues(prefix string, m map[string]any, out map[string]bool) {
	for k, v := range m {
		switch x := v.(type) {
		case map[string]any:
			flattenValues(prefix+k+".", x, out)
		case []any:
			var s []string
			for _, e := range x {
				s = append(s, fmt.Sprint(e))
			}
			out[prefix+k+"="+strings.Join(s, ",")] = true
		default:
			out[prefix+k+"="+fmt.Sprint(v)] = true
		}
	}
}

// scrapeTargets lists the targets of the proxies' job in deploy/prometheus/prometheus.yml.
func scrapeTargets(t *testing.T) []string {
	t.Helper()
	cfg := readYAML(t, filepath.Join(repoRoot, promConfigPath))
	var out []string
	for _, sc := range cfg["scrape_configs"].([]any) {
		sc := sc.(map[string]any)
		if sc["job_name"] != promJob {
			continue
		}
		for _, st := range sc["static_configs"].([]any) {
			for _, tg := range st.(map[string]any)["targets"].([]any) {
				out = append(out, tg.(string))
			}
		}
	}
	sort.Strings(out)
	return out
}

// TestPromtoolCheckConfig: promtool (Debian's prometheus package) accepts the configuration.
func TestPromtoolCheckConfig(t *testing.T) {
	if _, err := exec.LookPath("promtool"); err != nil {
		t.Fatalf("promtool not found on PATH: install it (Debian: apt-get install prometheus; or run `make test`, which does)")
	}
	out, err := exec.Command("promtool", "check", "config", filepath.Join(repoRoot, promConfigPath)).CombinedOutput()
	if err != nil {
		t.Fatalf("promtool check config %s: %v\n%s", promConfigPath, err, out)
	}
}

// TestDashboardFile: the dashboard parses, takes its datasource from a variable (so that it
// imports into any Grafana with a Prometheus datasource, no uid to edit; docker compose's
// provisioned one is the default) and has a panel for each thing an operator watches.
func TestDashboardFile(t *testing.T) {
	raw, err := os.ReadFile(filepath.Join(repoRoot, dashboardPath))
	if err != nil {
		t.Fatal(err)
	}
	type datasource struct {
		Type string `json:"type"`
		UID  string `json:"uid"`
	}
	var d struct {
		UID        string `json:"uid"`
		Title      string `json:"title"`
		Templating struct {
			List []struct {
				Name, Type, Query string
			} `json:"list"`
		} `json:"templating"`
		Panels []struct {
			Title      string     `json:"title"`
			Datasource datasource `json:"datasource"`
			Targets    []struct {
				Datasource datasource `json:"datasource"`
			} `json:"targets"`
		} `json:"panels"`
	}
	if err := json.Unmarshal(raw, &d); err != nil {
		t.Fatalf("%s: %v", dashboardPath, err)
	}
	if d.UID == "" || d.Title == "" || len(d.Panels) == 0 {
		t.Fatalf("dashboard uid %q title %q with %d panels; want all three", d.UID, d.Title, len(d.Panels))
	}
	vars := 0
	for _, v := range d.Templating.List {
		if v.Name == "datasource" && v.Type == "datasource" && v.Query == "prometheus" {
			vars++
		}
	}
	if vars != 1 {
		t.Errorf("dashboard variables %+v; want one named datasource, of type datasource, query prometheus", d.Templating.List)
	}
	want := datasource{Type: "prometheus", UID: "${datasource}"}
	for _, p := range d.Panels {
		if p.Datasource != want {
			t.Errorf("panel %q datasource %+v; want %+v", p.Title, p.Datasource, want)
		}
		for _, tg := range p.Targets {
			if tg.Datasource != want {
				t.Errorf("a query of panel %q has datasource %+v; want %+v", p.Title, tg.Datasource, want)
			}
		}
	}
	all := ""
	for _, e := range dashboardExprs(t) {
		all += e.expr + "\n"
	}
	for what, metric := range map[string]string{
		"dedupe ratio":   "llm_dedupe_saved_upstream_requests_total",
		"saved tokens":   "llm_dedupe_saved_tokens_total",
		"upstream calls": "llm_dedupe_upstream_requests_total",
		"follower wait":  "llm_dedupe_follower_wait_seconds_bucket",
		"takeovers":      "llm_dedupe_takeovers_total",
		"degraded":       "llm_dedupe_backend_degraded",
	} {
		if !strings.Contains(all, metric) {
			t.Errorf("the dashboard shows no %s (%s)", what, metric)
		}
	}
}

// TestDockerfile: a multi-stage build of a static, versioned binary onto a small non-root
// image, and a HEALTHCHECK whose command works against a running proxy.
func TestDockerfile(t *testing.T) {
	f, err := os.Open(filepath.Join(repoRoot, "Dockerfile"))
	if err != nil {
		t.Fatal(err)
	}
	defer f.Close()
	var froms, users, exposes []string
	var health, entry string
	text := ""
	sc := bufio.NewScanner(f)
	for sc.Scan() {
		line := strings.TrimSpace(sc.Text())
		text += line + "\n"
		word, rest, _ := strings.Cut(line, " ")
		switch strings.ToUpper(word) {
		case "FROM":
			froms = append(froms, rest)
		case "USER":
			users = append(users, rest)
		case "EXPOSE":
			exposes = append(exposes, rest)
		case "HEALTHCHECK":
			health = rest
		case "ENTRYPOINT":
			entry = rest
		}
	}
	if len(froms) < 2 || !strings.HasPrefix(froms[0], "golang:1.26") || strings.HasPrefix(froms[len(froms)-1], "golang") {
		t.Errorf("FROM %v; want a golang:1.26 build stage and a small final stage", froms)
	}
	for _, want := range []string{"CGO_ENABLED=0", "-trimpath", "-X main.version=", "./cmd/llm-dedupe-proxy"} {
		if !strings.Contains(text, want) {
			t.Errorf("the build does not say %q", want)
		}
	}
	if len(users) == 0 || users[len(users)-1] == "root" || strings.HasPrefix(users[len(users)-1], "0") {
		t.Errorf("USER %v; want a non-root user in the final stage", users)
	}
	if !slices.Contains(exposes, "8080") || !strings.Contains(text, "LLM_DEDUPE_LISTEN=:8080") {
		t.Errorf("EXPOSE %v; want 8080, the port the image listens on", exposes)
	}
	var entryArgs []string
	if err := json.Unmarshal([]byte(entry), &entryArgs); err != nil || len(entryArgs) != 1 {
		t.Fatalf("ENTRYPOINT %q; want [\"/path/of/the/binary\"]", entry)
	}
	_, cmdJSON, ok := strings.Cut(health, "CMD ")
	var hc []string
	if !ok || json.Unmarshal([]byte(cmdJSON), &hc) != nil || len(hc) < 2 || hc[0] != entryArgs[0] {
		t.Fatalf("HEALTHCHECK %q; want CMD [%q, \"healthcheck\", …] (no shell in the image)", health, entryArgs[0])
	}

	// The HEALTHCHECK command, run as the image would: the binary, its listen address.
	healthcheck := func(listen string) (int, string) {
		cmd := exec.Command(proxyBin, hc[1:]...)
		cmd.Env = []string{"LLM_DEDUPE_LISTEN=" + listen}
		out, err := cmd.CombinedOutput()
		return exitStatus(err), string(out)
	}
	p := startProc(t, "proxy", proxyBin, []string{"LLM_DEDUPE_LISTEN=127.0.0.1:0", "LLM_DEDUPE_UPSTREAM_BASE_URL=http://127.0.0.1:9"}, "serve")
	l, _ := p.waitLine(0, 15*time.Second, `"listening"`, msgIs("listening"))
	addr := parseLog(l)["addr"].(string)
	if code, out := healthcheck(addr); code != 0 {
		t.Errorf("healthcheck of a running proxy: status %d %s; want 0", code, out)
	}
	if code, out := healthcheck(redistest.FreeAddr(t)); code == 0 {
		t.Errorf("healthcheck with nothing listening: status 0 %s; want a failure", out)
	}

	ignore, err := os.ReadFile(filepath.Join(repoRoot, ".dockerignore"))
	if err != nil || !strings.Contains(string(ignore), ".git\n") {
		t.Errorf(".dockerignore %v: want .git left out of the build context", err)
	}
}
