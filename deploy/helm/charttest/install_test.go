package charttest

import (
	"strings"
	"testing"

	"helm.sh/helm/v3/pkg/chartutil"
	"helm.sh/helm/v3/pkg/lint"
	"helm.sh/helm/v3/pkg/lint/support"
)

// TestLint runs `helm lint` (Helm's lint package, in process) with each value set: Chart.yaml,
// values against values.schema.json, the templates rendered and parsed.
func TestLint(t *testing.T) {
	kv, err := chartutil.ParseKubeVersion(kubeVersion)
	if err != nil {
		t.Fatal(err)
	}
	for _, set := range valueSets {
		t.Run(set, func(t *testing.T) {
			l := lint.AllWithKubeVersion(chartDir, readValues(t, set), namespace, kv)
			for _, m := range l.Messages {
				if m.Severity >= support.WarningSev {
					t.Error(m)
				}
			}
		})
	}
}

// TestWrongValuesFailAtInstall: a value the chart cannot use stops `helm install` (and
// `helm template`) before anything is applied, with a message naming the value. Each case
// changes the "defaults" value set.
func TestWrongValuesFailAtInstall(t *testing.T) {
	for _, tc := range []struct {
		name string
		set  string // path=YAML value, as with --set-json
		want string // in the error
	}{
		// values.schema.json
		{"unknown top-level value", `replicas=3`, "replicas"},
		{"replica count as text", `replicaCount="3"`, "replicaCount"},
		{"unknown configuration key", `config.flight.lease_tll="3s"`, "lease_tll"},
		{"duration without unit", `config.flight.lease_ttl=3`, `/config/flight/lease_ttl': value must be 'a Go duration with its unit`},
		{"duration misspelt", `config.upstream.timeout="10 minutes"`, `/config/upstream/timeout': value must be 'a Go duration with its unit`},
		{"log level", `config.log.level="verbose"`, "level"},
		{"hashing scope", `config.hashing.scope="tenant"`, "scope"},
		{"deduplicated path not a path", `config.dedupe.paths=["v1/chat/completions"]`, "paths"},
		{"sampled sharing misspelt", `config.dedupe.sampled="inflight"`, "sampled"},
		{"listen set in config", `config.listen=":9000"`, "listen"},
		{"api key in config", `config.upstream.api_key="sk-x"`, "api_key"},
		{"redis address in config", `config.redis.addrs=["r:6379"]`, "addrs"},
		{"shutdown delay in config", `config.shutdown_delay="5s"`, "shutdown_delay"},
		{"redis address without port", `redis.addrs=["redis.example.internal"]`, "addrs"},
		{"redis mode", `redis.mode="replicated"`, "mode"},
		{"zero disruptions allowed", `podDisruptionBudget.maxUnavailable=0`, "maxUnavailable"},
		{"shutdown delay as duration", `shutdown.delaySeconds="10s"`, "delaySeconds"},
		// rules between values, in the templates
		{"no redis", `redis.addrs=[]`, "redis.addrs: set the address"},
		{"sentinel without master", `redis.mode="sentinel"`, "redis.masterName"},
		{"cluster of one address", `redis.mode="cluster"`, "redis.mode=cluster needs two or more"},
		{"standalone with several addresses", `redis.addrs=["a:6379","b:6379"]`, "redis.mode=cluster"},
		{"in-chart redis and an address", `redis.inChart.enabled=true`, "leave it empty"},
		{"admin without token", `admin.enabled=true`, "secrets.adminToken"},
		{"admin with a short token", `secrets.adminToken="short"`, ""}, // fine while admin is off
		{"CA without TLS", `redis.tls.caSecret="redis-ca"`, "redis.tls.enabled"},
		{"delay shorter than readiness", `shutdown.delaySeconds=3`, "shutdown.delaySeconds"},
		{"grace period too short", `terminationGracePeriodSeconds=30`, "terminationGracePeriodSeconds"},
		{"budget blocks drains", `podDisruptionBudget={"enabled":true,"maxUnavailable":null,"minAvailable":3}`, "podDisruptionBudget.minAvailable"},
		{"autoscaler min above max", `autoscaling={"enabled":true,"minReplicas":5,"maxReplicas":3}`, "autoscaling.minReplicas"},
		{"OTLP over JSON", `tracing.protocol="http/json"`, "protocol"},
		{"OTLP endpoint without scheme", `tracing.otlpEndpoint="otel-collector:4318"`, "otlpEndpoint"},
		{"sampler misspelt", `tracing.sampler="ratio"`, "sampler"},
		{"sampler ratio above 1", `tracing.samplerArg=2`, "samplerArg"},
		{"sampler ratio above 1, as text", `tracing.samplerArg="1.5"`, "samplerArg"},
		{"resource attribute with a comma", `tracing.resourceAttributes={"team":"a,b"}`, "resourceAttributes"},
		{"configuration through the environment", `extraEnv=[{"name":"LLM_DEDUPE_FLIGHT_LEASE_TTL","value":"1s"}]`, "extraEnv"},
		{"configuration through envFrom", `envFrom=[{"prefix":"LLM_DEDUPE_","configMapRef":{"name":"x"}}]`, "envFrom"},
		{"budget of every pod, in percent", `podDisruptionBudget={"enabled":true,"maxUnavailable":null,"minAvailable":"100%"}`, "podDisruptionBudget.minAvailable"},
		{"budget below every pod, in percent", `podDisruptionBudget={"enabled":true,"maxUnavailable":null,"minAvailable":"66%"}`, ""},
		{"network policy open to every pod", `networkPolicy.enabled=true`, "networkPolicy.api.from"},
		{"ingress without a host", `ingress.enabled=true`, "ingress.hosts"},
		{"ingress path not a path", `ingress={"enabled":true,"hosts":["a.example"],"paths":["v1"]}`, "paths"},
		{"route without a gateway", `httpRoute.enabled=true`, "httpRoute.parentRefs"},
		{"route timeout misspelt", `httpRoute.requestTimeout="10 minutes"`, "requestTimeout"},
		{"memory limit unreadable", `resources={"requests":{"cpu":"1","memory":"1Gi"},"limits":{"memory":"1 gigabyte"}}`, "resources.limits.memory"},
		{"GOMEMLIMIT above the limit", `goRuntime.memoryLimitPercent=120`, "memoryLimitPercent"},
		{"digest without algorithm", `image.digest="0123456789abcdef"`, "digest"},
		{"pull policy misspelt", `image.pullPolicy="Sometimes"`, "pullPolicy"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := readValues(t, "defaults")
			setJSON(t, vals, tc.set)
			_, err := render(vals)
			if err != nil {
				t.Log(err)
			}
			switch {
			case tc.want == "" && err != nil:
				t.Errorf("refused: %v", err)
			case tc.want == "":
			case err == nil:
				t.Errorf("installs; want it refused naming %q", tc.want)
			case !strings.Contains(err.Error(), tc.want):
				t.Errorf("refused with %v; want the message to name %q", err, tc.want)
			}
		})
	}
}

// TestDefaultsAloneAskForRedis: the chart's own defaults lack only the Redis address, and
// say so.
func TestDefaultsAloneAskForRedis(t *testing.T) {
	_, err := render(map[string]any{})
	if err == nil || !strings.Contains(err.Error(), "redis.addrs: set the address") {
		t.Errorf("the defaults alone give %v; want the Redis address asked for", err)
	}
	vals := map[string]any{"redis": map[string]any{"addrs": []any{"redis:6379"}}}
	if _, err := render(vals); err != nil {
		t.Errorf("the defaults with a Redis address: %v", err)
	}
}
