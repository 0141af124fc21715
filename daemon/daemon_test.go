package daemon

import (
	"context"
	"errors"
	"fmt"
	"io"
	"net"
	"net/http"
	"runtime"
	"strings"
	"syscall"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/internal/netutil"
)

// runNATS starts a real NATS server in process, JetStream on (stopped at
// cleanup).
func runNATS(t *testing.T) *server.Server {
	t.Helper()
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: -1, JetStream: true, StoreDir: t.TempDir(), NoLog: true, NoSigs: true})
	if err != nil {
		t.Fatal(err)
	}
	go s.Start()
	if !s.ReadyForConnections(10 * time.Second) {
		t.Fatal("nats server not ready")
	}
	t.Cleanup(s.Shutdown)
	return s
}

// freeAddrs returns n loopback addresses whose ports are free now.
func freeAddrs(t *testing.T, n int) []string {
	t.Helper()
	base, err := netutil.FreePorts(n)
	if err != nil {
		t.Fatal(err)
	}
	var out []string
	for i := range n {
		out = append(out, fmt.Sprintf("127.0.0.1:%d", base+i))
	}
	return out
}

// fleetConfig is a replica's configuration acquiring every kind of
// resource New acquires: the NATS connection, the gateway's listener, the
// gRPC listener and the metrics listener, at the addresses given.
func fleetConfig(t *testing.T, natsURL, grpcAddr, gatewayAddr, metricsAddr string) *config.Config {
	t.Helper()
	cfg := &config.Config{GRPCListen: grpcAddr, MetricsListen: metricsAddr,
		Models: []config.Model{{Name: "m"}},
		NATS:   config.NATS{URL: natsURL},
		Gateway: config.Gateway{Listen: gatewayAddr,
			Endpoints: []config.Endpoint{{Address: "127.0.0.1:8000", Pod: "vllm-0", Model: "m"}}}}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	return cfg
}

// goroutines returns the stacks of the process's goroutines but the
// embedded NATS server's (which starts some of its own, in its server
// package and subpackages such as server/ats, as clients use JetStream),
// and their number.
func goroutines() (string, int) {
	buf := make([]byte, 1<<20)
	buf = buf[:runtime.Stack(buf, true)]
	var own []string
	for _, g := range strings.Split(string(buf), "\n\n") {
		if !strings.Contains(g, "github.com/nats-io/nats-server/v2/server") {
			own = append(own, g)
		}
	}
	return strings.Join(own, "\n\n"), len(own)
}

// assertReleased fails unless the NATS server has no client left, no
// goroutine started since before is still running, and every address can
// be listened on again.
func assertReleased(t *testing.T, ns *server.Server, before int, addrs ...string) {
	t.Helper()
	waitFor(t, "the NATS server to see no client", func() bool { return ns.NumClients() == 0 })
	deadline := time.Now().Add(10 * time.Second)
	for {
		stacks, n := goroutines()
		if n <= before {
			break
		}
		if time.Now().After(deadline) {
			t.Fatalf("%d goroutines, %d before New:\n%s", n, before, stacks)
		}
		time.Sleep(5 * time.Millisecond)
	}
	for _, a := range addrs {
		l, err := net.Listen("tcp", a)
		if err != nil {
			t.Fatalf("%s still held: %v", a, err)
		}
		l.Close()
	}
}

// TestNewReleasesOnError: New failing at its last step (the metrics
// listener's address is taken) after it connected to NATS and opened the
// gateway's and the gRPC listeners releases them all: the NATS server
// sees no client, no goroutine is left, the ports are free.
func TestNewReleasesOnError(t *testing.T) {
	ns := runNATS(t)
	busy, err := net.Listen("tcp", "127.0.0.1:0")
	if err != nil {
		t.Fatal(err)
	}
	defer busy.Close()
	addrs := freeAddrs(t, 2)
	cfg := fleetConfig(t, ns.ClientURL(), addrs[0], addrs[1], busy.Addr().String())
	_, before := goroutines()
	d, err := New(cfg, nil)
	if err == nil || !strings.Contains(err.Error(), "metrics listen on "+busy.Addr().String()) {
		t.Fatalf("New with the metrics address taken: %v, %v; want its listen error", d, err)
	}
	if d != nil {
		t.Fatal("New returned a Daemon with its error")
	}
	assertReleased(t, ns, before, addrs...)
}

// newOnFreeAddrs builds a fleet daemon on three free loopback addresses,
// taking new ones when a port was taken between choosing and binding it
// (another test process may bind it first). The New that failed has
// released everything (TestNewReleasesOnError), so a retry starts clean.
func newOnFreeAddrs(t *testing.T, ns *server.Server) (*Daemon, []string, int) {
	t.Helper()
	for try := 0; ; try++ {
		addrs := freeAddrs(t, 3)
		cfg := fleetConfig(t, ns.ClientURL(), addrs[0], addrs[1], addrs[2])
		_, before := goroutines()
		d, err := New(cfg, nil)
		if err == nil {
			return d, addrs, before
		}
		if !errors.Is(err, syscall.EADDRINUSE) || try == 4 {
			t.Fatal(err)
		}
		waitFor(t, "the failed New's NATS connection to close", func() bool { return ns.NumClients() == 0 })
	}
}

// TestNewThenClose: Close releases what New acquired the same way; a
// second Close does nothing and Run after Close fails.
func TestNewThenClose(t *testing.T) {
	ns := runNATS(t)
	d, addrs, before := newOnFreeAddrs(t, ns)
	if d.GRPCAddr() != addrs[0] || d.GatewayAddr() != addrs[1] || d.MetricsAddr() != addrs[2] {
		t.Fatalf("addresses %s %s %s, want %v", d.GRPCAddr(), d.GatewayAddr(), d.MetricsAddr(), addrs)
	}
	waitFor(t, "the daemon's NATS connection", func() bool { return ns.NumClients() == 1 })
	if err := d.Close(); err != nil {
		t.Fatal(err)
	}
	assertReleased(t, ns, before, addrs...)
	if err := d.Close(); err != nil {
		t.Fatalf("second Close: %v", err)
	}
	if err := d.Run(context.Background()); err == nil {
		t.Fatal("Run after Close: no error")
	}
}

// TestRunReleases: Run releases what New acquired when its context ends,
// and Close after Run does nothing.
func TestRunReleases(t *testing.T) {
	ns := runNATS(t)
	d, addrs, before := newOnFreeAddrs(t, ns)
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- d.Run(ctx) }()
	waitFor(t, "/healthz to answer", func() bool {
		resp, err := http.Get("http://" + addrs[2] + "/healthz")
		if err != nil {
			return false
		}
		resp.Body.Close()
		return resp.StatusCode == http.StatusOK
	})
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("Run: %v", err)
	}
	if err := d.Close(); err != nil {
		t.Fatalf("Close after Run: %v", err)
	}
	http.DefaultClient.CloseIdleConnections()
	assertReleased(t, ns, before, addrs...)
}

// TestRunAgentServesMetricsWithTokens runs kvindex agent as cmd/kvindex
// does: its metrics server takes the auth section's tokens (no token 401,
// a token of scope read 200 with the agent's metrics and the refusal
// counted), and it stops cleanly, its NATS connection closed.
func TestRunAgentServesMetricsWithTokens(t *testing.T) {
	const secret = "agent-read-secret-0123456789"
	t.Setenv("KVINDEX_TEST_AGENT_READ", secret)
	ns := runNATS(t)
	addrs := freeAddrs(t, 2)
	cfg := &config.Config{MetricsListen: addrs[0], NATS: config.NATS{URL: ns.ClientURL()},
		Pods: []config.Pod{{Name: "vllm-0", Model: "m", Endpoint: "tcp://" + addrs[1]}},
		Auth: config.Auth{Tokens: []config.Token{{Name: "dashboards", Scopes: []string{"read"}, Env: "KVINDEX_TEST_AGENT_READ"}}}}
	cfg.SetDefaults()
	if err := cfg.Validate(); err != nil {
		t.Fatal(err)
	}
	if err := RunAgent(context.Background(), &config.Config{Pods: cfg.Pods}, nil); !errors.Is(err, config.ErrInvalid) || !strings.Contains(err.Error(), "nats.url") {
		t.Fatalf("RunAgent without nats.url: %v, want it named", err)
	}
	ctx, cancel := context.WithCancel(context.Background())
	done := make(chan error, 1)
	go func() { done <- RunAgent(ctx, cfg, nil) }()
	get := func(token string) (int, string, error) {
		req, _ := http.NewRequest(http.MethodGet, "http://"+addrs[0]+"/metrics", nil)
		if token != "" {
			req.Header.Set("Authorization", "Bearer "+token)
		}
		resp, err := http.DefaultClient.Do(req)
		if err != nil {
			return 0, "", err
		}
		defer resp.Body.Close()
		b, err := io.ReadAll(resp.Body)
		return resp.StatusCode, string(b), err
	}
	waitFor(t, "the agent's metrics server", func() bool { _, _, err := get(""); return err == nil })
	if code, _, _ := get(""); code != http.StatusUnauthorized {
		t.Errorf("/metrics without a token: %d, want 401", code)
	}
	code, body, err := get(secret)
	if err != nil || code != http.StatusOK {
		t.Fatalf("/metrics with a read token: %d %v", code, err)
	}
	for _, want := range []string{"kvindex_agent_deltas_published_total 0", `kvindex_auth_refused_total{listener="metrics",reason="unauthenticated"} 2`, "go_goroutines "} {
		if !strings.Contains(body, want) {
			t.Errorf("agent metrics lack %q", want)
		}
	}
	cancel()
	if err := <-done; err != nil {
		t.Fatalf("RunAgent: %v", err)
	}
	waitFor(t, "the agent's NATS connection to close", func() bool { return ns.NumClients() == 0 })
}
