package sim

import (
	"context"
	"errors"
	"fmt"
	"slices"
	"time"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/daemon"
	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/internal/netutil"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/enginepub"
	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/router"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// LiveOptions configure live mode.
type LiveOptions struct {
	// Speedup is virtual seconds per wall-clock second (default 1): 4 runs
	// a 60 s workload in 15 s. The engines' time model and TTFTs stay in
	// virtual seconds; only the pacing scales, and with it everything
	// kvindex measures on its own wall clock: the real event lag and its
	// route tracker's TTLs (10 s of speculative residency lasts 40 virtual
	// seconds at 4x).
	Speedup float64
	// Addr is an external kvindex's gRPC address; "" starts the real
	// daemon (daemon) in process on loopback ports.
	Addr string
	// BasePort is the first ZMQ port the engines bind with an external
	// daemon (default 5557; each indexed router's fleet takes Engines
	// consecutive ports). With the in-process daemon, free ports are picked.
	BasePort int
	// Host is the address engines bind (default 127.0.0.1).
	Host string
	// DaemonLog receives the in-process daemon's logs (nil: discard).
	DaemonLog bool
	// Fleet runs fleet mode instead of one daemon: an embedded NATS
	// server, a kvindex agent beside each engine and Replicas kvindex
	// serve replicas following the agents; the routers ask the replicas
	// in turn. Not with Addr.
	Fleet bool
	// Replicas is fleet mode's replica count (default 2).
	Replicas int
}

// liveFleet is the ZMQ identity of one indexed router's engines.
type liveFleet struct {
	router string
	model  string
	pods   []string
	ports  []int
}

func liveFleets(o *Options, lo *LiveOptions, ports []int) []liveFleet {
	var out []liveFleet
	k := 0
	for _, name := range o.Routers {
		if !router.NeedsIndex(name) {
			continue
		}
		f := liveFleet{router: name, model: o.Model + "@" + name}
		for i := range o.Engines {
			f.pods = append(f.pods, name+"-"+podName(i))
			if ports != nil {
				f.ports = append(f.ports, ports[k])
			} else {
				f.ports = append(f.ports, lo.BasePort+k)
			}
			k++
		}
		out = append(out, f)
	}
	return out
}

// LiveConfig returns the kvindex configuration an external daemon needs
// for a live run with these options: one model per indexed router, one pod
// per engine at the ports the engines will bind, the default listeners.
// Every other field is left zero, for the daemon's defaults
// (config.SetDefaults), so config.Marshal prints only what matters here.
func LiveConfig(w *workload.Workload, o Options, lo LiveOptions) (*config.Config, error) {
	o, err := o.withDefaults(w.Engines)
	if err != nil {
		return nil, err
	}
	lo.defaults()
	return daemonConfig(&o, &lo, liveFleets(&o, &lo, nil), config.DefaultGRPCListen, config.DefaultMetricsListen), nil
}

func (lo *LiveOptions) defaults() {
	if lo.Speedup <= 0 {
		lo.Speedup = 1
	}
	if lo.BasePort == 0 {
		lo.BasePort = 5557
	}
	if lo.Host == "" {
		lo.Host = "127.0.0.1"
	}
	if lo.Replicas <= 0 {
		lo.Replicas = 2
	}
}

// daemonConfig is the configuration that subscribes kvindex to fleets'
// engines, before config.SetDefaults.
func daemonConfig(o *Options, lo *LiveOptions, fleets []liveFleet, grpcListen, metricsListen string) *config.Config {
	c := &config.Config{GRPCListen: grpcListen, MetricsListen: metricsListen}
	for _, f := range fleets {
		c.Models = append(c.Models, config.Model{Name: f.model, BlockSize: o.Engine.BlockSize})
		for i, pod := range f.pods {
			c.Pods = append(c.Pods, config.Pod{Name: pod, Model: f.model, Endpoint: fmt.Sprintf("tcp://%s:%d", lo.Host, f.ports[i])})
		}
	}
	return c
}

// Live replays w on wall-clock time (scaled by lo.Speedup): simulated
// engines publish their KV events over real ZeroMQ sockets
// (enginepub.Publisher, vLLM's wire format) to a real kvindex daemon, and the
// precise routers ask it over real gRPC (api.Client). Every router runs at
// once, each with its own fleet, on the same arrivals. Results are in
// o.Routers order; IndexProblems counts what kvindex reported it could not
// apply (gaps, decode or apply errors, orphans, unknown blocks) plus
// workers whose resident blocks differ from their engine's cache at the end.
func Live(ctx context.Context, w *workload.Workload, o Options, lo LiveOptions) ([]metrics.Result, error) {
	o, err := o.withDefaults(w.Engines)
	if err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	lo.defaults()
	if lo.Fleet && lo.Addr != "" {
		return nil, errors.New("sim: live: fleet mode starts its own replicas; it takes no --addr")
	}
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	lr, err := startLive(ctx, &o, &lo)
	if err != nil {
		return nil, err
	}
	defer lr.close()
	start := time.Now()
	out := make([]metrics.Result, len(o.Routers))
	loops := make([]*loop, len(o.Routers))
	err = runJobs(ctx, len(o.Routers), len(o.Routers), func(ctx context.Context, k int) error {
		l, err := lr.newLoop(w, &o, k, start, lo.Speedup)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := l.run(ctx); err != nil {
			return err
		}
		out[k] = l.result()
		out[k].Wall = time.Since(t0)
		out[k].IndexProblems = -1
		loops[k] = l
		return nil
	})
	if err != nil {
		return nil, err
	}
	for k, name := range o.Routers {
		for _, lf := range lr.fleets {
			if lf.router != name {
				continue
			}
			sent := lr.sent[name]
			if lr.rig != nil {
				sent = nil // replicas count the agents' deltas, not the engines' batches
			}
			if out[k].IndexProblems, err = checkIndexed(ctx, lr.clients, lf, sent, loops[k].fleet); err != nil {
				return nil, err
			}
		}
	}
	return out, nil
}

// liveRig is what a live run's indexed routers use: their engines'
// publishers and the kvindex they ask (an in-process daemon, a fleet rig
// or an external daemon).
type liveRig struct {
	fleets []liveFleet
	pubs   map[string][]*enginepub.Publisher
	// sent counts each engine's published batches (written by its
	// router's loop only).
	sent map[string][]uint64
	// clients are the routers' servers, in turn: the replicas in fleet
	// mode.
	clients []*api.Client
	rig     *fleetRig
	closers []func()
}

func (lr *liveRig) close() {
	for i := len(lr.closers) - 1; i >= 0; i-- {
		lr.closers[i]()
	}
}

// startLive binds the indexed routers' engines (first, as vLLM's
// publishers do), starts or reaches kvindex, waits until it has subscribed
// to every engine and dials it.
func startLive(ctx context.Context, o *Options, lo *LiveOptions) (lr *liveRig, err error) {
	lr = &liveRig{pubs: map[string][]*enginepub.Publisher{}, sent: map[string][]uint64{}}
	defer func() {
		if err != nil {
			lr.close()
		}
	}()
	nIndexed := 0
	for _, name := range o.Routers {
		if router.NeedsIndex(name) {
			nIndexed++
		}
	}
	if nIndexed == 0 {
		return lr, nil
	}
	var ports []int
	if lo.Addr == "" {
		base, err := netutil.FreePorts(nIndexed * o.Engines)
		if err != nil {
			return nil, fmt.Errorf("sim: live: %w", err)
		}
		for i := range nIndexed * o.Engines {
			ports = append(ports, base+i)
		}
	}
	lr.fleets = liveFleets(o, lo, ports)
	for _, f := range lr.fleets {
		for i, pod := range f.pods {
			p, err := enginepub.NewPublisher(enginepub.PublisherConfig{
				Endpoint: fmt.Sprintf("tcp://%s:%d", lo.Host, f.ports[i]),
				Topic:    "kv@" + pod + "@" + f.model,
				Encoding: o.Wire,
				Bind:     true,
			})
			if err != nil {
				return nil, fmt.Errorf("sim: live: engine %s: %w", pod, err)
			}
			lr.closers = append(lr.closers, func() { p.Close() })
			lr.pubs[f.router] = append(lr.pubs[f.router], p)
		}
		lr.sent[f.router] = make([]uint64, len(f.pods))
	}
	addrs := []string{lo.Addr}
	switch {
	case lo.Fleet:
		if lr.rig, err = startFleetRig(o, lo, lr.fleets, lo.Replicas); err != nil {
			return nil, err
		}
		lr.closers = append(lr.closers, lr.rig.stop)
		addrs = lr.rig.addrs
	case lo.Addr == "":
		cfg := daemonConfig(o, lo, lr.fleets, "127.0.0.1:0", config.MetricsOff)
		cfg.SetDefaults()
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("sim: live: daemon config: %w", err)
		}
		log := o.Logger
		if !lo.DaemonLog {
			log = nil
		}
		d, err := daemon.New(cfg, log)
		if err != nil {
			return nil, fmt.Errorf("sim: live: %w", err)
		}
		dctx, dstop := context.WithCancel(context.Background())
		done := make(chan error, 1)
		go func() { done <- d.Run(dctx) }()
		lr.closers = append(lr.closers, func() { dstop(); <-done })
		addrs = []string{d.GRPCAddr()}
	}
	for _, ps := range lr.pubs {
		for _, p := range ps {
			wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
			err := p.WaitForSubscribers(wctx, 1)
			wcancel()
			if err != nil {
				return nil, fmt.Errorf("sim: live: kvindex at %s never subscribed: %w", addrs[0], err)
			}
		}
	}
	for _, a := range addrs {
		c, err := api.Dial(ctx, a)
		if err != nil {
			return nil, fmt.Errorf("sim: live: %w", err)
		}
		lr.closers = append(lr.closers, func() { c.Close() })
		lr.clients = append(lr.clients, c)
	}
	if lr.rig == nil {
		o.Logger.Info("live: kvindex subscribed", "addr", addrs[0], "fleets", len(lr.fleets))
		return lr, nil
	}
	if err := lr.rig.waitDiscovered(ctx, lr.clients, lr.fleets); err != nil {
		return nil, err
	}
	o.Logger.Info("live: fleet mode: agents registered, replicas synced", "replicas", addrs, "fleets", len(lr.fleets))
	return lr, nil
}

// newLoop builds router k's loop on wall-clock time since start, scaled
// by speedup; an indexed router publishes its engines' batches and asks
// kvindex (the replicas in turn in fleet mode).
func (lr *liveRig) newLoop(w *workload.Workload, o *Options, k int, start time.Time, speedup float64) (*loop, error) {
	name := o.Routers[k]
	f, err := newFleet(o, router.NeedsIndex(name))
	if err != nil {
		return nil, err
	}
	l := &loop{w: w, o: o, fleet: f, rec: metrics.NewRecorder(o.Engines),
		clock: func() time.Duration { return time.Duration(float64(time.Since(start)) * speedup) },
		wait: func(ctx context.Context, t time.Duration) error {
			d := time.Until(start.Add(time.Duration(float64(t) / speedup)))
			if d <= 0 {
				return nil
			}
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-ctx.Done():
				return fmt.Errorf("sim: live: %w", ctx.Err())
			case <-timer.C:
				return nil
			}
		}}
	rcfg := o.routerConfig(f)
	if router.NeedsIndex(name) {
		for _, lf := range lr.fleets {
			if lf.router == name {
				rcfg.Model, rcfg.Names = lf.model, lf.pods
			}
		}
		rcfg.KV = &grpcKV{c: lr.clients[k%len(lr.clients)]}
		ps, n := lr.pubs[name], lr.sent[name]
		l.publish = func(i int, b *events.Batch, _ time.Duration) error {
			b.Timestamp = float64(time.Now().UnixNano()) / 1e9
			if _, err := ps[i].Publish(b); err != nil {
				return fmt.Errorf("sim: live: engine %d: %w", i, err)
			}
			n[i]++
			return nil
		}
	}
	if l.router, err = router.New(name, rcfg); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	return l, nil
}

// checkIndexed waits (up to 10 s) until every client (the daemon, or
// each replica in fleet mode) holds, for each of the fleet's engines,
// exactly what the engine caches, with equal digests across replicas and,
// when sent is given, every batch the engine published; then it counts
// what kvindex could not apply exactly and what still differs.
func checkIndexed(ctx context.Context, clients []*api.Client, lf liveFleet, sent []uint64, f *fleet) (int64, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		var problems int64
		digests := map[string]uint64{}
		for _, c := range clients {
			resp, err := c.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{Model: lf.model, Digests: len(clients) > 1})
			if err != nil {
				return 0, fmt.Errorf("sim: live: %w", err)
			}
			seen := 0
			for _, ws := range resp.GetWorkers() {
				pod := ws.GetWorker().GetPod()
				i := slices.Index(lf.pods, pod)
				if i < 0 {
					continue
				}
				seen++
				problems += int64(ws.GetGaps() + ws.GetDecodeErrors() + ws.GetApplyErrors() + ws.GetOrphans() + ws.GetUnknownBlocks() +
					ws.GetBlockSizeMismatches() + ws.GetInvalidEvents() + ws.GetRestarts())
				if int64(ws.GetResidentBlocks()) != int64(f.engines[i].CachedBlocks()) || (sent != nil && ws.GetBatches() < sent[i]) {
					problems++
				}
				if d, ok := digests[pod]; ok && d != ws.GetDigest() {
					problems++
				}
				digests[pod] = ws.GetDigest()
			}
			problems += int64(len(lf.pods) - seen)
		}
		if problems == 0 || time.Now().After(deadline) {
			return problems, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}
