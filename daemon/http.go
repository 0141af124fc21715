package daemon

import (
	"fmt"
	"net"
	"net/http"
	"time"

	xnetutil "golang.org/x/net/netutil"

	"github.com/kvindex/kvindex/api"
)

// listenHTTP opens the HTTP/JSON API's listener (http_listen), when set:
// api.Server.HTTPHandler behind the gRPC API's auth, with its TLS and its
// connection limit. It is a listener of its own, not the gRPC port
// shared: grpc-go's transport, where admission control refuses a call
// before its body is read, serves only a listener it owns (sharing needs
// a protocol sniffer in front, or grpc-go's slower ServeHTTP transport,
// which has no tap). Without TLS it speaks HTTP/1.1 and HTTP/2 in clear
// (h2c), so gRPC and Connect clients may use HTTP/2 too.
func (d *Daemon) listenHTTP() error {
	cfg := d.cfg
	if cfg.HTTPListen == "" {
		return nil
	}
	lis, err := net.Listen("tcp", cfg.HTTPListen)
	if err != nil {
		return fmt.Errorf("daemon: HTTP listen on %s: %w", cfg.HTTPListen, err)
	}
	if cfg.Limits.MaxConnections > 0 {
		lis = xnetutil.LimitListener(lis, cfg.Limits.MaxConnections)
	}
	var auth *api.Auth
	if d.auth != nil {
		auth = d.auth.Auth
	}
	srv := &http.Server{Handler: d.api.HTTPHandler(auth), ReadHeaderTimeout: 5 * time.Second, IdleTimeout: 2 * time.Minute}
	srv.Protocols = new(http.Protocols)
	srv.Protocols.SetHTTP1(true)
	if d.tls != nil {
		srv.TLSConfig = d.tls.Config()
		srv.Protocols.SetHTTP2(true)
	} else {
		srv.Protocols.SetUnencryptedHTTP2(true)
	}
	// An HTTP server on its own listener: metricsServer's serve and
	// shutdown apply as they are.
	d.http = &metricsServer{srv: srv, lis: lis}
	d.rel.add(func() error { return d.http.shutdown(time.Second) })
	return nil
}

// HTTPAddr is the address of the HTTP/JSON API, "" when http_listen is
// not set.
func (d *Daemon) HTTPAddr() string {
	if d.http == nil {
		return ""
	}
	return d.http.addr()
}
