package api

import "context"

// identityKey is the context key of the authenticated client's identity.
type identityKey struct{}

// WithIdentity returns ctx carrying the authenticated client's identity (a
// token's name, or a certificate's subject): only the client that routed a
// request may release it.
func WithIdentity(ctx context.Context, id string) context.Context {
	return context.WithValue(ctx, identityKey{}, id)
}

// IdentityFrom returns the identity WithIdentity put in ctx.
func IdentityFrom(ctx context.Context) (string, bool) {
	id, ok := ctx.Value(identityKey{}).(string)
	return id, ok
}
