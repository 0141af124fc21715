// Command kvindex is the kvindex daemon: it subscribes to vLLM engines' KV
// events over ZeroMQ, keeps a live index of which blocks each worker holds,
// and answers routers over gRPC.
//
//	kvindex serve --config kvindex.yaml
//	kvindex demo
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/internal/config"
	"github.com/kvindex/kvindex/internal/daemon"
	"github.com/kvindex/kvindex/internal/demo"
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
	root.AddCommand(newServe(), newDemo())
	return root
}

func newServe() *cobra.Command {
	var (
		path                string
		grpcListen, metrics string
		logLevel, logFormat string
	)
	cmd := &cobra.Command{
		Use:   "serve",
		Short: "Run the daemon",
		Long: "Run the daemon with the YAML configuration given by --config; without --config it runs the\n" +
			"embedded default (one local vLLM engine at tcp://127.0.0.1:5557). Flags override the file.",
		RunE: func(cmd *cobra.Command, _ []string) error {
			var cfg *config.Config
			var err error
			if path != "" {
				cfg, err = config.Load(path)
			} else {
				cfg, err = config.Parse(config.DefaultYAML)
			}
			if err != nil {
				return err
			}
			if grpcListen != "" {
				cfg.GRPCListen = grpcListen
			}
			if metrics != "" {
				cfg.MetricsListen = metrics
			}
			if logLevel != "" {
				cfg.Log.Level = logLevel
			}
			if logFormat != "" {
				cfg.Log.Format = logFormat
			}
			if err := cfg.Validate(); err != nil {
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
	f.StringVar(&grpcListen, "grpc-listen", "", "gRPC listen address (overrides grpc_listen)")
	f.StringVar(&metrics, "metrics-listen", "", "Prometheus listen address, or off (overrides metrics_listen)")
	f.StringVar(&logLevel, "log-level", "", "debug, info, warn or error (overrides log.level)")
	f.StringVar(&logFormat, "log-format", "", "text or json (overrides log.format)")
	return cmd
}

func newDemo() *cobra.Command {
	var verbose bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "Run the daemon with simulated vLLM engines and show what it answers",
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return demo.Run(ctx, os.Stdout, demo.Options{Verbose: verbose})
		},
	}
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "show the daemon's logs")
	return cmd
}
