// Command kvbench drives kvindex's Score RPC at a fixed open-loop rate and
// prints the latency distribution (see testbed/loadgen).
//
//	kvbench --embedded --rps 10000 --duration 10s
//	kvbench --addr localhost:50051 --model my-model --rps 2000 --json
//	kvbench --embedded --serve --listen 127.0.0.1:7070   # server only
//	kvbench --addr 127.0.0.1:7070 --check --client grpc   # its generator
//	kvbench --embedded --serve --canned                   # the floor server (loadgen.Canned)
package main

import (
	"context"
	"fmt"
	"os"
	"os/signal"
	"runtime"
	"runtime/debug"
	"syscall"
	"time"

	"github.com/spf13/cobra"

	"github.com/kvindex/kvindex/api"
	"github.com/kvindex/kvindex/testbed/loadgen"
	"github.com/kvindex/kvindex/testbed/proc"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvbench:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	var (
		opts       loadgen.Options
		warmup     time.Duration
		asJSON     bool
		cpuprofile string
		serve      bool
		canned     bool
		listen     string
		procs      int
		gogc       int
		shape      = loadgen.DefaultShape()
		load       = loadgen.Config{Rate: 10000, Duration: 10 * time.Second, Concurrency: 8, Timeout: time.Second}
	)
	cmd := &cobra.Command{
		Use:   "kvbench (--embedded | --addr host:port)",
		Short: "Open-loop gRPC load generator for kvindex's Score",
		Long: "kvbench sends Score requests at a fixed rate (open loop: latency is measured from each\n" +
			"request's scheduled time, so server stalls are not hidden) and prints achieved rate,\n" +
			"p50/p90/p99/p99.9/max latency and errors.",
		Args:          cobra.NoArgs,
		SilenceUsage:  true,
		SilenceErrors: true,
		RunE: func(cmd *cobra.Command, _ []string) error {
			if opts.Embedded == (opts.Addr != "") {
				return fmt.Errorf("give exactly one of --embedded and --addr")
			}
			if serve && !opts.Embedded {
				return fmt.Errorf("--serve needs --embedded")
			}
			if canned && !serve {
				return fmt.Errorf("--canned needs --serve")
			}
			// The runtime settings are left to Go (and $GOMAXPROCS, $GOGC)
			// unless given: make bench sets them per process.
			if cmd.Flags().Changed("gomaxprocs") {
				if procs < 1 {
					return fmt.Errorf("--gomaxprocs %d: want at least 1", procs)
				}
				runtime.GOMAXPROCS(procs)
			}
			if cmd.Flags().Changed("gogc") {
				debug.SetGCPercent(gogc)
			}
			opts.Shape, opts.Load = shape, load
			if warmup > 0 {
				opts.Warmup = load
				opts.Warmup.Duration = warmup
			}
			ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
			defer stop()
			if serve {
				return serveOnly(ctx, cmd, shape, listen, cpuprofile, canned)
			}
			stopProfile, err := proc.StartCPUProfile(cpuprofile)
			if err != nil {
				return err
			}
			defer stopProfile()
			rep, err := loadgen.Bench(ctx, opts)
			if err != nil {
				return err
			}
			rep.Runtime = loadgen.CurrentRuntime()
			if asJSON {
				return proc.WriteJSON(cmd.OutOrStdout(), rep)
			}
			return rep.WriteText(cmd.OutOrStdout())
		},
	}
	f := cmd.Flags()
	f.StringVar(&opts.Addr, "addr", "", "gRPC address of a running kvindex")
	f.BoolVar(&opts.Embedded, "embedded", false, "start an in-process index and gRPC server on a loopback port")
	f.Float64Var(&load.Rate, "rps", load.Rate, "requests per second (open loop)")
	f.DurationVar(&load.Duration, "duration", load.Duration, "how long to send")
	f.IntVar(&load.Concurrency, "concurrency", load.Concurrency, "sender goroutines: at most this many requests in flight")
	f.IntVar(&opts.Connections, "connections", 0, "connections the senders share (0: one per sender)")
	f.StringVar(&opts.Client, "client", "grpc", "grpc: kvindex's Go client (grpc-go), marshalling every request as a Go router does; grpc-preencoded: the same client with each distinct request encoded once, the bytes passed through (the overload rows, where one generator core offers 3x a server core)")
	f.DurationVar(&load.Timeout, "timeout", load.Timeout, "per-request deadline (0: none)")
	f.DurationVar(&warmup, "warmup", time.Second, "unmeasured run at the same rate first (0: none)")
	f.BoolVar(&asJSON, "json", false, "print the report as JSON")
	f.BoolVar(&serve, "serve", false, "with --embedded: only serve the loaded index until interrupted (run the generator elsewhere with --addr)")
	f.BoolVar(&canned, "canned", false, "with --serve: serve the gRPC rows' floor, a grpc-go server answering every Score with the shape's answer computed once, no index work")
	f.StringVar(&listen, "listen", "", "with --serve: address to listen on (default a free loopback port)")
	f.StringVar(&cpuprofile, "cpuprofile", "", "write a CPU profile of the whole run (client and any embedded server; with --serve, of serving once the index is loaded) to this file")
	f.BoolVar(&opts.Check, "check", false, "with --addr: check every reply against the shape (the server is kvbench --embedded --serve with the same shape flags); --embedded always checks")
	f.BoolVar(&opts.BlockKeys, "block-keys", false, "send content keys (block_keys, computed client-side) instead of token ids")
	f.IntVar(&procs, "gomaxprocs", 0, "GOMAXPROCS of this process (default: Go's, the CPUs available)")
	f.IntVar(&gogc, "gogc", 0, "GOGC of this process: collect when the heap has grown this many percent over the live heap; -1 turns that off (default: Go's, from $GOGC)")
	f.StringVar(&shape.Model, "model", shape.Model, "model name in requests")
	f.IntVar(&shape.BlockSize, "block-size", shape.BlockSize, "tokens per block")
	f.IntVar(&shape.PromptBlocks, "prompt-blocks", shape.PromptBlocks, "prompt length in blocks")
	f.IntVar(&shape.SharedBlocks, "shared-blocks", shape.SharedBlocks, "prefix held by every worker, in blocks")
	return cmd
}

// serveOnly serves an embedded index loaded with shape, or with canned
// set the floor, until ctx ends, profiling from when it serves.
func serveOnly(ctx context.Context, cmd *cobra.Command, shape loadgen.Shape, listen, cpuprofile string, canned bool) error {
	var (
		addr, what string
		wait       func(context.Context)
	)
	if canned {
		c, err := loadgen.StartCanned(ctx, shape, listen)
		if err != nil {
			return err
		}
		defer c.Close()
		addr, wait, what = c.Addr, c.Wait, fmt.Sprintf("a canned %d-byte answer for %s", len(c.Response), shape)
	} else {
		e, err := loadgen.StartEmbedded(ctx, shape, listen, api.Options{})
		if err != nil {
			return err
		}
		defer e.Close()
		addr, wait, what = e.Addr, e.Wait, shape.String()
	}
	stopProfile, err := proc.StartCPUProfile(cpuprofile)
	if err != nil {
		return err
	}
	defer stopProfile()
	fmt.Fprintf(cmd.OutOrStdout(), "serving %s on %s (%s)\n", what, addr, loadgen.CurrentRuntime())
	wait(ctx)
	return nil
}
