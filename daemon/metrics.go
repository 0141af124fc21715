package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"net"
	"net/http"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/prometheus/client_golang/prometheus/promhttp"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/metrics"
)

// MetricsHandler serves reg's /metrics and a /healthz that answers "ok",
// both needing scope read when auth is not nil (auth.open_health opens
// /healthz).
func MetricsHandler(reg *prometheus.Registry, auth *Auth) http.Handler {
	mux := http.NewServeMux()
	mux.Handle("/metrics", promhttp.HandlerFor(reg, promhttp.HandlerOpts{Registry: reg}))
	mux.HandleFunc("/healthz", func(w http.ResponseWriter, _ *http.Request) { _, _ = w.Write([]byte("ok\n")) })
	if auth == nil {
		return mux
	}
	return auth.HTTP(api.ListenerMetrics, api.ScopeRead, "/healthz", mux)
}

// metricsServer is an HTTP server on its own listener: the metrics server
// of kvindex serve and agent, and the HTTP/JSON API.
type metricsServer struct {
	srv *http.Server
	lis net.Listener
}

// listenMetrics opens a metrics server's listener at addr (metrics_listen),
// serving HTTPS when tc is not nil; nil when addr is config.MetricsOff.
func listenMetrics(addr string, reg *prometheus.Registry, auth *Auth, tc *tls.Config) (*metricsServer, error) {
	if addr == config.MetricsOff {
		return nil, nil
	}
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("daemon: metrics listen on %s: %w", addr, err)
	}
	return &metricsServer{lis: lis, srv: &http.Server{Handler: MetricsHandler(reg, auth), ReadHeaderTimeout: 5 * time.Second, TLSConfig: tc}}, nil
}

func (m *metricsServer) addr() string { return m.lis.Addr().String() }

// serve serves until shutdown, after which it returns nil.
func (m *metricsServer) serve() error {
	var err error
	if m.srv.TLSConfig != nil {
		err = m.srv.ServeTLS(m.lis, "", "")
	} else {
		err = m.srv.Serve(m.lis)
	}
	if errors.Is(err, http.ErrServerClosed) {
		return nil
	}
	return err
}

// shutdown stops the server, giving requests under way up to timeout, and
// closes its listener whether or not it served.
func (m *metricsServer) shutdown(timeout time.Duration) error {
	ctx, cancel := context.WithTimeout(context.Background(), timeout)
	defer cancel()
	return errors.Join(m.srv.Shutdown(ctx), closeListener(m.lis)())
}

// newRegistry is a registry with the Go runtime's and the process's
// collectors, and cs.
func newRegistry(cs ...prometheus.Collector) *prometheus.Registry {
	reg := prometheus.NewRegistry()
	reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	reg.MustRegister(cs...)
	return reg
}

func (d *Daemon) registerMetrics() error {
	mc := metrics.NewCollector(d.ix, d.srcs)
	d.registry.MustRegister(mc, d.lag.Collector())
	if d.fleet == nil {
		return nil
	}
	mc.WithDigests() // replicas are compared by digest
	d.registry.MustRegister(
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_fleet_reconnects_total", Help: "NATS reconnections (each resynced every fleet worker from a snapshot)."},
			func() float64 { return float64(d.fleet.Reconnects()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_fleet_watch_restarts_total", Help: "Restarts of the watch of the agents' bucket (NATS or JetStream unreachable, the watch ended)."},
			func() float64 { return float64(d.fleet.WatchRestarts()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_fleet_foreign_registrations_total", Help: "Entries of the agents' bucket ignored: they do not parse or do not match their key."},
			func() float64 { return float64(d.fleet.Foreign()) }),
	)
	return nil
}
