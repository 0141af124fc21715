// Package tlsreload serves TLS from certificate, key and CA files that
// are replaced while the server runs (a cert-manager rotation, a mounted
// Kubernetes secret): each new handshake uses the files' current
// contents, checked at most once per interval, and a set of files that
// does not load leaves the last good one in use, counted and logged.
//
// A Reloader is safe for concurrent use.
package tlsreload

import (
	"context"
	"crypto/tls"
	"crypto/x509"
	"fmt"
	"log/slog"
	"os"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/internal/tick"
)

// Files are what a Reloader loads.
type Files struct {
	// CertFile and KeyFile are the server's PEM certificate chain and key.
	CertFile, KeyFile string
	// ClientCAFile, when set, is a PEM bundle of the CAs that sign client
	// certificates; clients must then present one (mTLS).
	ClientCAFile string
}

// Reloader holds the current TLS configuration built from Files.
type Reloader struct {
	files Files
	log   *slog.Logger

	cur      atomic.Pointer[tls.Config]
	failures atomic.Int64

	mu    sync.Mutex // guards stamp
	stamp string     // files' sizes and modification times at the last load
}

// New loads files, failing if they do not load.
func New(files Files, log *slog.Logger) (*Reloader, error) {
	defaults.Zero(&log, slog.New(slog.DiscardHandler))
	r := &Reloader{files: files, log: log}
	cfg, stamp, err := r.load()
	if err != nil {
		return nil, err
	}
	r.cur.Store(cfg)
	r.stamp = stamp
	return r, nil
}

// Config returns the tls.Config to serve with: each handshake takes the
// configuration current at that moment.
func (r *Reloader) Config() *tls.Config {
	return &tls.Config{
		MinVersion: tls.VersionTLS12,
		GetConfigForClient: func(*tls.ClientHelloInfo) (*tls.Config, error) {
			return r.cur.Load(), nil
		},
	}
}

// Failures counts reloads that failed (the previous files stayed in use).
func (r *Reloader) Failures() int64 { return r.failures.Load() }

// Run checks the files every interval until ctx is done and reloads them
// when any changed.
func (r *Reloader) Run(ctx context.Context, interval time.Duration) {
	tick.Every(ctx, interval, func(time.Time) { r.Check() })
}

// Check reloads the files if their sizes or modification times changed,
// and reports whether it did.
func (r *Reloader) Check() bool {
	stamp, err := r.stampNow()
	r.mu.Lock()
	same := err == nil && stamp == r.stamp
	r.mu.Unlock()
	if same {
		return false
	}
	cfg, stamp, err := r.load()
	if err != nil {
		r.failures.Add(1)
		r.log.Warn("TLS files changed but do not load; the previous ones stay in use", "err", err)
		return false
	}
	r.cur.Store(cfg)
	r.mu.Lock()
	r.stamp = stamp
	r.mu.Unlock()
	r.log.Info("TLS files reloaded", "cert", r.files.CertFile)
	return true
}

func (r *Reloader) stampNow() (string, error) {
	s := ""
	for _, p := range []string{r.files.CertFile, r.files.KeyFile, r.files.ClientCAFile} {
		if p == "" {
			continue
		}
		fi, err := os.Stat(p)
		if err != nil {
			return "", err
		}
		s += fmt.Sprintf("%s:%d:%d;", p, fi.Size(), fi.ModTime().UnixNano())
	}
	return s, nil
}

// load reads the files into a server configuration.
func (r *Reloader) load() (*tls.Config, string, error) {
	stamp, err := r.stampNow()
	if err != nil {
		return nil, "", fmt.Errorf("tlsreload: %w", err)
	}
	cert, err := tls.LoadX509KeyPair(r.files.CertFile, r.files.KeyFile)
	if err != nil {
		return nil, "", fmt.Errorf("tlsreload: certificate %s and key %s: %w", r.files.CertFile, r.files.KeyFile, err)
	}
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, Certificates: []tls.Certificate{cert}, NextProtos: []string{"h2", "http/1.1"}}
	if r.files.ClientCAFile != "" {
		pem, err := os.ReadFile(r.files.ClientCAFile)
		if err != nil {
			return nil, "", fmt.Errorf("tlsreload: client CA: %w", err)
		}
		pool := x509.NewCertPool()
		if !pool.AppendCertsFromPEM(pem) {
			return nil, "", fmt.Errorf("tlsreload: client CA %s: no PEM certificates", r.files.ClientCAFile)
		}
		cfg.ClientCAs, cfg.ClientAuth = pool, tls.RequireAndVerifyClientCert
	}
	return cfg, stamp, nil
}
