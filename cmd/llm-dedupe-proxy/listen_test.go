package main

import (
	"net"
	"strings"
	"testing"
)

// holdPort listens on a free loopback port for the test and returns its address.
func holdPort(t *testing.T) string {
	t.Helper()
	l, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	return l.Addr().String()
}

// TestServeSaysItsPortIsTaken: a port in use stops start-up as an invalid value does: one
// plain line naming the key (and the variable that set it), what may hold the port and the
// flag that moves it, status 2, and nothing logged or connected before it.
func TestServeSaysItsPortIsTaken(t *testing.T) {
	taken := holdPort(t)
	adminTaken := holdPort(t)
	for _, tc := range []struct {
		name string
		env  map[string]string
		args []string
		want string
	}{
		{"flag", nil, []string{"--listen=" + taken},
			"llm-dedupe-proxy: invalid config: listen: " + taken + " is taken (by another llm-dedupe-proxy still running, or another server?): " +
				"stop what holds it, or listen elsewhere with --listen=127.0.0.1:PORT\n"},
		{"variable", map[string]string{"LLM_DEDUPE_LISTEN": taken}, nil,
			"llm-dedupe-proxy: invalid config: LLM_DEDUPE_LISTEN (listen): " + taken + " is taken (by another llm-dedupe-proxy still running, or another server?): " +
				"stop what holds it, or listen elsewhere with --listen=127.0.0.1:PORT\n"},
		{"admin", nil, []string{"--listen=127.0.0.1:0", "--admin.listen=" + adminTaken, "--admin.token=a-token-of-16-chars"},
			"llm-dedupe-proxy: invalid config: admin.listen: " + adminTaken + " is taken (by another instance's admin API?): " +
				"stop what holds it, or listen elsewhere with --admin.listen=127.0.0.1:PORT\n"},
	} {
		t.Run(tc.name, func(t *testing.T) {
			args := append([]string{"serve", "--redis.addrs=127.0.0.1:1"}, tc.args...)
			r := runCmd(t, tc.env, "", args...)
			if r.code != 2 || r.stderr != tc.want {
				t.Errorf("status %d, stderr\n%s\nwant 2 and only\n%s", r.code, r.stderr, tc.want)
			}
		})
	}
}

// TestServeRefusesABadOTELValue: an OTEL_* value tracing cannot use stops start-up like an
// invalid key, with the other configuration errors, before anything is logged.
func TestServeRefusesABadOTELValue(t *testing.T) {
	env := map[string]string{"OTEL_TRACES_EXPORTER": "jaeger", "LLM_DEDUPE_FLIGHT_MAX_ATTEMPTS": "0"}
	r := runCmd(t, env, "", "serve", "--listen=127.0.0.1:0")
	want := "llm-dedupe-proxy: invalid config: LLM_DEDUPE_FLIGHT_MAX_ATTEMPTS (flight.max_attempts): must be at least 1, got 0\n" +
		"llm-dedupe-proxy: invalid config: OTEL_TRACES_EXPORTER: \"jaeger\" is not supported: use otlp, console or none (or a list: otlp,console)\n"
	if r.code != 2 || r.stderr != want {
		t.Errorf("status %d, stderr\n%s\nwant 2 and\n%s", r.code, r.stderr, want)
	}
	env = map[string]string{"OTEL_TRACES_EXPORTER": "console", "OTEL_TRACES_SAMPLER": "parentbased_traceidratio", "OTEL_TRACES_SAMPLER_ARG": "10%"}
	r = runCmd(t, env, "", "serve", "--print-config")
	if r.code != 2 || r.stdout != "" || !strings.HasPrefix(r.stderr, "llm-dedupe-proxy: invalid config: OTEL_TRACES_SAMPLER_ARG: must be a ratio from 0 to 1") {
		t.Errorf("--print-config with a bad sampler ratio: status %d, stdout %q, stderr %q; want 2 and the variable named", r.code, r.stdout, r.stderr)
	}
}
