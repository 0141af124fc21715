package api

import (
	"crypto/tls"
	"crypto/x509"
	"errors"
	"fmt"
	"os"

	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"
)

// ClientTLS are a client's TLS settings for Dial.
type ClientTLS struct {
	// CAFile is the PEM bundle signing the server's certificate; "" uses
	// the system's roots.
	CAFile string
	// CertFile and KeyFile are the client's certificate and key (mTLS).
	CertFile, KeyFile string
	// ServerName overrides the name checked in the server's certificate.
	ServerName string
}

// DialOption returns the option that makes Dial use TLS.
func (c ClientTLS) DialOption() (grpc.DialOption, error) {
	cfg, err := c.Config()
	if err != nil {
		return nil, err
	}
	return grpc.WithTransportCredentials(credentials.NewTLS(cfg)), nil
}

// Config returns the TLS configuration, also for HTTP clients (metrics).
func (c ClientTLS) Config() (*tls.Config, error) {
	cfg := &tls.Config{MinVersion: tls.VersionTLS12, ServerName: c.ServerName}
	if c.CAFile != "" {
		pem, err := os.ReadFile(c.CAFile)
		if err != nil {
			return nil, fmt.Errorf("kvindex: TLS CA: %w", err)
		}
		cfg.RootCAs = x509.NewCertPool()
		if !cfg.RootCAs.AppendCertsFromPEM(pem) {
			return nil, fmt.Errorf("kvindex: TLS CA %s: %w", c.CAFile, errors.New("no PEM certificates"))
		}
	}
	if (c.CertFile == "") != (c.KeyFile == "") {
		return nil, errors.New("kvindex: TLS client certificate: give both the certificate and the key")
	}
	if c.CertFile != "" {
		cert, err := tls.LoadX509KeyPair(c.CertFile, c.KeyFile)
		if err != nil {
			return nil, fmt.Errorf("kvindex: TLS client certificate: %w", err)
		}
		cfg.Certificates = []tls.Certificate{cert}
	}
	return cfg, nil
}
