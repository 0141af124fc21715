// Package daemon assembles the kvindex service from its parts: the index,
// the event sources that feed it, the gRPC API over it and the Prometheus
// endpoint. A Daemon is built once, run once, and safe to query from any
// goroutine while it runs.
package daemon

import (
	"context"
	"crypto/tls"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"sync"
	"sync/atomic"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	xnetutil "golang.org/x/net/netutil"
	"google.golang.org/grpc"
	"google.golang.org/grpc/credentials"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/discovery"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/events/natsbus"
	"github.com/kvindex/kvindex/events/zmq"
	"github.com/kvindex/kvindex/fleet"
	"github.com/kvindex/kvindex/indexer"
	"github.com/kvindex/kvindex/internal/defaults"
	"github.com/kvindex/kvindex/internal/tlsreload"
	"github.com/kvindex/kvindex/metrics"
	"github.com/kvindex/kvindex/picker"
	"github.com/kvindex/kvindex/scoring"
	"github.com/kvindex/kvindex/scoring/scrape"
)

// Daemon is a configured, listening kvindex service.
type Daemon struct {
	cfg *config.Config
	log *slog.Logger

	ix       *indexer.Index
	srcs     sources // every event source, for the API and metrics
	sub      *zmq.Subscriber
	fleet    *natsbus.Source // nil without fleet mode
	lag      *metrics.Lag    // kvindex_event_lag_seconds, both sources
	tracker  *scoring.Tracker
	loads    *scoring.LoadBoard // the engines' scraped load
	scraper  *scrape.Scraper
	grpc     *grpc.Server
	api      *api.Server
	tls      *tlsreload.Reloader // nil without TLS
	auth     *Auth               // nil without authentication
	grpcLis  net.Listener
	metrics  *metricsServer // nil with metrics_listen off
	http     *metricsServer // the HTTP/JSON API; nil without http_listen
	registry *prometheus.Registry

	discovery  discoverySource       // nil without discovery
	discovered *discovered           // the pods discovery added
	reconciler *discovery.Reconciler // nil without discovery
	// The endpoint picker and its pool; nil without gateway.listen.
	// gwSource is the InferencePool the pool comes from, if any.
	picker   *picker.Picker
	gw       *gatewayPool
	gwSource poolSource
	gwGRPC   *grpc.Server
	gwLis    net.Listener

	// rel releases what New acquired (the NATS connection, listeners).
	// Whichever of Run and Close claims the daemon first owns it: Run
	// releases when it returns, Close at once, never both.
	rel     releaser
	claimed atomic.Bool
}

// New builds the daemon of cfg and opens its listeners (so that ":0"
// addresses are resolved before Run). Nothing is received or served until
// Run; a Daemon never Run is released by Close. On error everything
// acquired so far is released.
func New(cfg *config.Config, log *slog.Logger) (*Daemon, error) {
	defaults.Zero(&log, slog.New(slog.DiscardHandler))
	d := &Daemon{cfg: cfg, log: log, lag: metrics.NewLag(), registry: newRegistry()}
	// In order: each step may use the parts of the steps before it, and
	// registers the release of what it acquires with d.rel.
	for _, step := range []func() error{
		d.newIndex, d.newSubscriber, d.connectFleet, d.registerMetrics, d.newScoring,
		d.newDiscovery, d.newAPI, d.newGRPC, d.newGateway, d.listenGRPC, d.listenHTTP, d.listenMetrics,
	} {
		if err := step(); err != nil {
			return nil, errors.Join(err, d.rel.release())
		}
	}
	return d, nil
}

// Close releases what New acquired of a Daemon that was never Run; after
// Run (which releases them itself), or a second Close, it does nothing.
func (d *Daemon) Close() error {
	if !d.claimed.CompareAndSwap(false, true) {
		return nil
	}
	return d.rel.release()
}

// releaser frees a Daemon's resources, registered as they are acquired,
// in reverse order, once.
type releaser []func() error

func (r *releaser) add(release func() error) { *r = append(*r, release) }

func (r *releaser) release() error {
	var errs []error
	for i := len(*r) - 1; i >= 0; i-- {
		errs = append(errs, (*r)[i]())
	}
	*r = nil
	return errors.Join(errs...)
}

// closeListener is the release of l, which its server may have closed.
func closeListener(l net.Listener) func() error {
	return func() error {
		if err := l.Close(); err != nil && !errors.Is(err, net.ErrClosed) {
			return fmt.Errorf("daemon: close listener %s: %w", l.Addr(), err)
		}
		return nil
	}
}

func (d *Daemon) newIndex() error {
	d.ix = indexer.New(indexer.Config{
		WorkerCapacity: d.cfg.Index.WorkerCapacity,
		MemoryBudget:   d.cfg.Index.MemoryBudgetMiB << 20,
		RemovalHistory: d.cfg.Index.RemovalHistory,
	})
	for _, m := range upFrontModels(d.cfg) {
		if _, err := d.ix.AddModel(m.Name, m.BlockSize); err != nil {
			return fmt.Errorf("daemon: model %q: %w", m.Name, err)
		}
	}
	return nil
}

// newSubscriber adds the configured workers to the index and builds the
// ZeroMQ subscriber of their endpoints and of the push listeners.
func (d *Daemon) newSubscriber() error {
	cfg := d.cfg
	var eps []zmq.Endpoint
	for _, we := range cfg.Workers() {
		ep, err := d.addWorker(we)
		if err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
		eps = append(eps, ep)
	}
	opts, err := fleet.SubscriberOptions(cfg, d.log, d.lag)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	opts.NewWorker = d.newPushWorker
	for _, pl := range cfg.Push {
		l := zmq.PushListener{Address: pl.Listen, Topic: pl.Topic, Routes: map[string]events.TopicRoute{}, MaxWorkers: pl.MaxWorkers, Allow: pl.Allow, DPSize: pl.DPSize}
		for _, r := range pl.Routes {
			l.Routes[r.Topic] = events.TopicRoute{Pod: r.Pod, Model: r.Model, ReplayEndpoint: r.ReplayEndpoint}
		}
		opts.Push = append(opts.Push, l)
	}
	if d.sub, err = zmq.NewSubscriber(opts, eps...); err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.srcs = sources{d.sub}
	return nil
}

// connectFleet connects to NATS and builds the source of the agents'
// workers, in fleet mode.
func (d *Daemon) connectFleet() error {
	cfg := d.cfg
	if !cfg.NATS.Enabled() {
		return nil
	}
	nc, err := fleet.Connect(cfg.NATS, "kvindex serve", d.log)
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	d.rel.add(func() error { nc.Close(); return nil })
	d.fleet = natsbus.NewSource(nc, coldAware{fleet.NewReplicas(d.ix, d.log), d}, natsbus.SourceOptions{
		Bucket: cfg.NATS.Bucket, TTL: cfg.NATS.RegistrationTTL, Models: cfg.NATS.Models,
		StaleAfterDisconnect: cfg.Events.StaleAfterDisconnect,
		LogEvery:             cfg.Log.ProblemInterval, Logger: d.log,
		Applied: func(_ events.WorkerRef, a natsbus.AppliedDelta) {
			d.lag.Observe(metrics.LagNATS, a.EngineTime, time.Now())
		},
	})
	d.srcs = append(d.srcs, d.fleet)
	return nil
}

// newScoring builds the tracker of routed requests and the load scraper.
func (d *Daemon) newScoring() error {
	cfg := d.cfg
	d.tracker = scoring.NewTracker(scoring.TrackerOptions{SpecTTL: cfg.Scoring.SpeculativeTTL, FlightTTL: cfg.Scoring.InflightTTL, MaxFlights: cfg.Limits.MaxInflight})
	d.loads = scoring.NewLoadBoard(3 * cfg.Scoring.ScrapeInterval)
	var targets []scrape.Target
	for _, p := range cfg.Pods {
		if p.MetricsURL != "" {
			targets = append(targets, scrape.Target{Pod: p.Name, DPSize: p.DPSize, URL: p.MetricsURL})
		}
	}
	d.scraper = scrape.New(targets, d.loads, cfg.Scoring.ScrapeInterval, d.log)
	d.registry.MustRegister(
		d.scraper,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvindex_inflight_requests", Help: "Routed requests not yet released or expired."},
			func() float64 { return float64(d.tracker.InFlight()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_inflight_refused_total", Help: "Routes refused because limits.max_inflight requests were in flight."},
			func() float64 { return float64(d.tracker.Refused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_speculative_skipped_total", Help: "Routes recorded without speculative blocks because speculative entries held their most keys."},
			func() float64 { return float64(d.tracker.SpecSkipped()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_scrape_failures_total", Help: "Failed scrapes of vLLM metrics endpoints."},
			func() float64 { return float64(d.scraper.Failures()) }),
	)
	return nil
}

func (d *Daemon) newDiscovery() error {
	switch dc := &d.cfg.Discovery; {
	case dc.Kubernetes != nil:
		client, err := discovery.NewClient(dc.Kubernetes.Kubeconfig)
		if err == nil {
			d.discovery, err = discovery.NewKubernetes(client, dc.Kubernetes)
		}
		if err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
	case dc.DNS != nil:
		d.discovery = discovery.NewDNS(dc.DNS)
	default:
		return nil
	}
	d.discovered = &discovered{d: d, pods: map[string]*discoveredPod{}}
	d.reconciler = discovery.NewReconciler(d.discovered, d.log)
	d.registry.MustRegister(d.reconciler)
	return nil
}

func (d *Daemon) newAPI() error {
	cfg := d.cfg
	pol, err := cfg.Policy()
	if err != nil {
		return fmt.Errorf("daemon: %w", err)
	}
	tokenizer, err := newTokenizer(cfg, d)
	if err != nil {
		return err
	}
	d.api = api.NewServer(d.ix, d.srcs, api.Options{
		Tokenizer:     tokenizer,
		Policy:        &pol,
		Tracker:       d.tracker,
		Loads:         d.loads,
		IncludeStale:  cfg.Score.IncludeStale,
		NoGroupCaps:   !cfg.Scoring.GroupCapsOn(),
		MaxTokens:     cfg.Limits.MaxTokens,
		MaxBlockKeys:  cfg.Limits.MaxBlockKeys,
		MaxCandidates: cfg.Limits.MaxCandidates,
		MaxWatches:    cfg.Limits.MaxWatches,
		MaxTenants:    cfg.Limits.MaxTenants,
		Registerer:    d.registry,
		Admission: api.AdmissionOptions{
			Off:               cfg.Limits.AdmissionOff,
			MaxConcurrent:     cfg.Limits.MaxConcurrent,
			MaxPending:        cfg.Limits.MaxPending,
			Target:            cfg.Limits.QueueTarget,
			MaxQueueDelay:     cfg.Limits.MaxQueueDelay,
			MaxInspect:        cfg.Limits.MaxInspect,
			MaxInspectPending: cfg.Limits.MaxInspectPending,
			InspectWait:       cfg.Limits.InspectWait,
		},
	})
	adm := prometheus.NewDesc("kvindex_admission_refused_total", "Calls refused by admission control, by reason: Score and Route for overload (the adaptive bound on pending calls), pending (limits.max_pending) or queued (waited past limits.max_queue_delay); Lookup, Dump and Diagnose for inspect (their own budget: limits.max_inspect, max_inspect_pending, inspect_wait).", []string{"reason"}, nil)
	gauges := []*prometheus.Desc{
		prometheus.NewDesc("kvindex_admission_pending", "Score and Route calls received and not finished.", nil, nil),
		prometheus.NewDesc("kvindex_admission_limit", "The adaptive bound on pending Score and Route calls.", nil, nil),
	}
	d.registry.MustRegister(metrics.NewFunc(func(ch chan<- prometheus.Metric) {
		st := d.api.AdmissionStats()
		ch <- prometheus.MustNewConstMetric(adm, prometheus.CounterValue, float64(st.RefusedOverload), "overload")
		ch <- prometheus.MustNewConstMetric(adm, prometheus.CounterValue, float64(st.RefusedPending), "pending")
		ch <- prometheus.MustNewConstMetric(adm, prometheus.CounterValue, float64(st.RefusedQueued), "queued")
		ch <- prometheus.MustNewConstMetric(adm, prometheus.CounterValue, float64(st.RefusedInspect), "inspect")
		ch <- prometheus.MustNewConstMetric(gauges[0], prometheus.GaugeValue, float64(st.Pending))
		ch <- prometheus.MustNewConstMetric(gauges[1], prometheus.GaugeValue, float64(st.Limit))
	}, adm, gauges[0], gauges[1]))
	return nil
}

// newGRPC loads TLS and authentication, which every listener shares, and
// builds the API's gRPC server.
func (d *Daemon) newGRPC() error {
	cfg := d.cfg
	var err error
	if cfg.TLS.Enabled() {
		if d.tls, err = tlsreload.New(tlsreload.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, ClientCAFile: cfg.TLS.ClientCAFile}, d.log); err != nil {
			return fmt.Errorf("daemon: %w", err)
		}
		d.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_tls_reload_failures_total", Help: "Changed TLS files that did not load (the previous ones stayed in use)."},
			func() float64 { return float64(d.tls.Failures()) }))
	}
	if d.auth, err = NewAuth(&cfg.Auth, d.log); err != nil {
		return err
	}
	if d.auth != nil {
		d.registry.MustRegister(d.auth.Collectors()...)
	}
	d.grpc = d.grpcServer(api.ListenerGRPC, d.api.GRPCOptions()...)
	d.api.Register(d.grpc)
	return nil
}

// grpcServer builds a gRPC server of opts with the daemon's TLS and
// authentication, as listener, released with the daemon.
func (d *Daemon) grpcServer(listener string, opts ...grpc.ServerOption) *grpc.Server {
	if d.tls != nil {
		opts = append(opts, grpc.Creds(credentials.NewTLS(d.tls.Config())))
	}
	if d.auth != nil {
		opts = append(opts, d.auth.ListenerOptions(listener)...)
	}
	s := grpc.NewServer(opts...)
	d.rel.add(func() error { s.Stop(); return nil })
	return s
}

// listen opens a TCP listener at addr, released with the daemon, that
// accepts at most maxConns connections at once (0: any number); what
// names it in the error.
func (d *Daemon) listen(what, addr string, maxConns int) (net.Listener, error) {
	lis, err := net.Listen("tcp", addr)
	if err != nil {
		return nil, fmt.Errorf("daemon: %s listen on %s: %w", what, addr, err)
	}
	d.rel.add(closeListener(lis))
	if maxConns > 0 {
		return xnetutil.LimitListener(lis, maxConns), nil
	}
	return lis, nil
}

func (d *Daemon) listenGRPC() (err error) {
	d.grpcLis, err = d.listen("gRPC", d.cfg.GRPCListen, d.cfg.Limits.MaxConnections)
	return err
}

func (d *Daemon) listenMetrics() error {
	var tc *tls.Config
	if d.cfg.TLS.Metrics {
		tc = d.tls.Config()
	}
	m, err := listenMetrics(d.cfg.MetricsListen, d.registry, d.auth, tc)
	if err != nil || m == nil {
		return err
	}
	d.rel.add(func() error { return m.shutdown(time.Second) })
	d.metrics = m
	return nil
}

// newPushWorker adds a worker first seen on a push listener. A model the
// configuration does not list gets the default block size; a mismatch
// shows as block-size errors on the worker.
func (d *Daemon) newPushWorker(ref events.WorkerRef, model, replay string) (events.Sink, error) {
	d.takeCold(ref)
	if _, ok := d.ix.Model(model); !ok {
		if _, err := d.ix.AddModel(model, config.DefaultBlockSize); err != nil {
			return nil, err
		}
		d.log.Warn("push-mode worker serves a model not in the configuration; assuming the default block size", "worker", ref.String(), "model", model, "block_size", config.DefaultBlockSize)
	}
	w, err := d.ix.AddWorker(indexer.WorkerInfo{Ref: ref, Model: model, Endpoint: "push"})
	if err != nil {
		return nil, err
	}
	return w, nil
}

// upFrontModels lists the models New registers: every model, except that
// a replica of a shard (nats.models) registers only its shard's and its
// own pods', so that it answers another shard's model as unknown rather
// than as one with no workers. With push listeners every model is kept (a
// model registered late would take the default block size); discovered
// and gateway pods and fleet workers add theirs as they appear.
func upFrontModels(cfg *config.Config) []config.Model {
	if !cfg.NATS.Enabled() || len(cfg.NATS.Models) == 0 || len(cfg.Push) > 0 {
		return cfg.Models
	}
	keep := map[string]bool{}
	for _, m := range cfg.NATS.Models {
		keep[m] = true
	}
	for _, p := range cfg.Pods {
		keep[p.Model] = true
	}
	var out []config.Model
	for _, m := range cfg.Models {
		if keep[m.Name] {
			out = append(out, m)
		}
	}
	return out
}

// GRPCAddr is the address the gRPC server listens on.
func (d *Daemon) GRPCAddr() string { return d.grpcLis.Addr().String() }

// Auth is the daemon's authentication, nil without any.
func (d *Daemon) Auth() *Auth { return d.auth }

// MetricsAddr is the address of /metrics, "" when disabled.
func (d *Daemon) MetricsAddr() string {
	if d.metrics == nil {
		return ""
	}
	return d.metrics.addr()
}

// Index is the daemon's index.
func (d *Daemon) Index() *indexer.Index { return d.ix }

// Fleet is the daemon's NATS source, nil without fleet mode.
func (d *Daemon) Fleet() *natsbus.Source { return d.fleet }

// Subscriber is the daemon's event subscriber.
func (d *Daemon) Subscriber() *zmq.Subscriber { return d.sub }

// Run receives events and serves until ctx is done, then stops gracefully
// and releases what New acquired. It returns nil on a clean shutdown, or
// the first error that stopped a part. A Daemon runs once, not after Close.
func (d *Daemon) Run(ctx context.Context) error {
	if !d.claimed.CompareAndSwap(false, true) {
		return errors.New("daemon: Run on a daemon already run or closed")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	g := &group{cancel: cancel, errc: make(chan error, 1)}
	d.start(ctx, g)
	d.log.Info("kvindex serving", "grpc", d.GRPCAddr(), "http", d.HTTPAddr(), "metrics", d.MetricsAddr(), "gateway", d.GatewayAddr(), "workers", len(d.ix.Workers()), "models", len(d.ix.Models()))
	<-ctx.Done()
	d.log.Info("kvindex shutting down")
	d.stopServing()
	g.wg.Wait()
	rerr := d.rel.release()
	select {
	case err := <-g.errc:
		return errors.Join(err, rerr)
	default:
		return rerr
	}
}

func (d *Daemon) start(ctx context.Context, g *group) {
	g.run("subscriber", func() error { return d.sub.Run(ctx) })
	if d.fleet != nil {
		g.run("fleet", func() error { return d.fleet.Run(ctx) })
	}
	if d.gwGRPC != nil {
		g.run("gateway serve", func() error { return d.gwGRPC.Serve(d.gwLis) })
	}
	g.run("gRPC serve", func() error { return d.grpc.Serve(d.grpcLis) })
	if d.http != nil {
		g.run("HTTP serve", d.http.serve)
	}
	if d.tls != nil {
		g.run("TLS reload", func() error { d.tls.Run(ctx, time.Second); return nil })
	}
	if d.auth != nil {
		g.run("token reload", func() error { d.auth.Run(ctx, time.Second); return nil })
	}
	if d.gwSource != nil {
		g.run("gateway inference pool", func() error { return d.gwSource.Run(ctx, d.gw.setPool) })
	}
	if d.discovery != nil {
		d.discovered.mu.Lock()
		d.discovered.runCtx = ctx
		d.discovered.mu.Unlock()
		g.run("discovery", func() error { return d.discovery.Run(ctx, d.reconciler) })
	}
	g.run("tracker", func() error { d.tracker.Run(ctx, time.Second); return nil })
	g.run("scraper", func() error { d.scraper.Run(ctx); return nil })
	if d.metrics != nil {
		g.run("metrics serve", d.metrics.serve)
	}
}

// stopServing drains the servers: NOT_SERVING first, so that health
// watchers (load balancers, probes) hear of the drain before connections
// close, then in-flight RPCs get 5 s to finish.
func (d *Daemon) stopServing() {
	d.api.Health().Shutdown()
	servers := []*grpc.Server{d.grpc}
	if d.picker != nil {
		d.picker.Health().Shutdown()
		servers = []*grpc.Server{d.gwGRPC, d.grpc}
	}
	stopped := make(chan struct{})
	go func() {
		for _, s := range servers {
			s.GracefulStop()
		}
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		for _, s := range servers {
			s.Stop()
		}
	}
	if d.http != nil {
		_ = d.http.shutdown(5 * time.Second)
	}
	if d.metrics != nil {
		_ = d.metrics.shutdown(5 * time.Second)
	}
}

// group runs the parts of a running Daemon: the first to fail stops them
// all, and its error is Run's.
type group struct {
	wg     sync.WaitGroup
	cancel context.CancelFunc
	errc   chan error // capacity 1: the first error
}

// run runs part in its own goroutine; ending on Run's cancellation is no
// error.
func (g *group) run(part string, f func() error) {
	g.wg.Add(1)
	go func() {
		defer g.wg.Done()
		err := f()
		if err == nil || errors.Is(err, context.Canceled) || errors.Is(err, grpc.ErrServerStopped) {
			return
		}
		select {
		case g.errc <- fmt.Errorf("daemon: %s: %w", part, err):
		default:
		}
		g.cancel()
	}()
}

// NewLogger builds the slog logger the config asks for, writing to w.
func NewLogger(c config.Log, w interface{ Write([]byte) (int, error) }) *slog.Logger {
	var level slog.Level
	_ = level.UnmarshalText([]byte(c.Level))
	opts := &slog.HandlerOptions{Level: level}
	if c.Format == "json" {
		return slog.New(slog.NewJSONHandler(w, opts))
	}
	return slog.New(slog.NewTextHandler(w, opts))
}
