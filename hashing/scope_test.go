package hashing

import (
	"strings"
	"testing"
)

func TestParseScope(t *testing.T) {
	tests := []struct {
		in, want string // want "" means an error
		errPart  string
	}{
		{"credential", "credential", ""},
		{"Credential", "credential", ""},
		{"global", "global", ""},
		{"GLOBAL", "global", ""},
		{"header:X-Tenant", "header:X-Tenant", ""},
		{"header:x-tenant", "header:X-Tenant", ""},
		{"Header:x-api-user", "header:X-Api-User", ""},
		{"header:tenant_id", "header:Tenant_id", ""},
		{"", "", "unknown scope"},
		{"tenant", "", "unknown scope"},
		{"credentials", "", "unknown scope"},
		{"credential:x", "", "unknown scope"},
		{"global:", "", "unknown scope"},
		{" global", "", "unknown scope"},
		{"header", "", "names no header"},
		{"header:", "", "names no header"},
		{"header:X Tenant", "", "not a valid header name"},
		{"header: X-Tenant", "", "not a valid header name"},
		{"header:X-Tenant:", "", "not a valid header name"},
		{"header:Ü", "", "not a valid header name"},
	}
	for _, tt := range tests {
		got, err := ParseScope(tt.in)
		if tt.want == "" {
			if err == nil || !strings.Contains(err.Error(), tt.errPart) || !strings.HasPrefix(err.Error(), "hashing: ") {
				t.Errorf("ParseScope(%q) = %v, %v; want an error saying %q", tt.in, got, err, tt.errPart)
			}
			continue
		}
		if err != nil || got.String() != tt.want {
			t.Errorf("ParseScope(%q) = %v, %v; want %s, nil", tt.in, got, err, tt.want)
			continue
		}
		again, err := ParseScope(got.String())
		if err != nil || again != got {
			t.Errorf("ParseScope(%q) = %v, %v; want %v, nil (round trip)", got.String(), again, err, got)
		}
	}
}

func TestScopeZeroValue(t *testing.T) {
	var s Scope
	c, _ := ParseScope("credential")
	if s != c || s.String() != "credential" {
		t.Errorf("zero Scope = %v; want credential", s)
	}
}

func TestScopeText(t *testing.T) {
	var s Scope
	if err := s.UnmarshalText([]byte("header:x-tenant")); err != nil {
		t.Fatal(err)
	}
	b, err := s.MarshalText()
	if err != nil || string(b) != "header:X-Tenant" {
		t.Errorf("MarshalText = %s, %v; want header:X-Tenant, nil", b, err)
	}
	if err := s.UnmarshalText([]byte("nope")); err == nil {
		t.Errorf("UnmarshalText(nope) = nil; want an error")
	}
	if s.String() != "header:X-Tenant" {
		t.Errorf("failed UnmarshalText changed the scope to %v", s)
	}
}
