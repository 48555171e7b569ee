package hashing

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"maps"
	"math/big"
	"slices"
	"strings"
	"unicode/utf8"
)

// A second, deliberately naive implementation of the canonical form, built on encoding/json
// and math/big, for the tests to check the fast one against. It cannot represent lone
// surrogates (encoding/json turns them into U+FFFD) and takes the last of duplicate keys;
// callers skip those inputs.

// refCanonical decodes b with encoding/json (numbers as json.Number) and writes the
// canonical form.
func refCanonical(b []byte) ([]byte, error) {
	dec := json.NewDecoder(bytes.NewReader(b))
	dec.UseNumber()
	var v any
	if err := dec.Decode(&v); err != nil {
		return nil, err
	}
	if _, err := dec.Token(); err != io.EOF {
		return nil, errors.New("data after the value")
	}
	if _, ok := v.(map[string]any); !ok {
		return nil, errors.New("not an object")
	}
	var buf bytes.Buffer
	refEncode(&buf, v)
	return buf.Bytes(), nil
}

func refEncode(w *bytes.Buffer, v any) {
	switch v := v.(type) {
	case nil:
		w.WriteString("null")
	case bool:
		fmt.Fprint(w, v)
	case json.Number:
		w.WriteString(refNumber(string(v)))
	case string:
		refString(w, v)
	case []any:
		w.WriteByte('[')
		for i, e := range v {
			if i > 0 {
				w.WriteByte(',')
			}
			refEncode(w, e)
		}
		w.WriteByte(']')
	case map[string]any:
		w.WriteByte('{')
		for i, k := range slices.Sorted(maps.Keys(v)) { // Go compares strings bytewise
			if i > 0 {
				w.WriteByte(',')
			}
			refString(w, k)
			w.WriteByte(':')
			refEncode(w, v[k])
		}
		w.WriteByte('}')
	default:
		panic(fmt.Sprintf("refEncode: unexpected %T", v))
	}
}

func refString(w *bytes.Buffer, s string) {
	w.WriteByte('"')
	for _, r := range s {
		switch r {
		case '"':
			w.WriteString(`\"`)
		case '\\':
			w.WriteString(`\\`)
		case '\b':
			w.WriteString(`\b`)
		case '\f':
			w.WriteString(`\f`)
		case '\n':
			w.WriteString(`\n`)
		case '\r':
			w.WriteString(`\r`)
		case '\t':
			w.WriteString(`\t`)
		default:
			if r < 0x20 {
				fmt.Fprintf(w, `\u%04x`, r)
			} else {
				w.WriteRune(r)
			}
		}
	}
	w.WriteByte('"')
}

// refNumber writes a JSON number in canonical form, with big integers for everything.
func refNumber(s string) string {
	neg := strings.HasPrefix(s, "-")
	s = strings.TrimPrefix(s, "-")
	mant, expText, _ := strings.Cut(strings.ToLower(s), "e")
	exp := new(big.Int)
	if expText != "" {
		exp.SetString(strings.TrimPrefix(expText, "+"), 10)
	}
	intPart, frac, _ := strings.Cut(mant, ".")
	digits := strings.TrimLeft(intPart+frac, "0")
	exp.Sub(exp, big.NewInt(int64(len(frac))))
	if digits == "" {
		return "0"
	}
	trimmed := strings.TrimRight(digits, "0")
	exp.Add(exp, big.NewInt(int64(len(digits)-len(trimmed))))
	digits = trimmed
	// value = digits × 10^exp; lead = exponent of the first digit
	lead := new(big.Int).Add(exp, big.NewInt(int64(len(digits)-1)))

	sign := ""
	if neg {
		sign = "-"
	}
	switch {
	case exp.Sign() >= 0 && exp.Cmp(big.NewInt(20)) <= 0:
		return sign + digits + strings.Repeat("0", int(exp.Int64()))
	case exp.Sign() < 0 && lead.Sign() >= 0:
		k := int(lead.Int64()) + 1
		return sign + digits[:k] + "." + digits[k:]
	case exp.Sign() < 0 && lead.Cmp(big.NewInt(-6)) >= 0:
		return sign + "0." + strings.Repeat("0", int(-lead.Int64()-1)) + digits
	}
	m := digits[:1]
	if len(digits) > 1 {
		m += "." + digits[1:]
	}
	e := lead.String()
	if lead.Sign() >= 0 {
		e = "+" + e
	}
	return sign + m + "e" + e
}

// hasSurrogateEscape reports whether a canonical text may hold a lone surrogate (which
// refCanonical cannot represent). A false positive only skips a check.
func hasSurrogateEscape(b []byte) bool { return bytes.Contains(b, []byte(`\ud`)) }

// validUTF8JSON reports whether encoding/json would read b without replacing anything.
func validUTF8JSON(b []byte) bool { return utf8.Valid(b) }
