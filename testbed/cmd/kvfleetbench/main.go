// Command kvfleetbench measures fleet mode end to end (see
// testbed/fleetbench and docs/benchmarks.md, "Fleet").
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"os/signal"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/testbed/fleetbench"
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
	root.AddCommand(newIngest(pin), newSync(pin), newLag(pin), newWire(), newAgent(), newRole())
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
			b, err := json.MarshalIndent(r, "", "  ")
			if err != nil {
				return err
			}
			_, err = fmt.Fprintf(cmd.OutOrStdout(), "%s\n", b)
			return err
		},
	}
}

// runFlags registers the flags of a benchmark's run: the workload seed,
// the open-loop rate, how long, and the replica's CPU profile (nil: none).
func runFlags(f *pflag.FlagSet, seed *uint64, rate *float64, d *time.Duration, profile *string) {
	f.Uint64Var(seed, "seed", *seed, "first worker's workload seed")
	f.Float64Var(rate, "rate", *rate, "new blocks a second, all sources together (open loop)")
	f.DurationVar(d, "duration", *d, "about how long to measure")
	if profile != nil {
		f.StringVar(profile, "cpuprofile", "", "CPU profile of the replica while it is measured")
	}
}

func newIngest(pin *fleetbench.Pinning) *cobra.Command {
	o := fleetbench.IngestOptions{Workers: 32, Shape: fleetbench.DefaultShape(), Seed: 1, Rate: 1e6, Duration: 10 * time.Second}
	cmd := benchCmd("ingest", "Agents publishing recorded deltas into one replica: new blocks per replica CPU-second",
		func(ctx context.Context) (*fleetbench.IngestResult, error) {
			o.Pin = *pin
			return fleetbench.Ingest(ctx, o)
		})
	cmd.Flags().IntVar(&o.Workers, "workers", o.Workers, "agents (one worker each)")
	runFlags(cmd.Flags(), &o.Seed, &o.Rate, &o.Duration, &o.Profile)
	return cmd
}

func newSync(pin *fleetbench.Pinning) *cobra.Command {
	o := fleetbench.SyncOptions{Workers: 1000, Shape: fleetbench.DefaultShape(), Seed: 1}
	cmd := benchCmd("sync", "One replica syncing every agent's worker from snapshots: time to all live, peak RSS",
		func(ctx context.Context) (*fleetbench.SyncResult, error) {
			o.Pin = *pin
			return fleetbench.Sync(ctx, o)
		})
	f := cmd.Flags()
	f.IntVar(&o.Workers, "workers", o.Workers, "agents (one worker each)")
	f.Uint64Var(&o.Seed, "seed", o.Seed, "first worker's workload seed")
	f.StringVar(&o.CacheDir, "cache-dir", "", "keep the generator's snapshots here between runs")
	f.StringVar(&o.Profile, "cpuprofile", "", "CPU profile of the replica until all workers are live")
	return cmd
}

func newLag(pin *fleetbench.Pinning) *cobra.Command {
	o := fleetbench.LagOptions{Pods: 100, Shape: fleetbench.DefaultShape(), Seed: 1, Rate: 1e5, Duration: 10 * time.Second, WarmRate: 2e6, Rounds: 1}
	cmd := benchCmd("lag", "Engine to replica lag through the agent path (enginepub, ZeroMQ, fleet.Agent, NATS, replica), against its floor (the same frames ZeroMQ -> NATS -> a subscriber, nothing applied)",
		func(ctx context.Context) (*fleetbench.LagResult, error) {
			o.Pin = *pin
			return fleetbench.Lag(ctx, o)
		})
	cmd.Flags().IntVar(&o.Pods, "pods", o.Pods, "engines, one agent each")
	cmd.Flags().IntVar(&o.Rounds, "rounds", o.Rounds, "runs of the floor and the path each, in turn; the p99s are their medians")
	cmd.Flags().IntVar(&o.AgentProcs, "agent-procs", o.AgentProcs, "processes the agents (and the floor's forwarders) run in, the engines dealt among them; 0: in the generator's process")
	runFlags(cmd.Flags(), &o.Seed, &o.Rate, &o.Duration, &o.Profile)
	return cmd
}

func newWire() *cobra.Command {
	return benchCmd("wire", "NATS bytes per block stored and removed, realistic batches and batches of 1, 16 and 256 blocks", fleetbench.Wire)
}

func newAgent() *cobra.Command {
	o := fleetbench.AgentOptions{Shape: fleetbench.DefaultShape(), Seed: 1, Rate: 1e4, Settle: 2 * time.Second, Duration: 10 * time.Second, WarmRate: 2e5}
	cmd := benchCmd("agent", "CPU and memory of the kvindex agent binary beside one pod churning its cache",
		func(ctx context.Context) (*fleetbench.AgentResult, error) { return fleetbench.AgentCost(ctx, o) })
	cmd.Flags().StringVar(&o.Binary, "kvindex", "", "the kvindex binary (default: beside this one, else on PATH)")
	runFlags(cmd.Flags(), &o.Seed, &o.Rate, &o.Duration, nil)
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
