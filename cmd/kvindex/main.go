// Command kvindex is the kvindex daemon: it subscribes to vLLM engines' KV
// events over ZeroMQ, keeps a live index of which blocks each worker holds,
// and answers routers over gRPC.
//
//	kvindex serve --config kvindex.yaml
//	kvindex agent --config agent.yaml   (fleet mode: the sidecar beside one vLLM pod)
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/daemon"
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
	cmd, o := command("serve", "Run the daemon",
		"Run the daemon with the YAML configuration given by --config; without --config it runs the\n"+
			"built-in default (one local vLLM engine at tcp://127.0.0.1:5557). Flags override the file.",
		func(ctx context.Context, cfg *config.Config) error {
			d, err := daemon.New(cfg, daemon.NewLogger(cfg.Log, os.Stderr))
			if err != nil {
				return err
			}
			return d.Run(ctx)
		})
	cmd.Flags().StringVar(&o.grpcListen, "grpc-listen", "", "gRPC listen address (overrides grpc_listen)")
	return cmd
}

func newAgent() *cobra.Command {
	cmd, o := command("agent", "Run the fleet sidecar beside one vLLM pod",
		"Run kvindex agent: it indexes one pod's workers from the engine's KV events over local ZeroMQ\n"+
			"and publishes their deltas and snapshots on NATS for the replicas (kvindex serve with nats.url).\n"+
			"The configuration names the pod (pods[], agent.pod) and NATS (nats.url). See docs/fleet.md.",
		func(ctx context.Context, cfg *config.Config) error {
			return daemon.RunAgent(ctx, cfg, daemon.NewLogger(cfg.Log, os.Stderr))
		})
	f := cmd.Flags()
	f.StringVar(&o.natsURL, "nats-url", "", "NATS server URL (overrides nats.url)")
	f.StringVar(&o.pod, "pod", "", "the pod of pods[] this agent sits beside (overrides agent.pod)")
	f.StringVar(&o.podName, "pod-name", "", "name that pod NAME instead (e.g. from Kubernetes' downward API), so one configuration serves every pod of a vLLM Deployment")
	return cmd
}

// command builds serve or agent with their shared flags; run gets the
// configuration and a context that SIGINT or SIGTERM cancels.
func command(use, short, long string, run func(context.Context, *config.Config) error) (*cobra.Command, *flagOverrides) {
	o := new(flagOverrides)
	cmd := &cobra.Command{
		Use:   use,
		Short: short,
		Long:  long,
		RunE: func(cmd *cobra.Command, _ []string) error {
			cfg, err := serveConfig(*o)
			if err != nil {
				return err
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return run(ctx, cfg)
		},
	}
	f := cmd.Flags()
	f.StringVarP(&o.path, "config", "c", "", "YAML configuration file")
	f.StringVar(&o.metricsListen, "metrics-listen", "", "Prometheus listen address, or off (overrides metrics_listen)")
	f.StringVar(&o.logLevel, "log-level", "", "debug, info, warn or error (overrides log.level)")
	f.StringVar(&o.logFormat, "log-format", "", "text or json (overrides log.format)")
	return cmd, o
}

// flagOverrides are the configuration file (path, "" for config.Default)
// and the flags that override its fields; "" leaves a field as configured.
type flagOverrides struct {
	path                      string
	grpcListen, metricsListen string
	logLevel, logFormat       string
	natsURL, pod, podName     string // kvindex agent's
}

// serveConfig reads the configuration file, or takes config.Default
// without one, applies the flags, then the defaults, and validates the
// result.
func serveConfig(o flagOverrides) (*config.Config, error) {
	cfg := config.Default()
	if o.path != "" {
		var err error
		if cfg, err = config.Load(o.path); err != nil {
			return nil, err
		}
	}
	for _, set := range []struct {
		field *string
		flag  string
	}{
		{&cfg.GRPCListen, o.grpcListen}, {&cfg.MetricsListen, o.metricsListen},
		{&cfg.Log.Level, o.logLevel}, {&cfg.Log.Format, o.logFormat},
		{&cfg.NATS.URL, o.natsURL}, {&cfg.Agent.Pod, o.pod},
	} {
		if set.flag != "" {
			*set.field = set.flag
		}
	}
	if o.podName != "" {
		if err := cfg.RenameAgentPod(o.podName); err != nil {
			return nil, err
		}
	}
	cfg.SetDefaults() // of sections a flag turned on (--nats-url)
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return cfg, nil
}
