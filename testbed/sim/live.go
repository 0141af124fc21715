package sim

import (
	"cmp"
	"context"
	"errors"
	"fmt"
	"slices"
	"strings"
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
	// Speedup is virtual seconds per wall-clock second (default 1). TTFTs
	// stay in virtual seconds; what kvindex measures on its own clock
	// scales (at 4x its 10 s speculative residency lasts 40 virtual s).
	Speedup float64
	Addr    string // an external kvindex's gRPC address ("": the daemon in process, on loopback)
	// BasePort is the engines' first ZMQ port with Addr (default 5557;
	// each indexed router's fleet takes Engines consecutive ports).
	BasePort    int
	DaemonLog   bool // the in-process daemons' logs go to Options.Logger
	PrintConfig bool // Main prints LiveConfig's configuration and runs nothing
	// Fleet runs an embedded NATS server, a kvindex agent per engine and
	// liveReplicas replicas the routers ask in turn, instead of one daemon.
	Fleet bool
}

// liveReplicas is fleet mode's replica count.
const liveReplicas = 2

// liveFleet is one indexed router's engines as kvindex knows them.
type liveFleet struct {
	router, model string
	pods          []string
	endpoints     []string // ZMQ, tcp://127.0.0.1:port
}

// liveFleets names the indexed routers' engines, at ports from base on.
func liveFleets(o *Options, base int) []liveFleet {
	var out []liveFleet
	for _, name := range o.Routers {
		if !router.NeedsIndex(name) {
			continue
		}
		f := liveFleet{router: name, model: o.Model + "@" + name}
		for i := range o.Engines {
			f.pods = append(f.pods, name+"-"+podName(i))
			f.endpoints = append(f.endpoints, fmt.Sprintf("tcp://127.0.0.1:%d", base))
			base++
		}
		out = append(out, f)
	}
	return out
}

// LiveConfig returns the kvindex configuration an external daemon needs
// for a live run: a model per indexed router, a pod per engine at the
// ports the engines will bind, the default listeners, and nothing else
// (config.Marshal prints only what matters).
func LiveConfig(w *workload.Workload, o Options, lo LiveOptions) (*config.Config, error) {
	o, err := o.withDefaults(w.Engines)
	if err != nil {
		return nil, err
	}
	lo.defaults()
	return daemonConfig(&o, liveFleets(&o, lo.BasePort), config.DefaultGRPCListen, config.DefaultMetricsListen), nil
}

// simLimits relax admission control for the simulator's daemons: the
// engines, routers and kvindex share the machine, and a Route refused
// because the simulated engines took the cores (queueing past the 1 ms
// target, or the 50 ms bound) would end the run; routing quality, not
// overload, is what it measures.
func simLimits() config.Limits {
	return config.Limits{QueueTarget: time.Second, MaxQueueDelay: 10 * time.Second}
}

func (lo *LiveOptions) defaults() {
	if lo.Speedup <= 0 {
		lo.Speedup = 1
	}
	lo.BasePort = cmp.Or(lo.BasePort, 5557)
}

// daemonConfig subscribes kvindex to fleets' engines (before SetDefaults).
func daemonConfig(o *Options, fleets []liveFleet, grpcListen, metricsListen string) *config.Config {
	c := &config.Config{GRPCListen: grpcListen, MetricsListen: metricsListen, Limits: simLimits()}
	if o.NoGroupCaps {
		c.Scoring.GroupCaps = new(false)
	}
	// The engines' max_num_seqs, as an operator configures it; the rest
	// of the default cost model is kvsim's engine.
	c.Scoring.Cost.MaxNumSeqs = CostModel(o.Engine).MaxNumSeqs
	for _, f := range fleets {
		c.Models = append(c.Models, config.Model{Name: f.model, BlockSize: o.Engine.BlockSize})
		for i, pod := range f.pods {
			c.Pods = append(c.Pods, config.Pod{Name: pod, Model: f.model, Endpoint: f.endpoints[i]})
		}
	}
	return c
}

// Live replays w on the wall clock (scaled by lo.Speedup), every router
// at once on the same arrivals: engines publish KV events over real
// ZeroMQ (enginepub, vLLM's wire format) to a real kvindex, which the
// precise routers ask over gRPC. IndexProblems counts what kvindex could
// not apply, plus KV-cache groups whose blocks differ from their engine's
// cache (IndexDetail names them).
func Live(ctx context.Context, w *workload.Workload, o Options, lo LiveOptions) ([]metrics.Result, error) {
	o, err := o.withDefaults(w.Engines)
	if err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	lo.defaults()
	if o.Serial {
		return nil, errors.New("sim: live: serial arrivals are for virtual time (kvsim run --serial)")
	}
	for _, r := range o.Routers {
		if strings.HasSuffix(r, PrefixOnly) {
			return nil, fmt.Errorf("sim: live: router %q: one daemon serves the run; set group caps off for all instead", r)
		}
	}
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
	fleets := make([]*fleet, len(o.Routers))
	err = runJobs(ctx, len(o.Routers), len(o.Routers), func(ctx context.Context, k int) error {
		l, err := lr.newLoop(w, &o, k, start, lo.Speedup)
		if err != nil {
			return err
		}
		t0 := time.Now()
		if err := l.run(ctx); err != nil {
			return err
		}
		out[k], fleets[k] = l.result(), l.fleet
		out[k].Wall = time.Since(t0)
		return nil
	})
	if err != nil {
		return nil, err
	}
	// Checked once every router is done, so that no check loads kvindex
	// while another router is measured.
	for _, lf := range lr.fleets {
		sent := lr.sent[lf.router]
		if lo.Fleet {
			sent = nil // replicas count the agents' deltas, not the engines' batches
		}
		k := slices.Index(o.Routers, lf.router)
		c, err := checkIndexed(ctx, lr.clients, lf, sent, fleets[k])
		if err != nil {
			return nil, err
		}
		out[k].IndexProblems, out[k].IndexDetail = c.total(), c.String()
	}
	return out, nil
}

// liveRig is what a live run's indexed routers use: their engines'
// publishers, the batches each published, and the kvindex clients (the
// replicas, in turn, in fleet mode).
type liveRig struct {
	fleets  []liveFleet
	pubs    map[string][]*enginepub.Publisher
	sent    map[string][]uint64 // written by the router's loop only
	clients []*api.Client
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
	lr.fleets = liveFleets(o, lo.BasePort)
	if len(lr.fleets) == 0 {
		return lr, nil
	}
	if lo.Addr == "" {
		base, err := netutil.FreePorts(len(lr.fleets) * o.Engines)
		if err != nil {
			return nil, fmt.Errorf("sim: live: %w", err)
		}
		lr.fleets = liveFleets(o, base)
	}
	for _, f := range lr.fleets {
		for i, pod := range f.pods {
			p, err := enginepub.NewPublisher(enginepub.PublisherConfig{Endpoint: f.endpoints[i], Topic: "kv@" + pod + "@" + f.model,
				Encoding: o.Wire, Bind: true})
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
		if addrs, err = lr.startFleet(o, lo); err != nil {
			return nil, err
		}
	case lo.Addr == "":
		cfg := daemonConfig(o, lr.fleets, "127.0.0.1:0", config.MetricsOff)
		cfg.SetDefaults()
		if err := cfg.Validate(); err != nil {
			return nil, fmt.Errorf("sim: live: daemon config: %w", err)
		}
		d, err := daemon.New(cfg, daemonLog(o, lo))
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
	if lo.Fleet {
		if err := waitDiscovered(ctx, lr.clients, lr.fleets); err != nil {
			return nil, err
		}
	}
	o.Logger.Info("live: kvindex subscribed", "addrs", addrs, "fleets", len(lr.fleets))
	return lr, nil
}

// newLoop builds router k's loop on the wall clock since start, scaled
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

// checkIndexed waits (up to 10 s) until every client (the daemon, or each
// replica) holds exactly what each of the fleet's engines caches in each
// KV-cache group, with equal digests across replicas and, when sent is
// given, every batch the engine published; then it counts what kvindex
// could not apply exactly and what still differs.
func checkIndexed(ctx context.Context, clients []*api.Client, lf liveFleet, sent []uint64, f *fleet) (*indexCheck, error) {
	deadline := time.Now().Add(10 * time.Second)
	for {
		c := &indexCheck{}
		digests := map[string]uint64{}
		for _, cl := range clients {
			resp, err := cl.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{Model: lf.model, Digests: len(clients) > 1})
			if err != nil {
				return nil, fmt.Errorf("sim: live: %w", err)
			}
			seen := 0
			for _, ws := range resp.GetWorkers() {
				pod := ws.GetWorker().GetPod()
				i := slices.Index(lf.pods, pod)
				if i < 0 {
					continue
				}
				seen++
				c.addStatus(ws)
				if ws.GetLastError() != "" {
					c.note("%s: %s", pod, ws.GetLastError())
				}
				c.compareGroups(i, f.engines[i], statusGroups(ws))
				if sent != nil && ws.GetBatches() < sent[i] {
					c.add(probWorkers, 1)
					c.note("%s applied %d of %d batches", pod, ws.GetBatches(), sent[i])
				}
				if d, ok := digests[pod]; ok && d != ws.GetDigest() {
					c.add(probWorkers, 1)
					c.note("%s: replicas' digests differ", pod)
				}
				digests[pod] = ws.GetDigest()
			}
			c.add(probWorkers, int64(len(lf.pods)-seen))
		}
		if c.total() == 0 || time.Now().After(deadline) {
			return c, nil
		}
		time.Sleep(20 * time.Millisecond)
	}
}
