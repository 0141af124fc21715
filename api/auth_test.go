package api

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"crypto/x509/pkix"
	"net/http"
	"net/http/httptest"
	"slices"
	"strings"
	"testing"

	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/status"
)

func TestAuthTokensValidate(t *testing.T) {
	for _, tc := range []struct {
		toks []Token
		want string
	}{
		{[]Token{{Secret: "s", Scopes: ScopeRead}}, "empty name"},
		{[]Token{{Name: "a", Scopes: ScopeRead}}, "empty secret"},
		{[]Token{{Name: "a", Secret: "s"}}, "no scopes"},
		{[]Token{{Name: "a", Secret: "s", Scopes: ScopeRead}, {Name: "a", Secret: "t", Scopes: ScopeRead}}, "given twice"},
		{[]Token{{Name: "a", Secret: "s", Scopes: ScopeRead}, {Name: "b", Secret: "s", Scopes: ScopeRoute}}, "same secret"},
	} {
		if _, err := NewAuth(tc.toks, AuthOptions{}); err == nil || !strings.Contains(err.Error(), tc.want) || strings.Contains(err.Error(), `"s"`) {
			t.Errorf("%+v: %v, want an error saying %q (without the secret)", tc.toks, err, tc.want)
		}
	}
}

func TestAuthCheck(t *testing.T) {
	a, err := NewAuth([]Token{{Name: "r", Secret: "read", Scopes: ScopeRead}, {Name: "w", Secret: "both", Scopes: ScopeRead | ScopeRoute}}, AuthOptions{})
	if err != nil {
		t.Fatal(err)
	}
	call := func(secret, method string) (string, codes.Code) {
		ctx := context.Background()
		if secret != "" {
			ctx = metadata.NewIncomingContext(ctx, metadata.Pairs("authorization", "Bearer "+secret))
		}
		ctx, err := a.check(ctx, a.listener(ListenerGRPC), method)
		id, _ := IdentityFrom(ctx)
		return id, status.Code(err)
	}
	for _, tc := range []struct {
		secret, method, id string
		code               codes.Code
	}{
		{"", "/kvindex.v1.IndexService/Score", "", codes.Unauthenticated},
		{"nope", "/kvindex.v1.IndexService/Score", "", codes.Unauthenticated},
		{"read", "/kvindex.v1.IndexService/Score", "r", codes.OK},
		{"read", "/grpc.health.v1.Health/Check", "r", codes.OK},
		{"read", "/kvindex.v1.IndexService/Route", "", codes.PermissionDenied},
		{"both", "/kvindex.v1.IndexService/Release", "w", codes.OK},
		{"", "/grpc.health.v1.Health/Check", "", codes.Unauthenticated},
		{"read", "/envoy.service.ext_proc.v3.ExternalProcessor/Process", "", codes.PermissionDenied},
		{"both", "/envoy.service.ext_proc.v3.ExternalProcessor/Process", "w", codes.OK},
	} {
		id, code := call(tc.secret, tc.method)
		if id != tc.id || code != tc.code {
			t.Errorf("%s with %q: identity %q, code %v; want %q, %v", tc.method, tc.secret, id, code, tc.id, tc.code)
		}
	}
	if u, d := a.Refusals(); u != 3 || d != 2 {
		t.Fatalf("refusals %d unauthenticated, %d denied; want 3, 2", u, d)
	}
}

func TestAuthHTTP(t *testing.T) {
	toks := []Token{{Name: "r", Secret: "read", Scopes: ScopeRead}, {Name: "x", Secret: "route", Scopes: ScopeRoute}}
	ok := http.HandlerFunc(func(w http.ResponseWriter, r *http.Request) {
		id, _ := IdentityFrom(r.Context())
		_, _ = w.Write([]byte("ok " + id))
	})
	for _, open := range []bool{false, true} {
		a, err := NewAuth(toks, AuthOptions{OpenHealth: open, CertIdentity: true})
		if err != nil {
			t.Fatal(err)
		}
		h := a.HTTP(ListenerMetrics, ScopeRead, "/healthz", ok)
		for _, tc := range []struct {
			path, auth string
			cert       string // a verified client certificate's common name
			code       int
			challenge  string // WWW-Authenticate, "" for none
			body       string
		}{
			{"/metrics", "", "", 401, `Bearer realm="kvindex"`, "no credential"},
			{"/metrics", "Bearer nope", "", 401, `Bearer realm="kvindex", error="invalid_token"`, "unknown token"},
			{"/metrics", "Basic cmVhZA==", "", 401, `Bearer realm="kvindex", error="invalid_token"`, "unknown token"},
			{"/metrics", "Bearer route", "", 403, `Bearer realm="kvindex", error="insufficient_scope", scope="read"`, `client "x" has scopes "route", the request needs "read"`},
			{"/metrics", "Bearer read", "", 200, "", "ok r"},
			{"/metrics", "", "probe", 200, "", "ok cert:probe"},
			{"/healthz", "Bearer read", "", 200, "", "ok"},
			{"/healthz", "", "", map[bool]int{false: 401, true: 200}[open], map[bool]string{false: `Bearer realm="kvindex"`}[open], map[bool]string{false: "no credential", true: "ok "}[open]},
		} {
			req := httptest.NewRequest(http.MethodGet, tc.path, nil)
			if tc.auth != "" {
				req.Header.Set("Authorization", tc.auth)
			}
			if tc.cert != "" {
				req.TLS = &tls.ConnectionState{VerifiedChains: [][]*x509.Certificate{{{Subject: pkix.Name{CommonName: tc.cert}}}}}
			}
			rec := httptest.NewRecorder()
			h.ServeHTTP(rec, req)
			body := rec.Body.String()
			if rec.Code != tc.code || rec.Header().Get("WWW-Authenticate") != tc.challenge || !strings.Contains(body, tc.body) {
				t.Errorf("open_health %v, %s with %q: %d %q %q; want %d %q, a body with %q", open, tc.path, tc.auth, rec.Code, rec.Header().Get("WWW-Authenticate"), body, tc.code, tc.challenge, tc.body)
			}
			if strings.Contains(body, "nope") {
				t.Errorf("the refusal quotes the secret: %q", body)
			}
		}
		wantU := map[bool]int64{false: 4, true: 3}[open]
		got := a.RefusalsByListener()
		want := []AuthRefusal{{ListenerMetrics, RefusedUnauthenticated, wantU}, {ListenerMetrics, RefusedDenied, 1}}
		if !slices.Equal(got, want) {
			t.Errorf("open_health %v: refusals %+v, want %+v", open, got, want)
		}
	}
}
