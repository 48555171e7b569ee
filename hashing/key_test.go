package hashing

import (
	"crypto/sha256"
	"encoding/hex"
	"fmt"
	"net/http"
	"path/filepath"
	"reflect"
	"slices"
	"strings"
	"sync"
	"testing"
)

func keyOf(t *testing.T, h *Hasher, r httpRequest) Request {
	t.Helper()
	req, err := h.Key(r.method, r.path, r.header, r.body)
	if err != nil {
		t.Fatalf("Key(%s %s, %s): %v", r.method, r.path, r.body, err)
	}
	return req
}

// TestKeyEqual: every request in a file of testdata/equal has the same key.
func TestKeyEqual(t *testing.T) {
	for _, path := range goldenFiles(t, "equal") {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			g := readGolden(t, path)
			h := g.hasher(t)
			first := keyOf(t, h, parseRequest(t, g.sections[0].data))
			for _, s := range g.sections[1:] {
				got := keyOf(t, h, parseRequest(t, s.data))
				if got.Key != first.Key {
					t.Errorf("key of %q = %s; want %s, the key of %q\n%s\n%s",
						s.name, got.Key, first.Key, g.sections[0].name, got.Canonical, first.Canonical)
				}
			}
		})
	}
}

// TestKeyUnequal: no two requests in a file of testdata/unequal share a key.
func TestKeyUnequal(t *testing.T) {
	for _, path := range goldenFiles(t, "unequal") {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			g := readGolden(t, path)
			h := g.hasher(t)
			seen := map[string]string{} // key → section name
			for _, s := range g.sections {
				got := keyOf(t, h, parseRequest(t, s.data))
				if other, ok := seen[got.Key]; ok {
					t.Errorf("%q and %q share key %s; want different keys\n%s", s.name, other, got.Key, got.Canonical)
				}
				seen[got.Key] = s.name
			}
		})
	}
}

// TestKeyMaterial pins the exact formula, so that a change that would move every key
// (and make instances of two versions stop sharing) is a deliberate one.
func TestKeyMaterial(t *testing.T) {
	body := []byte(`{ "model": "gpt-4o", "messages": [{"role": "user", "content": "hi"}], "user": "u1" }`)
	canonical := `{"messages":[{"content":"hi","role":"user"}],"model":"gpt-4o"}`
	header := http.Header{}
	header.Set("Authorization", "Bearer sk-test")
	header.Set("OpenAI-Project", "proj_1")

	cred := sha256.Sum256([]byte("Authorization\x01\x0eBearer sk-test" + "Api-Key\x00" +
		"Openai-Organization\x00" + "Openai-Project\x01\x06proj_1"))
	tenant := sha256.Sum256([]byte("X-Tenant\x01\x04acme"))
	header.Set("X-Tenant", "acme")

	tests := []struct {
		scope    string
		material string
		pinned   string
	}{
		{"credential", "credential:" + hex.EncodeToString(cred[:]),
			"bc6c37704d236f8331160155251538bfd4bfbda163c18c7b51cc04f4707014d3"},
		{"header:x-tenant", "header:X-Tenant:" + hex.EncodeToString(tenant[:]),
			"ec484d864b79fd4e0b679b69e07cd406be6ecdd52faff97c44095df689f5119b"},
		{"global", "global",
			"cc9b2ac42f62efa84e6dd3311aede91bdd040a0f9357c171a5ff9b53482f6ec3"},
	}
	for _, tt := range tests {
		scope, err := ParseScope(tt.scope)
		if err != nil {
			t.Fatal(err)
		}
		got, err := New(Options{Scope: scope, IgnoreFields: []string{"user"}}).Key("POST", "/v1/chat/completions", header, body)
		if err != nil {
			t.Fatal(err)
		}
		sum := sha256.Sum256([]byte(tt.material + "\x00POST /v1/chat/completions\x00" + canonical))
		if want := hex.EncodeToString(sum[:]); got.Key != want {
			t.Errorf("%s: key %s; want %s", tt.scope, got.Key, want)
		}
		if got.Key != tt.pinned {
			t.Errorf("%s: key %s; want the pinned %s (did the key format change on purpose?)", tt.scope, got.Key, tt.pinned)
		}
		if string(got.Canonical) != canonical {
			t.Errorf("%s: canonical %s; want %s", tt.scope, got.Canonical, canonical)
		}
	}
}

// TestScopeKindsApart: the scope tag keeps kinds apart even where no header is set, and
// an empty credential is not an absent one.
func TestScopeKindsApart(t *testing.T) {
	body := []byte(`{"model":"m"}`)
	keys := map[string]string{}
	add := func(scope string, header http.Header) {
		t.Helper()
		sc, err := ParseScope(scope)
		if err != nil {
			t.Fatal(err)
		}
		r, err := New(Options{Scope: sc}).Key("POST", "/v1/x", header, body)
		if err != nil {
			t.Fatal(err)
		}
		name := fmt.Sprintf("%s with %v", scope, header)
		if other, ok := keys[r.Key]; ok {
			t.Errorf("%s and %s share a key; want different keys", name, other)
		}
		keys[r.Key] = name
	}
	for _, s := range []string{"credential", "global", "header:Authorization", "header:X-Tenant", "header:Api-Key"} {
		add(s, nil)
	}
	add("credential", http.Header{"Authorization": {""}})
	add("credential", http.Header{"Authorization": {"a", "b"}})
	add("credential", http.Header{"Authorization": {"ab"}})
	add("credential", http.Header{"Authorization": {"a"}, "Api-Key": {"b"}})
	add("header:X-Tenant", http.Header{"X-Tenant": {""}})
}

func TestCredentialNotInMaterial(t *testing.T) {
	header := http.Header{"Authorization": {"Bearer sk-secret-value"}}
	p := getParser(nil)
	defer putParser(p)
	m := Scope{}.appendMaterial(nil, header, &p.scratch)
	if strings.Contains(string(m), "sk-secret") || len(m) != len("credential:")+64 {
		t.Errorf("credential scope material %q; want credential: and 64 hex digits", m)
	}
}

func TestRequestFields(t *testing.T) {
	tests := []struct {
		path, body string
		model      string
		stream     bool
		folded     []string
	}{
		{"/v1/chat/completions", `{"model":"gpt-4o","stream":true,"messages":[]}`, "gpt-4o", true, nil},
		{"/v1/chat/completions", `{"model":"gpt-\u0034o","stream":false}`, "gpt-4o", false, nil},
		{"/v1/chat/completions", `{"model":4,"stream":"true"}`, "", false, nil},
		{"/v1/chat/completions", `{"stream":1}`, "", false, nil},
		{"/v1/chat/completions", `{"user":"u","model":"m","stream":true}`, "m", true, nil},
		{"/v1/chat/completions", `{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
			"", false, []string{"chat-content-single-text-part"}},
		{"/v1/chat/completions?x=1", `{"messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`,
			"", false, []string{"chat-content-single-text-part"}},
		{"/v1/responses", `{"model":"o3","input":[{"role":"user","content":"x"}]}`,
			"o3", false, []string{"responses-input-single-user-message"}},
		{"/v1/responses", `{"input":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`, "", false, nil},
		{"/v1/embeddings", `{"input":[{"role":"user","content":"x"}]}`, "", false, nil},
	}
	h := New(Options{IgnoreFields: []string{"user", "model", "stream"}})
	for _, tt := range tests {
		got, err := h.Key("POST", tt.path, nil, []byte(tt.body))
		if err != nil {
			t.Fatalf("Key(%s): %v", tt.body, err)
		}
		if got.Model != tt.model || got.Stream != tt.stream || !slices.Equal(got.Folded, tt.folded) {
			t.Errorf("Key(%s %s) = model %q, stream %v, folded %q; want %q, %v, %q",
				tt.path, tt.body, got.Model, got.Stream, got.Folded, tt.model, tt.stream, tt.folded)
		}
		if len(got.Key) != 64 || strings.Trim(got.Key, "0123456789abcdef") != "" {
			t.Errorf("key %q; want 64 lower-case hex digits", got.Key)
		}
	}
}

// TestSamplingFields: "temperature" is read if it is a number, in canonical form, and
// "seed" if it is there and not null; even when the key leaves them out, neither is
// read from a nested object.
func TestSamplingFields(t *testing.T) {
	tests := []struct {
		body        string
		temperature string
		seed        bool
	}{
		{`{"messages":[]}`, "", false},
		{`{"temperature":0.7}`, "0.7", false},
		{`{"temperature":0.0,"seed":1}`, "0", true},
		{`{"temperature":1E0,"seed":0}`, "1", true},
		{`{"temperature":null,"seed":null}`, "", false},
		{`{"temperature":"0","seed":"x"}`, "", true},
		{`{"metadata":{"temperature":0,"seed":1}}`, "", false},
	}
	for _, ignore := range [][]string{nil, {"temperature", "seed"}} {
		h := New(Options{IgnoreFields: ignore})
		for _, tt := range tests {
			got, err := h.Key("POST", "/v1/chat/completions", nil, []byte(tt.body))
			if err != nil {
				t.Fatalf("Key(%s): %v", tt.body, err)
			}
			if got.Temperature != tt.temperature || got.Seed != tt.seed {
				t.Errorf("Key(%s) ignoring %q = temperature %q, seed %v; want %q, %v",
					tt.body, ignore, got.Temperature, got.Seed, tt.temperature, tt.seed)
			}
		}
	}
}

// TestSkipCanonical: a Hasher that skips the canonical text makes the same request, key
// included, without it.
func TestSkipCanonical(t *testing.T) {
	o := Options{IgnoreFields: []string{"user"}}
	full := New(o)
	o.SkipCanonical = true
	lean := New(o)
	hdr := http.Header{"Authorization": {"Bearer sk-1"}}
	body := []byte(`{"model":"m","stream":true,"user":"u","messages":[{"role":"user","content":[{"type":"text","text":"x"}]}]}`)
	ns := Namespace{Name: "app", Gen: 2}
	want, err := full.KeyIn(ns, "POST", "/v1/chat/completions", hdr, body)
	if err != nil {
		t.Fatal(err)
	}
	got, err := lean.KeyIn(ns, "POST", "/v1/chat/completions", hdr, body)
	if err != nil {
		t.Fatal(err)
	}
	if got.Canonical != nil {
		t.Errorf("Canonical %q; want nil", got.Canonical)
	}
	want.Canonical = nil
	if !reflect.DeepEqual(got, want) {
		t.Errorf("got %+v; want %+v", got, want)
	}
}

func TestFoldedCanonical(t *testing.T) {
	h := New(Options{})
	got, err := h.Key("POST", "/v1/chat/completions", nil, []byte(
		`{"messages":[{"role":"user","content":[{"type":"text","text":"a\u0062"}]},{"role":"user","content":[{"type":"text","text":"x"},{"type":"text","text":"y"}]}]}`))
	if err != nil {
		t.Fatal(err)
	}
	want := `{"messages":[{"content":"ab","role":"user"},{"content":[{"text":"x","type":"text"},{"text":"y","type":"text"}],"role":"user"}]}`
	if string(got.Canonical) != want {
		t.Errorf("canonical %s; want %s", got.Canonical, want)
	}
	again, err := h.Key("POST", "/v1/chat/completions", nil, got.Canonical)
	if err != nil || again.Key != got.Key || again.Folded != nil {
		t.Errorf("Key(canonical) = %s, folded %q, %v; want %s, none, nil", again.Key, again.Folded, err, got.Key)
	}
}

func TestNewCopiesIgnoreFields(t *testing.T) {
	ignore := []string{"user"}
	h := New(Options{IgnoreFields: ignore})
	ignore[0] = "model"
	got, _ := h.Key("POST", "/", nil, []byte(`{"user":"u","model":"m"}`))
	if string(got.Canonical) != `{"model":"m"}` {
		t.Errorf("canonical %s; want {\"model\":\"m\"}", got.Canonical)
	}
}

func TestZeroHasher(t *testing.T) {
	var h Hasher
	a, err := h.Key("POST", "/", http.Header{"Authorization": {"a"}}, []byte(`{"user":"u"}`))
	if err != nil {
		t.Fatal(err)
	}
	b, _ := New(Options{}).Key("POST", "/", http.Header{"Authorization": {"a"}}, []byte(`{"user":"u"}`))
	if a.Key != b.Key || string(a.Canonical) != `{"user":"u"}` {
		t.Errorf("zero Hasher: key %s, canonical %s; want %s, {\"user\":\"u\"}", a.Key, a.Canonical, b.Key)
	}
}

// TestKeyConcurrent runs many keys at once (run with -race) and checks each against the
// key made alone.
func TestKeyConcurrent(t *testing.T) {
	h := New(Options{IgnoreFields: []string{"user"}})
	bodies := make([][]byte, 50)
	want := make([]string, len(bodies))
	for i := range bodies {
		bodies[i] = fmt.Appendf(nil, `{"model":"m","seed":%d,"messages":[{"role":"user","content":[{"type":"text","text":"%s"}]}],"user":"%d"}`,
			i, strings.Repeat("x", i*37), i)
		r, err := h.Key("POST", "/v1/chat/completions", nil, bodies[i])
		if err != nil {
			t.Fatal(err)
		}
		want[i] = r.Key
	}
	var wg sync.WaitGroup
	for g := range 8 {
		wg.Go(func() {
			for n := range 200 {
				i := (g*31 + n) % len(bodies)
				r, err := h.Key("POST", "/v1/chat/completions", nil, bodies[i])
				if err != nil || r.Key != want[i] {
					t.Errorf("body %d: key %s, %v; want %s", i, r.Key, err, want[i])
					return
				}
			}
		})
	}
	wg.Wait()
}
