package tlsreload

import (
	"crypto/tls"
	"crypto/x509"
	"net"
	"os"
	"testing"
	"time"

	"github.com/kvindex/kvindex/internal/testcerts"
)

// serveOnce accepts TLS connections from cfg until the listener closes.
func serve(t *testing.T, cfg *tls.Config) string {
	t.Helper()
	l, err := tls.Listen("tcp", "127.0.0.1:0", cfg)
	if err != nil {
		t.Fatal(err)
	}
	t.Cleanup(func() { l.Close() })
	go func() {
		for {
			c, err := l.Accept()
			if err != nil {
				return
			}
			go func() {
				defer c.Close()
				_ = c.(*tls.Conn).Handshake()
				time.Sleep(10 * time.Millisecond)
			}()
		}
	}()
	return l.Addr().String()
}

// leafCN dials addr trusting caFile and returns the server certificate's
// common name.
func leafCN(t *testing.T, addr, caFile string, client *tls.Certificate) (string, error) {
	t.Helper()
	pem, err := os.ReadFile(caFile)
	if err != nil {
		t.Fatal(err)
	}
	pool := x509.NewCertPool()
	pool.AppendCertsFromPEM(pem)
	cfg := &tls.Config{RootCAs: pool, ServerName: "localhost"}
	if client != nil {
		cfg.Certificates = []tls.Certificate{*client}
	}
	c, err := tls.DialWithDialer(&net.Dialer{Timeout: 2 * time.Second}, "tcp", addr, cfg)
	if err != nil {
		return "", err
	}
	defer c.Close()
	if err := c.Handshake(); err != nil {
		return "", err
	}
	// TLS 1.3 reports a refused client certificate on the first read.
	_ = c.SetReadDeadline(time.Now().Add(200 * time.Millisecond))
	if _, err := c.Read(make([]byte, 1)); err != nil {
		if ne, ok := err.(net.Error); !ok || !ne.Timeout() {
			if err.Error() != "EOF" {
				return "", err
			}
		}
	}
	return c.ConnectionState().PeerCertificates[0].Subject.CommonName, nil
}

// A rotated certificate is served from the next handshake on; files that
// do not load leave the last good ones in use, counted.
func TestReloadOnChange(t *testing.T) {
	dir := t.TempDir()
	ca, err := testcerts.NewCA(dir, "test")
	if err != nil {
		t.Fatal(err)
	}
	first, _ := ca.Server("first")
	second, _ := ca.Server("second")
	live := Files{CertFile: dir + "/live.pem", KeyFile: dir + "/live-key.pem"}
	install := func(p testcerts.Pair) {
		for src, dst := range map[string]string{p.CertFile: live.CertFile, p.KeyFile: live.KeyFile} {
			b, err := os.ReadFile(src)
			if err != nil {
				t.Fatal(err)
			}
			if err := os.WriteFile(dst, b, 0o600); err != nil {
				t.Fatal(err)
			}
		}
	}
	install(first)
	r, err := New(live, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.Config())
	if cn, err := leafCN(t, addr, ca.File, nil); err != nil || cn != "first" {
		t.Fatalf("before rotation: %q, %v", cn, err)
	}
	time.Sleep(10 * time.Millisecond) // a distinct modification time
	install(second)
	if !r.Check() {
		t.Fatal("changed files not reloaded")
	}
	if cn, err := leafCN(t, addr, ca.File, nil); err != nil || cn != "second" {
		t.Fatalf("after rotation: %q, %v", cn, err)
	}
	if err := os.WriteFile(live.KeyFile, []byte("not a key"), 0o600); err != nil {
		t.Fatal(err)
	}
	if r.Check() || r.Failures() != 1 {
		t.Fatalf("broken files: reloaded or not counted (failures %d)", r.Failures())
	}
	if cn, err := leafCN(t, addr, ca.File, nil); err != nil || cn != "second" {
		t.Fatalf("after a failed reload: %q, %v", cn, err)
	}
}

// With a client CA, clients must present a certificate it signed.
func TestClientCA(t *testing.T) {
	dir := t.TempDir()
	ca, _ := testcerts.NewCA(dir, "test")
	other, _ := testcerts.NewCA(dir, "other")
	srv, _ := ca.Server("server")
	good, _ := ca.Client("router")
	bad, _ := other.Client("intruder")
	r, err := New(Files{CertFile: srv.CertFile, KeyFile: srv.KeyFile, ClientCAFile: ca.File}, nil)
	if err != nil {
		t.Fatal(err)
	}
	addr := serve(t, r.Config())
	load := func(p testcerts.Pair) *tls.Certificate {
		c, err := tls.LoadX509KeyPair(p.CertFile, p.KeyFile)
		if err != nil {
			t.Fatal(err)
		}
		return &c
	}
	if _, err := leafCN(t, addr, ca.File, load(good)); err != nil {
		t.Fatalf("client signed by the CA refused: %v", err)
	}
	if _, err := leafCN(t, addr, ca.File, nil); err == nil {
		t.Fatal("client without a certificate accepted")
	}
	if _, err := leafCN(t, addr, ca.File, load(bad)); err == nil {
		t.Fatal("client signed by another CA accepted")
	}
}
