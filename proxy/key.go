package proxy

import (
	"net/url"
	"strings"
)

// HeaderNamespace names a request's namespace: part of its key, so that an application
// can keep its answers apart from others' and an operator can purge them all at once.
const HeaderNamespace = "X-Dedupe-Namespace"

// maxNamespaceLen bounds a namespace name; names are kept in every instance's memory.
const maxNamespaceLen = 64

// validNamespace reports whether ns may name a namespace: empty (the default one), or up
// to 64 letters, digits and . _ - :.
func validNamespace(ns string) bool {
	if len(ns) > maxNamespaceLen {
		return false
	}
	for i := 0; i < len(ns); i++ {
		c := ns[i]
		if !('a' <= c && c <= 'z' || 'A' <= c && c <= 'Z' || '0' <= c && c <= '9' || strings.IndexByte("._-:", c) >= 0) {
			return false
		}
	}
	return true
}

// keyPath is the path and, if there is one, the query of a request, in the form the key is
// made of: the query is sent upstream (Azure-style APIs choose the API version there), so
// it is part of the key, its parameters sorted.
func keyPath(u *url.URL) string {
	if u.RawQuery == "" {
		return u.Path
	}
	q, err := url.ParseQuery(u.RawQuery)
	if err != nil {
		return u.Path + "?" + u.RawQuery
	}
	return u.Path + "?" + q.Encode()
}
