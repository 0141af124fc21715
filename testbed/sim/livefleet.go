package sim

import (
	"context"
	"fmt"
	"log/slog"
	"slices"
	"time"

	"github.com/nats-io/nats.go"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/daemon"
	kvfleet "github.com/kvindex/kvindex/fleet"
	kvindexv1 "github.com/kvindex/kvindex/proto/kvindex/v1"
	"github.com/kvindex/kvindex/testbed/embednats"
)

// fleetRig is live mode's fleet shape: an embedded NATS server (JetStream
// in a temporary directory), a kvindex agent per simulated engine
// subscribed to it over ZeroMQ, and liveReplicas kvindex serve replicas
// that know no engine and follow the agents over NATS.
type fleetRig struct {
	ns     *embednats.Server
	conns  []*nats.Conn
	addrs  []string
	cancel context.CancelFunc
	done   chan error
	parts  int
}

// daemonLog is the in-process daemons' logger (nil: discard).
func daemonLog(o *Options, lo *LiveOptions) *slog.Logger {
	if lo.DaemonLog {
		return o.Logger
	}
	return nil
}

// startFleetRig starts NATS, an agent per pod of fleets and the replicas.
func startFleetRig(o *Options, lo *LiveOptions, fleets []liveFleet) (r *fleetRig, err error) {
	r = &fleetRig{done: make(chan error, 64)}
	defer func() {
		if err != nil {
			r.stop()
		}
	}()
	if r.ns, err = embednats.Start("kvsim"); err != nil {
		return nil, err
	}
	nats := config.NATS{URL: r.ns.URL()}
	ctx, cancel := context.WithCancel(context.Background())
	r.cancel = cancel
	log := daemonLog(o, lo)
	for _, f := range fleets {
		for i, pod := range f.pods {
			cfg := &config.Config{MetricsListen: config.MetricsOff, NATS: nats,
				Models: []config.Model{{Name: f.model, BlockSize: o.Engine.BlockSize}},
				Pods:   []config.Pod{{Name: pod, Model: f.model, Endpoint: f.endpoints[i]}}}
			cfg.Agent.Pod = pod
			cfg.SetDefaults()
			if err := cfg.Validate(); err != nil {
				return nil, fmt.Errorf("sim: fleet: agent %s: %w", pod, err)
			}
			nc, err := kvfleet.Connect(nats, "kvsim agent "+pod, log)
			if err != nil {
				return nil, err
			}
			r.conns = append(r.conns, nc)
			a, err := kvfleet.NewAgent(ctx, cfg, nc, log)
			if err != nil {
				return nil, fmt.Errorf("sim: fleet: agent %s: %w", pod, err)
			}
			r.parts++
			go func() { r.done <- a.Run(ctx) }()
		}
	}
	for range liveReplicas {
		cfg := &config.Config{GRPCListen: "127.0.0.1:0", MetricsListen: config.MetricsOff, NATS: nats}
		cfg.SetDefaults()
		d, err := daemon.New(cfg, log)
		if err != nil {
			return nil, fmt.Errorf("sim: fleet: replica: %w", err)
		}
		r.addrs = append(r.addrs, d.GRPCAddr())
		r.parts++
		go func() { r.done <- d.Run(ctx) }()
	}
	return r, nil
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

func (r *fleetRig) stop() {
	if r.cancel != nil {
		r.cancel()
		for range r.parts {
			<-r.done
		}
	}
	for _, nc := range r.conns {
		nc.Close()
	}
	if r.ns != nil {
		r.ns.Close()
	}
}
