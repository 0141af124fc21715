package fleet

import (
	"fmt"
	"path/filepath"
	"strings"
	"testing"
	"time"

	"github.com/nats-io/nats-server/v2/server"
	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/internal/netutil"
	"github.com/kvindex/kvindex/internal/testcerts"
)

// tlsNATS starts an in-process NATS server on port with TLS from ca's
// server certificate, verifying client certificates (signed by ca) when
// verify is set.
func tlsNATS(t *testing.T, ca *testcerts.CA, port int, verify bool) *server.Server {
	t.Helper()
	pair, err := ca.Server("nats")
	if err != nil {
		t.Fatal(err)
	}
	tc, err := server.GenTLSConfig(&server.TLSConfigOpts{CertFile: pair.CertFile, KeyFile: pair.KeyFile, CaFile: ca.File, Verify: verify})
	if err != nil {
		t.Fatal(err)
	}
	s, err := server.NewServer(&server.Options{Host: "127.0.0.1", Port: port, TLS: true, TLSVerify: verify, TLSConfig: tc, TLSTimeout: 2, NoLog: true, NoSigs: true})
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

func freePort(t *testing.T) int {
	t.Helper()
	p, err := netutil.FreePorts(1)
	if err != nil {
		t.Fatal(err)
	}
	return p
}

// roundTrip checks that nc carries a request to a responder on itself,
// within 10 s.
func roundTrip(t *testing.T, nc *nats.Conn) {
	t.Helper()
	sub, err := nc.Subscribe("kvindex.test.echo", func(m *nats.Msg) { _ = m.Respond(append([]byte("re: "), m.Data...)) })
	if err != nil {
		t.Fatal(err)
	}
	defer func() { _ = sub.Unsubscribe() }()
	m, err := nc.Request("kvindex.test.echo", []byte("hi"), 10*time.Second)
	if err != nil || string(m.Data) != "re: hi" {
		t.Fatalf("request over NATS: %v %q", err, m.Data)
	}
}

// TestConnectTLS: Connect speaks TLS to NATS with nats.tls: it trusts the
// server through ca_file and server_name, presents cert_file and key_file
// to a server that verifies clients, and returns at once with the reason
// when the handshake is refused (an unknown CA, the wrong name, no client
// certificate or one from another CA) or a file cannot be read, naming
// the field. It never retries a refusal unseen.
func TestConnectTLS(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "nats")
	if err != nil {
		t.Fatal(err)
	}
	other, err := testcerts.NewCA(dir, "other")
	if err != nil {
		t.Fatal(err)
	}
	client, err := ca.Client("agent")
	if err != nil {
		t.Fatal(err)
	}
	foreign, err := other.Client("stranger")
	if err != nil {
		t.Fatal(err)
	}
	tlsPort, mtlsPort := freePort(t), freePort(t)
	tlsNATS(t, ca, tlsPort, false)
	srv := tlsNATS(t, ca, mtlsPort, true)
	tlsURL, mtlsURL := fmt.Sprintf("tls://127.0.0.1:%d", tlsPort), fmt.Sprintf("nats://127.0.0.1:%d", mtlsPort)

	for _, tc := range []struct {
		name string
		url  string
		tls  config.NATSTLS
		// want are parts of the error, nil to connect. (A server
		// refusing a client certificate closes the connection right after
		// the handshake: the client reads its alert or finds it closed.)
		want []string
	}{
		{"right CA", tlsURL, config.NATSTLS{CAFile: ca.File}, nil},
		{"server name", tlsURL, config.NATSTLS{CAFile: ca.File, ServerName: "localhost"}, nil},
		{"mTLS", mtlsURL, config.NATSTLS{CAFile: ca.File, CertFile: client.CertFile, KeyFile: client.KeyFile}, nil},
		{"wrong CA", tlsURL, config.NATSTLS{CAFile: other.File}, []string{"refused TLS", "x509", "unknown authority"}},
		{"wrong server name", tlsURL, config.NATSTLS{CAFile: ca.File, ServerName: "nats.example"}, []string{"refused TLS", "nats.example"}},
		{"no TLS configured", tlsURL[len("tls://"):], config.NATSTLS{}, []string{"refused TLS"}},
		{"mTLS without a client cert", mtlsURL, config.NATSTLS{CAFile: ca.File}, []string{"refused TLS", "the server ended it", "needs nats.tls.cert_file and key_file"}},
		{"mTLS with another CA's cert", mtlsURL, config.NATSTLS{CAFile: ca.File, CertFile: foreign.CertFile, KeyFile: foreign.KeyFile}, []string{"refused TLS", "the server ended it", "trust the CA of nats.tls.cert_file"}},
		{"missing CA file", tlsURL, config.NATSTLS{CAFile: filepath.Join(dir, "nope.pem")}, []string{"nats.tls.ca_file", "nope.pem", "no such file"}},
		{"CA file without PEM", tlsURL, config.NATSTLS{CAFile: client.KeyFile}, []string{"nats.tls.ca_file", "no PEM certificate"}},
		{"missing key file", mtlsURL, config.NATSTLS{CAFile: ca.File, CertFile: client.CertFile, KeyFile: filepath.Join(dir, "nope-key.pem")}, []string{"nats.tls.cert_file", "nope-key.pem", "no such file"}},
	} {
		t.Run(tc.name, func(t *testing.T) {
			url := tc.url
			if !strings.Contains(url, "://") {
				url = "nats://" + url
			}
			start := time.Now()
			nc, err := Connect(config.NATS{URL: url, TLS: tc.tls}, "test", nil)
			if tc.want == nil {
				if err != nil {
					t.Fatal(err)
				}
				defer nc.Close()
				if !nc.IsConnected() {
					t.Fatalf("status %v, want connected", nc.Status())
				}
				st, err := nc.TLSConnectionState()
				if err != nil || !st.HandshakeComplete {
					t.Fatalf("TLS state %+v, %v", st, err)
				}
				roundTrip(t, nc)
				return
			}
			if err == nil {
				nc.Close()
				t.Fatalf("connected (status %v), want an error with %q", nc.Status(), tc.want)
			}
			t.Log(err)
			for _, w := range tc.want {
				if !strings.Contains(err.Error(), w) {
					t.Errorf("error %q lacks %q", err, w)
				}
			}
			if d := time.Since(start); d > 5*time.Second {
				t.Errorf("refused after %v, want at once", d)
			}
		})
	}
	// The client certificate is what the server saw.
	nc, err := Connect(config.NATS{URL: mtlsURL, TLS: config.NATSTLS{CAFile: ca.File, CertFile: client.CertFile, KeyFile: client.KeyFile}}, "mtls", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	cz, err := srv.Connz(&server.ConnzOptions{Username: true})
	if err != nil {
		t.Fatal(err)
	}
	var names []string
	for _, c := range cz.Conns {
		names = append(names, c.Name+":"+c.TLSVersion)
	}
	if len(names) != 1 || !strings.HasPrefix(names[0], "mtls:1.") {
		t.Fatalf("server's connections %v, want the mTLS one", names)
	}
}

// TestConnectWaitsForServer: a server that is not up yet is no error:
// Connect returns, and the connection opens (over TLS) once the server
// starts.
func TestConnectWaitsForServer(t *testing.T) {
	ca, err := testcerts.NewCA(t.TempDir(), "nats")
	if err != nil {
		t.Fatal(err)
	}
	port := freePort(t)
	nc, err := Connect(config.NATS{URL: fmt.Sprintf("nats://127.0.0.1:%d", port), TLS: config.NATSTLS{CAFile: ca.File}}, "early", nil)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	if nc.IsConnected() {
		t.Fatal("connected before the server started")
	}
	tlsNATS(t, ca, port, false)
	// The request and its responder's subscription wait in the
	// connection's buffer until it connects.
	roundTrip(t, nc)
}
