package proxy

import (
	"net/http"
	"testing"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
)

// TestSamples is what "samples" means, per API: the table is the rule of ADR 0078.
func TestSamples(t *testing.T) {
	const (
		chat        = "/v1/chat/completions"
		completions = "/v1/completions"
		responses   = "/v1/responses"
		embeddings  = "/v1/embeddings"
		azureChat   = "/openai/deployments/gpt-4o/chat/completions"
	)
	tests := []struct {
		route, body string
		want        bool
	}{
		// Chat Completions: temperature absent (the API's default, 1) or above 0 samples;
		// 0, in any spelling, does not; a seed asks for a repeatable answer.
		{chat, `{"model":"m","messages":[]}`, true},
		{chat, `{"temperature":null}`, true},
		{chat, `{"temperature":1}`, true},
		{chat, `{"temperature":0.2}`, true},
		{chat, `{"temperature":1e-3}`, true},
		{chat, `{"temperature":2E0}`, true},
		{chat, `{"temperature":0}`, false},
		{chat, `{"temperature":0.0}`, false},
		{chat, `{"temperature":-0}`, false},
		{chat, `{"temperature":0e5}`, false},
		{chat, `{"temperature":-1}`, false}, // refused by the API: nothing to share anyway
		{chat, `{"temperature":"0"}`, true}, // not a number: refused by the API, taken as absent
		{chat, `{"seed":42}`, false},
		{chat, `{"seed":0,"temperature":1.5}`, false},
		{chat, `{"seed":null,"temperature":1}`, true},
		{chat, `{"metadata":{"temperature":0}}`, true}, // only the top level counts
		// Completions: the same rule.
		{completions, `{"prompt":"x"}`, true},
		{completions, `{"prompt":"x","temperature":0}`, false},
		{completions, `{"prompt":"x","seed":7}`, false},
		// Responses: temperature only; it takes no seed.
		{responses, `{"input":"x"}`, true},
		{responses, `{"input":"x","temperature":0}`, false},
		{responses, `{"input":"x","seed":7}`, true},
		// Embeddings never sample, nor does any other route.
		{embeddings, `{"input":"x"}`, false},
		{embeddings, `{"input":"x","temperature":1}`, false},
		{"/v1/moderations", `{"input":"x","temperature":1}`, false},
		// Routes are known by their end: Azure's deployment paths too.
		{azureChat, `{"messages":[]}`, true},
		{azureChat, `{"messages":[],"temperature":0}`, false},
	}
	h := hashing.New(hashing.Options{IgnoreFields: []string{"temperature", "seed"}})
	for _, tt := range tests {
		req, err := h.Key(http.MethodPost, tt.route, nil, []byte(tt.body))
		if err != nil {
			t.Fatalf("Key(%s): %v", tt.body, err)
		}
		if got := samples(tt.route, req); got != tt.want {
			t.Errorf("samples(%s, %s) = %v; want %v", tt.route, tt.body, got, tt.want)
		}
	}
}

// TestSamplingOf: under each setting, what is done with a request that samples, a retry
// told apart by the SDKs' retry count; a request that does not sample is left alone.
func TestSamplingOf(t *testing.T) {
	h := hashing.New(hashing.Options{})
	sampled, _ := h.Key(http.MethodPost, "/v1/chat/completions", nil, []byte(`{"messages":[]}`))
	greedy, _ := h.Key(http.MethodPost, "/v1/chat/completions", nil, []byte(`{"messages":[],"temperature":0}`))
	tests := []struct {
		sharing SampledSharing
		req     hashing.Request
		retry   string
		want    sampling
	}{
		{ShareInFlight, sampled, "", sampledInFlight},
		{ShareInFlight, sampled, "0", sampledInFlight},
		{ShareInFlight, sampled, "1", sampledRetry},
		{ShareInFlight, sampled, " 3 ", sampledRetry},
		{ShareInFlight, sampled, "-1", sampledInFlight},
		{ShareInFlight, sampled, "x", sampledInFlight},
		{ShareAndStore, sampled, "1", sampledStore},
		{ShareNever, sampled, "1", sampledNever},
		{ShareInFlight, greedy, "1", ""},
		{ShareNever, greedy, "", ""},
	}
	for _, tt := range tests {
		p := &Proxy{cfg: Config{Sampled: tt.sharing}}
		hdr := http.Header{}
		if tt.retry != "" {
			hdr.Set(HeaderRetryCount, tt.retry)
		}
		if got := p.samplingOf("/v1/chat/completions", tt.req, hdr); got != tt.want {
			t.Errorf("%v, temperature %q, retry count %q: %q; want %q", tt.sharing, tt.req.Temperature, tt.retry, got, tt.want)
		}
	}
}

func TestParseSampledSharing(t *testing.T) {
	for _, s := range []SampledSharing{ShareInFlight, ShareAndStore, ShareNever} {
		if got, err := ParseSampledSharing(s.String()); err != nil || got != s {
			t.Errorf("ParseSampledSharing(%q) = %v, %v; want %v", s.String(), got, err, s)
		}
	}
	for _, bad := range []string{"", "inflight", "Never", "always"} {
		if _, err := ParseSampledSharing(bad); err == nil {
			t.Errorf("ParseSampledSharing(%q) accepted", bad)
		}
	}
}
