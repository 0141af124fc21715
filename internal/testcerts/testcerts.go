// Package testcerts makes a throwaway certificate authority and the server
// and client certificates it signs, as PEM files, for tests of kvindex's
// TLS and mTLS (ECDSA P-256, valid for an hour, for 127.0.0.1 and
// localhost). Nothing here is meant for production.
package testcerts

import (
	"crypto/ecdsa"
	"crypto/elliptic"
	"crypto/rand"
	"crypto/x509"
	"crypto/x509/pkix"
	"encoding/pem"
	"fmt"
	"math/big"
	"net"
	"os"
	"path/filepath"
	"time"
)

// CA is a certificate authority that writes the certificates it signs to
// Dir.
type CA struct {
	Dir    string
	File   string // the CA certificate, PEM
	cert   *x509.Certificate
	key    *ecdsa.PrivateKey
	serial int64
}

// Pair is a certificate and its key, as files.
type Pair struct{ CertFile, KeyFile string }

// NewCA makes a CA named name in dir.
func NewCA(dir, name string) (*CA, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return nil, err
	}
	tmpl := &x509.Certificate{
		SerialNumber:          big.NewInt(1),
		Subject:               pkix.Name{CommonName: name},
		NotBefore:             time.Now().Add(-time.Minute),
		NotAfter:              time.Now().Add(time.Hour),
		IsCA:                  true,
		KeyUsage:              x509.KeyUsageCertSign,
		BasicConstraintsValid: true,
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, tmpl, &key.PublicKey, key)
	if err != nil {
		return nil, err
	}
	cert, err := x509.ParseCertificate(der)
	if err != nil {
		return nil, err
	}
	ca := &CA{Dir: dir, File: filepath.Join(dir, name+"-ca.pem"), cert: cert, key: key, serial: 1}
	return ca, writePEM(ca.File, "CERTIFICATE", der)
}

// Server signs a server certificate for 127.0.0.1 and localhost.
func (ca *CA) Server(name string) (Pair, error) {
	return ca.sign(name, x509.ExtKeyUsageServerAuth)
}

// Client signs a client certificate whose subject common name is name.
func (ca *CA) Client(name string) (Pair, error) {
	return ca.sign(name, x509.ExtKeyUsageClientAuth)
}

func (ca *CA) sign(name string, usage x509.ExtKeyUsage) (Pair, error) {
	key, err := ecdsa.GenerateKey(elliptic.P256(), rand.Reader)
	if err != nil {
		return Pair{}, err
	}
	ca.serial++
	tmpl := &x509.Certificate{
		SerialNumber: big.NewInt(ca.serial),
		Subject:      pkix.Name{CommonName: name},
		NotBefore:    time.Now().Add(-time.Minute),
		NotAfter:     time.Now().Add(time.Hour),
		KeyUsage:     x509.KeyUsageDigitalSignature,
		ExtKeyUsage:  []x509.ExtKeyUsage{usage},
		DNSNames:     []string{"localhost"},
		IPAddresses:  []net.IP{net.ParseIP("127.0.0.1")},
	}
	der, err := x509.CreateCertificate(rand.Reader, tmpl, ca.cert, &key.PublicKey, ca.key)
	if err != nil {
		return Pair{}, err
	}
	kder, err := x509.MarshalECPrivateKey(key)
	if err != nil {
		return Pair{}, err
	}
	p := Pair{CertFile: filepath.Join(ca.Dir, fmt.Sprintf("%s-%d.pem", name, ca.serial)), KeyFile: filepath.Join(ca.Dir, fmt.Sprintf("%s-%d-key.pem", name, ca.serial))}
	if err := writePEM(p.CertFile, "CERTIFICATE", der); err != nil {
		return Pair{}, err
	}
	return p, writePEM(p.KeyFile, "EC PRIVATE KEY", kder)
}

func writePEM(path, typ string, der []byte) error {
	return os.WriteFile(path, pem.EncodeToMemory(&pem.Block{Type: typ, Bytes: der}), 0o600)
}
