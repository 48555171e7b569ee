package singleflight

import (
	"encoding/json"
	"reflect"
	"testing"
)

// headerSamples are documents the fast paths take and documents they leave to
// encoding/json: escapes, HTML characters, non-ASCII and invalid UTF-8, nulls, whitespace,
// duplicates and malformed input.
var headerSamples = []string{
	`{"Content-Type":["application/json"],"X-Request-Id":["req_1"]}`,
	`{}`, `null`, ``, `{"A":[]}`, `{"A":null}`, `{"A":["x","y"],"B":["z"]}`,
	`{"A":["a\"b"]}`, `{"A":["<b>&"]}`, `{"A":["\u003c"]}`, `{"A":["é"]}`, "{\"A\":[\"\xff\"]}",
	`{"A":["x",null]}`, `{ "A":["x"]}`, `{"A":["x"],"A":["y"]}`, `{"A":["x"],}`, `{"A":["x",]}`,
	`{"A":["x"]"B":["y"]}`, `{"A":["x"]}x}`, `{"A":"x"}`, `{"A":[1]}`, `{"A":[`, `{"A`, `[]`, `{`,
	"{\"A\":[\"\t\"]}", `{"":[""]}`,
}

// TestHeaderCodecIsEncodingJSON checks the header codec against encoding/json: the same
// bytes out, the same maps (or an error) in.
func TestHeaderCodecIsEncodingJSON(t *testing.T) {
	for _, s := range headerSamples {
		checkDecode(t, s)
	}
	for _, h := range []map[string][]string{
		{"Content-Type": {"application/json"}, "X-Request-Id": {"req_1"}, "Openai-Processing-Ms": {"7"}},
		{"A": nil, "B": {}, "C": {"", "x"}},
		{"A": {"<b>"}}, {"A": {"a\"b\\c"}}, {"A": {"é"}}, {"A": {"\x00"}}, {"A\n": {"x"}},
	} {
		checkEncode(t, h)
	}
}

func checkDecode(t *testing.T, s string) {
	t.Helper()
	got, err := decodeHeader(s)
	var want map[string][]string
	wantErr := json.Unmarshal([]byte(s), &want)
	if (err != nil) != (wantErr != nil) || !reflect.DeepEqual(got, want) {
		t.Fatalf("decodeHeader(%q) = %#v, %v; encoding/json: %#v, %v", s, got, err, want, wantErr)
	}
}

func checkEncode(t *testing.T, h map[string][]string) {
	t.Helper()
	want := ""
	if len(h) > 0 {
		b, _ := json.Marshal(h)
		want = string(b)
	}
	if got := encodeHeader(h); got != want {
		t.Fatalf("encodeHeader(%#v) = %q; encoding/json: %q", h, got, want)
	}
	checkDecode(t, want)
}

func FuzzHeaderCodec(f *testing.F) {
	for _, s := range headerSamples {
		f.Add(s)
	}
	f.Fuzz(func(t *testing.T, s string) {
		checkDecode(t, s)
		var h map[string][]string
		if json.Unmarshal([]byte(s), &h) == nil {
			checkEncode(t, h)
		}
	})
}

func BenchmarkHeaderCodec(b *testing.B) {
	h := map[string][]string{"Content-Type": {"application/json"}, "Openai-Processing-Ms": {"7"}, "X-Request-Id": {"req_601"}}
	b.Run("encoding-json", func(b *testing.B) {
		for b.Loop() {
			b, _ := json.Marshal(h)
			var out map[string][]string
			_ = json.Unmarshal(b, &out)
		}
	})
	b.Run("codec", func(b *testing.B) {
		for b.Loop() {
			_, _ = decodeHeader(encodeHeader(h))
		}
	})
}
