// Command kvfleetbench measures fleet mode end to end (see
// testbed/fleetbench and docs/benchmarks.md, "Fleet").
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/testbed/fleetbench"
	"github.com/kvindex/kvindex/testbed/proc"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvfleetbench:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{Use: "kvfleetbench", Short: "Fleet-mode benchmarks: agents, NATS and replicas in separate processes", SilenceUsage: true, SilenceErrors: true}
	pin := &fleetbench.Pinning{Replica: os.Getenv("FLEET_REPLICA_CPU"), Generator: os.Getenv("FLEET_GEN_CPU")}
	pf := root.PersistentFlags()
	pf.StringVar(&pin.Replica, "replica-cpus", pin.Replica, "CPUs (taskset's list) of the replica, or the floor's subscriber, in ingest, sync and lag (default $FLEET_REPLICA_CPU; empty: unpinned)")
	pf.StringVar(&pin.Generator, "gen-cpus", pin.Generator, "CPUs (taskset's list) of the generator process in ingest, sync and lag (default $FLEET_GEN_CPU; empty: unpinned)")
	root.AddCommand(
		newBench("ingest", "Agents publishing recorded deltas into one replica: new blocks per replica CPU-second",
			fleetbench.Options{Workers: 32, Rate: 1e6, Duration: 10 * time.Second}, pin, fleetbench.Ingest),
		newBench("sync", "One replica syncing every agent's worker from snapshots: time to all live, peak RSS",
			fleetbench.Options{Workers: 1000}, pin, fleetbench.Sync),
		newBench("lag", "Engine to replica lag through the agent path (enginepub, ZeroMQ, fleet.Agent, NATS, replica), against its floor (the same frames ZeroMQ -> NATS -> a subscriber, nothing applied)",
			fleetbench.Options{Workers: 100, Rate: 1e5, Duration: 10 * time.Second, WarmRate: 2e6, Rounds: 1}, pin, fleetbench.Lag),
		benchCmd("wire", "NATS bytes per block stored and removed, realistic batches and batches of 1, 16 and 256 blocks", fleetbench.Wire),
		newBench("agent", "CPU and memory of the kvindex agent binary beside one pod churning its cache",
			fleetbench.Options{Rate: 1e4, Settle: 2 * time.Second, Duration: 10 * time.Second, WarmRate: 2e5}, pin, fleetbench.AgentCost),
		newRole())
	return root
}

// benchCmd is a benchmark's command: it runs run until SIGINT or SIGTERM
// and prints its result as JSON.
func benchCmd[R any](use, short string, run func(ctx context.Context) (R, error)) *cobra.Command {
	return &cobra.Command{
		Use:   use,
		Short: short,
		RunE: func(cmd *cobra.Command, _ []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			r, err := run(ctx)
			if err != nil {
				return err
			}
			return proc.WriteJSON(cmd.OutOrStdout(), r)
		},
	}
}

// newBench is a benchmark's command: it runs run with the options o (its
// defaults; DefaultShape, seed 1) as the flags and pinning leave them.
func newBench[R any](use, short string, o fleetbench.Options, pin *fleetbench.Pinning, run func(context.Context, fleetbench.Options) (R, error)) *cobra.Command {
	o.Shape, o.Seed = fleetbench.DefaultShape(), 1
	cmd := benchCmd(use, short, func(ctx context.Context) (R, error) {
		o.Pin = *pin
		return run(ctx, o)
	})
	f := cmd.Flags()
	f.Uint64Var(&o.Seed, "seed", o.Seed, "first worker's workload seed")
	switch use {
	case "lag":
		f.IntVar(&o.Workers, "pods", o.Workers, "engines, one agent each")
		f.IntVar(&o.Rounds, "rounds", o.Rounds, "runs of the floor and the path each, in turn; the p99s are their medians")
		f.IntVar(&o.AgentProcs, "agent-procs", o.AgentProcs, "processes the agents (and the floor's forwarders) run in, the engines dealt among them; 0: in the generator's process")
	case "agent":
		f.StringVar(&o.Binary, "kvindex", "", "the kvindex binary (default: beside this one, else on PATH)")
	default:
		f.IntVar(&o.Workers, "workers", o.Workers, "agents (one worker each)")
	}
	if use == "sync" {
		f.StringVar(&o.CacheDir, "cache-dir", "", "keep the generator's snapshots here between runs")
	} else {
		f.Float64Var(&o.Rate, "rate", o.Rate, "new blocks a second, all sources together (open loop)")
		f.DurationVar(&o.Duration, "duration", o.Duration, "about how long to measure")
	}
	if use != "agent" {
		f.StringVar(&o.Profile, "cpuprofile", "", "CPU profile of the replica while it is measured (sync: until all workers are live)")
	}
	return cmd
}

func newRole() *cobra.Command {
	var opts string
	cmd := &cobra.Command{
		Use:    "role NAME",
		Short:  "Run one part of a benchmark (started by the benchmarks themselves)",
		Hidden: true,
		Args:   cobra.ExactArgs(1),
		RunE: func(cmd *cobra.Command, args []string) error {
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			return fleetbench.RunRole(ctx, args[0], opts, os.Stdin, os.Stdout)
		},
	}
	cmd.Flags().StringVar(&opts, "opts", "{}", "the role's options, JSON")
	return cmd
}
