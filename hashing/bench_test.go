package hashing

import (
	"net/http"
	"testing"
)

// benchBody is a chat request of about 2 KB, as a client library sends it (compact, in its
// own key order), with a system prompt, a few turns, and the usual parameters.
var benchBody = []byte(`{"model":"gpt-4o-mini","messages":[` +
	`{"role":"system","content":"You are a helpful assistant for an online bookshop. Answer in two or three sentences, cite the catalogue number of every book you mention, and never invent a book that is not in the catalogue. If the customer asks about an order, ask for the order number first. Prices are in euros and include VAT."},` +
	`{"role":"user","content":"Hello! I am looking for a gift for my father, who likes naval history and long novels. He has already read everything by Patrick O'Brian."},` +
	`{"role":"assistant","content":"Since he enjoyed O'Brian, he may like C. S. Forester's Hornblower saga (cat. 20331), which follows one officer through the Napoleonic wars, or Dudley Pope's Ramage series (cat. 20417). Both are long, rich in period detail and available as boxed sets."},` +
	`{"role":"user","content":[{"type":"text","text":"The Hornblower set sounds good. Is there a hardcover edition, how much does it cost, and could you gift-wrap it? Also, \"when\" would it arrive in Lyon if I order today?"}]},` +
	`{"role":"assistant","content":"Yes: the hardcover boxed set (cat. 20331-H) costs 89.90 and we can gift-wrap it for 3.50. Orders placed before 14:00 usually reach Lyon within two working days."},` +
	`{"role":"assistant","content":"With pleasure. I have added the hardcover Hornblower set to your basket with gift-wrapping; you can review it before paying."},` +
	`{"role":"user","content":"Perfect. Please also suggest one non-fiction book about the same period, ideally with maps and illustrations, under 40 euros."}],` +
	`"temperature":0.7,"top_p":1,"max_tokens":512,"presence_penalty":0,"frequency_penalty":0,"n":1,"stream":true,` +
	`"stream_options":{"include_usage":true},"seed":1234567890,"user":"customer-8d1f6b0e-2c4a-4f3b-9e77-5a0c1d2e3f40",` +
	`"response_format":{"type":"text"},"logit_bias":{"50256":-100,"198":-1.5},"metadata":{"shop":"bookshop-eu","session":"a1b2c3d4e5"}}`)

func BenchmarkKey(b *testing.B) {
	h := New(Options{IgnoreFields: []string{"user"}})
	header := http.Header{"Authorization": {"Bearer sk-proj-0123456789abcdefghijklmnopqrstuvwxyzABCDEF"}}
	b.SetBytes(int64(len(benchBody)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := h.Key("POST", "/v1/chat/completions", header, benchBody); err != nil {
			b.Fatal(err)
		}
	}
}

func BenchmarkCanonicalize(b *testing.B) {
	b.SetBytes(int64(len(benchBody)))
	b.ReportAllocs()
	for b.Loop() {
		if _, err := Canonicalize(benchBody, []string{"user"}); err != nil {
			b.Fatal(err)
		}
	}
}

func TestBenchBodySize(t *testing.T) {
	if n := len(benchBody); n < 1800 || n > 2400 {
		t.Errorf("benchBody is %d bytes; want about 2 KB", n)
	}
	if _, err := Canonicalize(benchBody, nil); err != nil {
		t.Fatal(err)
	}
}
