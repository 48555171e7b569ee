package hashing

import (
	"math/big"
	"math/rand/v2"
	"strconv"
	"strings"
	"testing"
)

// canonNumber returns the canonical form of one JSON number.
func canonNumber(t *testing.T, s string) string {
	t.Helper()
	out, err := Canonicalize([]byte(`{"n":`+s+`}`), nil)
	if err != nil {
		t.Fatalf("Canonicalize(%s): %v", s, err)
	}
	return strings.TrimSuffix(strings.TrimPrefix(string(out), `{"n":`), `}`)
}

func TestNumberForms(t *testing.T) {
	tests := []struct{ in, want string }{
		{"0", "0"},
		{"-0", "0"},
		{"0.000", "0"},
		{"-0e-99999999999999999999999", "0"},
		{"1", "1"},
		{"-1", "-1"},
		{"1.0", "1"},
		{"1.00", "1"},
		{"1e0", "1"},
		{"1E+0", "1"},
		{"10e-1", "1"},
		{"0.1e1", "1"},
		{"100", "100"},
		{"1e2", "100"},
		{"1.5", "1.5"},
		{"-1.50", "-1.5"},
		{"15e-1", "1.5"},
		{"0.7", "0.7"},
		{"7e-1", "0.7"},
		{"123.456", "123.456"},
		{"1e20", "100000000000000000000"},
		{"100000000000000000000", "100000000000000000000"},
		{"1e21", "1e+21"},
		{"1000000000000000000000", "1e+21"},
		{"1230000000000000000000", "1230000000000000000000"}, // 19 zeros
		{"123000000000000000000000", "1.23e+23"},             // 21 zeros
		{"12345678901234567890123", "12345678901234567890123"},
		{"12345678901234567890123e20", "1234567890123456789012300000000000000000000"},
		{"0.000001", "0.000001"},
		{"1e-6", "0.000001"},
		{"1e-7", "1e-7"},
		{"0.0000001", "1e-7"},
		{"-0.00000012", "-1.2e-7"},
		{"0.000001234", "0.000001234"},
		{"0.1000000000000000000000000000001", "0.1000000000000000000000000000001"},
		{"1.7976931348623157e309", "1.7976931348623157e+309"},
		{"5e-324", "5e-324"},
		{"2e-400", "2e-400"},
		{"1e999999999999999999", "1e+999999999999999999"},
		{"1e1000000000000000000", "1e+1000000000000000000"},
		{"12.5e99999999999999999999", "1.25e+100000000000000000000"},
		{"-0.0125e-99999999999999999999", "-1.25e-100000000000000000001"},
		{"1e0000000000000000000000000002", "100"},
	}
	for _, tt := range tests {
		if got := canonNumber(t, tt.in); got != tt.want {
			t.Errorf("canonical(%s) = %s; want %s", tt.in, got, tt.want)
		}
		if got := refNumber(tt.in); got != tt.want {
			t.Errorf("refNumber(%s) = %s; want %s (the test's reference disagrees)", tt.in, got, tt.want)
		}
	}
}

// randomNumber returns a random JSON number spelling, biased toward the edges of the
// canonical forms; its exponent stays small enough for big.Rat.
func randomNumber(r *rand.Rand) string {
	var b strings.Builder
	if r.IntN(3) == 0 {
		b.WriteByte('-')
	}
	digits := func(n int) string {
		var d strings.Builder
		for range n {
			if r.IntN(3) == 0 {
				d.WriteByte('0')
			} else {
				d.WriteByte(byte('0' + r.IntN(10)))
			}
		}
		return d.String()
	}
	if r.IntN(4) == 0 {
		b.WriteByte('0')
	} else {
		b.WriteByte(byte('1' + r.IntN(9)))
		b.WriteString(digits(r.IntN(25)))
	}
	if r.IntN(2) == 0 {
		b.WriteByte('.')
		b.WriteString(digits(1 + r.IntN(25)))
	}
	if r.IntN(2) == 0 {
		b.WriteString([]string{"e", "E", "e+", "e-", "E-"}[r.IntN(5)])
		b.WriteString(strconv.Itoa(r.IntN(60)))
	}
	return b.String()
}

func rat(t *testing.T, s string) *big.Rat {
	t.Helper()
	x, ok := new(big.Rat).SetString(s)
	if !ok {
		t.Fatalf("big.Rat cannot read %q", s)
	}
	return x
}

// TestNumberExact checks, on random spellings, that the canonical form has the same exact
// value, is its own canonical form, agrees with the reference, and that two numbers have one
// canonical form exactly when their values are equal.
func TestNumberExact(t *testing.T) {
	r := rand.New(rand.NewPCG(1, 2))
	var prev string
	var prevRat *big.Rat
	for range 20000 {
		in := randomNumber(r)
		got := canonNumber(t, in)
		if rat(t, in).Cmp(rat(t, got)) != 0 {
			t.Fatalf("canonical(%s) = %s: a different value", in, got)
		}
		if again := canonNumber(t, got); again != got {
			t.Fatalf("canonical(%s) = %s; want %s (not idempotent)", got, again, got)
		}
		if ref := refNumber(in); ref != got {
			t.Fatalf("canonical(%s) = %s; reference says %s", in, got, ref)
		}
		x := rat(t, in)
		if prevRat != nil && (x.Cmp(prevRat) == 0) != (got == prev) {
			t.Fatalf("%s and previous %s: equal values %v, equal forms %v", got, prev, x.Cmp(prevRat) == 0, got == prev)
		}
		prev, prevRat = got, x
	}
}

func TestNumberEqualSpellings(t *testing.T) {
	// Every spelling of a value has one form: shift the decimal point and the exponent.
	r := rand.New(rand.NewPCG(3, 4))
	for range 2000 {
		d := strconv.FormatUint(r.Uint64N(1e12), 10)
		e := r.IntN(60) - 30
		want := canonNumber(t, d+"e"+strconv.Itoa(e))
		for shift := range 5 {
			s := d + strings.Repeat("0", shift) + "e" + strconv.Itoa(e-shift)
			if got := canonNumber(t, s); got != want {
				t.Fatalf("canonical(%s) = %s; want %s", s, got, want)
			}
			s = "0." + strings.Repeat("0", shift) + d + "e" + strconv.Itoa(e+len(d)+shift)
			if got := canonNumber(t, s); got != want {
				t.Fatalf("canonical(%s) = %s; want %s", s, got, want)
			}
		}
	}
}
