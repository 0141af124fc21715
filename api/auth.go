package api

import (
	"context"
	"crypto/sha256"
	"crypto/subtle"
	"crypto/tls"
	"errors"
	"fmt"
	"slices"
	"strings"
	"sync"
	"sync/atomic"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	"google.golang.org/grpc/credentials"
	"google.golang.org/grpc/metadata"
	"google.golang.org/grpc/peer"
	"google.golang.org/grpc/status"
)

// Scope is a set of permissions a client's token grants.
type Scope uint8

const (
	// ScopeRead allows Score, ListWorkers, health checks and reflection.
	ScopeRead Scope = 1 << iota
	// ScopeRoute allows Route and Release.
	ScopeRoute
)

// scopeNames name the scopes by bit.
var scopeNames = [...]string{"read", "route"}

// ParseScope reads "read" or "route".
func ParseScope(s string) (Scope, error) {
	if i := slices.Index(scopeNames[:], s); i >= 0 {
		return 1 << i, nil
	}
	return 0, fmt.Errorf("scope %q: want read or route", s)
}

// String lists the scopes, "read,route".
func (s Scope) String() string {
	var out []string
	for i, name := range scopeNames {
		if s&(1<<i) != 0 {
			out = append(out, name)
		}
	}
	return strings.Join(out, ",")
}

// methodScopes are the scopes each method needs (else ScopeRead); the
// picker's ext_proc stream routes every request.
var methodScopes = map[string]Scope{
	"/kvindex.v1.IndexService/Route":                       ScopeRoute,
	"/kvindex.v1.IndexService/Release":                     ScopeRoute,
	"/envoy.service.ext_proc.v3.ExternalProcessor/Process": ScopeRoute,
}

// Listener names of the refusal counts: the gRPC API, the picker's ext_proc
// and the HTTP metrics server (ListenerHTTP is the HTTP/JSON API's).
const (
	ListenerGRPC    = "grpc"
	ListenerGateway = "gateway"
	ListenerMetrics = "metrics"
)

// Token is one client's bearer token: its name (its identity), the secret
// and its scopes.
type Token struct {
	Name   string
	Secret string
	Scopes Scope
}

// AuthOptions tune an Auth.
type AuthOptions struct {
	// OpenHealth lets health checks (grpc.health.v1, /healthz) through
	// without a token: kubelet's probes cannot send one.
	OpenHealth bool
	// CertIdentity accepts a verified client certificate as the identity,
	// with every scope, when a call carries no token.
	CertIdentity bool
}

// Auth checks every call's credentials: a bearer token against the
// configured ones (compared in constant time by SHA-256) or a verified client
// certificate. It puts the identity in the context (IdentityFrom), refuses a
// missing or unknown credential (Unauthenticated) or scope
// (PermissionDenied), counting by listener. One Auth guards all a process's
// listeners. Secrets never appear in errors or logs.
//
// SetTokens swaps the table atomically (effective on the next call); mu
// guards listeners, which grows only at setup; calls count without a lock.
type Auth struct {
	opts   AuthOptions
	tokens atomic.Pointer[[]hashedToken]

	mu        sync.Mutex
	listeners []*listenerRefusals
}

// listenerRefusals are one listener's refusal counters.
type listenerRefusals struct {
	name                    string
	unauthenticated, denied atomic.Int64
}

// listener returns (adding them the first time) listener name's counters.
func (a *Auth) listener(name string) *listenerRefusals {
	a.mu.Lock()
	defer a.mu.Unlock()
	for _, l := range a.listeners {
		if l.name == name {
			return l
		}
	}
	l := &listenerRefusals{name: name}
	a.listeners = append(a.listeners, l)
	return l
}

type hashedToken struct {
	name   string
	sum    [sha256.Size]byte
	scopes Scope
}

// NewAuth returns an Auth over tokens.
func NewAuth(tokens []Token, opts AuthOptions) (*Auth, error) {
	a := &Auth{opts: opts}
	if err := a.SetTokens(tokens); err != nil {
		return nil, err
	}
	return a, nil
}

// SetTokens replaces the token table. Names must be unique and secrets
// non-empty and distinct.
func (a *Auth) SetTokens(tokens []Token) error {
	out := make([]hashedToken, 0, len(tokens))
	seen := map[string]bool{}
	sums := map[[sha256.Size]byte]string{}
	for i, t := range tokens {
		switch {
		case t.Name == "":
			return fmt.Errorf("api: token %d: empty name", i)
		case seen[t.Name]:
			return fmt.Errorf("api: token %q given twice", t.Name)
		case t.Secret == "":
			return fmt.Errorf("api: token %q: empty secret", t.Name)
		case t.Scopes == 0:
			return fmt.Errorf("api: token %q: no scopes", t.Name)
		}
		seen[t.Name] = true
		sum := sha256.Sum256([]byte(t.Secret))
		if other, dup := sums[sum]; dup {
			return fmt.Errorf("api: tokens %q and %q have the same secret", other, t.Name)
		}
		sums[sum] = t.Name
		out = append(out, hashedToken{name: t.Name, sum: sum, scopes: t.Scopes})
	}
	a.tokens.Store(&out)
	return nil
}

// Reasons of AuthRefusal.
const (
	// RefusedUnauthenticated: no credential, or an unknown token.
	RefusedUnauthenticated = "unauthenticated"
	// RefusedDenied: a known client without the scope the call needs.
	RefusedDenied = "denied"
)

// AuthRefusal is one listener's count of refusals for one reason.
type AuthRefusal struct {
	Listener, Reason string
	N                int64
}

// RefusalsByListener returns each listener's refusals, both reasons, in
// setup order.
func (a *Auth) RefusalsByListener() []AuthRefusal {
	a.mu.Lock()
	ls := slices.Clone(a.listeners)
	a.mu.Unlock()
	out := make([]AuthRefusal, 0, 2*len(ls))
	for _, l := range ls {
		out = append(out,
			AuthRefusal{Listener: l.name, Reason: RefusedUnauthenticated, N: l.unauthenticated.Load()},
			AuthRefusal{Listener: l.name, Reason: RefusedDenied, N: l.denied.Load()})
	}
	return out
}

// ServerOptions returns the interceptors enforcing a on the gRPC API.
func (a *Auth) ServerOptions() []grpc.ServerOption { return a.ListenerOptions(ListenerGRPC) }

// ListenerOptions returns the interceptors enforcing a on a gRPC server,
// counting refusals under listener.
func (a *Auth) ListenerOptions(listener string) []grpc.ServerOption {
	l := a.listener(listener)
	return []grpc.ServerOption{
		grpc.ChainUnaryInterceptor(func(ctx context.Context, req any, info *grpc.UnaryServerInfo, h grpc.UnaryHandler) (any, error) {
			ctx, err := a.check(ctx, l, info.FullMethod)
			if err != nil {
				return nil, err
			}
			return h(ctx, req)
		}),
		grpc.ChainStreamInterceptor(func(srv any, ss grpc.ServerStream, info *grpc.StreamServerInfo, h grpc.StreamHandler) error {
			ctx, err := a.check(ss.Context(), l, info.FullMethod)
			if err != nil {
				return err
			}
			return h(srv, &identityStream{ServerStream: ss, ctx: ctx})
		}),
	}
}

// identityStream is a ServerStream whose context carries the identity.
type identityStream struct {
	grpc.ServerStream
	ctx context.Context
}

func (s *identityStream) Context() context.Context { return s.ctx }

var (
	errNoCredential = errors.New("no credential: send \"authorization: Bearer <token>\"")
	errUnknownToken = errors.New("unknown token")
)

// check authorises a gRPC call of method, returning ctx with the identity.
func (a *Auth) check(ctx context.Context, l *listenerRefusals, method string) (context.Context, error) {
	if a.opts.OpenHealth && strings.HasPrefix(method, "/grpc.health.v1.Health/") {
		return ctx, nil
	}
	md, _ := metadata.FromIncomingContext(ctx)
	name, err := a.authorize(l, method, md.Get("authorization"), func() (string, bool) { return certIdentity(ctx) })
	if err != nil {
		return ctx, err
	}
	return WithIdentity(ctx, name), nil
}

// authorize returns the name of method's caller (identify), or its refusal
// status, counted into l. The gRPC and HTTP/JSON APIs share it.
func (a *Auth) authorize(l *listenerRefusals, method string, vals []string, cert func() (string, bool)) (string, error) {
	need, ok := methodScopes[method]
	if !ok {
		need = ScopeRead
	}
	name, scopes, err := a.identify(vals, cert)
	if err != nil {
		l.unauthenticated.Add(1)
		return "", status.Errorf(codes.Unauthenticated, "%s: %v", method, err)
	}
	if scopes&need != need {
		l.denied.Add(1)
		return "", status.Errorf(codes.PermissionDenied, "%s: client %q has scopes %q, the call needs %q", method, name, scopes.String(), need.String())
	}
	return name, nil
}

// identify returns the caller's name and scopes from its authorization
// header values, or with CertIdentity its certificate.
func (a *Auth) identify(vals []string, cert func() (string, bool)) (string, Scope, error) {
	if len(vals) == 0 {
		if a.opts.CertIdentity {
			if name, ok := cert(); ok {
				return name, ScopeRead | ScopeRoute, nil
			}
		}
		return "", 0, errNoCredential
	}
	secret, ok := strings.CutPrefix(vals[0], "Bearer ")
	if !ok || len(vals) > 1 {
		return "", 0, errUnknownToken
	}
	sum := sha256.Sum256([]byte(secret))
	var found *hashedToken
	ts := *a.tokens.Load()
	for i := range ts {
		// Every token is compared: the time says nothing of which matched.
		if subtle.ConstantTimeCompare(sum[:], ts[i].sum[:]) == 1 {
			found = &ts[i]
		}
	}
	if found == nil {
		return "", 0, errUnknownToken
	}
	return found.name, found.scopes, nil
}

// certIdentity returns the caller's verified certificate's name (certName).
func certIdentity(ctx context.Context) (string, bool) {
	p, ok := peer.FromContext(ctx)
	if !ok {
		return "", false
	}
	ti, ok := p.AuthInfo.(credentials.TLSInfo)
	if !ok {
		return "", false
	}
	return certName(&ti.State)
}

// certName returns "cert:" and the verified client certificate's common name.
func certName(cs *tls.ConnectionState) (string, bool) {
	if cs == nil || len(cs.VerifiedChains) == 0 || len(cs.VerifiedChains[0]) == 0 {
		return "", false
	}
	cn := cs.VerifiedChains[0][0].Subject.CommonName
	return "cert:" + cn, cn != ""
}

// BearerToken is a client's per-call credential; with requireTLS the
// connection must be TLS.
type BearerToken struct {
	token      string
	requireTLS bool
}

// NewBearerToken returns the credential for grpc.WithPerRPCCredentials.
func NewBearerToken(token string, requireTLS bool) BearerToken {
	return BearerToken{token: token, requireTLS: requireTLS}
}

// GetRequestMetadata implements credentials.PerRPCCredentials.
func (b BearerToken) GetRequestMetadata(context.Context, ...string) (map[string]string, error) {
	return map[string]string{"authorization": "Bearer " + b.token}, nil
}

// RequireTransportSecurity implements credentials.PerRPCCredentials.
func (b BearerToken) RequireTransportSecurity() bool { return b.requireTLS }
