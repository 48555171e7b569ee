package proxy_test

import (
	"testing"

	"github.com/llm-dedupe-proxy/llm-dedupe-proxy/proxy"
)

// TestRedactURLHidesCredentials: a base URL's password and secret-looking query values are
// replaced before it is printed or logged; everything else stays readable.
func TestRedactURLHidesCredentials(t *testing.T) {
	for in, want := range map[string]string{
		"https://user:pw@gw.example/openai":                         "https://user:<redacted>@gw.example/openai",
		"https://gw.example/openai?api-version=2024-02-01":          "https://gw.example/openai?api-version=2024-02-01",
		"https://gw.example/openai?api-key=k3y&api-version=1":       "https://gw.example/openai?api-key=<redacted>&api-version=1",
		"https://gw.example/x?Access_Token=t&sig=s&flag&password=p": "https://gw.example/x?Access_Token=<redacted>&sig=<redacted>&flag&password=<redacted>",
		"://not a url": "<unparsable URL redacted>",
	} {
		if got := proxy.RedactURL(in); got != want {
			t.Errorf("RedactURL(%q) = %q; want %q", in, got, want)
		}
	}
}
