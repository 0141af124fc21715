package sim

import (
	"context"
	"fmt"
	"slices"
	"strings"
	"sync"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/router"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// Simulate replays w through a fresh fleet per router in virtual time and
// returns one result per router, in o.Routers order.
func Simulate(ctx context.Context, w *workload.Workload, o Options) ([]metrics.Result, error) {
	points, err := Sweep(ctx, w, o, nil)
	if err != nil {
		return nil, err
	}
	return points[0].Results, nil
}

// SweepPoint is every router's result at one cache size, and the
// workload's bounds there (what fits).
type SweepPoint struct {
	CacheBlocks int
	Results     []metrics.Result // in Options.Routers order
	Bounds      *Bounds
}

// Sweep runs every router at each cache size (blocks per engine; nil:
// o's, without bounds) in virtual time, each on its own fleet on the
// same arrivals, o.Parallel at once, the largest caches first (they run
// longest, so the pool ends evenly). Points are in the order of sizes.
func Sweep(ctx context.Context, w *workload.Workload, o Options, sizes []int) ([]SweepPoint, error) {
	o, err := o.withDefaults(w.Engines)
	if err != nil {
		return nil, err
	}
	if err := w.Validate(); err != nil {
		return nil, fmt.Errorf("sim: %w", err)
	}
	bounds := sizes != nil
	if !bounds {
		sizes = []int{o.Engine.CacheBlocks}
	}
	type job struct{ point, router int }
	var jobs []job
	out := make([]SweepPoint, len(sizes))
	for pi, size := range sizes {
		if size <= 0 {
			return nil, fmt.Errorf("sim: sweep: cache size %d", size)
		}
		out[pi] = SweepPoint{CacheBlocks: size, Results: make([]metrics.Result, len(o.Routers))}
		if bounds {
			bo := o
			bo.Engine.CacheBlocks = size
			if out[pi].Bounds, err = ComputeBounds(w, bo); err != nil {
				return nil, fmt.Errorf("sim: sweep at %d blocks: %w", size, err)
			}
		}
		for ri := range o.Routers {
			jobs = append(jobs, job{pi, ri})
		}
	}
	slices.SortStableFunc(jobs, func(a, b job) int { return sizes[b.point] - sizes[a.point] })
	err = runJobs(ctx, o.Parallel, len(jobs), func(ctx context.Context, k int) error {
		j := jobs[k]
		jo := o
		jo.Engine.CacheBlocks = sizes[j.point]
		res, err := simulateOne(ctx, w, &jo, o.Routers[j.router])
		if err != nil {
			return err
		}
		out[j.point].Results[j.router] = res
		o.Logger.Info("simulated", "router", res.Router, "workload", w.Name, "cache_blocks", jo.Engine.CacheBlocks,
			"wall", res.Wall.Round(time.Millisecond), "hit_rate", fmt.Sprintf("%.3f", res.TokenHitRate()))
		return nil
	})
	if err != nil {
		return nil, err
	}
	return out, nil
}

// runJobs runs n jobs, at most par at once, and returns the first error
// (cancelling the others).
func runJobs(ctx context.Context, par, n int, fn func(ctx context.Context, k int) error) error {
	ctx, cancel := context.WithCancel(ctx)
	defer cancel()
	sem := make(chan struct{}, max(1, par))
	var (
		wg       sync.WaitGroup
		mu       sync.Mutex
		firstErr error
	)
	for k := range n {
		select {
		case sem <- struct{}{}:
		case <-ctx.Done():
		}
		if ctx.Err() != nil {
			break
		}
		wg.Add(1)
		go func() {
			defer wg.Done()
			defer func() { <-sem }()
			if err := fn(ctx, k); err != nil {
				mu.Lock()
				if firstErr == nil {
					firstErr = err
				}
				mu.Unlock()
				cancel()
			}
		}()
	}
	wg.Wait()
	if firstErr != nil {
		return firstErr
	}
	return ctx.Err()
}

// simulateOne runs one router in virtual time.
func simulateOne(ctx context.Context, w *workload.Workload, o *Options, name string) (metrics.Result, error) {
	start := time.Now()
	if base, ok := strings.CutSuffix(name, PrefixOnly); ok {
		po := *o
		po.NoGroupCaps = true
		res, err := simulateOne(ctx, w, &po, base)
		res.Router = name
		return res, err
	}
	needsIndex := router.NeedsIndex(name)
	f, err := newFleet(o, needsIndex)
	if err != nil {
		return metrics.Result{}, err
	}
	l := &loop{w: w, o: o, fleet: f, rec: metrics.NewRecorder(o.Engines)}
	rcfg := o.routerConfig(f)
	var p *pipeline
	if needsIndex {
		if p, err = newPipeline(o, func() time.Duration { return l.now }); err != nil {
			return metrics.Result{}, err
		}
		rcfg.KV = &localKV{s: p.scorer}
		for i := range o.Engines {
			rcfg.Names = append(rcfg.Names, podName(i))
		}
		lag := o.EventLag
		l.deliver = p.apply
		l.publish = func(i int, b *events.Batch, now time.Duration) error {
			payload, err := p.encode(b, lag > 0)
			if err != nil {
				return fmt.Errorf("sim: engine %d: %w", i, err)
			}
			if lag == 0 {
				p.apply(i, payload)
				return nil
			}
			l.schedule(simEvent{t: now + lag, kind: evDeliver, engine: int32(i), payload: payload})
			return nil
		}
	}
	if l.router, err = router.New(name, rcfg); err != nil {
		return metrics.Result{}, fmt.Errorf("sim: %w", err)
	}
	if err := l.run(ctx); err != nil {
		return metrics.Result{}, err
	}
	res := l.result()
	if p != nil {
		c := p.check(f)
		res.IndexProblems, res.IndexDetail = c.total(), c.String()
		if c.total() > 0 {
			o.Logger.Warn("kvindex disagreed with the engines", "router", name, "problems", res.IndexDetail)
		}
	}
	res.Wall = time.Since(start)
	return res, nil
}
