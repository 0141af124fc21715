package api

import (
	"errors"
	"fmt"
	"net/http"
)

// HTTP returns h guarded by a (the metrics server's /metrics and /healthz),
// refusals counted under listener: a request needs a bearer token of scope
// need, or with CertIdentity a verified client certificate. No or an unknown
// credential is 401 with a Bearer challenge, a missing scope 403 (RFC 6750).
// With OpenHealth, the health path ("" for none) needs no credential.
func (a *Auth) HTTP(listener string, need Scope, health string, h http.Handler) http.Handler {
	l := a.listener(listener)
	return http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		if a.opts.OpenHealth && health != "" && r.URL.Path == health {
			h.ServeHTTP(w, r)
			return
		}
		name, scopes, err := a.identify(r.Header.Values("Authorization"), func() (string, bool) { return certName(r.TLS) })
		if err != nil {
			l.unauthenticated.Add(1)
			challenge := `Bearer realm="kvindex"`
			if errors.Is(err, errUnknownToken) {
				challenge += `, error="invalid_token"`
			}
			w.Header().Set("WWW-Authenticate", challenge)
			http.Error(w, fmt.Sprintf("%s: %v", r.URL.Path, err), http.StatusUnauthorized)
			return
		}
		if scopes&need != need {
			l.denied.Add(1)
			w.Header().Set("WWW-Authenticate", fmt.Sprintf(`Bearer realm="kvindex", error="insufficient_scope", scope=%q`, need.String()))
			http.Error(w, fmt.Sprintf("%s: client %q has scopes %q, the request needs %q", r.URL.Path, name, scopes.String(), need.String()), http.StatusForbidden)
			return
		}
		h.ServeHTTP(w, r.WithContext(WithIdentity(r.Context(), name)))
	})
}
