package daemon

import (
	"context"
	"log/slog"
	"sync"
	"time"

	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/fleet"
	"github.com/kvindex/kvindex/internal/defaults"
)

// RunAgent runs kvindex agent as cfg configures it until ctx is done: the
// fleet agent beside one pod (fleet.Agent), its metrics server and, with
// agent.grpc_listen, its index served for inspection. One Auth, the same
// tokens as kvindex serve's, guards both listeners.
func RunAgent(ctx context.Context, cfg *config.Config, log *slog.Logger) error {
	defaults.Zero(&log, slog.New(slog.DiscardHandler))
	if _, err := cfg.ValidateAgent(); err != nil {
		return err
	}
	nc, err := fleet.Connect(cfg.NATS, "kvindex agent", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	var wg sync.WaitGroup
	defer wg.Wait() // after cancel: the goroutines below end with ctx
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	a, err := fleet.NewAgent(ctx, cfg, nc, log)
	if err != nil {
		return err
	}
	auth, err := NewAuth(&cfg.Auth, log)
	if err != nil {
		return err
	}
	reg := newRegistry(a.Collectors()...)
	var grpcOpts []grpc.ServerOption
	if auth != nil {
		reg.MustRegister(auth.Collectors()...)
		grpcOpts = auth.ListenerOptions(api.ListenerGRPC)
		wg.Go(func() { auth.Run(ctx, time.Second) })
	}
	ms, err := listenMetrics(cfg.MetricsListen, reg, auth, nil)
	if err != nil {
		return err
	}
	if ms != nil {
		defer func() { _ = ms.shutdown(2 * time.Second) }()
		wg.Go(func() {
			if err := ms.serve(); err != nil {
				log.Error("kvindex agent metrics server stopped", "err", err)
			}
		})
		log.Info("kvindex agent metrics", "addr", ms.addr())
	}
	if cfg.Agent.GRPCListen != "" {
		_, stop, err := a.ServeIndex(cfg.Agent.GRPCListen, grpcOpts...)
		if err != nil {
			return err
		}
		defer stop()
	}
	log.Info("kvindex agent running", "pod", cfg.Agent.Pod, "nats", cfg.NATS.URL != "")
	return a.Run(ctx)
}
