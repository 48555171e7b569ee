package hashing_test

import (
	"net/http"
	"testing"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/hashing"
)

func TestNamespaceSeparatesKeys(t *testing.T) {
	h := hashing.New(hashing.Options{})
	hdr := http.Header{"Authorization": {"Bearer k"}}
	body := []byte(`{"model":"m","messages":[]}`)
	key := func(ns hashing.Namespace) string {
		t.Helper()
		r, err := h.KeyIn(ns, "POST", "/v1/chat/completions", hdr, body)
		if err != nil {
			t.Fatal(err)
		}
		return r.Key
	}
	plain, err := h.Key("POST", "/v1/chat/completions", hdr, body)
	if err != nil {
		t.Fatal(err)
	}
	if got := key(hashing.Namespace{}); got != plain.Key {
		t.Fatalf("the zero namespace changed the key: %s; want %s", got, plain.Key)
	}
	seen := map[string]hashing.Namespace{plain.Key: {}}
	for _, ns := range []hashing.Namespace{
		{Name: "a"}, {Name: "b"}, {Name: "a", Gen: 1}, {Name: "a", Gen: 2}, {Gen: 1}, {Name: "a1"}, {Name: "a", Gen: 11},
	} {
		k := key(ns)
		if prev, ok := seen[k]; ok {
			t.Fatalf("namespaces %+v and %+v share key %s", prev, ns, k)
		}
		seen[k] = ns
		if again := key(ns); again != k {
			t.Fatalf("namespace %+v: key %s then %s", ns, k, again)
		}
	}
}
