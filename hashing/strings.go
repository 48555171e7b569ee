package hashing

import (
	"encoding/binary"
	"unicode/utf8"
)

// Strings are decoded to the characters they stand for and written again with one escaping,
// so that every spelling of a string has one canonical form.
//
// Decoded text is kept in WTF-8: UTF-8, plus the three-byte form of a surrogate code point
// for a lone surrogate escape ("\ud800"). Such a surrogate is not a character, but
// upstreams differ on what they make of it, so it stays distinct from U+FFFD and from every
// other surrogate, and is written back as the same escape. Raw bytes in the body must be
// valid UTF-8, so a surrogate in the decoded text always came from an escape.

// strStop marks the bytes that end a run of plain string content: the closing quote, the
// start of an escape, and the control characters that must not appear raw.
var strStop = func() (t [256]bool) {
	for c := range 0x20 {
		t[c] = true
	}
	t['"'], t['\\'] = true, true
	return t
}()

// hasStop reports whether any of the eight bytes in x is a strStop byte: '"', '\\' or below
// 0x20 (the classic SWAR tests for a zero byte and for a byte less than n; they can report a
// byte that is not there only after one that is, so they never miss one).
func hasStop(x uint64) bool {
	const ones, highs = 0x0101010101010101, 0x8080808080808080
	zero := func(v uint64) uint64 { return (v - ones) & ^v & highs }
	return zero(x^('"'*ones))|zero(x^('\\'*ones))|((x-0x20*ones)&^x&highs) != 0
}

// str reads a string at p.pos (the opening quote). A string without escapes is its own
// decoded and canonical form, and is left in the body; one with escapes is decoded into buf.
func (p *parser) str() (node, error) {
	start := p.pos
	src := p.src
	i := start + 1
	var seen uint64 // the bytes passed, or-ed together: bit 7 set means UTF-8 to check
	for i+8 <= len(src) {
		x := binary.LittleEndian.Uint64(src[i:])
		if hasStop(x) {
			break
		}
		seen |= x
		i += 8
	}
	for i < len(src) && !strStop[src[i]] {
		seen |= uint64(src[i])
		i++
	}
	switch {
	case i == len(src):
		return node{}, p.errEOF()
	case src[i] == '\\':
		return p.strEscaped(start, i)
	case src[i] < 0x20:
		return node{}, p.errorf(i, "control character %U in a string (escape it)", src[i])
	}
	if seen&0x8080808080808080 != 0 {
		if err := p.checkUTF8(start+1, i); err != nil {
			return node{}, err
		}
	}
	p.pos = i + 1
	return node{kind: kindString, lo: start + 1, hi: i}, nil
}

// strEscaped decodes a string with escapes into buf; esc is the offset of the first '\'.
func (p *parser) strEscaped(start, esc int) (node, error) {
	src := p.src
	lo := len(p.buf)
	seg := start + 1 // start of the unescaped run not yet copied
	i := esc
	for i < len(src) {
		c := src[i]
		switch {
		case c == '"', c == '\\':
			if err := p.checkUTF8(seg, i); err != nil {
				return node{}, err
			}
			p.buf = append(p.buf, src[seg:i]...)
			if c == '"' {
				p.pos = i + 1
				return node{kind: kindString, inBuf: true, lo: lo, hi: len(p.buf)}, nil
			}
			n, err := p.escape(i)
			if err != nil {
				return node{}, err
			}
			i += n
			seg = i
		case c < 0x20:
			return node{}, p.errorf(i, "control character %U in a string (escape it)", c)
		default:
			i++
		}
	}
	return node{}, p.errEOF()
}

// escape decodes the escape at src[i] (a '\') into buf and returns its length.
func (p *parser) escape(i int) (int, error) {
	src := p.src
	if i+1 == len(src) {
		return 0, p.errEOF()
	}
	var c byte
	switch src[i+1] {
	case '"', '\\', '/':
		c = src[i+1]
	case 'b':
		c = '\b'
	case 'f':
		c = '\f'
	case 'n':
		c = '\n'
	case 'r':
		c = '\r'
	case 't':
		c = '\t'
	case 'u':
		r, err := p.hex4(i)
		if err != nil {
			return 0, err
		}
		if 0xD800 <= r && r < 0xDC00 && i+11 < len(src) && src[i+6] == '\\' && src[i+7] == 'u' {
			if r2, err := p.hex4(i + 6); err == nil && 0xDC00 <= r2 && r2 < 0xE000 {
				p.buf = utf8.AppendRune(p.buf, 0x10000+(r-0xD800)<<10+(r2-0xDC00))
				return 12, nil
			}
		}
		if 0xD800 <= r && r < 0xE000 { // lone surrogate: WTF-8
			p.buf = append(p.buf, 0xE0|byte(r>>12), 0x80|byte(r>>6)&0x3F, 0x80|byte(r)&0x3F)
		} else {
			p.buf = utf8.AppendRune(p.buf, r)
		}
		return 6, nil
	default:
		return 0, p.errorf(i, "invalid escape %s in a string", quoteByte(src[i+1]))
	}
	p.buf = append(p.buf, c)
	return 2, nil
}

// hex4 reads the four hex digits of the \u escape at src[i].
func (p *parser) hex4(i int) (rune, error) {
	var r rune
	for j := i + 2; j < i+6; j++ {
		if j >= len(p.src) {
			return 0, p.errEOF()
		}
		c := p.src[j]
		switch {
		case '0' <= c && c <= '9':
			c -= '0'
		case 'a' <= c && c <= 'f':
			c -= 'a' - 10
		case 'A' <= c && c <= 'F':
			c -= 'A' - 10
		default:
			return 0, p.errorf(j, "invalid \\u escape: %s is not a hex digit", quoteByte(c))
		}
		r = r<<4 | rune(c)
	}
	return r, nil
}

// checkUTF8 reports the first byte of src[lo:hi] that is not valid UTF-8.
func (p *parser) checkUTF8(lo, hi int) error {
	s := p.src[lo:hi]
	if utf8.Valid(s) {
		return nil
	}
	for i := 0; i < len(s); {
		r, n := utf8.DecodeRune(s[i:])
		if r == utf8.RuneError && n == 1 {
			return p.errorf(lo+i, "invalid UTF-8 (byte 0x%02x) in a string", s[i])
		}
		i += n
	}
	return nil
}

// appendString writes a string node in canonical form, with its quotes.
func (p *parser) appendString(out []byte, n node) []byte {
	out = append(out, '"')
	if !n.inBuf { // no escapes in the body: nothing that needs one
		out = append(out, p.src[n.lo:n.hi]...)
		return append(out, '"')
	}
	return append(appendEscaped(out, p.buf[n.lo:n.hi]), '"')
}

const hexDigits = "0123456789abcdef"

// appendEscaped escapes decoded (WTF-8) text: the short escapes where JSON has one, \u00xx
// for other control characters, \udxxx for a lone surrogate, everything else as itself.
func appendEscaped(out, s []byte) []byte {
	run := 0 // start of the run not yet copied
	for i := 0; i < len(s); {
		c := s[i]
		var esc string
		switch {
		case c >= 0x20 && c != '"' && c != '\\' && c != 0xED:
			i++
			continue
		case c == 0xED:
			if i+2 >= len(s) || s[i+1] < 0xA0 { // U+D000–U+D7FF: a character
				i += 3
				continue
			}
			out = append(out, s[run:i]...)
			r := rune(c&0x0F)<<12 | rune(s[i+1]&0x3F)<<6 | rune(s[i+2]&0x3F)
			out = append(out, '\\', 'u', hexDigits[r>>12], hexDigits[r>>8&0xF], hexDigits[r>>4&0xF], hexDigits[r&0xF])
			i += 3
			run = i
			continue
		case c == '"':
			esc = `\"`
		case c == '\\':
			esc = `\\`
		case c == '\b':
			esc = `\b`
		case c == '\f':
			esc = `\f`
		case c == '\n':
			esc = `\n`
		case c == '\r':
			esc = `\r`
		case c == '\t':
			esc = `\t`
		}
		out = append(out, s[run:i]...)
		if esc != "" {
			out = append(out, esc...)
		} else {
			out = append(out, '\\', 'u', '0', '0', hexDigits[c>>4], hexDigits[c&0xF])
		}
		i++
		run = i
	}
	return append(out, s[run:]...)
}
