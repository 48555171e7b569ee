package proxy_test

import (
	"testing"
	"time"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/internal/redistest"
	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/singleflight"
)

// TestSavedTokensOfHits: hits count the tokens their answer reports, whether the usage was
// read once when the answer was kept (AnnotateUsage, as cmd wires it) or from the bytes each
// hit is sent (a Flights without it, and the hit that reads an answer from Redis), for
// unary and streamed answers of both APIs.
func TestSavedTokensOfHits(t *testing.T) {
	rs := redistest.Start(t)
	const hits = 4
	for _, api := range []struct {
		name, path, body   string
		prompt, completion float64 // per hit
	}{
		{"chat", "/v1/chat/completions", chatBody, 11, 7},
		{"chat stream", "/v1/chat/completions", streamBody, 11, 5},
		{"responses", "/v1/responses", `{"model":"gpt-test","temperature":0,"input":"hello"}`, 11, 7},
		{"responses stream", "/v1/responses", `{"model":"gpt-test","temperature":0,"stream":true,"input":"hello"}`, 11, 5},
	} {
		for _, annotate := range []bool{true, false} {
			for _, backend := range []string{"memory", "redis"} {
				name := api.name + "/" + backend + "/annotate"
				if !annotate {
					name = api.name + "/" + backend + "/no-annotate"
				}
				t.Run(name, func(t *testing.T) {
					up := startUpstream(t)
					s := setup{flight: singleflight.Options{ResultTTL: time.Minute, KeyPrefix: "usage:" + name}, noAnnotate: !annotate}
					ins := []*instance{newInstance(t, up, s)}
					if backend == "redis" {
						s.redis = rs
						ins = []*instance{newInstance(t, up, s), newInstance(t, up, s)}
					}
					first := post(t, ins[0].URL, api.path, api.body)
					if first.status != 200 || first.header.Get("X-Dedupe-Role") != "owner" {
						t.Fatalf("first: status %d role %q; want 200 owner", first.status, first.header.Get("X-Dedupe-Role"))
					}
					for i := range hits {
						a := post(t, ins[i%len(ins)].URL, api.path, api.body)
						if a.header.Get("X-Dedupe-Role") != "hit" || a.body != first.body {
							t.Fatalf("hit %d: role %q; want hit with the owner's body", i, a.header.Get("X-Dedupe-Role"))
						}
					}
					prompt, completion := 0.0, 0.0
					for _, in := range ins {
						prompt += value(t, in.Reg, "llm_dedupe_saved_tokens_total", map[string]string{"model": "gpt-test", "kind": "prompt"})
						completion += value(t, in.Reg, "llm_dedupe_saved_tokens_total", map[string]string{"model": "gpt-test", "kind": "completion"})
					}
					if prompt != hits*api.prompt || completion != hits*api.completion {
						t.Fatalf("saved %v prompt and %v completion tokens; want %v and %v",
							prompt, completion, hits*api.prompt, hits*api.completion)
					}
				})
			}
		}
	}
}
