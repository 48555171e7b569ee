package e2e

import (
	"crypto/rand"
	"encoding/hex"
	"encoding/json"
	"fmt"
	"io"
	"net/http"
	"regexp"
	"slices"
	"sort"
	"strconv"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/fakeupstream"
)

// tracedReq is a client request of the trace scenario and what came of it.
type tracedReq struct {
	model  string
	in     int    // the instance it was sent to
	parent string // the traceparent it was sent with, "" if none
	ch     <-chan answer
	a      answer
	call   int64 // the upstream call whose answer it got
}

// traceparent is a new W3C trace context, sampled, as a client of the proxy would send.
func traceparent() string {
	b := make([]byte, 24)
	rand.Read(b)
	return "00-" + hex.EncodeToString(b[:16]) + "-" + hex.EncodeToString(b[16:]) + "-01"
}

// splitTraceparent is the trace id and the span id of a traceparent.
func splitTraceparent(tp string) (traceID, spanID string) {
	parts := strings.Split(tp, "-")
	if len(parts) != 4 {
		return "", ""
	}
	return parts[1], parts[2]
}

// The span name of a chat request (server) and of a chat call upstream (client).
const (
	chatSpan = "POST " + chatPath
	chatCall = "chat "
)

// TestTracesLinkEveryAnswerToItsCall: three instances on one Redis export their spans to a
// real Jaeger, one over OTLP/gRPC and two over OTLP/HTTP. A herd over the three shares one
// upstream call and later requests are hits of its stored answer; a second flight's owner
// is stopped (SIGSTOP) until a follower elsewhere takes the flight over as attempt 2, and
// later requests are hits of that answer. Some requests bring a traceparent. Jaeger's query
// API then shows: one client span per upstream call, whose context the upstream received in
// traceparent, a child of its owner's server span; a server span per request, in the trace
// its traceparent named; and on every follower's and hit's server span exactly one link, to
// the client span of the call that made its answer (after the takeover, attempt 2's), with
// the reason (follower, takeover, hit) and the attempt.
func TestTracesLinkEveryAnswerToItsCall(t *testing.T) {
	j := startJaeger(t)
	const service = "llm-dedupe-e2e"
	since := time.Now()
	c := startCluster(t, clusterOpts{
		env: map[string]string{
			"OTEL_SERVICE_NAME":           service,
			"OTEL_EXPORTER_OTLP_ENDPOINT": j.OTLPHTTP,
			"OTEL_EXPORTER_OTLP_PROTOCOL": "http/protobuf",
			"OTEL_BSP_SCHEDULE_DELAY":     "100", // ms: a span leaves soon after it ends
		},
		envOf: func(i int) map[string]string {
			if i != 1 {
				return nil
			}
			return map[string]string{"OTEL_EXPORTER_OTLP_ENDPOINT": j.OTLPGRPC, "OTEL_EXPORTER_OTLP_PROTOCOL": "grpc"}
		},
	})
	var reqs []*tracedReq
	send := func(model string, in int, withParent bool) *tracedReq {
		r := &tracedReq{model: model, in: in}
		var hdr []string
		if withParent {
			r.parent = traceparent()
			hdr = []string{"Traceparent", r.parent}
		}
		r.ch = postAsync(c.ins[in].URL, chatPath, chatBody(model, "trace me"), apiKeyA, hdr...)
		reqs = append(reqs, r)
		return r
	}
	finish := func(call int64, role string, rs ...*tracedReq) {
		t.Helper()
		for i, r := range rs {
			r.a = <-r.ch
			r.call = wantChat(t, fmt.Sprintf("%s client %d on %s", r.model, i, c.ins[r.in].name), r.a, r.model, call)
			if role != "" && r.a.role() != role {
				t.Errorf("%s client %d on %s: role %q; want %s", r.model, i, c.ins[r.in].name, r.a.role(), role)
			}
		}
	}

	// A herd: call 1, owned on the first instance; then hits of its answer.
	herd := "e2e-trace-herd"
	c.fake.set(fakeupstream.Behavior{Hold: true})
	owner := send(herd, 0, true)
	c.fake.waitFor(fakeupstream.Stats{Calls: 1}, 10*time.Second)
	var followers []*tracedReq
	for i := range 30 {
		followers = append(followers, send(herd, i%3, i%2 == 0))
	}
	waitWaiting(t, c.ins, 31)
	c.fake.release()
	finish(1, "owner", owner)
	finish(1, "follower", followers...)
	for i := range 6 {
		finish(1, "hit", send(herd, i%3, i%2 == 1))
	}

	// A takeover: call 2, owned on the first instance, which is stopped until a follower on
	// another instance calls again (call 3, attempt 2); then hits of call 3's answer.
	tk := "e2e-trace-takeover"
	c.fake.set(fakeupstream.Behavior{Hold: true})
	flight := []*tracedReq{send(tk, 0, true)}
	c.fake.waitFor(fakeupstream.Stats{Calls: 2}, 10*time.Second)
	for i := range 16 {
		flight = append(flight, send(tk, i%3, i%2 == 1)) // the owner's instance too
	}
	waitWaiting(t, c.ins, 17)
	takeover := c.fake.timeTo(fakeupstream.Stats{Calls: 3}, 10*time.Second)
	c.ins[0].pause()
	took := takeover()
	c.ins[0].resume()
	// Continued, the old owner learns it lost the lease and cancels its call.
	c.fake.waitFor(fakeupstream.Stats{Calls: 3, Abandoned: 1}, 5*time.Second)
	c.fake.release()
	finish(3, "", flight...)
	t.Logf("takeover after %v; the stopped owner's client was answered as %s", took.Round(time.Millisecond), flight[0].a.role())
	for i := range 3 {
		finish(3, "hit", send(tk, i, i == 1))
	}
	if t.Failed() {
		t.FailNow() // the answers are wrong: their spans would say nothing more
	}

	// What the upstream received: each call with the trace context of a span of its own.
	calls := c.fake.calls()
	if len(calls) != 3 {
		t.Fatalf("upstream calls %d; want 3", len(calls))
	}
	model := map[int64]string{1: herd, 2: tk, 3: tk}
	for _, call := range calls {
		if !strings.Contains(call.Body, strconv.Quote(model[call.N])) {
			t.Errorf("call %d: body %s; want model %s", call.N, call.Body, model[call.N])
		}
		if tid, sid := splitTraceparent(call.Traceparent); len(tid) != 32 || len(sid) != 16 {
			t.Fatalf("call %d: traceparent %q; want one", call.N, call.Traceparent)
		}
	}

	// Spans travel while the instances run (every 100 ms); then the instances stop
	// (SIGTERM: they flush what is left) and Jaeger holds every span there will be.
	wantServer := len(reqs)
	j.waitSpans(t, service, since, 30*time.Second, func(spans []span) (bool, string) {
		server, client := 0, 0
		for _, s := range spans {
			switch {
			case s.Kind == kindServer && s.Name == chatSpan:
				server++
			case s.Kind == kindClient:
				client++
			}
		}
		return server >= wantServer && client >= 3, fmt.Sprintf("%d server spans, %d client spans", server, client)
	})
	wantExemplars(t, c.ins)
	for _, in := range c.ins {
		in.signal(syscall.SIGTERM)
	}
	for _, in := range c.ins {
		if code := in.wait(10 * time.Second); code != 0 {
			t.Errorf("%s exited with status %d; want 0", in.name, code)
		}
	}
	spans, err := j.spans(service, since)
	if err != nil {
		t.Fatal(err)
	}
	checkTraces(t, c, j, spans, traceScenario{reqs: reqs, calls: calls,
		answerOf: map[string]int64{herd: 1, tk: 3}, ranBy: map[int64]*tracedReq{1: owner, 2: flight[0]}})
}

// traceScenario is what the trace scenario did: its requests, the upstream calls, the call
// whose answer every request of a model got, and the request that ran a call (the takeover's
// call excepted: which follower takes over is not known).
type traceScenario struct {
	reqs     []*tracedReq
	calls    []fakeupstream.Call
	answerOf map[string]int64
	ranBy    map[int64]*tracedReq
}

// checkTraces checks the spans in Jaeger against what the scenario did.
func checkTraces(t *testing.T, c *cluster, j *jaegerProc, spans []span, sc traceScenario) {
	t.Helper()
	reqs, calls, answerOf := sc.reqs, sc.calls, sc.answerOf
	byID := map[string]span{}
	var server, client []span
	for _, s := range spans {
		byID[s.SpanID] = s
		switch {
		case s.Kind == kindServer:
			server = append(server, s)
		case s.Kind == kindClient:
			client = append(client, s)
		}
	}

	// One client span per call, the one whose context the upstream received.
	if len(client) != len(calls) {
		t.Errorf("client spans %d; want %d, one per upstream call", len(client), len(calls))
	}
	callSpan := map[int64]span{}
	attempt := map[int64]string{1: "1", 2: "1", 3: "2"}
	for _, call := range calls {
		tid, sid := splitTraceparent(call.Traceparent)
		s, ok := byID[sid]
		if !ok || s.Kind != kindClient || s.TraceID != tid {
			t.Errorf("call %d: upstream received traceparent %s; no client span with that trace and span id", call.N, call.Traceparent)
			continue
		}
		callSpan[call.N] = s
		model := jsonModel(call.Body)
		if s.Name != chatCall+model || s.Attrs["gen_ai.request.model"] != model || s.Attrs["gen_ai.operation.name"] != "chat" {
			t.Errorf("call %d: span %q %v; want %q, gen_ai.request.model %s", call.N, s.Name, s.Attrs, chatCall+model, model)
		}
		if s.Attrs["llm_dedupe.attempt"] != attempt[call.N] {
			t.Errorf("call %d: llm_dedupe.attempt %q; want %s", call.N, s.Attrs["llm_dedupe.attempt"], attempt[call.N])
		}
		// Its parent is the server span of the request that ran it, in the same trace (the
		// one that request brought, if any), on the same instance.
		p, ok := byID[s.Parent]
		if !ok || p.Kind != kindServer || p.Name != chatSpan || p.TraceID != s.TraceID || p.Instance != s.Instance {
			t.Errorf("call %d: parent span %s %+v; want the server span of the request that ran it", call.N, s.Parent, p)
			continue
		}
		if r := sc.ranBy[call.N]; r != nil {
			rtid, rsid := splitTraceparent(r.parent)
			if p.TraceID != rtid || p.Parent != rsid {
				t.Errorf("call %d: in trace %s under span %s; want the trace %s of the request that ran it, under its span %s",
					call.N, p.TraceID, p.Parent, rtid, rsid)
			}
		} else if p.Attrs["llm_dedupe.role"] != "owner" {
			t.Errorf("call %d: the request that ran it has role %q; want owner", call.N, p.Attrs["llm_dedupe.role"])
		}
	}
	if s := callSpan[1]; s.Error || s.Attrs["gen_ai.response.id"] != "chatcmpl-1" {
		t.Errorf("call 1: error %v, gen_ai.response.id %q; want no error, chatcmpl-1", s.Error, s.Attrs["gen_ai.response.id"])
	}
	if s := callSpan[2]; !s.Error {
		t.Errorf("call 2 (cancelled when its owner lost the flight): span without error status")
	}
	if s := callSpan[3]; s.Error || s.Attrs["gen_ai.response.id"] != "chatcmpl-3" || s.Attrs["llm_dedupe.takeover"] == "" {
		t.Errorf("call 3: error %v, gen_ai.response.id %q, llm_dedupe.takeover %q; want a takeover's call answered chatcmpl-3",
			s.Error, s.Attrs["gen_ai.response.id"], s.Attrs["llm_dedupe.takeover"])
	}

	// A server span per request, from the instance it was sent to; one with a traceparent
	// in that trace, a child of the span it named, with the role its client was told.
	var chat []span
	for _, s := range server {
		if s.Name == chatSpan {
			chat = append(chat, s)
		}
	}
	if len(chat) != len(reqs) {
		t.Errorf("server spans %q: %d; want %d, one per request", chatSpan, len(chat), len(reqs))
	}
	pids := map[string]string{} // service.instance.id: hostname-pid
	for _, in := range c.ins {
		pids[strconv.Itoa(in.cmd.Process.Pid)] = in.name
	}
	perInstance, wantPer := map[string]int{}, map[string]int{}
	for _, s := range chat {
		perInstance[pids[s.Instance[strings.LastIndexByte(s.Instance, '-')+1:]]]++
	}
	byParent := map[string]span{}
	for _, s := range chat {
		byParent[s.TraceID+"/"+s.Parent] = s
	}
	roles, wantRoles := map[string]int{}, map[string]int{}
	for _, s := range chat {
		roles[s.Attrs["llm_dedupe.role"]]++
	}
	for i, r := range reqs {
		wantPer[c.ins[r.in].name]++
		wantRoles[r.a.role()]++
		if r.parent == "" {
			continue
		}
		tid, sid := splitTraceparent(r.parent)
		s, ok := byParent[tid+"/"+sid]
		if !ok {
			t.Errorf("request %d (%s, %s, traceparent %s): no server span in its trace with its span for parent", i, r.model, r.a.role(), r.parent)
			continue
		}
		if s.Attrs["llm_dedupe.role"] != r.a.role() {
			t.Errorf("request %d: span role %q; its client was told %q", i, s.Attrs["llm_dedupe.role"], r.a.role())
		}
	}
	if fmt.Sprint(perInstance) != fmt.Sprint(wantPer) {
		t.Errorf("server spans per instance %v; want %v (instance B exports over gRPC, the others over HTTP)", perInstance, wantPer)
	}
	if fmt.Sprint(roles) != fmt.Sprint(wantRoles) {
		t.Errorf("server spans by llm_dedupe.role %v; the clients were told %v", roles, wantRoles)
	}

	// Every request answered by another request's call links to that call's client span:
	// followers, hits, and the stopped owner's request when the takeover's answer served
	// it; the request that ran the call links to none.
	for _, s := range chat {
		role, m := s.Attrs["llm_dedupe.role"], s.Attrs["gen_ai.request.model"]
		call := answerOf[m]
		want := callSpan[call]
		if s.Attrs["llm_dedupe.attempt"] != attempt[call] {
			t.Errorf("%s span %s (%s): llm_dedupe.attempt %q; want %s", role, s.SpanID, m, s.Attrs["llm_dedupe.attempt"], attempt[call])
		}
		if s.SpanID == want.Parent {
			if len(s.Links) != 0 || role != "owner" {
				t.Errorf("%s span %s (%s) ran the call of its answer: links %+v; want an owner with none", role, s.SpanID, m, s.Links)
			}
			continue
		}
		reason := "follower"
		switch {
		case role == "hit":
			reason = "hit"
		case call == 3:
			reason = "takeover"
		}
		if len(s.Links) != 1 || s.Links[0].TraceID != want.TraceID || s.Links[0].SpanID != want.SpanID ||
			s.Links[0].Attrs["llm_dedupe.link.reason"] != reason {
			t.Errorf("%s span %s (%s): links %+v; want one to call %d's client span %s/%s, reason %s",
				role, s.SpanID, m, s.Links, call, want.TraceID, want.SpanID, reason)
		}
	}

	// The phases inside a flight: the owner's look-up, the waits, the takeover.
	phases := map[string]int{}
	for _, s := range spans {
		if strings.HasPrefix(s.Name, "dedupe.") {
			phases[s.Name]++
		}
	}
	names := make([]string, 0, len(phases))
	for n := range phases {
		names = append(names, n)
	}
	sort.Strings(names)
	t.Logf("spans: %d client, %d server, phases %v", len(client), len(chat), phases)
	for _, n := range []string{"dedupe.lookup", "dedupe.wait", "dedupe.takeover"} {
		if phases[n] == 0 {
			t.Errorf("no %s span; want some (got %v)", n, names)
		}
	}

	// The UI's API shows a link as a FOLLOWS_FROM reference (without its attributes).
	for _, s := range chat {
		if s.Attrs["llm_dedupe.role"] != "hit" {
			continue
		}
		if len(s.Links) == 0 {
			break // told above
		}
		refs, err := j.references(s.TraceID, s.SpanID)
		if err != nil {
			t.Error(err)
		} else if want := "FOLLOWS_FROM " + s.Links[0].SpanID; !slices.Contains(refs, want) {
			t.Errorf("hit span %s in /api/traces: references %v; want %s", s.SpanID, refs, want)
		}
		break
	}
}

// jsonModel is the model a request body names.
func jsonModel(body string) string {
	var v struct {
		Model string `json:"model"`
	}
	_ = json.Unmarshal([]byte(body), &v)
	return v.Model
}

// wantExemplars: asked for OpenMetrics, as Prometheus asks, every traced instance's request
// durations carry a trace ID as an exemplar, and the instance that called the upstream its
// upstream durations too.
func wantExemplars(t *testing.T, ins []*instance) {
	t.Helper()
	upstream := 0
	for _, in := range ins {
		req, _ := http.NewRequest(http.MethodGet, in.URL+"/metrics", nil)
		req.Header.Set("Accept", "application/openmetrics-text; version=1.0.0")
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			t.Fatal(err)
		}
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		exemplar := regexp.MustCompile(`(?m)^llm_dedupe_(request|upstream)_duration_seconds_bucket\{.*\} \d+ # \{trace_id="[0-9a-f]{32}"\}`)
		kinds := map[string]bool{}
		for _, m := range exemplar.FindAllStringSubmatch(string(b), -1) {
			kinds[m[1]] = true
		}
		if !kinds["request"] {
			t.Errorf("%s: no request duration exemplar in its OpenMetrics (%s)", in.name, resp.Header.Get("Content-Type"))
		}
		if kinds["upstream"] {
			upstream++
		}
	}
	if upstream == 0 {
		t.Error("no instance has an upstream duration exemplar")
	}
}
