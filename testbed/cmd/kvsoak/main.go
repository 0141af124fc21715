// Command kvsoak is kvindex's soak test (testbed/soak,
// docs/reliability.md). It prints a JSON summary and exits 0 on a pass, 1
// on any failure of the daemon (the summary names each), 2 when the soak
// could not run.
//
//	kvsoak --duration 2m            # make soak
//	kvsoak --duration 15s --seed 7
package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"syscall"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/testbed/proc"
	"github.com/kvindex/kvindex/testbed/soak"
)

func main() {
	code := 0
	if err := newRoot(&code).Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvsoak:", err)
		code = 2
	}
	os.Exit(code)
}

func newRoot(code *int) *cobra.Command {
	opts := soak.DefaultOptions()
	keep := false
	cmd := &cobra.Command{
		Use:           "kvsoak",
		Short:         "Soak test of the kvindex daemon: restarts, hostile input, exact checks, flat memory",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), nil))
			if err := opts.Validate(); err != nil {
				return err
			}
			dir, err := os.MkdirTemp("", "kvsoak-")
			if err != nil {
				return fmt.Errorf("work directory: %w", err)
			}
			opts.Dir = dir
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			sum, err := soak.Run(ctx, opts)
			if err != nil {
				return fmt.Errorf("%w (work directory %s)", err, opts.Dir)
			}
			if err := proc.WriteJSON(cmd.OutOrStdout(), sum); err != nil {
				return err
			}

			if !sum.Passed {
				*code = 1
			} else if !keep {
				_ = os.RemoveAll(opts.Dir)
			}
			return nil
		},
	}
	cmd.AddCommand(newChaos(code))
	f := cmd.Flags()
	f.DurationVar(&opts.Duration, "duration", opts.Duration, "how long the fleet runs under load")
	f.Uint64Var(&opts.Seed, "seed", opts.Seed, "seed of every random choice (workloads, garbage, schedule)")
	f.BoolVar(&keep, "keep", false, "keep the work directory (configuration, daemon binary and logs) after a pass")
	f.StringVar(&opts.GoTool, "go", opts.GoTool, "go command used to build the daemon")
	f.IntVar(&opts.WarmupSteps, "warmup-steps", opts.WarmupSteps, "steps each engine runs before the daemon first starts")
	f.Float64Var(&opts.MaxRefused, "max-refused", opts.MaxRefused, "the largest fraction of Score and Route calls the daemon may refuse for overload (ResourceExhausted from admission control) before the run fails")
	return cmd
}
