package api

import (
	"context"
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
		ctx, err := a.check(ctx, method)
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
	} {
		id, code := call(tc.secret, tc.method)
		if id != tc.id || code != tc.code {
			t.Errorf("%s with %q: identity %q, code %v; want %q, %v", tc.method, tc.secret, id, code, tc.id, tc.code)
		}
	}
	if u, d := a.Refusals(); u != 3 || d != 1 {
		t.Fatalf("refusals %d unauthenticated, %d denied; want 3, 1", u, d)
	}
}
