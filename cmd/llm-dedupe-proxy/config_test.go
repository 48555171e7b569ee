package main

import (
	"flag"
	"fmt"
	"reflect"
	"strings"
	"testing"
	"time"

	"go.yaml.in/yaml/v3"
)

// altConfig differs from defaultConfig in every key and is valid.
func altConfig() Config {
	return Config{
		Listen: "127.0.0.1:9999",
		Upstream: UpstreamConfig{
			BaseURL: "http://upstream.test/openai", APIKey: "sk-alt",
			Timeout: 2 * time.Minute, IdleTimeout: 15 * time.Second,
		},
		Redis: RedisConfig{
			Addrs: []string{"r1:6379", "r2:6380"}, MasterName: "mymaster", Username: "u", Password: "p",
			DB: 2, TLS: true, KeyPrefix: "x:flight", DialTimeout: 2 * time.Second,
			ReadTimeout: 3 * time.Second, PoolSize: 50, TLSCAFile: "/etc/ssl/private-ca.pem",
		},
		Flight: FlightConfig{
			HeartbeatInterval: 2 * time.Second, LeaseTTL: 6 * time.Second,
			TakeoverJitter: 100 * time.Millisecond, MaxAttempts: 5, ResultTTL: time.Hour,
			Linger: 10 * time.Second, StreamBatchDelay: 10 * time.Millisecond,
			StreamBatchBytes: 1024, StreamMaxLen: 500, MemoryMaxEntries: 50, MemoryMaxBytes: 1 << 20,
			Abandoned: "finish", AbandonGrace: 7 * time.Second,
		},
		Limits:          LimitsConfig{MaxBodyBytes: 1 << 20, BodyReadTimeout: 5 * time.Second, SendTimeout: 20 * time.Second, MaxResponseBytes: 8 << 20},
		Hashing:         HashingConfig{Scope: "header:X-Tenant", IgnoreFields: []string{"user", "metadata"}},
		Dedupe:          DedupeConfig{Paths: []string{"/v1/chat/completions"}, Sampled: "never", SampledRetryWindow: 3 * time.Second},
		Store:           StoreConfig{Rules: []string{"/v1/embeddings * 24h", "* gpt-4o* 0"}, ToolCalls: false},
		Admin:           AdminConfig{Listen: "127.0.0.1:9998", Token: "admin-token-0123456789"},
		Log:             LogConfig{Level: "debug", Format: "text"},
		ShutdownTimeout: 5 * time.Second,
		ShutdownDelay:   2 * time.Second,
	}
}

// text is how a value is written in an environment variable or a flag.
func text(v reflect.Value) string {
	switch x := v.Interface().(type) {
	case time.Duration:
		return formatDuration(x)
	case []string:
		return strings.Join(x, ", ")
	}
	return fmt.Sprint(v.Interface())
}

func TestAltConfigDiffersEverywhere(t *testing.T) {
	def, alt := defaultConfig(), altConfig()
	if err := validate(alt); err != nil {
		t.Fatalf("altConfig is invalid: %v", err)
	}
	as := settings(&alt)
	for i, s := range settings(&def) {
		if reflect.DeepEqual(s.field.Interface(), as[i].field.Interface()) {
			t.Errorf("altConfig keeps the default of %s; give it another value", s.key)
		}
	}
}

// TestEveryKeyFromEnvAndFlags sets every key at once, from the environment and from flags.
func TestEveryKeyFromEnvAndFlags(t *testing.T) {
	alt := altConfig()
	env := map[string]string{}
	var args []string
	for _, s := range settings(&alt) {
		env[s.env()] = text(s.field)
		args = append(args, "--"+s.key+"="+text(s.field))
	}
	tests := []struct {
		name string
		env  map[string]string
		args []string
	}{
		{"env", env, nil},
		{"flags", nil, args},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			fs := flag.NewFlagSet("test", flag.ContinueOnError)
			cf := newConfigFlags(fs)
			if err := fs.Parse(tt.args); err != nil {
				t.Fatal(err)
			}
			got, err := cf.load(tt.env)
			if err != nil || !reflect.DeepEqual(got, alt) {
				t.Errorf("load = %+v, %v;\nwant %+v", got, err, alt)
			}
		})
	}
}

// printed runs serve --print-config and returns the printed configuration.
func printed(t *testing.T, env map[string]string, args ...string) map[string]any {
	t.Helper()
	r := runCmd(t, env, "", append([]string{"serve", "--print-config"}, args...)...)
	if r.code != 0 {
		t.Fatalf("--print-config %q: status %d, stderr %q", args, r.code, r.stderr)
	}
	var m map[string]any
	if err := yaml.Unmarshal([]byte(r.stdout), &m); err != nil {
		t.Fatalf("printed config %q: %v", r.stdout, err)
	}
	return m
}

func get(m map[string]any, key string) any {
	for section, rest, ok := strings.Cut(key, "."); ok; section, rest, ok = strings.Cut(rest, ".") {
		m, key = m[section].(map[string]any), rest
	}
	return m[key]
}

func TestPrecedence(t *testing.T) {
	file := writeFile(t, "c.yaml", "listen: \":1111\"\nflight:\n  max_attempts: 4\nredis:\n  addrs: [a:1]\n")
	tests := []struct {
		name       string
		env        map[string]string
		args       []string
		listen     string
		maxAttempt int
		addrs      []any
	}{
		{"defaults", nil, nil, ":8080", 3, []any{}},
		{"file", nil, []string{"--config", file}, ":1111", 4, []any{"a:1"}},
		{"file named by env", map[string]string{"LLM_DEDUPE_CONFIG": file}, nil, ":1111", 4, []any{"a:1"}},
		{"env over file", map[string]string{"LLM_DEDUPE_LISTEN": ":2222", "LLM_DEDUPE_REDIS_ADDRS": "b:1, c:2"},
			[]string{"--config", file}, ":2222", 4, []any{"b:1", "c:2"}},
		{"flag over env", map[string]string{"LLM_DEDUPE_LISTEN": ":2222", "LLM_DEDUPE_REDIS_ADDRS": "b:1"},
			[]string{"--config", file, "--listen", ":3333"}, ":3333", 4, []any{"b:1"}},
		{"empty env is unset", map[string]string{"LLM_DEDUPE_LISTEN": ""}, []string{"--config", file}, ":1111", 4, []any{"a:1"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			m := printed(t, tt.env, tt.args...)
			if got := get(m, "listen"); got != tt.listen {
				t.Errorf("listen = %v; want %v", got, tt.listen)
			}
			if got := get(m, "flight.max_attempts"); got != tt.maxAttempt {
				t.Errorf("flight.max_attempts = %v; want %v", got, tt.maxAttempt)
			}
			if got := get(m, "redis.addrs"); !reflect.DeepEqual(got, tt.addrs) {
				t.Errorf("redis.addrs = %#v; want %#v", got, tt.addrs)
			}
			if got := get(m, "flight.lease_ttl"); got != "3s" {
				t.Errorf("flight.lease_ttl = %v; want the default 3s", got)
			}
		})
	}
}

func TestEnvListSplitting(t *testing.T) {
	env := map[string]string{
		"LLM_DEDUPE_REDIS_ADDRS":           " r1:6379 ,r2:6379,, ",
		"LLM_DEDUPE_DEDUPE_PATHS":          "/v1/a,/v1/b",
		"LLM_DEDUPE_HASHING_IGNORE_FIELDS": "user",
	}
	m := printed(t, env)
	want := map[string][]any{
		"redis.addrs":           {"r1:6379", "r2:6379"},
		"dedupe.paths":          {"/v1/a", "/v1/b"},
		"hashing.ignore_fields": {"user"},
	}
	for key, w := range want {
		if got := get(m, key); !reflect.DeepEqual(got, w) {
			t.Errorf("%s = %#v; want %#v", key, got, w)
		}
	}
}

func TestInvalidConfig(t *testing.T) {
	unknown := writeFile(t, "c.yaml", "upstream:\n  base_uri: http://x\n")
	fraction := writeFile(t, "f.yaml", "flight:\n  max_attempts: 2.5\n")
	tests := []struct {
		name string
		env  map[string]string
		args []string
		keys []string
	}{
		{"lease below twice the heartbeat", nil, []string{"--flight.heartbeat_interval=1.5s", "--flight.lease_ttl=2s"}, []string{"flight.lease_ttl"}},
		{"relative base URL", nil, []string{"--upstream.base_url=api.openai.com"}, []string{"upstream.base_url"}},
		{"ftp base URL", map[string]string{"LLM_DEDUPE_UPSTREAM_BASE_URL": "ftp://x"}, nil, []string{"upstream.base_url"}},
		{"scope", map[string]string{"LLM_DEDUPE_HASHING_SCOPE": "tenant"}, nil, []string{"hashing.scope"}},
		{"duration syntax", map[string]string{"LLM_DEDUPE_UPSTREAM_TIMEOUT": "600"}, nil, []string{"upstream.timeout"}},
		{"zero attempts", nil, []string{"--flight.max_attempts=0"}, []string{"flight.max_attempts"}},
		{"not a number", nil, []string{"--limits.max_body_bytes=10MB"}, []string{"limits.max_body_bytes"}},
		{"negative result TTL", nil, []string{"--flight.result_ttl=-1s"}, []string{"flight.result_ttl"}},
		{"negative shutdown delay", nil, []string{"--shutdown_delay=-1s"}, []string{"shutdown_delay"}},
		{"admin without token", nil, []string{"--admin.listen=127.0.0.1:9090"}, []string{"admin.token"}},
		{"short admin token", nil, []string{"--admin.listen=127.0.0.1:9090", "--admin.token=short"}, []string{"admin.token"}},
		{"admin on the proxy's address", nil, []string{"--admin.listen=:8080", "--admin.token=0123456789abcdef"}, []string{"admin.listen"}},
		{"store rule", map[string]string{"LLM_DEDUPE_STORE_RULES": "/v1/embeddings 24h"}, nil, []string{"store.rules"}},
		{"empty key prefix", nil, []string{"--redis.key_prefix="}, []string{"redis.key_prefix"}},
		{"unknown file key", nil, []string{"--config", unknown}, []string{"upstream.base_uri"}},
		{"missing file", nil, []string{"--config", "/nonexistent/c.yaml"}, []string{"--config"}},
		{"dedupe path shadows /metrics", nil, []string{"--dedupe.paths=/v1/chat/completions,/metrics"}, []string{"dedupe.paths"}},
		{"dedupe path shadows /readyz", nil, []string{"--dedupe.paths=/readyz"}, []string{"dedupe.paths"}},
		{"dedupe path pattern", nil, []string{"--dedupe.paths=/v1/*"}, []string{"dedupe.paths"}},
		{"dedupe path with a query", nil, []string{"--dedupe.paths=/v1/x?y=1"}, []string{"dedupe.paths"}},
		{"dedupe path with dot segments", nil, []string{"--dedupe.paths=/v1/../x"}, []string{"dedupe.paths"}},
		{"sampled sharing", map[string]string{"LLM_DEDUPE_DEDUPE_SAMPLED": "inflight"}, nil, []string{"dedupe.sampled"}},
		{"negative retry window", nil, []string{"--dedupe.sampled_retry_window=-1s"}, []string{"dedupe.sampled_retry_window"}},
		{"CA file without TLS", nil, []string{"--redis.tls_ca_file=/etc/ssl/ca.pem"}, []string{"redis.tls_ca_file"}},
		{"zero body read timeout", nil, []string{"--limits.body_read_timeout=0s"}, []string{"limits.body_read_timeout"}},
		{"zero send timeout", nil, []string{"--limits.send_timeout=0s"}, []string{"limits.send_timeout"}},
		{"port out of range", nil, []string{"--listen=127.0.0.1:99999"}, []string{"listen"}},
		{"a fraction for an integer, in a file", nil, []string{"--config", fraction}, []string{"flight.max_attempts"}},
		{"redis without a port", nil, []string{"--redis.addrs=127.0.0.1:"}, []string{"redis.addrs"}},
		{"redis port out of range", nil, []string{"--redis.addrs=127.0.0.1:99999"}, []string{"redis.addrs"}},
		{"redis port 0", nil, []string{"--redis.addrs=127.0.0.1:0"}, []string{"redis.addrs"}},
		{"zero response bytes", nil, []string{"--limits.max_response_bytes=0"}, []string{"limits.max_response_bytes"}},
		{"zero memory bytes", nil, []string{"--flight.memory_max_bytes=0"}, []string{"flight.memory_max_bytes"}},
		{"several at once", map[string]string{"LLM_DEDUPE_LOG_FORMAT": "xml", "LLM_DEDUPE_REDIS_DB": "-1"},
			[]string{"--log.level=loud", "--dedupe.paths=v1/chat", "--listen="},
			[]string{"log.format", "redis.db", "log.level", "dedupe.paths", "listen"}},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			r := runCmd(t, tt.env, "", append([]string{"serve", "--print-config"}, tt.args...)...)
			if r.code != 2 || r.stdout != "" {
				t.Errorf("status %d, stdout %q; want 2 and nothing", r.code, r.stdout)
			}
			for _, key := range tt.keys {
				// A value from the environment is named by its variable, then its key.
				want := key + ": "
				if env := (setting{key: key}).env(); tt.env[env] != "" {
					want = env + " (" + key + "): "
				}
				if !strings.Contains(r.stderr, "llm-dedupe-proxy: invalid config: "+want) {
					t.Errorf("stderr %q; want a line naming %s", r.stderr, want)
				}
			}
		})
	}
}

func TestValidEdgeValues(t *testing.T) {
	m := printed(t, nil, "--flight.result_ttl=0", "--flight.takeover_jitter=0s", "--hashing.scope=global")
	if got := get(m, "flight.result_ttl"); got != "0s" {
		t.Errorf("flight.result_ttl = %v; want 0s (dedupe only)", got)
	}
}

func TestPrintConfigRedactsSecrets(t *testing.T) {
	env := map[string]string{"LLM_DEDUPE_UPSTREAM_API_KEY": "sk-very-secret"}
	r := runCmd(t, env, "", "serve", "--print-config", "--redis.password=hunter2", "--redis.username=alice")
	if r.code != 0 || strings.Contains(r.stdout, "sk-very-secret") || strings.Contains(r.stdout, "hunter2") {
		t.Fatalf("status %d, output %s; want 0 and no secret", r.code, r.stdout)
	}
	var m map[string]any
	if err := yaml.Unmarshal([]byte(r.stdout), &m); err != nil {
		t.Fatal(err)
	}
	for key, want := range map[string]string{"upstream.api_key": "<redacted>", "redis.password": "<redacted>", "redis.username": "alice"} {
		if got := get(m, key); got != want {
			t.Errorf("%s = %v; want %v", key, got, want)
		}
	}
	r = runCmd(t, nil, "", "serve", "--print-config", "--admin.listen=127.0.0.1:9090", "--admin.token=admin-token-very-secret")
	if r.code != 0 || strings.Contains(r.stdout, "admin-token-very-secret") {
		t.Fatalf("status %d, output %s; want 0 and no admin token", r.code, r.stdout)
	}
	if got := get(printed(t, nil, "--admin.listen=127.0.0.1:9090", "--admin.token=admin-token-very-secret"), "admin.token"); got != "<redacted>" {
		t.Errorf("admin.token = %v; want <redacted>", got)
	}
	if got := get(printed(t, nil), "redis.password"); got != "" {
		t.Errorf("unset redis.password printed as %v; want \"\"", got)
	}
}

// TestPrintConfigRedactsBaseURL: a password in upstream.base_url, or a secret in its query
// (Azure-style api-key, a signature), is redacted where the configuration is printed or
// logged; what is not secret (the host, the path, api-version) stays readable.
func TestPrintConfigRedactsBaseURL(t *testing.T) {
	base := "https://alice:pa55word@gw.test/openai?api-version=2024-06-01&api-key=k3y-secret&sig=s1gnature"
	r := runCmd(t, nil, "", "serve", "--print-config", "--upstream.base_url="+base)
	if r.code != 0 {
		t.Fatalf("status %d: %s", r.code, r.stderr)
	}
	for _, secret := range []string{"pa55word", "k3y-secret", "s1gnature"} {
		if strings.Contains(r.stdout, secret) {
			t.Errorf("--print-config shows %q:\n%s", secret, r.stdout)
		}
	}
	for _, kept := range []string{"alice", "gw.test/openai", "api-version=2024-06-01"} {
		if !strings.Contains(r.stdout, kept) {
			t.Errorf("--print-config lost %q:\n%s", kept, r.stdout)
		}
	}
	// One spelling of a redacted secret, in the URL as for a secret key.
	for _, want := range []string{"alice:<redacted>@", "api-key=<redacted>", "sig=<redacted>"} {
		if !strings.Contains(r.stdout, want) {
			t.Errorf("--print-config does not say %q:\n%s", want, r.stdout)
		}
	}
}

// TestBadValueNamesItsVariable: a value that came from an environment variable is refused
// naming the variable, and the key; one from a flag or a file names the key.
func TestBadValueNamesItsVariable(t *testing.T) {
	r := runCmd(t, map[string]string{"LLM_DEDUPE_FLIGHT_RESULT_TTL": "10"}, "", "serve", "--print-config")
	if want := `LLM_DEDUPE_FLIGHT_RESULT_TTL (flight.result_ttl): cannot use "10" as a duration`; r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Errorf("status %d, %q; want 2 and %q", r.code, r.stderr, want)
	}
	r = runCmd(t, map[string]string{"LLM_DEDUPE_FLIGHT_LEASE_TTL": "1s"}, "", "serve", "--print-config")
	if want := "LLM_DEDUPE_FLIGHT_LEASE_TTL (flight.lease_ttl): must be at least"; r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Errorf("status %d, %q; want 2 and %q", r.code, r.stderr, want)
	}
	// The flag wins over the variable, and is what the message names.
	r = runCmd(t, map[string]string{"LLM_DEDUPE_FLIGHT_RESULT_TTL": "1m"}, "", "serve", "--print-config", "--flight.result_ttl=10")
	if want := `invalid config: flight.result_ttl: cannot use "10" as a duration`; r.code != 2 || !strings.Contains(r.stderr, want) {
		t.Errorf("status %d, %q; want 2 and %q", r.code, r.stderr, want)
	}
}

func TestUnknownEnv(t *testing.T) {
	env := map[string]string{
		"LLM_DEDUPE_UPSTREAM_BASE_URL": "http://x", "LLM_DEDUPE_CONFIG": "/c.yaml", "PATH": "/bin",
		"LLM_DEDUPE_UPSTREAM_BASEURL": "http://typo", "LLM_DEDUPE_REDIS_PASSWORD": "p", "LLM_DEDUPE_LIMITS_MAX_BODY": "1",
		"LLM_DEDUPE_REDIS_ADDR": "127.0.0.1:6379", "LLM_DEDUPE_BASE_URL": "http://x", "LLM_DEDUPE_FROBNICATE": "1",
		"LLM_DEDUPE_PPROF_LISTEN": "127.0.0.1:6060",
		// Kubernetes's service links of Services named llm-dedupe and llm-dedupe-proxy.
		"LLM_DEDUPE_PORT": "tcp://10.0.0.1:8080", "LLM_DEDUPE_SERVICE_HOST": "10.0.0.1",
		"LLM_DEDUPE_PROXY_SERVICE_PORT": "8080", "LLM_DEDUPE_PROXY_SERVICE_PORT_HTTP": "8080",
		"LLM_DEDUPE_PROXY_PORT": "tcp://10.0.0.2:8080", "LLM_DEDUPE_PROXY_PORT_8080_TCP": "tcp://10.0.0.2:8080",
		"LLM_DEDUPE_PROXY_PORT_8080_TCP_ADDR": "10.0.0.2", "LLM_DEDUPE_PROXY_PORT_8080_TCP_PORT": "8080",
		"LLM_DEDUPE_PROXY_PORT_8080_TCP_PROTO": "tcp",
	}
	var got []string
	for _, err := range unknownEnv(env) {
		got = append(got, err.Error())
	}
	want := []string{
		"LLM_DEDUPE_BASE_URL: an environment variable that names no key (did you mean LLM_DEDUPE_UPSTREAM_BASE_URL?)",
		"LLM_DEDUPE_FROBNICATE: an environment variable that names no key",
		"LLM_DEDUPE_LIMITS_MAX_BODY: an environment variable that names no key (did you mean LLM_DEDUPE_LIMITS_MAX_BODY_BYTES?)",
		"LLM_DEDUPE_REDIS_ADDR: an environment variable that names no key (did you mean LLM_DEDUPE_REDIS_ADDRS?)",
		"LLM_DEDUPE_UPSTREAM_BASEURL: an environment variable that names no key (did you mean LLM_DEDUPE_UPSTREAM_BASE_URL?)",
	}
	if !reflect.DeepEqual(got, want) {
		t.Errorf("unknownEnv =\n%s\nwant\n%s", strings.Join(got, "\n"), strings.Join(want, "\n"))
	}
}

// TestUnknownNamesRefusedAlike: a misspelt variable and a misspelt key of the file both stop
// every command that reads the configuration with status 2 and the name meant, and
// --print-config shows no configuration that would not be the one in effect.
func TestUnknownNamesRefusedAlike(t *testing.T) {
	file := writeFile(t, "c.yaml", "redis:\n  addr: 127.0.0.1:6379\n")
	tests := []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"variable", map[string]string{"LLM_DEDUPE_REDIS_ADDR": "127.0.0.1:6379"}, nil,
			"llm-dedupe-proxy: invalid config: LLM_DEDUPE_REDIS_ADDR: an environment variable that names no key (did you mean LLM_DEDUPE_REDIS_ADDRS?)\n"},
		{"file key", nil, []string{"--config", file},
			"llm-dedupe-proxy: invalid config: redis.addr: unknown key in " + file + " (did you mean redis.addrs?)\n"},
	}
	for _, tt := range tests {
		for _, cmd := range [][]string{{"serve", "--print-config"}, {"serve"}, {"key"}, {"healthcheck"}} {
			t.Run(tt.name+"/"+strings.Join(cmd, " "), func(t *testing.T) {
				r := runCmd(t, tt.env, "{}", append(cmd, tt.args...)...)
				if r.code != 2 || r.stdout != "" || r.stderr != tt.want {
					t.Errorf("status %d, stdout %q, stderr %q; want 2, nothing and %q", r.code, r.stdout, r.stderr, tt.want)
				}
			})
		}
	}
}
