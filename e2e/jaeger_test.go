package e2e

import (
	"encoding/json"
	"fmt"
	"net/http"
	"net/url"
	"os/exec"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
)

// jaegerProc is a Jaeger v2 process: OTLP in over gRPC and HTTP, traces in memory, its
// query API out, each on a loopback port of its own (e2e/jaeger/config.yaml).
type jaegerProc struct {
	*proc
	OTLPHTTP string // the OTLP/HTTP endpoint, for OTEL_EXPORTER_OTLP_ENDPOINT
	OTLPGRPC string // the OTLP/gRPC endpoint (http://: without TLS)
	URL      string // the query API and UI
}

// startJaeger runs the Jaeger scripts/jaeger.sh builds (at once when it is built, as
// `make test` does first) and waits until it takes spans.
func startJaeger(t *testing.T) *jaegerProc {
	t.Helper()
	build := exec.Command("bash", filepath.Join(repoRoot, "scripts", "jaeger.sh"))
	build.Dir = repoRoot
	var stderr strings.Builder
	build.Stderr = &stderr
	out, err := build.Output()
	if err != nil {
		t.Fatalf("scripts/jaeger.sh (builds Jaeger with Go; make test runs it first): %v\n%s", err, stderr.String())
	}
	bin := strings.TrimSpace(string(out))
	config := filepath.Join(repoRoot, "e2e", "jaeger", "config.yaml")
	for try := 0; ; try++ {
		otlpHTTP, otlpGRPC, query := redistest.FreeAddr(t), redistest.FreeAddr(t), redistest.FreeAddr(t)
		env := []string{"JAEGER_OTLP_HTTP=" + otlpHTTP, "JAEGER_OTLP_GRPC=" + otlpGRPC,
			"JAEGER_QUERY_HTTP=" + query, "JAEGER_QUERY_GRPC=" + redistest.FreeAddr(t)}
		p := startProc(t, "jaeger", bin, env, "--config", "file:"+config)
		if jaegerReady(p, 30*time.Second) {
			return &jaegerProc{proc: p, OTLPHTTP: "http://" + otlpHTTP, OTLPGRPC: "http://" + otlpGRPC, URL: "http://" + query}
		}
		if try == 2 {
			t.Fatalf("jaeger did not start (ports %s %s %s)", otlpHTTP, otlpGRPC, query)
		}
		p.kill() // a port was taken in between: try others
	}
}

// jaegerReady waits until Jaeger logs that its pipeline runs; false if it exits first or
// does not say so within d.
func jaegerReady(p *proc, d time.Duration) bool {
	timer := time.NewTimer(d)
	defer timer.Stop()
	for from := 0; ; {
		p.mu.Lock()
		for _, l := range p.lines[from:] {
			if strings.Contains(l, "Everything is ready") {
				p.mu.Unlock()
				return true
			}
		}
		from = len(p.lines)
		exited, ch := p.exited, p.changed
		p.mu.Unlock()
		if exited {
			return false
		}
		select {
		case <-ch:
		case <-timer.C:
			return false
		}
	}
}

// span is a span as Jaeger's API v3 gives it (OTLP JSON), with its resource's service
// instance; attributes as strings.
type span struct {
	TraceID, SpanID, Parent string
	Name                    string
	Kind                    int // 2 server, 3 client (OTLP SpanKind)
	Error                   bool
	Attrs                   map[string]string
	Links                   []spanLink
	Instance                string // service.instance.id
}

type spanLink struct {
	TraceID, SpanID string
	Attrs           map[string]string
}

// OTLP span kinds.
const (
	kindServer = 2
	kindClient = 3
)

type otlpAttrs []struct {
	Key   string `json:"key"`
	Value struct {
		String *string `json:"stringValue"`
		Int    *string `json:"intValue"` // int64 as a JSON string
		Bool   *bool   `json:"boolValue"`
	} `json:"value"`
}

func (as otlpAttrs) strings() map[string]string {
	m := map[string]string{}
	for _, a := range as {
		switch v := a.Value; {
		case v.String != nil:
			m[a.Key] = *v.String
		case v.Int != nil:
			m[a.Key] = *v.Int
		case v.Bool != nil:
			m[a.Key] = fmt.Sprint(*v.Bool)
		}
	}
	return m
}

// spans are the spans of every trace with a span of service that started since since,
// through GET /api/v3/traces. Jaeger's older API (/api/traces, the UI's) shows a link
// only as a FOLLOWS_FROM reference, without its attributes; v3 keeps them.
func (j *jaegerProc) spans(service string, since time.Time) ([]span, error) {
	q := url.Values{
		"query.service_name":   {service},
		"query.num_traces":     {"1000"},
		"query.start_time_min": {since.Add(-time.Minute).UTC().Format(time.RFC3339Nano)},
		"query.start_time_max": {time.Now().Add(time.Minute).UTC().Format(time.RFC3339Nano)},
	}
	resp, err := client.Get(j.URL + "/api/v3/traces?" + q.Encode())
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	if resp.StatusCode == http.StatusNotFound {
		return nil, nil // none yet
	}
	if resp.StatusCode != http.StatusOK {
		return nil, fmt.Errorf("jaeger /api/v3/traces: %s", resp.Status)
	}
	var r struct {
		Result struct {
			ResourceSpans []struct {
				Resource struct {
					Attributes otlpAttrs `json:"attributes"`
				} `json:"resource"`
				ScopeSpans []struct {
					Spans []struct {
						TraceID    string    `json:"traceId"`
						SpanID     string    `json:"spanId"`
						Parent     string    `json:"parentSpanId"`
						Name       string    `json:"name"`
						Kind       int       `json:"kind"`
						Attributes otlpAttrs `json:"attributes"`
						Links      []struct {
							TraceID    string    `json:"traceId"`
							SpanID     string    `json:"spanId"`
							Attributes otlpAttrs `json:"attributes"`
						} `json:"links"`
						Status struct {
							Code int `json:"code"` // 2: error
						} `json:"status"`
					} `json:"spans"`
				} `json:"scopeSpans"`
			} `json:"resourceSpans"`
		} `json:"result"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("jaeger /api/v3/traces: %v", err)
	}
	var out []span
	for _, rs := range r.Result.ResourceSpans {
		res := rs.Resource.Attributes.strings()
		for _, ss := range rs.ScopeSpans {
			if res["service.name"] != service {
				continue
			}
			for _, s := range ss.Spans {
				sp := span{TraceID: s.TraceID, SpanID: s.SpanID, Parent: s.Parent, Name: s.Name, Kind: s.Kind,
					Error: s.Status.Code == 2, Attrs: s.Attributes.strings(), Instance: res["service.instance.id"]}
				for _, l := range s.Links {
					sp.Links = append(sp.Links, spanLink{TraceID: l.TraceID, SpanID: l.SpanID, Attrs: l.Attributes.strings()})
				}
				out = append(out, sp)
			}
		}
	}
	return out, nil
}

// waitSpans polls the query API of j until done says the spans of service are all there,
// and fails the test after d: spans arrive in batches nothing else tells of.
func (j *jaegerProc) waitSpans(t *testing.T, service string, since time.Time, d time.Duration, done func([]span) (bool, string)) {
	t.Helper()
	deadline := time.Now().Add(d)
	for {
		spans, err := j.spans(service, since)
		ok, last := false, fmt.Sprint(err)
		if err == nil {
			ok, last = done(spans)
		}
		if ok {
			return
		}
		if time.Now().After(deadline) {
			t.Fatalf("jaeger: spans of %s not all there within %v; last: %s", service, d, last)
		}
		time.Sleep(100 * time.Millisecond) // polling: Jaeger tells no one when spans arrive
	}
}

// references are the references of the span spanID of trace traceID as the UI's API
// (/api/traces/{id}) shows them: "CHILD_OF <span id>" for its parent, "FOLLOWS_FROM
// <span id>" for a link.
func (j *jaegerProc) references(traceID, spanID string) ([]string, error) {
	resp, err := client.Get(j.URL + "/api/traces/" + traceID)
	if err != nil {
		return nil, err
	}
	defer resp.Body.Close()
	var r struct {
		Data []struct {
			Spans []struct {
				SpanID     string `json:"spanID"`
				References []struct {
					RefType string `json:"refType"`
					SpanID  string `json:"spanID"`
				} `json:"references"`
			} `json:"spans"`
		} `json:"data"`
	}
	if err := json.NewDecoder(resp.Body).Decode(&r); err != nil {
		return nil, fmt.Errorf("jaeger /api/traces/%s: %s: %v", traceID, resp.Status, err)
	}
	for _, t := range r.Data {
		for _, s := range t.Spans {
			if s.SpanID != spanID {
				continue
			}
			var refs []string
			for _, ref := range s.References {
				refs = append(refs, ref.RefType+" "+ref.SpanID)
			}
			return refs, nil
		}
	}
	return nil, fmt.Errorf("jaeger /api/traces/%s: no span %s", traceID, spanID)
}
