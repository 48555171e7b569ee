package charttest

import (
	"bufio"
	"context"
	"encoding/json"
	"io"
	"math"
	"net/http"
	"os"
	"os/exec"
	"path/filepath"
	"strconv"
	"strings"
	"testing"
	"time"

	corev1 "k8s.io/api/core/v1"
)

// The Go runtime's limits the chart derives from the pod's resources (ADR 0072).

// envValue is the plain value of the container's variable name, and whether it is set.
func envValue(c *corev1.Container, name string) (string, bool) {
	for _, e := range c.Env {
		if e.Name == name {
			return e.Value, true
		}
	}
	return "", false
}

// wantRuntime is what the chart promises: GOMEMLIMIT the percentage of the memory limit;
// GOMAXPROCS unset with a CPU limit, else the CPU request rounded up, at least 2.
func wantRuntime(res corev1.ResourceRequirements, percent int64) (memLimit, maxProcs string) {
	if m, ok := res.Limits[corev1.ResourceMemory]; ok && percent > 0 {
		memLimit = strconv.FormatInt(int64(math.Floor(float64(m.Value())*float64(percent)/100)), 10)
	}
	if _, ok := res.Limits[corev1.ResourceCPU]; !ok {
		cpu := res.Requests[corev1.ResourceCPU]
		maxProcs = strconv.FormatInt(max(2, int64(math.Ceil(float64(cpu.MilliValue())/1000))), 10)
	}
	return memLimit, maxProcs
}

func TestGoRuntimeFollowsTheResources(t *testing.T) {
	for _, tc := range []struct {
		name      string
		resources map[string]any
		goRuntime map[string]any
	}{
		{"defaults", nil, nil},
		{"a CPU limit", map[string]any{"requests": map[string]any{"cpu": "500m", "memory": "1Gi"}, "limits": map[string]any{"cpu": "3", "memory": "1Gi"}}, nil},
		{"a large request", map[string]any{"requests": map[string]any{"cpu": "2500m", "memory": "3Gi"}, "limits": map[string]any{"memory": "3Gi"}}, nil},
		{"decimal units", map[string]any{"requests": map[string]any{"cpu": 4, "memory": "1.5G"}, "limits": map[string]any{"memory": "1.5G"}}, map[string]any{"memoryLimitPercent": 90}},
		{"plain bytes", map[string]any{"requests": map[string]any{"cpu": "1", "memory": 805306368}, "limits": map[string]any{"memory": 805306368}}, nil},
		{"GOMEMLIMIT off", nil, map[string]any{"memoryLimitPercent": 0}},
		{"no memory limit", map[string]any{"requests": map[string]any{"cpu": "100m", "memory": "256Mi"}}, nil},
		{"GOMAXPROCS given", nil, map[string]any{"maxProcs": 6}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			vals := readValues(t, "defaults")
			if tc.resources != nil {
				vals["resources"] = tc.resources
			}
			if tc.goRuntime != nil {
				vals["goRuntime"] = tc.goRuntime
			}
			p := proxyOf(t, newRelease(t, tc.name, vals))
			gr := p.r.vals["goRuntime"].(map[string]any)
			pct, _ := toInt(gr["memoryLimitPercent"])
			wantMem, wantProcs := wantRuntime(p.container.Resources, pct)
			if n, ok := toInt(gr["maxProcs"]); ok {
				wantProcs = strconv.FormatInt(n, 10)
			}
			for name, want := range map[string]string{"GOMEMLIMIT": wantMem, "GOMAXPROCS": wantProcs} {
				got, set := envValue(p.container, name)
				if got != want || set != (want != "") {
					t.Errorf("%s = %q (set %v); want %q with resources %v", name, got, set, want, p.container.Resources)
				}
			}
		})
	}
}

// toInt reads a number of the values: float64 from a values file, int from a test's map.
func toInt(v any) (int64, bool) {
	switch n := v.(type) {
	case float64:
		return int64(n), true
	case int:
		return int64(n), true
	case int64:
		return n, true
	}
	return 0, false
}

// TestDefaultMemoryHoldsTheCacheAndAnAnswer: by default the memory the garbage collector
// aims under (GOMEMLIMIT) holds the answer cache full and the largest answer in flight, with
// room for the rest, and the pod requests the memory it may use.
func TestDefaultMemoryHoldsTheCacheAndAnAnswer(t *testing.T) {
	p := proxyOf(t, renderSet(t, "defaults"))
	printed, stderr, ok := checkConfig(t, p)
	if !ok {
		t.Fatalf("the proxy refuses the configuration: %s", stderr)
	}
	number := func(key string) int64 {
		n, ok := lookup(printed, key).(float64)
		if !ok {
			t.Fatalf("%s = %v; want a number", key, lookup(printed, key))
		}
		return int64(n)
	}
	cache, answer := number("flight.memory_max_bytes"), number("limits.max_response_bytes")
	v, _ := envValue(p.container, "GOMEMLIMIT")
	limit, err := strconv.ParseInt(v, 10, 64)
	if err != nil {
		t.Fatalf("GOMEMLIMIT %q: %v", v, err)
	}
	// 64 MiB for the rest: the runtime, buffers of the connections, waiting requests.
	if need := cache + answer + 64<<20; limit < need {
		t.Errorf("GOMEMLIMIT %d below the cache %d + an answer %d + 64 MiB", limit, cache, answer)
	}
	req, lim := p.container.Resources.Requests.Memory(), p.container.Resources.Limits.Memory()
	if req.Cmp(*lim) != 0 {
		t.Errorf("memory request %s, limit %s; want them equal, so that the node holds what the pod may use", req, lim)
	}
	if n := number("redis.pool_size"); n <= 0 {
		t.Errorf("redis.pool_size %d; want it explicit", n)
	}
}

// TestProxyRunsWithTheChartsRuntimeLimits starts the proxy with the configuration and the
// environment the pod gets (its Redis unreachable here: it serves, degraded) and reads from
// its own /metrics that the Go runtime took the limits the chart set.
func TestProxyRunsWithTheChartsRuntimeLimits(t *testing.T) {
	for _, set := range []string{"defaults", "everything"} {
		t.Run(set, func(t *testing.T) {
			p := proxyOf(t, renderSet(t, set))
			wantMem, _ := envValue(p.container, "GOMEMLIMIT")
			wantProcs, _ := envValue(p.container, "GOMAXPROCS")
			if wantMem == "" || wantProcs == "" {
				t.Fatalf("GOMEMLIMIT %q, GOMAXPROCS %q; want both set", wantMem, wantProcs)
			}
			page := runProxy(t, p)
			for name, want := range map[string]string{"go_gc_gomemlimit_bytes": wantMem, "go_sched_gomaxprocs_threads": wantProcs} {
				got, ok := sample(page, name)
				w, _ := strconv.ParseFloat(want, 64)
				if !ok || got != w {
					t.Errorf("the proxy reports %s %v (found %v); want %s", name, got, ok, want)
				}
			}
		})
	}
}

// runProxy runs serve as the pod would, on a loopback port instead of the pod's, and
// returns its /metrics page.
func runProxy(t *testing.T, p *proxyParts) string {
	t.Helper()
	file := filepath.Join(t.TempDir(), "config.yaml")
	if err := os.WriteFile(file, []byte(p.cfgText), 0o600); err != nil {
		t.Fatal(err)
	}
	ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
	defer cancel()
	cmd := exec.CommandContext(ctx, proxyBinary(t), "serve", "--config", file)
	// Later variables win: a loopback port, and a log to read the address from.
	cmd.Env = append(podEnv(t, p), "LLM_DEDUPE_LISTEN=127.0.0.1:0", "LLM_DEDUPE_LOG_FORMAT=json")
	stderr, err := cmd.StderrPipe()
	if err != nil {
		t.Fatal(err)
	}
	if err := cmd.Start(); err != nil {
		t.Fatal(err)
	}
	defer func() {
		cmd.Process.Kill()
		cmd.Wait()
	}()
	addr := ""
	sc := bufio.NewScanner(stderr)
	for addr == "" && sc.Scan() {
		var line struct{ Msg, Addr string }
		if json.Unmarshal(sc.Bytes(), &line) == nil && line.Msg == "listening" {
			addr = line.Addr
		}
	}
	if addr == "" {
		t.Fatal("the proxy stopped before listening")
	}
	go io.Copy(io.Discard, stderr)
	resp, err := http.Get("http://" + addr + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}

// sample is the value of an unlabelled series in a Prometheus text page.
func sample(page, name string) (float64, bool) {
	for _, line := range strings.Split(page, "\n") {
		if v, ok := strings.CutPrefix(line, name+" "); ok {
			f, err := strconv.ParseFloat(v, 64)
			return f, err == nil
		}
	}
	return 0, false
}
