package singleflight

import (
	"encoding/json"
	"fmt"
	"slices"
	"strconv"
	"strings"
)

// Headers travel through Redis as the JSON encoding/json makes of a map[string][]string.
// Printable ASCII with nothing to escape is written and read here, byte for byte what
// encoding/json writes; anything else goes through encoding/json. See ADR 0018.

// encodeHeader returns h as a JSON object with sorted keys, "" if h is empty.
func encodeHeader(h map[string][]string) string {
	if len(h) == 0 {
		return ""
	}
	keys := make([]string, 0, len(h))
	size := 2
	for k, vs := range h {
		if !plainJSON(k) {
			return marshalHeader(h)
		}
		keys = append(keys, k)
		size += len(k) + 6
		for _, v := range vs {
			if !plainJSON(v) {
				return marshalHeader(h)
			}
			size += len(v) + 3
		}
	}
	slices.Sort(keys)
	var b strings.Builder
	b.Grow(size)
	b.WriteByte('{')
	for i, k := range keys {
		writeItem(&b, i == 0, k)
		b.WriteByte(':')
		vs := h[k]
		if vs == nil {
			b.WriteString("null")
			continue
		}
		b.WriteByte('[')
		for j, v := range vs {
			writeItem(&b, j == 0, v)
		}
		b.WriteByte(']')
	}
	b.WriteByte('}')
	return b.String()
}

func writeItem(b *strings.Builder, first bool, s string) {
	if !first {
		b.WriteByte(',')
	}
	b.WriteByte('"')
	b.WriteString(s)
	b.WriteByte('"')
}

func marshalHeader(h map[string][]string) string {
	b, _ := json.Marshal(h)
	return string(b)
}

// plainJSON reports whether encoding/json writes s as it is: printable ASCII, no escape.
func plainJSON(s string) bool {
	for i := 0; i < len(s); i++ {
		switch c := s[i]; {
		case c < 0x20 || c >= 0x7f, c == '"', c == '\\', c == '<', c == '>', c == '&':
			return false
		}
	}
	return true
}

func decodeHeader(s string) (map[string][]string, error) {
	if h, ok := parsePlainHeader(s); ok {
		return h, nil
	}
	var h map[string][]string
	err := json.Unmarshal([]byte(s), &h)
	return h, err
}

// parsePlainHeader parses what encodeHeader writes itself; false for anything else.
func parsePlainHeader(s string) (map[string][]string, bool) {
	if len(s) < 2 || s[0] != '{' || s[len(s)-1] != '}' {
		return nil, false
	}
	h := make(map[string][]string, strings.Count(s, `":`))
	p := s[1 : len(s)-1]
	for p != "" {
		k, rest, ok := plainString(p)
		if !ok || !strings.HasPrefix(rest, ":") {
			return nil, false
		}
		p = rest[1:]
		if rest, ok := strings.CutPrefix(p, "null"); ok {
			h[k], p = nil, rest
		} else {
			if !strings.HasPrefix(p, "[") {
				return nil, false
			}
			p = p[1:]
			vs := make([]string, 0, 1)
			for !strings.HasPrefix(p, "]") {
				if len(vs) > 0 {
					if !strings.HasPrefix(p, ",") {
						return nil, false
					}
					p = p[1:]
				}
				v, rest, ok := plainString(p)
				if !ok {
					return nil, false
				}
				vs, p = append(vs, v), rest
			}
			h[k], p = vs, p[1:]
		}
		if p == "" {
			break
		}
		if p[0] != ',' || len(p) == 1 {
			return nil, false
		}
		p = p[1:]
	}
	return h, true
}

// plainString reads a quoted string of plain ASCII from the start of p; false otherwise.
func plainString(p string) (v, rest string, ok bool) {
	if len(p) < 2 || p[0] != '"' {
		return "", "", false
	}
	end := strings.IndexByte(p[1:], '"')
	if end < 0 {
		return "", "", false
	}
	v = p[1 : 1+end]
	for i := 0; i < len(v); i++ {
		if c := v[i]; c == '\\' || c < 0x20 || c >= 0x80 {
			return "", "", false
		}
	}
	return v, p[2+end:], true
}

// originKey carries Head.Origin inside the encoded header: no header name has a colon, so
// it cannot meet one, and an instance that does not know it replays nothing of it (net/http
// drops invalid header names). See ADR 0061.
const originKey = ":origin"

// encodeHead is the header of h as it travels, its origin included.
func encodeHead(h Head) string {
	if h.Origin == "" {
		return encodeHeader(h.Header)
	}
	m := make(map[string][]string, len(h.Header)+1)
	for k, vs := range h.Header {
		m[k] = vs
	}
	m[originKey] = []string{h.Origin}
	return encodeHeader(m)
}

func decodeHead(status, header string) (Head, error) {
	s, err := strconv.Atoi(status)
	if err != nil {
		return Head{}, fmt.Errorf("singleflight: bad stored status %q", status)
	}
	h := Head{Status: s}
	if header != "" {
		if h.Header, err = decodeHeader(header); err != nil {
			return Head{}, fmt.Errorf("singleflight: bad stored header: %w", err)
		}
		if o, ok := h.Header[originKey]; ok {
			delete(h.Header, originKey)
			if len(o) == 1 {
				h.Origin = o[0]
			}
		}
	}
	return h, nil
}
