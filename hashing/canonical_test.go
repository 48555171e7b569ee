package hashing

import (
	"bytes"
	"errors"
	"path/filepath"
	"strings"
	"testing"
)

func TestCanonicalGolden(t *testing.T) {
	for _, path := range goldenFiles(t, "canonical") {
		t.Run(strings.TrimSuffix(filepath.Base(path), ".txt"), func(t *testing.T) {
			g := readGolden(t, path)
			var in, want []byte
			for _, s := range g.sections {
				switch s.name {
				case "in":
					in = s.data
				case "want":
					want = bytes.TrimSuffix(s.data, []byte("\n"))
				default:
					t.Fatalf("unknown section %q", s.name)
				}
			}
			got, err := Canonicalize(in, []string{"user"})
			if err != nil {
				t.Fatalf("Canonicalize: %v", err)
			}
			if !bytes.Equal(got, want) {
				t.Errorf("Canonicalize(%s)\n got %s\nwant %s", in, got, want)
			}
			again, err := Canonicalize(got, []string{"user"})
			if err != nil || !bytes.Equal(again, got) {
				t.Errorf("Canonicalize(canonical) = %s, %v; want %s, nil", again, err, got)
			}
		})
	}
}

func TestCanonicalizeIgnore(t *testing.T) {
	in := []byte(`{"user":"u","metadata":{"user":"nested"},"User":1,"model":"m"}`)
	tests := []struct {
		ignore []string
		want   string
	}{
		{nil, `{"User":1,"metadata":{"user":"nested"},"model":"m","user":"u"}`},
		{[]string{"user"}, `{"User":1,"metadata":{"user":"nested"},"model":"m"}`},
		{[]string{"user", "metadata", "absent"}, `{"User":1,"model":"m"}`},
		{[]string{"user", "User", "metadata", "model"}, `{}`},
	}
	for _, tt := range tests {
		got, err := Canonicalize(in, tt.ignore)
		if err != nil || string(got) != tt.want {
			t.Errorf("Canonicalize(%s, %q) = %s, %v; want %s, nil", in, tt.ignore, got, err, tt.want)
		}
	}
}

func TestCanonicalizeEscapedKeyIgnored(t *testing.T) {
	got, err := Canonicalize([]byte(`{"\u0075ser":"u","a":1}`), []string{"user"})
	if err != nil || string(got) != `{"a":1}` {
		t.Errorf("got %s, %v; want {\"a\":1}, nil", got, err)
	}
}

func TestInvalidJSON(t *testing.T) {
	tests := []struct {
		name, in string
		want     string // a part of the message
	}{
		{"empty", ``, "empty body"},
		{"whitespace", " \n\t", "only whitespace"},
		{"array", `[{"a":1}]`, "the body is an array"},
		{"string", `"hi"`, "the body is a string"},
		{"number", `42`, "the body is a number"},
		{"true", `true`, "the body is a boolean"},
		{"null", `null`, "the body is null"},
		{"garbage", `hello`, "the body is not JSON"},
		{"bom", "\xef\xbb\xbf{}", "the body is not JSON"},
		{"trailing garbage", `{"a":1}x`, "after the top-level object"},
		{"two objects", `{"a":1} {"a":1}`, "after the top-level object"},
		{"trailing comma in object", `{"a":1,}`, "want a string key"},
		{"trailing comma in array", `{"a":[1,]}`, "want a value"},
		{"truncated object", `{"model":"gpt-4o"`, "unexpected end of body"},
		{"truncated string", `{"model":"gpt-4`, "unexpected end of body"},
		{"truncated key", `{"mod`, "unexpected end of body"},
		{"truncated after colon", `{"a":`, "unexpected end of body"},
		{"truncated array", `{"a":[1,2`, "unexpected end of body"},
		{"truncated literal", `{"a":tr`, "unexpected end of body"},
		{"truncated number", `{"a":-`, "unexpected end of body"},
		{"truncated fraction", `{"a":1.`, "unexpected end of body"},
		{"truncated exponent", `{"a":1e+`, "unexpected end of body"},
		{"truncated escape", `{"a":"\`, "unexpected end of body"},
		{"truncated unicode escape", `{"a":"\u00`, "unexpected end of body"},
		{"missing colon", `{"a" 1}`, "want ':'"},
		{"unquoted key", `{a:1}`, "want a string key"},
		{"single quotes", `{'a':1}`, "want a string key"},
		{"missing comma", `{"a":1 "b":2}`, "want ',' or '}'"},
		{"missing comma in array", `{"a":[1 2]}`, "want ',' or ']'"},
		{"bad literal", `{"a":nul}`, "want null"},
		{"capitalized literal", `{"a":True}`, "want a value"},
		{"leading zero", `{"a":01}`, "leading zero"},
		{"plus sign", `{"a":+1}`, "want a value"},
		{"bare fraction", `{"a":.5}`, "want a value"},
		{"empty fraction", `{"a":1.e5}`, "after a decimal point"},
		{"empty exponent", `{"a":1e}`, "in an exponent"},
		{"hex number", `{"a":0x10}`, "want ',' or '}'"},
		{"NaN", `{"a":NaN}`, "want a value"},
		{"Infinity", `{"a":-Infinity}`, "in a number"},
		{"raw newline in string", "{\"a\":\"x\ny\"}", "control character"},
		{"raw tab in string", "{\"a\":\"x\ty\"}", "control character"},
		{"bad escape", `{"a":"\x"}`, "invalid escape"},
		{"bad unicode escape", `{"a":"\u12G4"}`, "not a hex digit"},
		{"invalid UTF-8", "{\"a\":\"\xff\"}", "invalid UTF-8"},
		{"invalid UTF-8 after escape", "{\"a\":\"\\n\xc3\x28\"}", "invalid UTF-8"},
		{"UTF-8 surrogate", "{\"a\":\"\xed\xa0\x80\"}", "invalid UTF-8"},
		{"overlong UTF-8", "{\"a\":\"\xc0\xaf\"}", "invalid UTF-8"},
		{"invalid UTF-8 in key", "{\"\xfe\":1}", "invalid UTF-8"},
		{"duplicate key", `{"a":1,"b":2,"a":1}`, `duplicate key "a"`},
		{"duplicate nested key", `{"m":[{"role":"user","role":"system"}]}`, `duplicate key "role"`},
		{"duplicate key by escape", `{"a":1,"\u0061":2}`, `duplicate key "a"`},
		{"comment", `{"a":1 /* c */}`, "want ',' or '}'"},
		{"too deep", `{"a":` + strings.Repeat("[", maxDepth) + strings.Repeat("]", maxDepth) + `}`, "nested deeper than 1000"},
		{"far too deep", strings.Repeat(`{"a":`, 1_000_000), "nested deeper than 1000"},
		{"far too deep arrays", `{"a":` + strings.Repeat("[", 1_000_000), "nested deeper than 1000"},
	}
	for _, tt := range tests {
		t.Run(tt.name, func(t *testing.T) {
			got, err := Canonicalize([]byte(tt.in), nil)
			if !errors.Is(err, ErrInvalidJSON) {
				t.Fatalf("Canonicalize(%.40q) = %s, %v; want an error wrapping ErrInvalidJSON", tt.in, got, err)
			}
			if !strings.Contains(err.Error(), tt.want) {
				t.Errorf("error %q; want it to contain %q", err, tt.want)
			}
			if _, kerr := New(Options{}).Key("POST", "/v1/chat/completions", nil, []byte(tt.in)); !errors.Is(kerr, ErrInvalidJSON) {
				t.Errorf("Key: got error %v; want ErrInvalidJSON", kerr)
			}
		})
	}
}

func TestErrorPosition(t *testing.T) {
	in := "{\n  \"model\": \"gpt-4o\",\n  \"n\": 1,,\n}"
	_, err := Canonicalize([]byte(in), nil)
	want := "hashing: invalid JSON: unexpected ',', want a string key at line 3, column 10 (byte 32)"
	if err == nil || err.Error() != want {
		t.Errorf("got %v; want %s", err, want)
	}
}

func TestMaxDepth(t *testing.T) {
	// The top-level object is level 1, so it may hold maxDepth-1 levels of nesting.
	in := `{"a":` + strings.Repeat("[", maxDepth-1) + strings.Repeat("]", maxDepth-1) + `}`
	got, err := Canonicalize([]byte(in), nil)
	if err != nil || string(got) != in {
		t.Errorf("Canonicalize(%d levels) = %.20s…, %v; want the input, nil", maxDepth, got, err)
	}
}

func TestCanonicalDoesNotAlias(t *testing.T) {
	h := New(Options{})
	r1, err := h.Key("POST", "/v1/chat/completions", nil, []byte(`{"a":"first"}`))
	if err != nil {
		t.Fatal(err)
	}
	c1, err := Canonicalize([]byte(`{"b":"first"}`), nil)
	if err != nil {
		t.Fatal(err)
	}
	for range 10 {
		h.Key("POST", "/v1/chat/completions", nil, []byte(`{"z":"second, and longer"}`))
		Canonicalize([]byte(`{"y":"second, and longer"}`), nil)
	}
	if string(r1.Canonical) != `{"a":"first"}` || string(c1) != `{"b":"first"}` {
		t.Errorf("results changed by later calls: %s, %s", r1.Canonical, c1)
	}
}

func TestLargeBody(t *testing.T) {
	// Larger than a pooled parser keeps, to go through the path that drops it.
	big := `{"model":"m","messages":[` + strings.Repeat(`{"role":"user","content":"\u00e9 0.50"},`, 100_000) + `{}]}`
	got, err := Canonicalize([]byte(big), nil)
	if err != nil {
		t.Fatal(err)
	}
	want := `{"messages":[` + strings.Repeat(`{"content":"é 0.50","role":"user"},`, 100_000) + `{}],"model":"m"}`
	if string(got) != want {
		t.Errorf("large body: got %d bytes; want %d", len(got), len(want))
	}
}

func TestHasStop(t *testing.T) {
	naive := func(b []byte) bool {
		for _, c := range b {
			if strStop[c] {
				return true
			}
		}
		return false
	}
	for c := range 256 {
		for pos := range 8 {
			for _, fill := range []byte{'a', 0x7f, 0x80, 0xff, ' ', '!', '#', '[', ']'} {
				b := bytes.Repeat([]byte{fill}, 8)
				b[pos] = byte(c)
				x := uint64(0)
				for i := 7; i >= 0; i-- {
					x = x<<8 | uint64(b[i])
				}
				if got, want := hasStop(x), naive(b); got != want {
					t.Fatalf("hasStop(% x) = %v; want %v", b, got, want)
				}
			}
		}
	}
}
