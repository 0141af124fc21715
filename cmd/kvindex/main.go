// Command kvindex is the kvindex daemon: it subscribes to vLLM engines' KV
// events over ZeroMQ, keeps a live index of which blocks each worker holds,
// and answers routers over gRPC.
//
//	kvindex serve --config kvindex.yaml
//	kvindex agent --config agent.yaml   (fleet mode: the sidecar beside one vLLM pod)
package main

import (
	"context"
	"errors"
	"fmt"
	"net"
	"net/http"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"
	"github.com/spf13/cobra"
	"google.golang.org/grpc"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/daemon"
	"github.com/kvindex/kvindex/fleet"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvindex:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "kvindex",
		Short:         "Live index of the KV-cache blocks every vLLM worker holds, served over gRPC",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newServe(), newAgent())
	return root
}

func newServe() *cobra.Command {
	var (
		path      string
		overrides flagOverrides
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon",
		Long: "Run the daemon with the YAML configuration given by --config; without --config it runs the\n" +
			"built-in default (one local vLLM engine at tcp://127.0.0.1:5557). Flags override the file.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := serveConfig(path, overrides)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			d, err := daemon.New(cfg, daemon.NewLogger(cfg.Log, os.Stderr))
			if err != nil {
				return err
			}
			return d.Run(ctx)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&path, "config", "c", "", "YAML configuration file")
	f.StringVar(&overrides.grpcListen, "grpc-listen", "", "gRPC listen address (overrides grpc_listen)")
	f.StringVar(&overrides.metricsListen, "metrics-listen", "", "Prometheus listen address, or off (overrides metrics_listen)")
	f.StringVar(&overrides.logLevel, "log-level", "", "debug, info, warn or error (overrides log.level)")
	f.StringVar(&overrides.logFormat, "log-format", "", "text or json (overrides log.format)")
	return cmd
}

// flagOverrides are serve's flags that override configuration fields;
// "" leaves the field as configured.
type flagOverrides struct {
	grpcListen, metricsListen string
	logLevel, logFormat       string
}

// serveConfig reads the configuration file at path, or takes
// config.Default when path is "", applies the flags and validates the
// result.
func serveConfig(path string, o flagOverrides) (*config.Config, error) {
	cfg := config.Default()
	if path != "" {
		var err error
		if cfg, err = config.Load(path); err != nil {
			return nil, err
		}
	}
	if o.grpcListen != "" {
		cfg.GRPCListen = o.grpcListen
	}
	if o.metricsListen != "" {
		cfg.MetricsListen = o.metricsListen
	}
	if o.logLevel != "" {
		cfg.Log.Level = o.logLevel
	}
	if o.logFormat != "" {
		cfg.Log.Format = o.logFormat
	}
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}

func newAgent() *cobra.Command {
	var (
		path      string
		natsURL   string
		pod       string
		podName   string
		overrides flagOverrides
	)
	cmd := &cobra.Command{
		Use:   "agent",
		Short: "Run the fleet sidecar beside one vLLM pod",
		Long: "Run kvindex agent: it indexes one pod's workers from the engine's KV events over local ZeroMQ\n" +
			"and publishes their deltas and snapshots on NATS for the replicas (kvindex serve with nats.url).\n" +
			"The configuration names the pod (pods[], agent.pod) and NATS (nats.url). See docs/fleet.md.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := serveConfig(path, overrides)
			if err != nil {
				return err
			}
			if natsURL != "" {
				cfg.NATS.URL = natsURL
			}
			if pod != "" {
				cfg.Agent.Pod = pod
			}
			if podName != "" {
				if err := renamePod(cfg, podName); err != nil {
					return err
				}
			}
			if !cfg.NATS.Enabled() {
				return errors.New("agent: nats.url (or --nats-url) is required")
			}
			if err := cfg.Validate(); err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return runAgent(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&path, "config", "c", "", "YAML configuration file")
	f.StringVar(&natsURL, "nats-url", "", "NATS server URL (overrides nats.url)")
	f.StringVar(&pod, "pod", "", "the pod of pods[] this agent sits beside (overrides agent.pod)")
	f.StringVar(&podName, "pod-name", "", "name that pod NAME instead (e.g. from Kubernetes' downward API), so one configuration serves every pod of a vLLM Deployment")
	f.StringVar(&overrides.metricsListen, "metrics-listen", "", "Prometheus listen address, or off (overrides metrics_listen)")
	f.StringVar(&overrides.logLevel, "log-level", "", "debug, info, warn or error (overrides log.level)")
	f.StringVar(&overrides.logFormat, "log-format", "", "text or json (overrides log.format)")
	return cmd
}

// renamePod gives the pod the agent sits beside (agent.pod, or the only
// one) the name name, for agents whose configuration is shared by every
// pod of a Deployment.
func renamePod(cfg *config.Config, name string) error {
	p, err := cfg.ValidateAgent()
	if err != nil {
		return err
	}
	if cfg.Agent.Pod != "" {
		cfg.Agent.Pod = name
	}
	p.Name = name
	return nil
}

// runAgent runs the agent of cfg with its metrics endpoint until ctx ends.
func runAgent(ctx context.Context, cfg *config.Config) error {
	log := daemon.NewLogger(cfg.Log, os.Stderr)
	nc, err := fleet.Connect(cfg.NATS, "kvindex agent", log)
	if err != nil {
		return err
	}
	defer nc.Close()
	a, err := fleet.NewAgent(ctx, cfg, nc, log)
	if err != nil {
		return err
	}
	// One authentication, the same tokens as kvindex serve's, guards the
	// metrics server and the inspection gRPC.
	auth, err := daemon.NewAuth(&cfg.Auth, log)
	if err != nil {
		return err
	}
	var grpcOpts []grpc.ServerOption
	if auth != nil {
		grpcOpts = auth.ListenerOptions(api.ListenerGRPC)
		authCtx, cancel := context.WithCancel(ctx)
		defer cancel()
		go auth.Run(authCtx, time.Second)
	}
	if cfg.MetricsListen != "off" {
		reg := prometheus.NewRegistry()
		reg.MustRegister(collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
		reg.MustRegister(a.Collectors()...)
		if auth != nil {
			reg.MustRegister(auth.Collectors()...)
		}
		lis, err := net.Listen("tcp", cfg.MetricsListen)
		if err != nil {
			return fmt.Errorf("agent: metrics listen on %s: %w", cfg.MetricsListen, err)
		}
		srv := &http.Server{Handler: daemon.MetricsHandler(reg, auth), ReadHeaderTimeout: 5 * time.Second}
		go func() { _ = srv.Serve(lis) }()
		defer func() {
			sctx, cancel := context.WithTimeout(context.Background(), 2*time.Second)
			defer cancel()
			_ = srv.Shutdown(sctx)
		}()
		log.Info("kvindex agent metrics", "addr", lis.Addr().String())
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
