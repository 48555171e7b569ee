package hashing

import (
	"bytes"
	"encoding/json"
	"errors"
	"os"
	"path/filepath"
	"testing"
)

// fuzzSeeds are bodies that reach every branch of the parser, plus the golden testdata.
var fuzzSeeds = []string{
	`{}`,
	`{"a":1}`,
	` {"b" : [1, 2.50, -0, 1e21, 1E-7, 0.000001, true, false, null, {"x":{}}, []]} `,
	`{"s":"\u0041\ud83d\ude00\ud800\udfff\/\"\\\b\f\n\r\t\u0000é😀"}`,
	`{"messages":[{"role":"user","content":[{"type":"text","text":"hi"}]}]}`,
	`{"input":[{"role":"user","content":"hi"}]}`,
	`{"n":12345678901234567890123456789e-40,"m":1e99999999999999999999}`,
	`{"a":1,"a":2}`,
	`{"a":[1,]}`,
	`{"a":"x`,
	`[1]`,
	`{"a":1}x`,
	"{\"a\":\"\xff\"}",
	"{\"\\u00e9\":1,\"é\":2}",
	`{"z":{"y":{"x":[[[[{"w":"v"}]]]]}}}`,
}

func FuzzCanonical(f *testing.F) {
	for _, s := range fuzzSeeds {
		f.Add([]byte(s))
	}
	for _, dir := range []string{"equal", "unequal", "canonical"} {
		files, _ := filepath.Glob(filepath.Join("testdata", dir, "*.txt"))
		for _, path := range files {
			b, err := os.ReadFile(path)
			if err != nil {
				f.Fatal(err)
			}
			for _, part := range bytes.Split(b, []byte("\n\n")) { // request bodies follow a blank line
				if i := bytes.Index(part, []byte("\n-- ")); i >= 0 {
					part = part[:i]
				}
				f.Add(part)
			}
		}
	}
	h := New(Options{IgnoreFields: []string{"user"}})
	f.Fuzz(func(t *testing.T, in []byte) {
		c, err := Canonicalize(in, nil)
		if err != nil {
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("Canonicalize(%q): error %v does not wrap ErrInvalidJSON", in, err)
			}
			if _, kerr := h.Key("POST", "/v1/chat/completions", nil, in); kerr == nil {
				t.Fatalf("Canonicalize(%q) failed (%v) but Key did not", in, err)
			}
			return
		}
		if !json.Valid(in) {
			t.Fatalf("Canonicalize(%q) accepted what encoding/json calls invalid", in)
		}

		// Idempotence.
		c2, err := Canonicalize(c, nil)
		if err != nil || !bytes.Equal(c2, c) {
			t.Fatalf("Canonicalize(Canonicalize(%q)) = %q, %v; want %q", in, c2, err, c)
		}

		// The canonical form means what the input meant: read by encoding/json and written
		// by the reference encoder, both give it back.
		if !hasSurrogateEscape(c) {
			ref, err := refCanonical(c)
			if err != nil || !bytes.Equal(ref, c) {
				t.Fatalf("reference(canonical %q) = %q, %v; want the same", c, ref, err)
			}
			if validUTF8JSON(in) {
				ref, err := refCanonical(in)
				if err != nil || !bytes.Equal(ref, c) {
					t.Fatalf("reference(%q) = %q, %v; want %q", in, ref, err, c)
				}
			}
		}

		// JSON-equal spellings share a key, with and without folding rules.
		var indented, compact bytes.Buffer
		if err := json.Indent(&indented, in, "\t ", "  "); err != nil {
			t.Fatalf("json.Indent(%q): %v", in, err)
		}
		if err := json.Compact(&compact, in); err != nil {
			t.Fatalf("json.Compact(%q): %v", in, err)
		}
		for _, path := range []string{"/v1/chat/completions", "/v1/responses", "/v1/embeddings"} {
			k, err := h.Key("POST", path, nil, in)
			if err != nil {
				t.Fatalf("Key(%q): %v; Canonicalize accepted it", in, err)
			}
			for _, other := range [][]byte{indented.Bytes(), compact.Bytes(), c} {
				k2, err := h.Key("POST", path, nil, other)
				if err != nil || k2.Key != k.Key {
					t.Fatalf("Key(%q) = %s, %v; want %s, the key of %q", other, k2.Key, err, k.Key, in)
				}
			}
			// Folding is idempotent: the folded text keys as itself.
			k3, err := h.Key("POST", path, nil, k.Canonical)
			if err != nil || k3.Key != k.Key || !bytes.Equal(k3.Canonical, k.Canonical) {
				t.Fatalf("Key(folded %q) = %s %q, %v; want %s", k.Canonical, k3.Key, k3.Canonical, err, k.Key)
			}
		}
	})
}
