// Package daemon assembles the kvindex service from its parts: the index,
// the ZMQ subscriber that feeds it, the gRPC API over it and the Prometheus
// endpoint. cmd/kvindex and the demo only turn configuration into a Daemon.
//
// A Daemon is built once, run once, and safe to query (addresses, index)
// from any goroutine while it runs.
package daemon

import (
	"context"
	"errors"
	"fmt"
	"log/slog"
	"net"
	"net/http"
	"sync"
	"time"

	"github.com/nats-io/nats.go"
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
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
	nc       *nats.Conn      // nil without fleet mode
	fleet    *natsbus.Source // nil without fleet mode
	lag      *metrics.Lag    // kvindex_event_lag_seconds, both sources
	tracker  *scoring.Tracker
	scraper  *scrape.Scraper
	grpc     *grpc.Server
	api      *api.Server
	tls      *tlsreload.Reloader // nil without TLS
	auth     *Auth               // nil without authentication
	grpcLis  net.Listener
	httpSrv  *http.Server
	httpLis  net.Listener
	registry *prometheus.Registry

	discovery  discoverySource       // nil without discovery
	discovered *discovered           // the pods discovery added
	reconciler *discovery.Reconciler // nil without discovery
	// The endpoint picker (gateway.listen); nil without it. gw is its
	// pool as it changes; gwSource, when not nil, the InferencePool it
	// comes from.
	picker   *picker.Picker
	gw       *gatewayPool
	gwSource poolSource
	gwGRPC   *grpc.Server
	gwLis    net.Listener
}

// New builds the index and its workers from cfg and opens the gRPC and
// metrics listeners (so that ":0" addresses are resolved before Run).
// Nothing is received or served until Run.
func New(cfg *config.Config, log *slog.Logger) (*Daemon, error) {
	if log == nil {
		log = slog.New(slog.DiscardHandler)
	}
	d := &Daemon{cfg: cfg, log: log, ix: indexer.New(indexer.Config{
		WorkerCapacity: cfg.Index.WorkerCapacity,
		MemoryBudget:   cfg.Index.MemoryBudgetMiB << 20,
		RemovalHistory: cfg.Index.RemovalHistory,
	}), lag: metrics.NewLag()}
	for _, m := range upFrontModels(cfg) {
		if _, err := d.ix.AddModel(m.Name, m.BlockSize); err != nil {
			return nil, fmt.Errorf("daemon: model %q: %w", m.Name, err)
		}
	}
	var eps []zmq.Endpoint
	for _, we := range cfg.Workers() {
		w, err := d.ix.AddWorker(indexer.WorkerInfo{Ref: we.Worker, Model: we.Model, Endpoint: we.Endpoint})
		if err != nil {
			return nil, fmt.Errorf("daemon: worker %s: %w", we.Worker, err)
		}
		if we.CapacityBlocks > 0 {
			w.SetCapacity(we.CapacityBlocks)
		}
		eps = append(eps, zmq.Endpoint{Worker: we.Worker, Address: we.Endpoint, Topic: we.Topic, ReplayEndpoint: we.ReplayEndpoint, Sink: w})
	}
	policy, err := events.ParseGapPolicy(cfg.Events.GapPolicy)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	opts := zmq.SubscriberOptions{
		Logger:               log,
		LogEvery:             cfg.Log.ProblemInterval,
		QueueSize:            cfg.Events.QueueSize,
		QueueBytes:           cfg.Events.QueueBytes,
		MaxMessageBytes:      cfg.Events.MaxMessageBytes,
		ReplayTimeout:        cfg.Events.ReplayTimeout,
		ReplayConcurrency:    cfg.Events.ReplayConcurrency,
		GapPolicy:            policy,
		StaleAfterDisconnect: cfg.Events.StaleAfterDisconnect,
		StaleAfterSilence:    cfg.Events.StaleAfterSilence,
		NewWorker:            d.newPushWorker,
		Applied: func(_ events.WorkerRef, b *events.Batch, replayed bool) {
			if !replayed {
				d.lag.Observe(metrics.LagZMQ, b.Timestamp, time.Now())
			}
		},
	}
	for _, pl := range cfg.Push {
		l := zmq.PushListener{Address: pl.Listen, Topic: pl.Topic, Routes: map[string]events.TopicRoute{}, MaxWorkers: pl.MaxWorkers, Allow: pl.Allow}
		for _, r := range pl.Routes {
			l.Routes[r.Topic] = events.TopicRoute{Pod: r.Pod, Model: r.Model, ReplayEndpoint: r.ReplayEndpoint}
		}
		opts.Push = append(opts.Push, l)
	}
	sub, err := zmq.NewSubscriber(opts, eps...)
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	d.sub = sub
	d.srcs = sources{sub}
	if cfg.NATS.Enabled() {
		if d.nc, err = fleet.Connect(cfg.NATS, "kvindex serve", log); err != nil {
			return nil, fmt.Errorf("daemon: %w", err)
		}
		d.fleet = natsbus.NewSource(d.nc, coldAware{fleet.NewReplicas(d.ix, log), d}, natsbus.SourceOptions{
			Bucket: cfg.NATS.Bucket, TTL: cfg.NATS.RegistrationTTL, Models: cfg.NATS.Models,
			StaleAfterDisconnect: cfg.Events.StaleAfterDisconnect,
			LogEvery:             cfg.Log.ProblemInterval, Logger: log,
			Applied: func(_ events.WorkerRef, a natsbus.AppliedDelta) {
				d.lag.Observe(metrics.LagNATS, a.EngineTime, time.Now())
			},
		})
		d.srcs = append(d.srcs, d.fleet)
	}

	d.registry = prometheus.NewRegistry()
	mc := metrics.NewCollector(d.ix, d.srcs)
	if d.fleet != nil {
		mc.WithDigests() // replicas are compared by digest
	}
	d.registry.MustRegister(
		collectors.NewGoCollector(),
		collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}),
		mc,
		d.lag.Collector(),
	)
	if d.fleet != nil {
		d.registry.MustRegister(
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_fleet_reconnects_total", Help: "NATS reconnections (each resynced every fleet worker from a snapshot)."},
				func() float64 { return float64(d.fleet.Reconnects()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_fleet_watch_restarts_total", Help: "Restarts of the watch of the agents' bucket (NATS or JetStream unreachable, the watch ended)."},
				func() float64 { return float64(d.fleet.WatchRestarts()) }),
			prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_fleet_foreign_registrations_total", Help: "Entries of the agents' bucket ignored: they do not parse or do not match their key."},
				func() float64 { return float64(d.fleet.Foreign()) }),
		)
	}
	pol, err := cfg.Policy()
	if err != nil {
		return nil, fmt.Errorf("daemon: %w", err)
	}
	d.tracker = scoring.NewTracker(scoring.TrackerOptions{SpecTTL: cfg.Scoring.SpeculativeTTL, FlightTTL: cfg.Scoring.InflightTTL, MaxFlights: cfg.Limits.MaxInflight})
	loads := scoring.NewLoadBoard(3 * cfg.Scoring.ScrapeInterval)
	var targets []scrape.Target
	for _, p := range cfg.Pods {
		if p.MetricsURL != "" {
			targets = append(targets, scrape.Target{Pod: p.Name, DPSize: p.DPSize, URL: p.MetricsURL})
		}
	}
	d.scraper = scrape.New(targets, loads, cfg.Scoring.ScrapeInterval, log)
	if cfg.Discovery.Enabled() {
		if d.discovery, err = newDiscoverySource(&cfg.Discovery); err != nil {
			return nil, fmt.Errorf("daemon: %w", err)
		}
		d.discovered = &discovered{d: d, pods: map[string]*discoveredPod{}}
		d.reconciler = discovery.NewReconciler(d.discovered, log)
		d.registry.MustRegister(d.reconciler)
	}
	d.registry.MustRegister(d.scraper) // the engines' own prefix-cache counters
	d.registry.MustRegister(
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "kvindex_inflight_requests", Help: "Routed requests not yet released or expired."},
			func() float64 { return float64(d.tracker.InFlight()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_inflight_refused_total", Help: "Routes refused because limits.max_inflight requests were in flight."},
			func() float64 { return float64(d.tracker.Refused()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_speculative_skipped_total", Help: "Routes recorded without speculative blocks because speculative entries held their most keys."},
			func() float64 { return float64(d.tracker.SpecSkipped()) }),
		prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_scrape_failures_total", Help: "Failed scrapes of vLLM metrics endpoints."},
			func() float64 { return float64(d.scraper.Failures()) }),
	)
	tk, err := newTokenizer(cfg, d)
	if err != nil {
		return nil, err
	}
	var tokenizer api.Tokenizer
	if tk != nil {
		tokenizer = tk
	}
	srv := api.NewServer(d.ix, d.srcs, api.Options{
		Tokenizer:     tokenizer,
		Policy:        &pol,
		Tracker:       d.tracker,
		Loads:         loads,
		IncludeStale:  cfg.Score.IncludeStale,
		MaxTokens:     cfg.Limits.MaxTokens,
		MaxBlockKeys:  cfg.Limits.MaxBlockKeys,
		MaxCandidates: cfg.Limits.MaxCandidates,
		MaxWatches:    cfg.Limits.MaxWatches,
		MaxTenants:    cfg.Limits.MaxTenants,
		Registerer:    d.registry,
		Admission: api.AdmissionOptions{
			Off:           cfg.Limits.AdmissionOff,
			MaxConcurrent: cfg.Limits.MaxConcurrent,
			MaxPending:    cfg.Limits.MaxPending,
			Target:        cfg.Limits.QueueTarget,
			MaxQueueDelay: cfg.Limits.MaxQueueDelay,

			MaxInspect:        cfg.Limits.MaxInspect,
			MaxInspectPending: cfg.Limits.MaxInspectPending,
			InspectWait:       cfg.Limits.InspectWait,
		},
	})
	d.api = srv
	gopts := srv.GRPCOptions()
	if cfg.TLS.Enabled() {
		if d.tls, err = tlsreload.New(tlsreload.Files{CertFile: cfg.TLS.CertFile, KeyFile: cfg.TLS.KeyFile, ClientCAFile: cfg.TLS.ClientCAFile}, log); err != nil {
			return nil, fmt.Errorf("daemon: %w", err)
		}
		gopts = append(gopts, grpc.Creds(credentials.NewTLS(d.tls.Config())))
		d.registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "kvindex_tls_reload_failures_total", Help: "Changed TLS files that did not load (the previous ones stayed in use)."},
			func() float64 { return float64(d.tls.Failures()) }))
	}
	if d.auth, err = NewAuth(&cfg.Auth, log); err != nil {
		return nil, err
	}
	if d.auth != nil {
		gopts = append(gopts, d.auth.ListenerOptions(api.ListenerGRPC)...)
		d.registry.MustRegister(d.auth.Collectors()...)
	}
	d.grpc = grpc.NewServer(gopts...)
	srv.Register(d.grpc)
	if cfg.Gateway.Enabled() {
		if err := d.newGateway(cfg); err != nil {
			return nil, err
		}
	}

	if d.grpcLis, err = net.Listen("tcp", cfg.GRPCListen); err != nil {
		d.closeGateway()
		return nil, fmt.Errorf("daemon: gRPC listen on %s: %w", cfg.GRPCListen, err)
	}
	if cfg.Limits.MaxConnections > 0 {
		d.grpcLis = xnetutil.LimitListener(d.grpcLis, cfg.Limits.MaxConnections)
	}
	adm := prometheus.NewDesc("kvindex_admission_refused_total", "Calls refused by admission control, by reason: Score and Route for overload (the adaptive bound on pending calls), pending (limits.max_pending) or queued (waited past limits.max_queue_delay); Lookup, Dump and Diagnose for inspect (their own budget: limits.max_inspect, max_inspect_pending, inspect_wait).", []string{"reason"}, nil)
	admGauges := []*prometheus.Desc{
		prometheus.NewDesc("kvindex_admission_pending", "Score and Route calls received and not finished.", nil, nil),
		prometheus.NewDesc("kvindex_admission_limit", "The adaptive bound on pending Score and Route calls.", nil, nil),
	}
	d.registry.MustRegister(collectorFunc{adm, func(ch chan<- prometheus.Metric) {
		st := srv.AdmissionStats()
		ch <- prometheus.MustNewConstMetric(adm, prometheus.CounterValue, float64(st.RefusedOverload), "overload")
		ch <- prometheus.MustNewConstMetric(adm, prometheus.CounterValue, float64(st.RefusedPending), "pending")
		ch <- prometheus.MustNewConstMetric(adm, prometheus.CounterValue, float64(st.RefusedQueued), "queued")
		ch <- prometheus.MustNewConstMetric(adm, prometheus.CounterValue, float64(st.RefusedInspect), "inspect")
		ch <- prometheus.MustNewConstMetric(admGauges[0], prometheus.GaugeValue, float64(st.Pending))
		ch <- prometheus.MustNewConstMetric(admGauges[1], prometheus.GaugeValue, float64(st.Limit))
	}, admGauges})
	if cfg.MetricsListen != "off" {
		if d.httpLis, err = net.Listen("tcp", cfg.MetricsListen); err != nil {
			d.grpcLis.Close()
			d.closeGateway()
			return nil, fmt.Errorf("daemon: metrics listen on %s: %w", cfg.MetricsListen, err)
		}
		d.httpSrv = &http.Server{Handler: MetricsHandler(d.registry, d.auth), ReadHeaderTimeout: 5 * time.Second}
		if cfg.TLS.Metrics {
			d.httpSrv.TLSConfig = d.tls.Config()
		}
	}
	return d, nil
}

// newPushWorker adds a worker first seen on a push listener. A model the
// configuration does not list is added with the default block size; a
// mismatch then shows as block-size errors on the worker.
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

// upFrontModels lists the models New registers in the index: every model
// of cfg, except on a replica restricted to a shard (nats.models), which
// registers only its shard's models and those its own pods serve, so that
// it answers a model another shard holds as unknown rather than as one
// with no workers. Push listeners keep every model (their engines may name
// any, and a model registered late would take the default block size);
// discovered and gateway pods, and fleet workers, add theirs as they
// appear.
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
	if d.httpLis == nil {
		return ""
	}
	return d.httpLis.Addr().String()
}

// Index is the daemon's index.
func (d *Daemon) Index() *indexer.Index { return d.ix }

// Fleet is the daemon's NATS source, nil without fleet mode.
func (d *Daemon) Fleet() *natsbus.Source { return d.fleet }

// Subscriber is the daemon's event subscriber.
func (d *Daemon) Subscriber() *zmq.Subscriber { return d.sub }

// Run receives events and serves gRPC and metrics until ctx is done, then
// stops gracefully (in-flight RPCs finish, sockets close). It returns nil
// on a clean shutdown, or the first error that stopped a part.
func (d *Daemon) Run(ctx context.Context) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	var wg sync.WaitGroup
	errc := make(chan error, 8) // one per goroutine that sends
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := d.sub.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
			errc <- fmt.Errorf("daemon: subscriber: %w", err)
			cancel()
		}
	}()
	if d.fleet != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.fleet.Run(ctx); err != nil && !errors.Is(err, context.Canceled) {
				errc <- fmt.Errorf("daemon: fleet: %w", err)
				cancel()
			}
		}()
	}
	if d.gwGRPC != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.gwGRPC.Serve(d.gwLis); err != nil {
				errc <- fmt.Errorf("daemon: gateway serve: %w", err)
				cancel()
			}
		}()
	}
	wg.Add(1)
	go func() {
		defer wg.Done()
		if err := d.grpc.Serve(d.grpcLis); err != nil {
			errc <- fmt.Errorf("daemon: gRPC serve: %w", err)
			cancel()
		}
	}()
	if d.tls != nil {
		wg.Add(1)
		go func() { defer wg.Done(); d.tls.Run(ctx, time.Second) }()
	}
	if d.auth != nil {
		wg.Add(1)
		go func() { defer wg.Done(); d.auth.Run(ctx, time.Second) }()
	}
	if d.gwSource != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.gwSource.Run(ctx, d.gw.setPool); err != nil && !errors.Is(err, context.Canceled) {
				errc <- fmt.Errorf("daemon: gateway inference pool: %w", err)
				cancel()
			}
		}()
	}
	if d.discovery != nil {
		d.discovered.mu.Lock()
		d.discovered.runCtx = ctx
		d.discovered.mu.Unlock()
		wg.Add(1)
		go func() {
			defer wg.Done()
			if err := d.discovery.Run(ctx, d.reconciler); err != nil && !errors.Is(err, context.Canceled) {
				errc <- fmt.Errorf("daemon: discovery: %w", err)
				cancel()
			}
		}()
	}
	wg.Add(2)
	go func() { defer wg.Done(); d.tracker.Run(ctx, time.Second) }()
	go func() { defer wg.Done(); d.scraper.Run(ctx) }()
	if d.httpSrv != nil {
		wg.Add(1)
		go func() {
			defer wg.Done()
			serve := d.httpSrv.Serve
			if d.httpSrv.TLSConfig != nil {
				serve = func(l net.Listener) error { return d.httpSrv.ServeTLS(l, "", "") }
			}
			if err := serve(d.httpLis); err != nil && !errors.Is(err, http.ErrServerClosed) {
				errc <- fmt.Errorf("daemon: metrics serve: %w", err)
				cancel()
			}
		}()
	}
	d.log.Info("kvindex serving", "grpc", d.GRPCAddr(), "metrics", d.MetricsAddr(), "gateway", d.GatewayAddr(), "workers", len(d.ix.Workers()), "models", len(d.ix.Models()))
	<-ctx.Done()
	d.log.Info("kvindex shutting down")
	stopped := make(chan struct{})
	// NOT_SERVING first, so that health watchers (load balancers, probes)
	// hear of the drain before connections close.
	d.api.Health().Shutdown()
	if d.picker != nil {
		d.picker.Health().Shutdown()
	}
	go func() {
		if d.gwGRPC != nil {
			d.gwGRPC.GracefulStop()
		}
		d.grpc.GracefulStop()
		close(stopped)
	}()
	select {
	case <-stopped:
	case <-time.After(5 * time.Second):
		if d.gwGRPC != nil {
			d.gwGRPC.Stop()
		}
		d.grpc.Stop()
	}
	if d.httpSrv != nil {
		sctx, scancel := context.WithTimeout(context.Background(), 5*time.Second)
		_ = d.httpSrv.Shutdown(sctx)
		scancel()
	}
	wg.Wait()
	if d.nc != nil {
		d.nc.Close()
	}
	select {
	case err := <-errc:
		return err
	default:
		return nil
	}
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

// collectorFunc is a prometheus.Collector of metric families computed at
// scrape time.
type collectorFunc struct {
	desc    *prometheus.Desc
	collect func(chan<- prometheus.Metric)
	more    []*prometheus.Desc
}

func (c collectorFunc) Describe(ch chan<- *prometheus.Desc) {
	ch <- c.desc
	for _, d := range c.more {
		ch <- d
	}
}
func (c collectorFunc) Collect(ch chan<- prometheus.Metric) { c.collect(ch) }
