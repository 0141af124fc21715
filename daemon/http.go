package daemon

import (
	"net/http"
	"time"

	"github.com/kvindex/kvindex/api"
)

// listenHTTP opens the HTTP/JSON API's listener (http_listen), when set,
// with the gRPC API's auth, TLS and connection limit. It is a listener of
// its own: grpc-go's transport, where admission control refuses a call
// before its body is read, serves only a listener it owns. Without TLS it
// speaks HTTP/1.1 and h2c.
func (d *Daemon) listenHTTP() error {
	cfg := d.cfg
	if cfg.HTTPListen == "" {
		return nil
	}
	lis, err := d.listen("HTTP", cfg.HTTPListen, cfg.Limits.MaxConnections)
	if err != nil {
		return err
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
