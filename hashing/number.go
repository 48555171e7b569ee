package hashing

import (
	"math/big"
	"strconv"
)

// Numbers are compared by exact decimal value: a number is reduced to its significant
// digits d (no leading or trailing zeros) and an exponent e, value = ±d × 10^e, and written
// from those alone. Nothing goes through float64, so no two distinct values meet.

// Limits of the plain (non-exponent) form; see the package documentation.
const (
	maxPlainTrailingZeros = 20 // "100000000000000000000" (1e20) is plain, 1e21 is not
	maxPlainLeadingZeros  = 5  // "0.000001" (1e-6) is plain, 1e-7 is not
)

// number reads a number at p.pos. One already in canonical form (most are: 0, 42, -3, 0.7)
// is left in the body; any other is rewritten into buf.
func (p *parser) number() (node, error) {
	src := p.src
	start := p.pos
	i := start
	neg := src[i] == '-'
	if neg {
		i++
	}
	intLo := i
	switch {
	case i == len(src):
		return node{}, p.errEOF()
	case src[i] == '0':
		i++
		if i < len(src) && isDigit(src[i]) {
			return node{}, p.errorf(intLo, "number with a leading zero")
		}
	case isDigit(src[i]):
		for i < len(src) && isDigit(src[i]) {
			i++
		}
	default:
		return node{}, p.errorf(i, "unexpected %s in a number, want a digit", quoteByte(src[i]))
	}
	intHi := i
	fracLo, fracHi := i, i
	if i < len(src) && src[i] == '.' {
		i++
		fracLo = i
		for i < len(src) && isDigit(src[i]) {
			i++
		}
		fracHi = i
		if fracLo == fracHi {
			if i == len(src) {
				return node{}, p.errEOF()
			}
			return node{}, p.errorf(i, "unexpected %s after a decimal point, want a digit", quoteByte(src[i]))
		}
	}
	expLo, expHi, expNeg := i, i, false
	if i < len(src) && (src[i] == 'e' || src[i] == 'E') {
		i++
		if i < len(src) && (src[i] == '+' || src[i] == '-') {
			expNeg = src[i] == '-'
			i++
		}
		expLo = i
		for i < len(src) && isDigit(src[i]) {
			i++
		}
		expHi = i
		if expLo == expHi {
			if i == len(src) {
				return node{}, p.errEOF()
			}
			return node{}, p.errorf(i, "unexpected %s in an exponent, want a digit", quoteByte(src[i]))
		}
	}
	p.pos = i

	if expLo == expHi && isCanonicalPlain(src[intLo:intHi], src[fracLo:fracHi], neg) {
		return node{kind: kindNumber, lo: start, hi: i}, nil
	}
	lo := len(p.buf)
	p.buf = p.appendNumber(p.buf, neg, src[intLo:intHi], src[fracLo:fracHi], src[expLo:expHi], expNeg)
	return node{kind: kindNumber, inBuf: true, lo: lo, hi: len(p.buf)}, nil
}

// isCanonicalPlain reports whether a number without exponent is already written the way
// appendNumber would write it.
func isCanonicalPlain(intPart, frac []byte, neg bool) bool {
	if len(frac) == 0 {
		if intPart[0] == '0' {
			return !neg // "0" yes, "-0" no
		}
		return trailingZeros(intPart) <= maxPlainTrailingZeros
	}
	if frac[len(frac)-1] == '0' {
		return false
	}
	return intPart[0] != '0' || leadingZeros(frac) <= maxPlainLeadingZeros
}

// appendNumber writes the canonical form of ±int.frac × 10^±exp (digit strings as in JSON).
func (p *parser) appendNumber(out []byte, neg bool, intPart, frac, exp []byte, expNeg bool) []byte {
	p.num = append(append(p.num[:0], intPart...), frac...)
	d := p.num[leadingZeros(p.num):]
	if len(d) == 0 {
		return append(out, '0') // -0 is 0, whatever its exponent
	}
	tz := trailingZeros(d)
	d = d[:len(d)-tz]
	// value = d × 10^e with e = exp + adj
	adj := int64(tz) - int64(len(frac))

	exp = exp[leadingZeros(exp):]
	if len(exp) > 18 { // |exp| ≥ 10^18: far outside the plain forms; exact all the same
		return appendHugeExp(out, neg, d, exp, expNeg, adj)
	}
	var e int64
	for _, c := range exp {
		e = e*10 + int64(c-'0')
	}
	if expNeg {
		e = -e
	}
	e += adj
	n := int64(len(d))
	E := e + n - 1 // exponent of the first digit: d[0].d[1:] × 10^E

	if neg {
		out = append(out, '-')
	}
	switch {
	case e >= 0 && e <= maxPlainTrailingZeros:
		out = append(out, d...)
		for range e {
			out = append(out, '0')
		}
	case e < 0 && E >= 0:
		out = append(out, d[:E+1]...)
		out = append(out, '.')
		out = append(out, d[E+1:]...)
	case e < 0 && -E-1 <= maxPlainLeadingZeros:
		out = append(out, '0', '.')
		for range -E - 1 {
			out = append(out, '0')
		}
		out = append(out, d...)
	default:
		out = appendMantissa(out, d)
		if E < 0 {
			out = append(out, '-')
			E = -E
		} else {
			out = append(out, '+')
		}
		out = strconv.AppendInt(out, E, 10)
	}
	return out
}

// appendMantissa writes d[0].d[1:]e (the '.' only when there is more than one digit).
func appendMantissa(out, d []byte) []byte {
	out = append(out, d[0])
	if len(d) > 1 {
		out = append(out, '.')
		out = append(out, d[1:]...)
	}
	return append(out, 'e')
}

// appendHugeExp writes a number whose exponent does not fit an int64 comfortably. Only a
// hostile or broken client sends one, so it may be slow; it must still be exact.
func appendHugeExp(out []byte, neg bool, d, exp []byte, expNeg bool, adj int64) []byte {
	E, _ := new(big.Int).SetString(string(exp), 10)
	if expNeg {
		E.Neg(E)
	}
	E.Add(E, big.NewInt(adj+int64(len(d))-1))
	if neg {
		out = append(out, '-')
	}
	out = appendMantissa(out, d)
	if E.Sign() >= 0 {
		out = append(out, '+')
	}
	return E.Append(out, 10)
}

func leadingZeros(s []byte) int {
	i := 0
	for i < len(s) && s[i] == '0' {
		i++
	}
	return i
}

func trailingZeros(s []byte) int {
	i := 0
	for i < len(s) && s[len(s)-1-i] == '0' {
		i++
	}
	return i
}
