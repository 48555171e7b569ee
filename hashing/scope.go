package hashing

import (
	"crypto/sha256"
	"encoding/binary"
	"encoding/hex"
	"fmt"
	"net/http"
	"strings"
)

// Scope says which part of a request keeps tenants apart. The zero value is the credential
// scope. The package documentation describes each scope.
type Scope struct {
	kind   int    // 0 credential, 1 header, 2 global
	header string // for the header scope, in canonical form (http.CanonicalHeaderKey)
}

const (
	scopeCredential = iota
	scopeHeader
	scopeGlobal
)

// credentialHeaders are the headers that decide what a caller may access, in canonical form
// (so http.Header.Values finds them without allocating), in the order they are hashed.
var credentialHeaders = []string{
	"Authorization",
	"Api-Key",             // Azure OpenAI and clients written for it
	"Openai-Organization", // OpenAI-Organization
	"Openai-Project",      // OpenAI-Project
}

// ParseScope reads "credential", "header:NAME" or "global". The kind is matched without
// regard to case; NAME must be a valid header name, and is matched without regard to case,
// as HTTP header names are.
func ParseScope(s string) (Scope, error) {
	kind, name, hasName := strings.Cut(s, ":")
	switch {
	case strings.EqualFold(kind, "credential") && !hasName:
		return Scope{kind: scopeCredential}, nil
	case strings.EqualFold(kind, "global") && !hasName:
		return Scope{kind: scopeGlobal}, nil
	case strings.EqualFold(kind, "header") && hasName:
		if name == "" {
			return Scope{}, fmt.Errorf("hashing: scope %q names no header (want header:NAME)", s)
		}
		if !validHeaderName(name) {
			return Scope{}, fmt.Errorf("hashing: scope %q: %q is not a valid header name", s, name)
		}
		return Scope{kind: scopeHeader, header: http.CanonicalHeaderKey(name)}, nil
	case strings.EqualFold(kind, "header"):
		return Scope{}, fmt.Errorf("hashing: scope %q names no header (want header:NAME)", s)
	}
	return Scope{}, fmt.Errorf("hashing: unknown scope %q (want credential, header:NAME or global)", s)
}

// validHeaderName reports whether name is an HTTP token (RFC 9110 §5.6.2).
func validHeaderName(name string) bool {
	for i := 0; i < len(name); i++ {
		c := name[i]
		if 'a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' {
			continue
		}
		if !strings.ContainsRune("!#$%&'*+-.^_`|~", rune(c)) {
			return false
		}
	}
	return name != ""
}

// String returns the form ParseScope reads.
func (s Scope) String() string {
	switch s.kind {
	case scopeHeader:
		return "header:" + s.header
	case scopeGlobal:
		return "global"
	default:
		return "credential"
	}
}

// MarshalText returns the form ParseScope reads, so a Scope can sit in a config struct.
func (s Scope) MarshalText() ([]byte, error) { return []byte(s.String()), nil }

// UnmarshalText reads the form ParseScope reads.
func (s *Scope) UnmarshalText(b []byte) error {
	v, err := ParseScope(string(b))
	if err != nil {
		return err
	}
	*s = v
	return nil
}

// appendMaterial appends the scope's part of the hashed text: its tag, and for credential
// and header a SHA-256 of the headers that decide it, so that no credential is ever part of
// a key and the part never holds a zero byte. scratch is reused working space.
func (s Scope) appendMaterial(out []byte, h http.Header, scratch *[]byte) []byte {
	var names []string
	switch s.kind {
	case scopeGlobal:
		return append(out, "global"...)
	case scopeHeader:
		out = append(out, "header:"...)
		out = append(out, s.header...)
		out = append(out, ':')
		names = []string{s.header}
	default:
		out = append(out, "credential:"...)
		names = credentialHeaders
	}
	// name ‖ uvarint(count) ‖ (uvarint(len) ‖ value)*, for each name in a fixed order: no
	// two sets of headers encode alike.
	b := (*scratch)[:0]
	for _, name := range names {
		vs := h.Values(name)
		b = append(b, name...)
		b = binary.AppendUvarint(b, uint64(len(vs)))
		for _, v := range vs {
			b = binary.AppendUvarint(b, uint64(len(v)))
			b = append(b, v...)
		}
	}
	*scratch = b
	sum := sha256.Sum256(b)
	return hex.AppendEncode(out, sum[:])
}
