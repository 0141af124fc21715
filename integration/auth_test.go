package integration

import (
	"bytes"
	"context"
	"crypto/tls"
	"crypto/x509"
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
	"github.com/kvindex/kvindex/internal/config"
	"github.com/kvindex/kvindex/internal/ctl"
	"github.com/kvindex/kvindex/internal/testcerts"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
)

// secureFleet is a daemon serving gRPC and /metrics over mTLS, with a read
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
	m := s.metricsTLS(t)
	for _, want := range []string{`kvindex_auth_refused_total{reason="unauthenticated"} 2`, `kvindex_auth_refused_total{reason="denied"} 1`} {
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

// metricsTLS reads /metrics over mTLS.
func (s *secureFleet) metricsTLS(t *testing.T) string {
	t.Helper()
	pem, _ := os.ReadFile(s.ca.File)
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	cert, err := tls.LoadX509KeyPair(s.client.CertFile, s.client.KeyFile)
	if err != nil {
		t.Fatal(err)
	}
	hc := &http.Client{Transport: &http.Transport{TLSClientConfig: &tls.Config{RootCAs: pool, Certificates: []tls.Certificate{cert}}}}
	if resp, err := http.Get("http://" + s.d.MetricsAddr() + "/metrics"); err == nil {
		b, _ := io.ReadAll(resp.Body)
		resp.Body.Close()
		if resp.StatusCode == http.StatusOK || strings.Contains(string(b), "kvindex_") {
			t.Fatal("/metrics served over plaintext")
		}
	}
	resp, err := hc.Get("https://" + s.d.MetricsAddr() + "/metrics")
	if err != nil {
		t.Fatal(err)
	}
	defer resp.Body.Close()
	b, err := io.ReadAll(resp.Body)
	if err != nil {
		t.Fatal(err)
	}
	return string(b)
}
