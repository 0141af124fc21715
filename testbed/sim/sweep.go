package sim

import (
	"context"
	"fmt"
	"slices"
	"strconv"
	"strings"

	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// SweepPoint is every router's result at one cache size.
type SweepPoint struct {
	// CacheBlocks is each engine's cache size in blocks.
	CacheBlocks int
	// Results has one entry per router, in Options.Routers order.
	Results []metrics.Result
	// Bounds are the workload's bounds at this cache size (what fits).
	Bounds *Bounds
}

// Sweep runs every router at every cache size (blocks per engine), in
// virtual time, and returns the points in the order of sizes.
func Sweep(ctx context.Context, w *workload.Workload, o Options, sizes []int) ([]SweepPoint, error) {
	o, err := o.withDefaults(w.Engines)
	if err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	if len(sizes) == 0 {
		return nil, fmt.Errorf("sim: sweep: no cache sizes")
	}
	out := make([]SweepPoint, len(sizes))
	type job struct {
		point, router int
		o             Options
	}
	var jobs []job
	for pi, size := range sizes {
		if size <= 0 {
			return nil, fmt.Errorf("sim: sweep: cache size %d", size)
		}
		bo := o
		bo.Engine.CacheBlocks = size
		b, err := ComputeBounds(w, bo)
		if err != nil {
			return nil, fmt.Errorf("sim: sweep at %d blocks: %w", size, err)
		}
		out[pi] = SweepPoint{CacheBlocks: size, Results: make([]metrics.Result, len(o.Routers)), Bounds: b}
		for ri, name := range o.Routers {
			jo := o
			jo.Engine.CacheBlocks = size
			jo.Routers = []string{name}
			jobs = append(jobs, job{point: pi, router: ri, o: jo})
		}
	}
	// Largest caches first: they run longest, so the pool ends evenly.
	slices.SortStableFunc(jobs, func(a, b job) int { return b.o.Engine.CacheBlocks - a.o.Engine.CacheBlocks })
	err = runJobs(ctx, o.Parallel, len(jobs), func(ctx context.Context, k int) error {
		j := jobs[k]
		res, err := simulateOne(ctx, w, &j.o, j.o.Routers[0])
		if err != nil {
			return fmt.Errorf("sim: sweep at %d blocks: %w", j.o.Engine.CacheBlocks, err)
		}
		out[j.point].Results[j.router] = res
		o.Logger.Info("swept", "router", res.Router, "cache_blocks", j.o.Engine.CacheBlocks, "hit_rate", fmt.Sprintf("%.3f", res.TokenHitRate()), "wall", res.Wall)
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// ParseSizes parses a comma-separated list of cache sizes in blocks; a
// size may end in k (thousands).
func ParseSizes(s string) ([]int, error) {
	var out []int
	for _, f := range strings.Split(s, ",") {
		f = strings.TrimSpace(strings.ToLower(f))
		if f == "" {
			continue
		}
		mult := 1
		if strings.HasSuffix(f, "k") {
			mult, f = 1000, strings.TrimSuffix(f, "k")
		}
		n, err := strconv.ParseFloat(f, 64)
		if err != nil || n <= 0 {
			return nil, fmt.Errorf("sim: cache size %q: want a positive number of blocks", f)
		}
		out = append(out, int(n*float64(mult)))
	}
	if len(out) == 0 {
		return nil, fmt.Errorf("sim: no cache sizes in %q", s)
	}
	return out, nil
}
