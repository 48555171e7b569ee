package hashing

import (
	"bytes"
	"encoding/json"
	"fmt"
	"slices"
	"unicode/utf8"
)

// maxDepth bounds how deeply arrays and objects may nest, so that a hostile body cannot
// exhaust the stack; real requests nest a handful of levels.
const maxDepth = 1000

type kind uint8

const (
	kindNull kind = iota
	kindFalse
	kindTrue
	kindNumber
	kindString
	kindArray
	kindObject
)

// A node is one parsed JSON value. A string or number points at its canonical content: in
// the body itself when it can be copied as is (inBuf false), else in parser.buf, where
// strings are decoded (and must be escaped again when written) and numbers rewritten. An
// array points at its elements in parser.elems, an object at its members, sorted by key, in
// parser.members.
type node struct {
	kind   kind
	inBuf  bool
	lo, hi int
}

const nodeSize = 24 // bytes, near enough, for pool accounting

type member struct{ key, val node }

// A parser builds the tree of one body and writes it out again. Children are collected on
// the two stacks while their container is open and moved to elems or members, contiguously,
// when it closes; so the whole tree lives in four slices that are reused between requests.
type parser struct {
	src []byte
	pos int

	buf     []byte // decoded strings and rewritten numbers
	num     []byte // digits of the number being rewritten
	scratch []byte // scope material
	out     []byte // the written key material

	elems, elemStack     []node
	members, memberStack []member
}

func (p *parser) reset(src []byte) {
	p.src, p.pos = src, 0
	p.buf, p.out = p.buf[:0], p.out[:0]
	p.elems, p.elemStack = p.elems[:0], p.elemStack[:0]
	p.members, p.memberStack = p.members[:0], p.memberStack[:0]
}

// text returns the content of a string or number node.
func (p *parser) text(n node) []byte {
	if n.inBuf {
		return p.buf[n.lo:n.hi]
	}
	return p.src[n.lo:n.hi]
}

// parse reads the whole body, which must be one object and nothing else.
func (p *parser) parse() (node, error) {
	p.skipSpace()
	if p.pos == len(p.src) {
		if len(p.src) == 0 {
			return node{}, fmt.Errorf("%w: empty body", ErrInvalidJSON)
		}
		return node{}, fmt.Errorf("%w: body holds only whitespace", ErrInvalidJSON)
	}
	if c := p.src[p.pos]; c != '{' {
		what := "not JSON"
		switch {
		case !json.Valid(p.src): // only on this error path: say "not JSON" rather than guess
		case c == '[':
			what = "an array"
		case c == '"':
			what = "a string"
		case c == '-' || isDigit(c):
			what = "a number"
		case c == 't' || c == 'f':
			what = "a boolean"
		case c == 'n':
			what = "null"
		}
		return node{}, p.errorf(p.pos, "the body is %s, want a JSON object", what)
	}
	root, err := p.object(1)
	if err != nil {
		return node{}, err
	}
	p.skipSpace()
	if p.pos < len(p.src) {
		return node{}, p.errorf(p.pos, "unexpected %s after the top-level object", quoteByte(p.src[p.pos]))
	}
	return root, nil
}

func (p *parser) value(depth int) (node, error) {
	if p.pos == len(p.src) {
		return node{}, p.errEOF()
	}
	switch c := p.src[p.pos]; {
	case c == '{':
		return p.object(depth + 1)
	case c == '[':
		return p.array(depth + 1)
	case c == '"':
		return p.str()
	case c == '-' || isDigit(c):
		return p.number()
	case c == 't':
		return p.literal("true", kindTrue)
	case c == 'f':
		return p.literal("false", kindFalse)
	case c == 'n':
		return p.literal("null", kindNull)
	default:
		return node{}, p.errorf(p.pos, "unexpected %s, want a value", quoteByte(c))
	}
}

func (p *parser) literal(word string, k kind) (node, error) {
	rest := p.src[p.pos:]
	n := min(len(rest), len(word))
	if string(rest[:n]) != word[:n] {
		return node{}, p.errorf(p.pos, "invalid literal, want %s", word)
	}
	if n < len(word) {
		return node{}, p.errEOF()
	}
	p.pos += len(word)
	return node{kind: k}, nil
}

func (p *parser) object(depth int) (node, error) {
	if depth > maxDepth {
		return node{}, p.errorf(p.pos, "arrays and objects nested deeper than %d levels", maxDepth)
	}
	start := p.pos
	p.pos++ // '{'
	base := len(p.memberStack)
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == '}' {
		p.pos++
		return node{kind: kindObject, lo: len(p.members), hi: len(p.members)}, nil
	}
	for {
		p.skipSpace()
		if p.pos == len(p.src) {
			return node{}, p.errEOF()
		}
		if p.src[p.pos] != '"' {
			return node{}, p.errorf(p.pos, "unexpected %s, want a string key", quoteByte(p.src[p.pos]))
		}
		key, err := p.str()
		if err != nil {
			return node{}, err
		}
		p.skipSpace()
		if p.pos == len(p.src) {
			return node{}, p.errEOF()
		}
		if p.src[p.pos] != ':' {
			return node{}, p.errorf(p.pos, "unexpected %s after an object key, want ':'", quoteByte(p.src[p.pos]))
		}
		p.pos++
		p.skipSpace()
		val, err := p.value(depth)
		if err != nil {
			return node{}, err
		}
		p.memberStack = append(p.memberStack, member{key, val})
		p.skipSpace()
		if p.pos == len(p.src) {
			return node{}, p.errEOF()
		}
		c := p.src[p.pos]
		p.pos++
		if c == '}' {
			break
		}
		if c != ',' {
			return node{}, p.errorf(p.pos-1, "unexpected %s after an object member, want ',' or '}'", quoteByte(c))
		}
	}
	ms := p.memberStack[base:]
	if err := p.sortMembers(ms, start); err != nil {
		return node{}, err
	}
	lo := len(p.members)
	p.members = append(p.members, ms...)
	p.memberStack = p.memberStack[:base]
	return node{kind: kindObject, lo: lo, hi: len(p.members)}, nil
}

// sortMembers sorts an object's members by key and rejects a key that appears twice.
func (p *parser) sortMembers(ms []member, start int) error {
	cmp := func(a, b member) int { return bytes.Compare(p.text(a.key), p.text(b.key)) }
	if !slices.IsSortedFunc(ms, cmp) {
		slices.SortFunc(ms, cmp)
	}
	for i := 1; i < len(ms); i++ {
		if k := p.text(ms[i].key); bytes.Equal(k, p.text(ms[i-1].key)) {
			return p.errorf(start, "duplicate key %q in the object", k)
		}
	}
	return nil
}

func (p *parser) array(depth int) (node, error) {
	if depth > maxDepth {
		return node{}, p.errorf(p.pos, "arrays and objects nested deeper than %d levels", maxDepth)
	}
	p.pos++ // '['
	base := len(p.elemStack)
	p.skipSpace()
	if p.pos < len(p.src) && p.src[p.pos] == ']' {
		p.pos++
		return node{kind: kindArray, lo: len(p.elems), hi: len(p.elems)}, nil
	}
	for {
		p.skipSpace()
		v, err := p.value(depth)
		if err != nil {
			return node{}, err
		}
		p.elemStack = append(p.elemStack, v)
		p.skipSpace()
		if p.pos == len(p.src) {
			return node{}, p.errEOF()
		}
		c := p.src[p.pos]
		p.pos++
		if c == ']' {
			break
		}
		if c != ',' {
			return node{}, p.errorf(p.pos-1, "unexpected %s after an array element, want ',' or ']'", quoteByte(c))
		}
	}
	lo := len(p.elems)
	p.elems = append(p.elems, p.elemStack[base:]...)
	p.elemStack = p.elemStack[:base]
	return node{kind: kindArray, lo: lo, hi: len(p.elems)}, nil
}

func (p *parser) skipSpace() {
	for p.pos < len(p.src) {
		switch p.src[p.pos] {
		case ' ', '\t', '\n', '\r':
			p.pos++
		default:
			return
		}
	}
}

func isDigit(c byte) bool { return '0' <= c && c <= '9' }

func (p *parser) errEOF() error {
	return p.errorf(len(p.src), "unexpected end of body (truncated?)")
}

// errorf returns an error wrapping ErrInvalidJSON that says where in the body it happened.
func (p *parser) errorf(at int, format string, args ...any) error {
	line, col := 1, 1
	before := p.src[:at]
	if i := bytes.LastIndexByte(before, '\n'); i >= 0 {
		line += bytes.Count(before, []byte{'\n'})
		before = before[i+1:]
	}
	col += utf8.RuneCount(before)
	msg := fmt.Sprintf(format, args...)
	return fmt.Errorf("%w: %s at line %d, column %d (byte %d)", ErrInvalidJSON, msg, line, col, at)
}

func quoteByte(c byte) string {
	if c < utf8.RuneSelf {
		return fmt.Sprintf("%q", rune(c))
	}
	return fmt.Sprintf("byte 0x%02x", c)
}
