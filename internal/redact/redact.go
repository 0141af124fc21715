// Package redact removes credentials from what kvindex logs: passwords in
// URLs' user info and the values of query parameters that carry tokens or
// keys, so that a metrics_url such as
// https://user:pw@10.0.0.5/metrics?token=abc never reaches a log line or
// an error message in clear.
//
// The functions are pure and safe for concurrent use.
package redact

import (
	"errors"
	"net/url"
	"strings"
)

// Mask replaces every redacted value.
const Mask = "REDACTED"

// secretParams mark a query parameter whose name contains one of them,
// compared without case, as a credential.
var secretParams = []string{"token", "secret", "password", "passwd", "key", "auth", "sig", "signature", "credential", "session"}

// URL returns u with its user-info password and secret query values
// replaced by Mask. Text that does not parse as a URL is masked whole if
// it looks like it carries credentials ("@" or "="), else returned as is.
func URL(u string) string {
	p, err := url.Parse(u)
	if err != nil {
		if strings.ContainsAny(u, "@=") {
			return Mask
		}
		return u
	}
	if p.User != nil {
		if _, has := p.User.Password(); has {
			p.User = url.UserPassword(p.User.Username(), Mask)
		}
	}
	if p.RawQuery != "" {
		q := p.Query()
		changed := false
		for name, vals := range q {
			if secret(name) {
				for i := range vals {
					vals[i] = Mask
				}
				changed = true
			}
		}
		if changed {
			p.RawQuery = q.Encode()
		}
	}
	return p.String()
}

func secret(name string) bool {
	n := strings.ToLower(name)
	for _, s := range secretParams {
		if strings.Contains(n, s) {
			return true
		}
	}
	return false
}

// Err returns err without the URL net/http puts in it (which keeps query
// strings, credentials included): the *url.Error's inner error.
func Err(err error) error {
	var ue *url.Error
	if errors.As(err, &ue) {
		return ue.Err
	}
	return err
}
