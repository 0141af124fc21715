package sim

import (
	"context"
	"fmt"
	"io"
	"time"

	"github.com/kvindex/kvindex/config"
	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// RunConfig is one kvsim invocation.
type RunConfig struct {
	Workload WorkloadSpec
	Options  Options
	Live     *LiveOptions // live mode when set, else virtual time
	CSVDir   string       // receives the CSV files when set
}

// Main runs rc and prints its tables to w.
func Main(ctx context.Context, rc RunConfig, w io.Writer) error {
	wl, err := LoadWorkload(rc.Workload)
	if err != nil {
		return err
	}
	if rc.Live != nil && rc.Live.PrintConfig {
		cfg, err := LiveConfig(wl, rc.Options, *rc.Live)
		if err != nil {
			return err
		}
		b, err := config.Marshal(cfg)
		if err != nil {
			return fmt.Errorf("sim: %w", err)
		}
		_, err = w.Write(b)
		return err
	}
	if _, err := run(ctx, "kvsim", wl, rc, w); err != nil {
		return err
	}
	if rc.CSVDir != "" {
		fmt.Fprintf(w, "CSV written to %s\n", rc.CSVDir)
	}
	return nil
}

// run replays wl as rc says, printing a header titled title, the table
// and the wall-clock time to w, and writes the CSV files into rc.CSVDir
// when set. It returns the wall-clock time of the replay and bounds.
func run(ctx context.Context, title string, wl *workload.Workload, rc RunConfig, w io.Writer) (time.Duration, error) {
	mode, agreeNote := "virtual time", ""
	if rc.Live != nil {
		lo := *rc.Live
		lo.defaults()
		mode = fmt.Sprintf("live: real ZMQ + gRPC, wall clock x%g", lo.Speedup)
		if lo.Fleet {
			mode = fmt.Sprintf("live fleet: engines -ZMQ-> an agent each -NATS-> %d replicas -gRPC-> routers, wall clock x%g", liveReplicas, lo.Speedup)
			agreeNote = fmt.Sprintf(", on all %d replicas with equal digests", liveReplicas)
		}
	}
	fmt.Fprintf(w, "%s (%s): %s\n\n", title, mode, Describe(wl, rc.Options))
	start := time.Now()
	var results []metrics.Result
	var err error
	if rc.Live != nil {
		results, err = Live(ctx, wl, rc.Options, *rc.Live)
	} else {
		results, err = Simulate(ctx, wl, rc.Options)
	}
	if err != nil {
		return 0, err
	}
	bounds, err := ComputeBounds(wl, rc.Options)
	if err != nil {
		return 0, err
	}
	wall := time.Since(start)
	if err := WriteTable(w, results, bounds, agreeNote); err != nil {
		return 0, err
	}
	fmt.Fprintf(w, "\n%d routers in %s (wall clock)\n", len(results), wall.Round(10*time.Millisecond))
	if rc.CSVDir != "" {
		return wall, WriteCSV(rc.CSVDir, results, bounds)
	}
	return wall, nil
}

// DemoConfig is what `kvsim demo` (`make demo`) runs: about 10 s live of
// the prefixes workload, 300 requests at 40 QPS, on 4 engines of 2,048
// blocks (a quarter of the 40 prefixes of 128 blocks fit one), every
// router, the daemon in process.
func DemoConfig() RunConfig {
	return RunConfig{
		Workload: WorkloadSpec{Kind: KindPrefixes, Requests: 300, Seed: 1, Prefixes: workload.PrefixesConfig{QPS: 40}},
		Options:  Options{Engine: engine.Config{CacheBlocks: 2048}, Seed: 1},
		Live:     &LiveOptions{Speedup: 1},
	}
}
