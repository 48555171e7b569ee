package proxy

import (
	"errors"
	"net/url"
	"strings"
)

// secretParams are words that mark a query parameter of a URL as a secret: api-key
// (Azure), key, token, sig (signed URLs), secret, password, auth, credential.
var secretParams = []string{"key", "token", "sig", "secret", "password", "passwd", "auth", "credential"}

// RedactURL returns u with its userinfo password and the values of its secret-looking
// query parameters replaced, for printing and logging: a base URL may carry credentials.
func RedactURL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		return "<unparsable URL redacted>"
	}
	if p.RawQuery != "" {
		var parts []string
		for _, kv := range strings.Split(p.RawQuery, "&") {
			name, _, hasValue := strings.Cut(kv, "=")
			lower := strings.ToLower(name)
			for _, w := range secretParams {
				if hasValue && strings.Contains(lower, w) {
					kv = name + "=" + redacted
					break
				}
			}
			parts = append(parts, kv)
		}
		p.RawQuery = strings.Join(parts, "&")
	}
	if _, has := p.User.Password(); has {
		// url.URL.Redacted spells it xxxxx; the rest of the proxy's output says <redacted>.
		return strings.Replace(p.Redacted(), ":xxxxx@", ":"+redacted+"@", 1)
	}
	return p.String()
}

// redacted stands for a secret wherever one is printed or logged: in a URL, and by
// serve --print-config.
const redacted = "<redacted>"

// redactErr redacts the URL an error of an upstream call names (a *url.Error says
// `Post "https://…?api-key=…": …`), so that a logged cause holds no secret of the base URL.
func redactErr(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		cp := *ue
		cp.URL = RedactURL(ue.URL)
		return &cp
	}
	return err
}
