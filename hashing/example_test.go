package hashing_test

import (
	"fmt"
	"net/http"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
)

func ExampleCanonicalize() {
	body := []byte(`{
		"user": "alice",
		"temperature": 1.0,
		"model": "gpt-4o",
		"messages": [{"role": "user", "content": "Caf\u00e9?  "}],
		"max_tokens": 1e3
	}`)
	out, err := hashing.Canonicalize(body, []string{"user"})
	if err != nil {
		panic(err)
	}
	fmt.Println(string(out))
	// Output:
	// {"max_tokens":1000,"messages":[{"content":"Café?  ","role":"user"}],"model":"gpt-4o","temperature":1}
}

func ExampleHasher_Key() {
	h := hashing.New(hashing.Options{IgnoreFields: []string{"user"}})
	header := http.Header{"Authorization": {"Bearer sk-example"}}

	a, err := h.Key("POST", "/v1/chat/completions", header, []byte(
		`{"model":"gpt-4o","stream":true,"user":"alice","messages":[{"role":"user","content":"Hi"}]}`))
	if err != nil {
		panic(err)
	}
	// The same request: other key order, whitespace and user, content as a text part.
	b, err := h.Key("POST", "/v1/chat/completions", header, []byte(`{
		"messages": [{"content": [{"type": "text", "text": "Hi"}], "role": "user"}],
		"stream": true, "model": "gpt-4o", "user": "bob"}`))
	if err != nil {
		panic(err)
	}
	// Another credential: another key.
	c, err := h.Key("POST", "/v1/chat/completions", http.Header{"Authorization": {"Bearer sk-other"}}, []byte(
		`{"model":"gpt-4o","stream":true,"messages":[{"role":"user","content":"Hi"}]}`))
	if err != nil {
		panic(err)
	}
	fmt.Println(string(a.Canonical))
	fmt.Println(a.Model, a.Stream, b.Folded)
	fmt.Println(a.Key == b.Key, a.Key == c.Key)
	// Output:
	// {"messages":[{"content":"Hi","role":"user"}],"model":"gpt-4o","stream":true}
	// gpt-4o true [chat-content-single-text-part]
	// true false
}
