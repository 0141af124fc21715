// Command kvindex is the kvindex daemon: it subscribes to vLLM engines' KV
// events over ZeroMQ, keeps a live index of which blocks each worker holds,
// and answers routers over gRPC.
//
//	kvindex serve --config kvindex.yaml
package main

import (
	"fmt"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/internal/config"
	"github.com/kvindex/kvindex/internal/daemon"
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
	root.AddCommand(newServe())
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
