package fleet

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"os"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/internal/lograte"
	"github.com/kvindex/kvindex/internal/redact"
)

// reconnectLogEvery spaces the logged failures of reconnection attempts
// (one every 250 ms while NATS is away).
const reconnectLogEvery = 30 * time.Second

// Connect opens the NATS connection of c for a process named name. It
// reconnects forever, logging each change; an unreachable server is waited
// for in the background, but a TLS refusal on the first attempt or an
// unreadable nats.tls file is returned at once. The URL is logged redacted.
func Connect(c config.NATS, name string, log *slog.Logger) (*nats.Conn, error) {
	defaults.Zero(&log, slog.New(slog.DiscardHandler))
	url := redact.URL(c.URL)
	var (
		mu    sync.Mutex
		limit lograte.Limiter
	)
	opts := []nats.Option{
		nats.Name(name),
		nats.MaxReconnects(-1),
		nats.ReconnectWait(250 * time.Millisecond),
		// Pings find a dead connection in 10-15 s, not nats.go's 4 min.
		nats.PingInterval(5 * time.Second),
		nats.MaxPingsOutstanding(2),
		nats.DisconnectErrHandler(func(_ *nats.Conn, err error) {
			log.Warn("NATS disconnected", "url", url, "err", err)
		}),
		nats.ReconnectHandler(func(nc *nats.Conn) {
			log.Info("NATS reconnected", "url", redact.URL(nc.ConnectedUrl()))
		}),
		nats.ReconnectErrHandler(func(_ *nats.Conn, err error) {
			mu.Lock()
			ok, held := limit.Allow(time.Now(), reconnectLogEvery)
			mu.Unlock()
			if ok {
				log.Warn("NATS reconnection failed", "url", url, "err", err, "tls", tlsRefused(err), "suppressed", held)
			}
		}),
	}
	if c.CredsFile != "" {
		opts = append(opts, nats.UserCredentials(c.CredsFile))
	}
	if c.TLS.Enabled() {
		o, err := tlsOption(c.TLS)
		if err != nil {
			return nil, fmt.Errorf("fleet: NATS TLS for %s: %w", url, err)
		}
		opts = append(opts, o)
	}
	// The first attempt does not retry, so a refused handshake is returned;
	// any other failure retries in the background (NATS may start later).
	nc, err := nats.Connect(c.URL, opts...)
	if err == nil {
		return nc, nil
	}
	if tlsRefused(err) {
		var verify *tls.CertificateVerificationError
		switch {
		case errors.As(err, &verify):
			return nil, fmt.Errorf("fleet: NATS at %s refused TLS: %w", url, err)
		case c.TLS.CertFile == "":
			// The server, not this client, ended the handshake.
			return nil, fmt.Errorf("fleet: NATS at %s refused TLS (the server ended it: one that verifies clients needs nats.tls.cert_file and key_file): %w", url, err)
		default:
			return nil, fmt.Errorf("fleet: NATS at %s refused TLS (the server ended it: does it trust the CA of nats.tls.cert_file?): %w", url, err)
		}
	}
	log.Warn("NATS not reachable yet; retrying in the background", "url", url, "err", err)
	if nc, err = nats.Connect(c.URL, append(opts, nats.RetryOnFailedConnect(true))...); err != nil {
		return nil, fmt.Errorf("fleet: connecting to NATS at %s: %w", url, err)
	}
	return nc, nil
}

// tlsOption checks t's files once and returns an option that rereads
// them at every connection, so a rotated certificate is picked up.
func tlsOption(t config.NATSTLS) (nats.Option, error) {
	var (
		cert  nats.TLSCertHandler
		roots nats.RootCAsHandler
	)
	if t.CertFile != "" {
		cert = func() (tls.Certificate, error) {
			c, err := tls.LoadX509KeyPair(t.CertFile, t.KeyFile)
			if err != nil {
				return tls.Certificate{}, fmt.Errorf("nats.tls.cert_file %s, key_file %s: %w", t.CertFile, t.KeyFile, err)
			}
			return c, nil
		}
		if _, err := cert(); err != nil {
			return nil, err
		}
	}
	if t.CAFile != "" {
		roots = func() (*x509.CertPool, error) {
			pem, err := os.ReadFile(t.CAFile)
			if err != nil {
				return nil, fmt.Errorf("nats.tls.ca_file: %w", err)
			}
			pool := x509.NewCertPool()
			if !pool.AppendCertsFromPEM(pem) {
				return nil, fmt.Errorf("nats.tls.ca_file %s: no PEM certificate in it", t.CAFile)
			}
			return pool, nil
		}
		if _, err := roots(); err != nil {
			return nil, err
		}
	}
	base := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: t.ServerName}
	return func(o *nats.Options) error {
		o.Secure = true
		o.TLSConfig = base
		o.TLSCertCB = cert
		o.RootCAsCB = roots
		return nil
	}, nil
}

// tlsRefused reports whether err is a failed TLS handshake or a TLS
// mismatch between client and server: what retrying will not mend.
func tlsRefused(err error) bool {
	var (
		verify  *tls.CertificateVerificationError
		unknown x509.UnknownAuthorityError
		host    x509.HostnameError
		invalid x509.CertificateInvalidError
		op      *net.OpError
	)
	switch {
	case errors.Is(err, nats.ErrTLS), errors.Is(err, nats.ErrSecureConnRequired), errors.Is(err, nats.ErrSecureConnWanted),
		errors.As(err, &verify), errors.As(err, &unknown), errors.As(err, &host), errors.As(err, &invalid):
		return true
	case errors.As(err, &op) && op.Op == "remote error":
		// TLS 1.3: a refused client certificate arrives on the first read.
		return true
	}
	return false
}
