package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
	"errors"
	"io"
	"log/slog"
	"net/http"
	"os"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"google.golang.org/grpc"
	"google.golang.org/grpc/codes"
	healthpb "google.golang.org/grpc/health/grpc_health_v1"
	"google.golang.org/grpc/status"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/ctl"
	"github.com/kvindex/kvindex/internal/testcerts"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// secureFleet is a daemon serving gRPC, HTTP/JSON and /metrics over mTLS, with a read
// token (file), a route token (env) and a second route token.
type secureFleet struct {
	*fleet
	ca                  *testcerts.CA
	client              testcerts.Pair
	readFile, routeFile string
	logs                *syncBuffer
}

const (
	readSecret   = "read-secret-0123456789"
	routeSecret  = "route-secret-0123456789"
	route2Secret = "route2-secret-0123456789"
)

func newSecureFleet(t *testing.T) *secureFleet {
	t.Helper()
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "kvindex-test")
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := ca.Server("kvindex")
	client, _ := ca.Client("router-1")
	s := &secureFleet{ca: ca, client: client, readFile: filepath.Join(dir, "read"), routeFile: filepath.Join(dir, "route"), logs: &syncBuffer{}}
	for f, secret := range map[string]string{s.readFile: readSecret + "\n", s.routeFile: routeSecret} {
		if err := os.WriteFile(f, []byte(secret), 0o600); err != nil {
			t.Fatal(err)
		}
	}
	t.Setenv("KVINDEX_TEST_ROUTE2", route2Secret)
	log := slog.New(slog.NewTextHandler(s.logs, &slog.HandlerOptions{Level: slog.LevelDebug}))
	s.fleet = newFleet(t, fleetOptions{log: log, configure: func(c *config.Config) {
		c.TLS = config.TLS{CertFile: srv.CertFile, KeyFile: srv.KeyFile, ClientCAFile: ca.File, Metrics: true}
		c.HTTPListen = "127.0.0.1:0"
		c.Auth = config.Auth{OpenHealth: true, Tokens: []config.Token{
			{Name: "dashboards", Scopes: []string{"read"}, File: s.readFile},
			{Name: "gateway", Scopes: []string{"read", "route"}, File: s.routeFile},
			{Name: "gateway-2", Scopes: []string{"route", "read"}, Env: "KVINDEX_TEST_ROUTE2"},
		}}
	}}, podSpec{name: "a"})
	s.start()
	return s
}

// dial returns a client over mTLS with token ("" for none).
func (s *secureFleet) dial(t *testing.T, token string) *api.Client {
	t.Helper()
	tlsOpt, err := api.ClientTLS{CAFile: s.ca.File, CertFile: s.client.CertFile, KeyFile: s.client.KeyFile}.DialOption()
	if err != nil {
		t.Fatal(err)
	}
	opts := []grpc.DialOption{tlsOpt}
	if token != "" {
		opts = append(opts, grpc.WithPerRPCCredentials(api.NewBearerToken(token, true)))
	}
	c, err := api.Dial(context.Background(), s.d.GRPCAddr(), opts...)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { c.Close() })
	return c
}

func TestTLSTokensAndScopes(t *testing.T) {
	s := newSecureFleet(t)
	ctx := context.Background()
	req := &kvindexv1.ScoreRequest{Model: model, TokenIds: tokens("p", 4*blockSize)}

	// Plaintext, and TLS without a client certificate, do not get in.
	plain, err := api.Dial(ctx, s.d.GRPCAddr())
	if err != nil {
		t.Fatal(err)
	}
	defer plain.Close()
	if _, err := plain.Score(ctx, req); status.Code(err) != codes.Unavailable {
		t.Fatalf("plaintext: %v, want Unavailable", err)
	}
	noCert, _ := api.ClientTLS{CAFile: s.ca.File}.DialOption()
	nc, _ := api.Dial(ctx, s.d.GRPCAddr(), noCert, grpc.WithPerRPCCredentials(api.NewBearerToken(readSecret, true)))
	defer nc.Close()
	if _, err := nc.Score(ctx, req); err == nil {
		t.Fatal("TLS without a client certificate was served")
	}

	// mTLS without a token, or with a wrong one: Unauthenticated.
	for _, tok := range []string{"", "not-a-token"} {
		if _, err := s.dial(t, tok).Score(ctx, req); status.Code(err) != codes.Unauthenticated {
			t.Fatalf("token %q: %v, want Unauthenticated", tok, err)
		}
	}
	// Health is open (open_health) for probes that cannot send a token.
	hc := healthpb.NewHealthClient(s.dial(t, "").Conn())
	if r, err := hc.Check(ctx, &healthpb.HealthCheckRequest{}); err != nil || r.GetStatus() != healthpb.HealthCheckResponse_SERVING {
		t.Fatalf("open health: %v, %v", r, err)
	}

	// read scope: Score and ListWorkers, not Route or Release.
	reader := s.dial(t, readSecret)
	if _, err := reader.Score(ctx, req); err != nil {
		t.Fatalf("read token Score: %v", err)
	}
	if _, err := reader.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{}); err != nil {
		t.Fatalf("read token ListWorkers: %v", err)
	}
	route := &kvindexv1.RouteRequest{RequestId: "r1", Score: req}
	if _, err := reader.Route(ctx, route); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("read token Route: %v, want PermissionDenied", err)
	}

	// route scope; a request is released only by the client that routed it.
	gw, gw2 := s.dial(t, routeSecret), s.dial(t, route2Secret)
	if _, err := gw.Route(ctx, route); err != nil {
		t.Fatalf("route token Route: %v", err)
	}
	if _, err := gw2.Release(ctx, "r1"); status.Code(err) != codes.PermissionDenied {
		t.Fatalf("another client's Release: %v, want PermissionDenied", err)
	}
	if ok, err := gw.Release(ctx, "r1"); err != nil || !ok {
		t.Fatalf("owner's Release: %v, %v", ok, err)
	}

	// kvindexctl's client settings reach the same server.
	var out bytes.Buffer
	cfg := ctl.Config{Addr: s.d.GRPCAddr(), Out: &out, Token: readSecret, Timeout: 5 * time.Second,
		TLS: ctl.TLS{CAFile: s.ca.File, CertFile: s.client.CertFile, KeyFile: s.client.KeyFile}}
	if err := ctl.Workers(ctx, cfg, ""); err != nil || !strings.Contains(out.String(), "a/0") {
		t.Fatalf("kvindexctl workers over mTLS: %v\n%s", err, out.String())
	}

	// /metrics is served over the same mTLS and counts the refusals.
	m := s.metricsTLS(t, readSecret)
	for _, want := range []string{`kvindex_auth_refused_total{listener="grpc",reason="unauthenticated"} 2`, `kvindex_auth_refused_total{listener="grpc",reason="denied"} 1`} {
		if !strings.Contains(m, want) {
			t.Errorf("metrics lack %s", want)
		}
	}

	// Rotating a token file: the new secret works within seconds, the old
	// one stops working.
	const rotated = "read-secret-rotated-987654"
	if err := os.WriteFile(s.readFile, []byte(rotated), 0o600); err != nil {
		t.Fatal(err)
	}
	newReader := s.dial(t, rotated)
	s.waitFor(func() bool { _, err := newReader.Score(ctx, req); return err == nil }, "the rotated token to be accepted")
	if _, err := reader.Score(ctx, req); status.Code(err) != codes.Unauthenticated {
		t.Fatalf("old token after rotation: %v, want Unauthenticated", err)
	}

	// No secret ever reaches the logs.
	logs := s.logs.String()
	for _, secret := range []string{readSecret, routeSecret, route2Secret, rotated} {
		if strings.Contains(logs, secret) {
			t.Fatalf("a token secret is in the daemon's logs")
		}
	}
}

// metricsTLS reads /metrics over mTLS with token.
func (s *secureFleet) metricsTLS(t *testing.T, token string) string {
	t.Helper()
	if resp, err := http.Get("http://" + s.d.MetricsAddr() + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(b), "kvindex_") {
			t.Fatal("/metrics served over plaintext")
		}
	}
	code, _, body := httpGet(t, httpsClient(t, s.ca.File, s.client), "https://"+s.d.MetricsAddr()+"/metrics", token)
	if code != http.StatusOK {
		t.Fatalf("/metrics with a read token: %d %s", code, body)
	}
	return body
}

// httpsClient is an HTTP client trusting caFile, presenting client's
// certificate unless client is the zero Pair.
func httpsClient(t *testing.T, caFile string, client testcerts.Pair) *http.Client {
	t.Helper()
	pem, _ := os.ReadFile(caFile)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	tc := &tls.Config{RootCAs: pool}
	if client.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(client.CertFile, client.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		tc.Certificates = []tls.Certificate{cert}
	}
	return &http.Client{Transport: &http.Transport{TLSClientConfig: tc}}
}

// httpGet GETs url with token ("" for none) and returns the status, the
// WWW-Authenticate challenge and the body.
func httpGet(t *testing.T, hc *http.Client, url, token string) (int, string, string) {
	t.Helper()
	req, err := http.NewRequest(http.MethodGet, url, nil)
	if err != nil {
		t.Fatal(err)
	}
	if token != "" {
		req.Header.Set("Authorization", "Bearer "+token)
	}
	resp, err := hc.Do(req)
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return resp.StatusCode, resp.Header.Get("WWW-Authenticate"), string(b)
}

// TestMetricsTokens: the metrics server takes the gRPC API's tokens, over
// mTLS (open_health) and over TLS without client certificates (health
// closed): /metrics needs scope read (no or an unknown token 401 with a
// Bearer challenge, a route-only token 403), /healthz needs it unless
// auth.open_health; a rotated token file takes effect on /metrics once
// the daemon has reloaded it; refusals are counted by listener; kvindexctl
// health --http sends its token.
func TestMetricsTokens(t *testing.T) {
	const routeOnly = "route-only-secret-0123456789"
	t.Setenv("KVINDEX_TEST_ROUTE_ONLY", routeOnly)
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "kvindex-test")
	if err != nil {
		t.Fatal(err)
	}
	srv, _ := ca.Server("kvindex")
	client, _ := ca.Client("dashboards-1")
	for _, mtls := range []bool{true, false} {
		t.Run(map[bool]string{true: "mTLS", false: "TLS"}[mtls], func(t *testing.T) {
			readFile := filepath.Join(t.TempDir(), "read")
			if err := os.WriteFile(readFile, []byte(readSecret+"\n"), 0o600); err != nil {
				t.Fatal(err)
			}
			f := newFleet(t, fleetOptions{configure: func(c *config.Config) {
				c.TLS = config.TLS{CertFile: srv.CertFile, KeyFile: srv.KeyFile, Metrics: true}
				if mtls {
					c.TLS.ClientCAFile = ca.File
				}
				c.Auth = config.Auth{OpenHealth: mtls, Tokens: []config.Token{
					{Name: "dashboards", Scopes: []string{"read"}, File: readFile},
					{Name: "gateway", Scopes: []string{"read", "route"}, Env: "KVINDEX_TEST_ROUTE2"},
					{Name: "router", Scopes: []string{"route"}, Env: "KVINDEX_TEST_ROUTE_ONLY"},
				}}
			}}, podSpec{name: "a"})
			t.Setenv("KVINDEX_TEST_ROUTE2", route2Secret)
			f.start()
			var pair testcerts.Pair
			if mtls {
				pair = client
			}
			hc := httpsClient(t, ca.File, pair)
			base := "https://" + f.d.MetricsAddr()
			for _, tc := range []struct {
				path, token string
				code        int
				challenge   string
			}{
				{"/metrics", "", 401, `Bearer realm="kvindex"`},
				{"/metrics", "not-a-token", 401, `Bearer realm="kvindex", error="invalid_token"`},
				{"/metrics", routeOnly, 403, `Bearer realm="kvindex", error="insufficient_scope", scope="read"`},
				{"/metrics", readSecret, 200, ""},
				{"/healthz", readSecret, 200, ""},
				{"/healthz", "", map[bool]int{true: 200, false: 401}[mtls], map[bool]string{false: `Bearer realm="kvindex"`}[mtls]},
			} {
				code, challenge, body := httpGet(t, hc, base+tc.path, tc.token)
				if code != tc.code || challenge != tc.challenge {
					t.Errorf("%s with %q: %d %q; want %d %q (%s)", tc.path, tc.token, code, challenge, tc.code, tc.challenge, strings.TrimSpace(body))
				}
				if code == 200 && tc.path == "/metrics" && !strings.Contains(body, "kvindex_batches_total{") {
					t.Errorf("/metrics answered 200 without the metrics")
				}
			}
			wantU := map[bool]string{true: "2", false: "3"}[mtls]
			_, _, m := httpGet(t, hc, base+"/metrics", route2Secret)
			for _, want := range []string{`kvindex_auth_refused_total{listener="metrics",reason="unauthenticated"} ` + wantU, `kvindex_auth_refused_total{listener="metrics",reason="denied"} 1`, `kvindex_auth_refused_total{listener="grpc",reason="unauthenticated"} 0`} {
				if !strings.Contains(m, want) {
					t.Errorf("metrics lack %s", want)
				}
			}

			// kvindexctl health --http sends its token (and the TLS settings).
			var out bytes.Buffer
			cfg := ctl.Config{Out: &out, Timeout: 5 * time.Second, TLS: ctl.TLS{CAFile: ca.File, CertFile: pair.CertFile, KeyFile: pair.KeyFile}}
			if !mtls {
				if err := ctl.HealthHTTP(context.Background(), cfg, base+"/healthz"); !errors.Is(err, ctl.ErrNotServing) || !strings.Contains(err.Error(), "401") {
					t.Errorf("kvindexctl health --http without a token: %v, want 401", err)
				}
			}
			cfg.Token = readSecret
			if err := ctl.HealthHTTP(context.Background(), cfg, base+"/healthz"); err != nil || strings.TrimSpace(out.String()) != "ok" {
				t.Errorf("kvindexctl health --http with a read token: %v, %q", err, out.String())
			}

			// Rotation: once the daemon has reloaded the rewritten file, the
			// old secret is refused and the new one served.
			const rotated = "read-secret-rotated-987654"
			if err := os.WriteFile(readFile, []byte(rotated), 0o600); err != nil {
				t.Fatal(err)
			}
			f.waitFor(func() bool { return f.d.Auth().Reloads() == 1 }, "the daemon to reload the token file")
			if code, _, _ := httpGet(t, hc, base+"/metrics", readSecret); code != 401 {
				t.Errorf("/metrics with the rotated-out secret: %d, want 401", code)
			}
			if code, _, body := httpGet(t, hc, base+"/metrics", rotated); code != 200 || !strings.Contains(body, "kvindex_auth_token_reloads_total 1") {
				t.Errorf("/metrics with the new secret: %d, reloads counted: %v", code, strings.Contains(body, "kvindex_auth_token_reloads_total 1"))
			}
		})
	}
}
