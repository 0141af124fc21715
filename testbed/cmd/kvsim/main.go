// Command kvsim is kvindex's fleet simulator: it replays a request trace
// (Mooncake format) or a generated workload through simulated vLLM engines
// and compares routers side by side on the same arrivals: round-robin,
// least-loaded, prefix-hash, approximate, the routers a team would deploy
// instead (llm-d, llm-d-precise, dynamo, sglang, aibrix, with their
// published defaults), precise (kvindex Score), precise+load (kvindex
// Route) and ttft-greedy, a perfect-knowledge reference; the tables add
// the offline bounds (hit rate with an infinite cache, TTFT with no
// queueing).
//
//	kvsim analyze requests.jsonl                # does cache-aware routing pay on my traffic?
//	kvsim run --cache-blocks 12500 --csv out    # the Mooncake trace, virtual time
//	kvsim grid --cells 'rag-*'                  # the workload suite x 1x/2x x 25k/12.5k blocks, into docs/results/
//	kvsim live --workload prefixes --requests 300 --speedup 2
//	kvsim demo                                  # what `make demo` runs
//	kvsim engine --pod vllm-0 --http :8000      # one simulated vLLM engine, served (docker-compose.yaml)
//	kvsim load --kvindex :50051 --engine vllm-0=http://localhost:8000   # routed demo traffic
package main

import (
	"context"
	"fmt"
	"io"
	"log/slog"
	"os"
	"os/signal"
	"strconv"
	"strings"
	"syscall"
	"time"

	"github.com/spf13/cobra"
	"github.com/spf13/pflag"

	"github.com/kvindex/kvindex/scoring"
	"github.com/kvindex/kvindex/testbed/sim"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/router"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

func main() {
	if err := newRoot().Execute(); err != nil {
		fmt.Fprintln(os.Stderr, "kvsim:", err)
		os.Exit(1)
	}
}

func newRoot() *cobra.Command {
	root := &cobra.Command{
		Use:           "kvsim",
		Short:         "Fleet simulator: replay traffic through simulated vLLM engines and compare routers",
		SilenceUsage:  true,
		SilenceErrors: true,
	}
	root.AddCommand(newAnalyze(), newRun(), newGrid(), newLive(), newDemo(), newEngine(), newLoad())
	return root
}

// flags are run's and live's.
type flags struct {
	rc                sim.RunConfig
	routers           string
	policy, guard     string
	groupCaps         string
	verbose           bool
	prefixesQPS, zipf float64
}

func (f *flags) register(fs *pflag.FlagSet) {
	rc := &f.rc
	fs.StringVar(&rc.Workload.Kind, "workload", sim.KindMooncake, "mooncake, prefixes, tenants, sessions, rag, tools, or the path of a Mooncake-format JSONL file")
	fs.StringVar(&rc.Workload.Trace, "trace", "", "the Mooncake trace (default $KVSIM_TRACE, else "+sim.DefaultTrace+" from the repository root)")
	fs.IntVar(&rc.Workload.Requests, "requests", 0, "first N requests of a trace, or a generator's count: requests, sessions (sessions), tasks (tools) (0: all / the generator's default)")
	fs.Float64Var(&rc.Workload.RateScale, "rate-scale", 1, "multiply the arrival rate (2 = arrivals twice as dense)")
	fs.DurationVar(&rc.Workload.Pause, "pause", 0, "delay every request after the first by this much (a sparse start)")
	fs.Uint64Var(&rc.Workload.Seed, "seed", 1, "seed of generators, engine hashes and tie-breaks")
	fs.IntVar(&rc.Workload.Prefixes.Prefixes, "prefixes", 0, "prefixes: distinct shared prefixes (default 40)")
	fs.Float64Var(&f.zipf, "zipf", workload.DefaultZipfS, "prefixes: Zipf exponent of prefix popularity (0: uniform)")
	fs.Float64Var(&f.prefixesQPS, "qps", 0, "prefixes: Poisson arrival rate (default 20)")

	o := &rc.Options
	engineFlags(fs, o)
	fs.IntVar(&o.Engine.CacheBlocks, "cache-blocks", 0, "KV cache per engine in blocks (default 25000)")
	fs.StringVar(&f.routers, "routers", "all", "comma-separated routers: "+strings.Join(router.Names, ", "))
	fs.DurationVar(&o.EventLag, "event-lag", 0, "virtual delay before kvindex applies each engine batch (virtual mode)")
	fs.StringVar(&f.groupCaps, "group-caps", "on", "kvindex's hybrid rule: on (a hit as far as every KV-cache group serves it), off (the prefix group alone), or both (each kvindex router also as <router>"+sim.PrefixOnly+", virtual time)")
	fs.BoolVar(&o.Serial, "serial", false, "route each request only once every engine is idle and every batch applied: nothing in flight, to check kvindex's predictions alone (virtual mode)")
	fs.StringVar(&o.Model, "model", "", "model name in kvindex (default "+sim.DefaultModel+")")
	fs.StringVar(&o.PreciseLoadMode, "precise-load-mode", router.ModeRoute, "precise+load: route (kvindex's Route ranking) or client (a client-side cost from Score, for comparison)")
	fs.StringVar(&f.policy, "route-policy", "", "precise+load: kvindex policy sent with Route: cache_aware or longest_prefix (default: the server's)")
	fs.StringVar(&f.guard, "route-guard", "", "precise+load: kvindex hotspot guard sent with Route: cost, static or off")
	fs.StringVar(&rc.CSVDir, "csv", "", "write CSV files into this directory")
	fs.BoolVarP(&f.verbose, "verbose", "v", false, "log progress to stderr")
}

// engineFlags registers the fleet flags of run, live and analyze.
func engineFlags(fs *pflag.FlagSet, o *sim.Options) {
	fs.IntVar(&o.Engines, "engines", o.Engines, "number of engines (default: the workload's: 8, or 4 for prefixes)")
	fs.IntVar(&o.Engine.BlockSize, "block-size", 0, "tokens per KV block (default: the model layout's, 16 for llama)")
	fs.Var(layoutFlag{&o.Engine.Layout}, "model-layout", "the engines' KV-cache groups, as vLLM runs the model: "+strings.Join(engine.PresetNames(), ", "))
	tm := &o.Engine.Time
	*tm = engine.DefaultTimeModel()
	fs.Float64Var(&tm.PrefillTokensPerSec, "prefill-rate", tm.PrefillTokensPerSec, "prefill tokens per second per engine, attention aside")
}

// layoutFlag is --model-layout: a preset of engine.Preset.
type layoutFlag struct{ l *engine.Layout }

func (f layoutFlag) String() string {
	if f.l == nil || f.l.Name == "" {
		return "llama"
	}
	return f.l.Name
}

func (f layoutFlag) Set(name string) error {
	l, err := engine.Preset(name)
	if err != nil {
		return err
	}
	*f.l = l
	return nil
}

func (layoutFlag) Type() string { return "name" }

func (f *flags) config() (sim.RunConfig, error) {
	rc := f.rc
	var err error
	if rc.Options.Routers, err = router.Parse(f.routers); err != nil {
		return rc, err
	}
	if f.zipf < 0 {
		return rc, fmt.Errorf("--zipf %v: want an exponent >= 0 (0: uniform)", f.zipf)
	}
	rc.Workload.Prefixes.ZipfS, rc.Workload.Prefixes.Uniform = f.zipf, f.zipf == 0
	rc.Workload.Prefixes.QPS = f.prefixesQPS
	switch f.groupCaps {
	case "on":
	case "off":
		rc.Options.NoGroupCaps = true
	case "both":
		rc.Options.Routers = sim.WithPrefixOnly(rc.Options.Routers)
	default:
		return rc, fmt.Errorf("--group-caps %q: want on, off or both", f.groupCaps)
	}
	rc.Options.Seed = rc.Workload.Seed
	if f.policy != "" || f.guard != "" {
		rc.Options.RoutePolicy = &scoring.Override{Name: f.policy, Guard: f.guard}
	}
	rc.Options.Logger = progress(f.verbose)
	return rc, nil
}

func newRun() *cobra.Command {
	f := &flags{}
	cmd := &cobra.Command{
		Use:   "run",
		Short: "Replay a workload in virtual time (fast, in process, through kvindex's real decoder, index and ranking)",
		RunE: interruptible(func(ctx context.Context, w io.Writer, _ []string) error {
			rc, err := f.config()
			if err != nil {
				return err
			}
			return sim.Main(ctx, rc, w)
		}),
	}
	f.register(cmd.Flags())
	return cmd
}

func newGrid() *cobra.Command {
	gc := sim.GridConfig{}
	var rates, caches string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "grid",
		Short: "Run the workload suite's grid (workloads x rates x cache sizes) and check precise+load's criterion per cell",
		Long: "grid runs every picked cell (a workload of the suite at a rate multiplier on 8 engines of a cache\n" +
			"size) one after another in virtual time, writes each cell's table and CSV into <dir>/<cell>/, then\n" +
			"evaluates the criterion on every cell found under <dir> (precise+load's p99 and mean TTFT each\n" +
			"within 5% of the lowest of the baselines and ttft-greedy, its token hit rate >= 90% of the best, none\n" +
			"better on both p99 and hit rate) and precise+load against each peer router (p99 and mean within 2%,\n" +
			"hit rate >= 95% of the best peer's) into <dir>/grid.md, grid.csv and peers.csv. --resume skips the\n" +
			"cells that already have results (an interrupted grid goes on). Cells are named <workload>-<rate>x-<cache>,\n" +
			"e.g. sessions-2x-12.5k; --cells takes names or patterns. Hybrid cells follow: each of --layouts on the\n" +
			"mooncake and sessions workloads at the first rate, named <workload>-<rate>x-<cache>-<layout>, every kvindex\n" +
			"router also as <router>" + sim.PrefixOnly + " (kvindex matching by the prefix group alone, not in the criterion).",
		RunE: interruptible(func(ctx context.Context, w io.Writer, _ []string) error {
			var err error
			if rates != "" {
				for _, f := range strings.Split(rates, ",") {
					r, err := strconv.ParseFloat(strings.TrimSuffix(strings.TrimSpace(f), "x"), 64)
					if err != nil || r <= 0 {
						return fmt.Errorf("--rates %q: want positive multipliers such as 1,2", rates)
					}
					gc.Rates = append(gc.Rates, r)
				}
			}
			if caches != "" {
				if gc.Caches, err = sim.ParseSizes(caches); err != nil {
					return err
				}
			}
			gc.Options.Logger = progress(verbose)
			return sim.RunGrid(ctx, gc, w)
		}),
	}
	fs := cmd.Flags()
	fs.StringArrayVar(&gc.Cells, "cells", nil, "cells to run, by name or pattern (repeatable; default: all)")
	fs.BoolVar(&gc.Resume, "resume", false, "skip the picked cells that already have results under --dir")
	fs.StringSliceVar(&gc.Workloads, "workloads", nil, "workloads of the grid (default "+strings.Join(sim.GridWorkloads, ",")+")")
	fs.StringVar(&rates, "rates", "", "rate multipliers (default 1,2)")
	fs.StringVar(&caches, "caches", "", "cache sizes, blocks per engine (default 25k,12.5k)")
	fs.StringSliceVar(&gc.Layouts, "layouts", nil, "model layouts of the hybrid cells (default "+strings.Join(sim.GridLayouts, ",")+"; none: no hybrid cell)")
	fs.StringVar(&gc.Dir, "dir", "docs/results", "directory of the cells' results and the summary")
	fs.StringVar(&gc.Trace, "trace", "", "the Mooncake trace (default $KVSIM_TRACE, else "+sim.DefaultTrace+" from the repository root)")
	fs.Uint64Var(&gc.Seed, "seed", 1, "seed of generators, engine hashes and tie-breaks")
	fs.IntVar(&gc.Requests, "requests", 0, "shorten every workload to N requests (sessions, tasks for tools; 0: the suite as documented)")
	fs.BoolVarP(&verbose, "verbose", "v", false, "log progress to stderr")
	return cmd
}

func newLive() *cobra.Command {
	f := &flags{}
	lo := &sim.LiveOptions{}
	cmd := &cobra.Command{
		Use:   "live",
		Short: "Replay a workload on the wall clock: engines publish over real ZMQ to a real kvindex, routers ask over gRPC",
		RunE: interruptible(func(ctx context.Context, w io.Writer, _ []string) error {
			rc, err := f.config()
			if err != nil {
				return err
			}
			rc.Live = lo
			lo.DaemonLog = f.verbose
			return sim.Main(ctx, rc, w)
		}),
	}
	fs := cmd.Flags()
	f.register(fs)
	fs.Float64Var(&lo.Speedup, "speedup", 1, "virtual seconds per wall-clock second")
	fs.StringVar(&lo.Addr, "addr", "", "an external kvindex's gRPC address (default: start the daemon in process)")
	fs.IntVar(&lo.BasePort, "base-port", 5557, "first ZMQ port of the engines with --addr")
	fs.BoolVar(&lo.PrintConfig, "print-config", false, "print the kvindex configuration --addr needs, and exit")
	fs.BoolVar(&lo.Fleet, "fleet", false, "fleet mode: embedded NATS, a kvindex agent per engine, replicas the routers ask in turn")
	return cmd
}

func newAnalyze() *cobra.Command {
	ac := sim.AnalyzeConfig{}
	var sizes string
	var verbose bool
	cmd := &cobra.Command{
		Use:   "analyze LOG",
		Short: "Should I deploy this? The reuse ceiling of your own request log, and round-robin, the peer routers, precise and precise+load replayed on it",
		Long: "analyze reads a request log you already have: Mooncake JSONL (hash_ids), JSONL of token ids\n" +
			"({\"timestamp\": ms, \"token_ids\": [...], \"output_length\": n}) or OpenAI request bodies (prompt or\n" +
			"messages, optional timestamp in ms), tokenized by a vLLM /tokenize endpoint (--tokenize) or, without\n" +
			"one, estimated (4-character pieces of the text). It hashes 16-token blocks, prints the reuse ceiling\n" +
			"(the share of prompt tokens that are a prefix of an earlier request within --window), replays the log\n" +
			"through round-robin, the routers you would deploy instead (llm-d, llm-d-precise, dynamo, sglang, aibrix),\n" +
			"precise and precise+load over shrinking caches, names the best at each size, and ends with a one-line verdict.",
		Args: cobra.ExactArgs(1),
		RunE: interruptible(func(ctx context.Context, w io.Writer, args []string) error {
			var err error
			if ac.Sizes, err = sim.ParseSizes(sizes); err != nil {
				return err
			}
			ac.Log, ac.Options.Logger = args[0], progress(verbose)
			return sim.Analyze(ctx, ac, w)
		}),
	}
	fs := cmd.Flags()
	fs.StringVar(&ac.TokenizeURL, "tokenize", "", "a vLLM /tokenize endpoint for OpenAI bodies (e.g. http://vllm:8000/tokenize); default: an estimate")
	fs.DurationVar(&ac.Window, "window", 10*time.Minute, "how far back a reused prefix may have been seen")
	fs.StringVar(&sizes, "sweep-cache", "25k,12.5k,6250,3125", "cache sizes to replay, blocks per engine")
	engineFlags(fs, &ac.Options)
	fs.Uint64Var(&ac.Options.Seed, "seed", 1, "seed of engine hashes and tie-breaks")
	fs.BoolVarP(&verbose, "verbose", "v", false, "log progress to stderr")
	return cmd
}

func newDemo() *cobra.Command {
	rc := sim.DemoConfig()
	var verbose bool
	cmd := &cobra.Command{
		Use:   "demo",
		Short: "A short live run: the real daemon, simulated engines over ZMQ, every router, the table",
		RunE: interruptible(func(ctx context.Context, w io.Writer, _ []string) error {
			rc.Options.Logger, rc.Live.DaemonLog = progress(verbose), verbose
			return sim.Main(ctx, rc, w)
		}),
	}
	cmd.Flags().IntVar(&rc.Workload.Requests, "requests", rc.Workload.Requests, "requests to replay")
	cmd.Flags().Float64Var(&rc.Live.Speedup, "speedup", rc.Live.Speedup, "virtual seconds per wall-clock second")
	cmd.Flags().BoolVarP(&verbose, "verbose", "v", false, "log progress and the daemon to stderr")
	cmd.Flags().BoolVar(&rc.Live.Fleet, "fleet", false, "fleet mode: embedded NATS, a kvindex agent per engine, two replicas the routers ask in turn")
	return cmd
}

// progress is the logger of --verbose (progress on stderr), else nil.
func progress(verbose bool) *slog.Logger {
	if !verbose {
		return nil
	}
	return slog.New(slog.NewTextHandler(os.Stderr, &slog.HandlerOptions{Level: slog.LevelInfo}))
}

// interruptible runs fn with a context SIGINT and SIGTERM cancel.
func interruptible(fn func(ctx context.Context, w io.Writer, args []string) error) func(*cobra.Command, []string) error {
	return func(cmd *cobra.Command, args []string) error {
		ctx, stop := signal.NotifyContext(cmd.Context(), syscall.SIGINT, syscall.SIGTERM)
		defer stop()
		return fn(ctx, cmd.OutOrStdout(), args)
	}
}
