package sim

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"sync"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/daemon"
	kvfleet "github.com/kvindex/kvindex/fleet"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/embednats"
)

// daemonLog is the in-process daemons' logger (nil: discard).
func daemonLog(o *Options, lo *LiveOptions) *slog.Logger {
	if lo.DaemonLog {
		return o.Logger
	}
	return nil
}

// startFleet starts live mode's fleet shape and returns the replicas'
// gRPC addresses: an embedded NATS server (JetStream in a temporary
// directory), a kvindex agent per pod of lr.fleets subscribed to its
// engine over ZeroMQ, and liveReplicas kvindex serve replicas that know
// no engine and follow the agents over NATS. lr.close stops them.
func (lr *liveRig) startFleet(o *Options, lo *LiveOptions) ([]string, error) {
	ns, err := embednats.Start("kvsim")
	if err != nil {
		return nil, err
	}
	lr.closers = append(lr.closers, ns.Close)
	var conns []*nats.Conn
	lr.closers = append(lr.closers, func() {
		for _, nc := range conns {
			nc.Close()
		}
	})
	ctx, cancel := context.WithCancel(context.Background())
	var wg sync.WaitGroup
	lr.closers = append(lr.closers, func() { cancel(); wg.Wait() })
	natsCfg := config.NATS{URL: ns.URL()}
	log := daemonLog(o, lo)
	for _, f := range lr.fleets {
		for i, pod := range f.pods {
			cfg := daemonConfig(o, []liveFleet{{model: f.model, pods: f.pods[i : i+1], endpoints: f.endpoints[i : i+1]}}, "", config.MetricsOff)
			cfg.NATS, cfg.Agent.Pod = natsCfg, pod
			cfg.SetDefaults()
			if err := cfg.Validate(); err != nil {
				return nil, fmt.Errorf("sim: fleet: agent %s: %w", pod, err)
			}
			nc, err := kvfleet.Connect(natsCfg, "kvsim agent "+pod, log)
			if err != nil {
				return nil, err
			}
			conns = append(conns, nc)
			a, err := kvfleet.NewAgent(ctx, cfg, nc, log)
			if err != nil {
				return nil, fmt.Errorf("sim: fleet: agent %s: %w", pod, err)
			}
			wg.Go(func() { _ = a.Run(ctx) })
		}
	}
	var addrs []string
	for range liveReplicas {
		cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: config.MetricsOff, NATS: natsCfg, Limits: simLimits()}
		cfg.Scoring.GroupCaps = new(!o.NoGroupCaps)
		cfg.SetDefaults()
		d, err := daemon.New(cfg, log)
		if err != nil {
			return nil, fmt.Errorf("sim: fleet: replica: %w", err)
		}
		addrs = append(addrs, d.GRPCAddr())
		wg.Go(func() { _ = d.Run(ctx) })
	}
	return addrs, nil
}

// waitDiscovered waits (up to 15 s) until every replica lists every pod
// of fleets as healthy.
func waitDiscovered(ctx context.Context, clients []*api.Client, fleets []liveFleet) error {
	var want []string
	for _, f := range fleets {
		want = append(want, f.pods...)
	}
	deadline := time.Now().Add(15 * time.Second)
	for i, c := range clients {
		for {
			resp, err := c.ListWorkers(ctx, &kvindexv1.ListWorkersRequest{})
			if err != nil {
				return fmt.Errorf("sim: fleet: replica %d: %w", i, err)
			}
			missing := slices.Clone(want)
			for _, ws := range resp.GetWorkers() {
				if ws.GetHealth() == kvindexv1.WorkerHealth_WORKER_HEALTH_OK {
					missing = slices.DeleteFunc(missing, func(p string) bool { return p == ws.GetWorker().GetPod() })
				}
			}
			if len(missing) == 0 {
				break
			}
			if time.Now().After(deadline) {
				return fmt.Errorf("sim: fleet: replica %d has not synced %v in 15 s", i, missing)
			}
			time.Sleep(20 * time.Millisecond)
		}
	}
	return nil
}
