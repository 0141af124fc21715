package main

import (
	"fmt"
	"log/slog"
	"os"
	"os/signal"
	"path/filepath"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/testbed/chaos"
	"github.com/kvindex/kvindex/testbed/proc"
)

// newChaos is `kvsoak chaos`: seeds of fault schedules against a fleet of
// processes (testbed/chaos, docs/reliability.md). It prints each seed's
// verdict on stderr (a failure with its replay command, schedule and
// first invariant broken) and the totals as JSON on stdout, and exits 1
// when a seed failed.
func newChaos(code *int) *cobra.Command {
	seed, seeds := uint64(1), 3
	opts := chaos.Options{Duration: 40 * time.Second, Replicas: 2}
	goTool, keep, verbose := "go", false, false
	cmd := &cobra.Command{
		Use:   "chaos",
		Short: "Run a fleet (engines, agents, nats-server, replicas) under seeded fault schedules and check every answer",
		Args:  cobra.NoArgs,
		RunE: func(cmd *cobra.Command, _ []string) error {
			switch {
			case seeds < 1:
				return fmt.Errorf("--seeds %d: want at least 1", seeds)
			case opts.Replicas < 1 || opts.Replicas > 3:
				return fmt.Errorf("--replicas %d: want 1 to 3", opts.Replicas)
			case opts.Duration < 5*time.Second:
				return fmt.Errorf("--duration %v: want at least 5s", opts.Duration)
			}
			level := slog.LevelWarn
			if verbose {
				level = slog.LevelInfo
			}
			opts.Logger = slog.New(slog.NewTextHandler(cmd.ErrOrStderr(), &slog.HandlerOptions{Level: level}))
			base, err := os.MkdirTemp("", "kvchaos-")
			if err != nil {
				return fmt.Errorf("work directory: %w", err)
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if opts.Bins, err = chaos.Build(ctx, goTool, base); err != nil {
				return err
			}
			var sums []*chaos.Summary
			for s := seed; s < seed+uint64(seeds); s++ {
				opts.Seed, opts.Dir = s, filepath.Join(base, fmt.Sprintf("seed-%d", s))
				if err := os.MkdirAll(opts.Dir, 0o755); err != nil {
					return err
				}
				sum, err := chaos.Run(ctx, opts)
				if err != nil {
					return fmt.Errorf("seed %d: %w (work directory %s)", s, err, opts.Dir)
				}
				sum.Report(cmd.ErrOrStderr())
				sums = append(sums, sum)
			}
			t := chaos.Total(sums)
			if err := proc.WriteJSON(cmd.OutOrStdout(), t); err != nil {
				return err
			}
			fmt.Fprintf(cmd.ErrOrStderr(), "chaos: %d of %d seeds passed; faults %v; violations %v\n", t.Passed, t.Seeds, t.Faults, t.Violations)
			if len(t.Failed) > 0 {
				*code = 1
				fmt.Fprintf(cmd.ErrOrStderr(), "chaos: failed seeds %v; logs in %s\n", t.Failed, base)
			} else if !keep {
				_ = os.RemoveAll(base)
			}
			return nil
		},
	}
	f := cmd.Flags()
	f.Uint64Var(&seed, "seed", seed, "the first seed")
	f.IntVar(&seeds, "seeds", seeds, "how many seeds to run, from --seed on")
	f.DurationVar(&opts.Duration, "duration", opts.Duration, "each seed's fault phase")
	f.IntVar(&opts.Replicas, "replicas", opts.Replicas, "replicas in the fleet (1 to 3)")
	f.StringVar(&goTool, "go", goTool, "go command that builds kvindex and nats-server")
	f.BoolVar(&keep, "keep", false, "keep the work directory (binaries, configurations, logs) after a pass")
	f.BoolVar(&verbose, "verbose", false, "log every fault and phase")
	return cmd
}
