package sim

import (
	"context"
	"errors"
	"fmt"
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

	nIndexed := 0
	for _, name := range o.Routers {
		if router.NeedsIndex(name) {
			nIndexed++
		}
	}
	var ports []int
	if lo.Addr == "" && nIndexed > 0 {
		base, err := netutil.FreePorts(nIndexed * o.Engines)
		if err != nil {
			return nil, fmt.Errorf("sim: live: %w", err)
		}
		for i := range nIndexed * o.Engines {
			ports = append(ports, base+i)
		}
	}
	fleets := liveFleets(&o, &lo, ports)

	// Engines bind first, as vLLM's publishers do. sent counts each
	// engine's published batches (written by its router's loop only).
	pubs := map[string][]*enginepub.Publisher{}
	sent := map[string][]uint64{}
	defer func() {
		for _, ps := range pubs {
			for _, p := range ps {
				p.Close()
			}
		}
	}()
	for _, f := range fleets {
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
			pubs[f.router] = append(pubs[f.router], p)
		}
		sent[f.router] = make([]uint64, len(f.pods))
	}

	addr := lo.Addr
	var d *daemon.Daemon
	var rig *fleetRig
	daemonDone := make(chan error, 1)
	if nIndexed > 0 && lo.Fleet {
		if rig, err = startFleetRig(&o, &lo, fleets, lo.Replicas); err != nil {
			return nil, err
		}
		defer rig.stop()
		addr = rig.addrs[0]
	} else if nIndexed > 0 && addr == "" {
		cfg := daemonConfig(&o, &lo, fleets, "127.0.0.1:0", config.MetricsOff)
		cfg.SetDefaults()
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("sim: live: daemon config: %w", err)
		}
		log := o.Logger
		if !lo.DaemonLog {
			log = nil
		}
		if d, err = daemon.New(cfg, log); err != nil {
			return nil, fmt.Errorf("sim: live: %w", err)
		}
		dctx, dstop := context.WithCancel(context.Background())
		go func() { daemonDone <- d.Run(dctx) }()
		defer func() { dstop(); <-daemonDone }()
		addr = d.GRPCAddr()
	}
	var client *api.Client
	var clients []*api.Client // the routers' servers, in turn: the replicas in fleet mode
	if nIndexed > 0 {
		for _, ps := range pubs {
			for _, p := range ps {
				wctx, wcancel := context.WithTimeout(ctx, 15*time.Second)
				err := p.WaitForSubscribers(wctx, 1)
				wcancel()
				if err != nil {
					return nil, fmt.Errorf("sim: live: kvindex at %s never subscribed: %w", addr, err)
				}
			}
		}
		addrs := []string{addr}
		if rig != nil {
			addrs = rig.addrs
		}
		for _, a := range addrs {
			c, err := api.Dial(ctx, a)
			if err != nil {
				return nil, fmt.Errorf("sim: live: %w", err)
			}
			defer c.Close()
			clients = append(clients, c)
		}
		client = clients[0]
		if rig != nil {
			if err := rig.waitDiscovered(ctx, clients, fleets); err != nil {
				return nil, err
			}
			o.Logger.Info("live: fleet mode: agents registered, replicas synced", "replicas", addrs, "fleets", len(fleets))
		} else {
			o.Logger.Info("live: kvindex subscribed", "addr", addr, "fleets", len(fleets))
		}
	}

	start := time.Now()
	wait := func(ctx context.Context, t time.Duration) error {
		due := start.Add(time.Duration(float64(t) / lo.Speedup))
		if d := time.Until(due); d > 0 {
			timer := time.NewTimer(d)
			defer timer.Stop()
			select {
			case <-ctx.Done():
				return fmt.Errorf("sim: live: %w", ctx.Err())
			case <-timer.C:
			}
		}
		return nil
	}
	out := make([]metrics.Result, len(o.Routers))
	loops := make([]*loop, len(o.Routers))
	err = runJobs(ctx, len(o.Routers), len(o.Routers), func(ctx context.Context, k int) error {
		name := o.Routers[k]
		f, err := newFleet(&o, router.NeedsIndex(name))
		if err != nil {
			return err
		}
		l := &loop{w: w, o: &o, fleet: f, rec: metrics.NewRecorder(o.Engines), wait: wait,
			clock: func() time.Duration { return time.Duration(float64(time.Since(start)) * lo.Speedup) }}
		rcfg := router.Config{Fleet: f, BlockSize: o.Engine.BlockSize, Model: o.Model, AffinityTokens: o.AffinityTokens,
			Approx: o.Approx, LoadWeight: o.LoadWeight, PreciseLoadMode: o.PreciseLoadMode, RoutePolicy: o.RoutePolicy, Seed: o.Seed}
		if router.NeedsIndex(name) {
			for _, lf := range fleets {
				if lf.router == name {
					rcfg.Model, rcfg.Names = lf.model, lf.pods
				}
			}
			rcfg.KV = &grpcKV{c: client}
			if len(clients) > 1 {
				rcfg.KV = &grpcKV{c: clients[k%len(clients)]}
			}
			ps, n := pubs[name], sent[name]
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
			return fmt.Errorf("sim: %w", err)
		}
		t0 := time.Now()
		if err := l.run(ctx); err != nil {
			return err
		}
		res := l.result()
		res.Wall = time.Since(t0)
		res.IndexProblems = -1
		out[k] = res
		loops[k] = l
		return nil
	})
	if err != nil {
		return nil, err
	}
	for k, name := range o.Routers {
		if !router.NeedsIndex(name) {
			continue
		}
		for _, lf := range fleets {
			if lf.router == name {
				check := func() (int64, error) { return checkLive(ctx, client, lf, sent[name], loops[k].fleet) }
				if rig != nil {
					check = func() (int64, error) { return checkFleet(ctx, clients, lf, loops[k].fleet) }
				}
				n, err := check()
				if err != nil {
					return nil, err
				}
				out[k].IndexProblems = n
			}
		}
	}
	return out, nil
}

// checkLive waits (up to 10 s) until kvindex has received every batch the
// fleet published, then counts what it could not apply exactly.
func checkLive(ctx context.Context, c *api.Client, lf liveFleet, sent []uint64, f *fleet) (int64, error) {
	want := map[string]uint64{}
	for i, n := range sent {
		want[lf.pods[i]] = n
	}
	deadline := time.Now().Add(10 * time.Second)
	for {
		resp, err := c.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{Model: lf.model})
		if err != nil {
			return 0, fmt.Errorf("sim: live: %w", err)
		}
		caught := true
		var problems int64
		for _, ws := range resp.GetWorkers() {
			pod := ws.GetWorker().GetPod()
			if ws.GetBatches() < want[pod] {
				caught = false
			}
			problems += int64(ws.GetGaps() + ws.GetDecodeErrors() + ws.GetApplyErrors() + ws.GetOrphans() + ws.GetUnknownBlocks() +
				ws.GetBlockSizeMismatches() + ws.GetInvalidEvents() + ws.GetRestarts())
			for i, p := range lf.pods {
				if p == pod && int64(ws.GetResidentBlocks()) != int64(f.engines[i].CachedBlocks()) {
					problems++
				}
			}
		}
		if caught || time.Now().After(deadline) {
			if !caught {
				problems++
			}
			return problems, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}
