package sim

import (
	"context"
	"math/rand/v2"
	"testing"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/engine"
	"github.com/kvindex/kvindex/testbed/sim/metrics"
	"github.com/kvindex/kvindex/testbed/sim/router"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// collapseCase is one traffic shape on which some router collapses
// (everything on one engine, or caches thrashing); precise+load must not.
type collapseCase struct {
	name  string
	w     *workload.Workload
	cache int // blocks per engine
}

// poisson builds n requests at qps with prompts from prompt(i, rng).
func poisson(name string, n int, qps float64, seed uint64, prompt func(i int, rng *rand.Rand) []workload.Segment) *workload.Workload {
	rng := rand.New(rand.NewPCG(seed, 0xc011))
	w := &workload.Workload{Name: name, Engines: 4, Requests: make([]workload.Request, n)}
	var t float64
	for i := range w.Requests {
		t += rng.ExpFloat64() / qps
		segs := prompt(i, rng)
		l := 0
		for _, s := range segs {
			l += s.Len
		}
		w.Requests[i] = workload.Request{ID: i, Arrival: time.Duration(t * float64(time.Second)), Prompt: segs, PromptLen: l, OutputLen: 16 + rng.IntN(112)}
	}
	return w
}

func collapseCases(t *testing.T) []collapseCase {
	t.Helper()
	unique := func(i int) uint64 { return workload.Mix64(0x756e69717565 ^ uint64(i)) } // "unique"
	// Universal prefix, sparse start: every prompt opens with the same
	// 512 tokens (as every Mooncake request does), then 1-6k tokens of its
	// own; one request, then nothing for 10 s, then 4 QPS (about 40% of
	// the fleet's prefill). Longest-prefix routing sends everything to the
	// engine that ran the first request.
	universal := poisson("universal-sparse", 500, 4, 1, func(i int, rng *rand.Rand) []workload.Segment {
		return []workload.Segment{{ID: 0x756e6976, Len: 512}, {ID: unique(i), Len: 1024 + rng.IntN(5120)}}
	}).Pause(1, 10*time.Second)
	// One dominant tenant: 60% of requests share tenant 0's 6,000-token
	// context (5 users' 1,200-token questions); the rest spread over 40
	// tenants. Tenant 0 alone needs more than one engine's prefill.
	dominant := poisson("dominant-tenant", 1200, 16, 2, func(_ int, rng *rand.Rand) []workload.Segment {
		tenant := 0
		if rng.Float64() >= 0.6 {
			tenant = 1 + rng.IntN(40)
		}
		user := rng.IntN(5)
		return []workload.Segment{{ID: 0x7465 ^ uint64(tenant)<<8, Len: 6000}, {ID: 0x7573 ^ uint64(tenant)<<16 ^ uint64(user), Len: 1200}}
	})
	// All-unique prompts: nothing to hit; routing is load balancing.
	allUnique := poisson("all-unique", 800, 8, 3, func(i int, rng *rand.Rand) []workload.Segment {
		return []workload.Segment{{ID: unique(i), Len: 1024 + rng.IntN(6144)}}
	})
	// Tiny caches: 40 Zipf-popular 2,048-token prefixes against caches of
	// 512 blocks (four prefixes).
	tiny, err := workload.Prefixes(workload.PrefixesConfig{Requests: 800, Seed: 4})
	if err != nil {
		t.Fatal(err)
	}
	return []collapseCase{
		{"universal prefix, sparse start", universal, 0},
		{"one dominant tenant", dominant, 0},
		{"all-unique prompts", allUnique, 0},
		{"tiny caches", tiny, 512},
	}
}

// TestNoCollapse runs every router on the four shapes and checks that
// precise+load's p99 TTFT is within 10% of the best router's (ttft-greedy,
// with perfect knowledge, included) and that it keeps its hits.
func TestNoCollapse(t *testing.T) {
	for _, tc := range collapseCases(t) {
		t.Run(tc.name, func(t *testing.T) {
			o := Options{Engines: 4, Seed: 1, Parallel: 2}
			if tc.cache > 0 {
				o.Engine = engine.Config{CacheBlocks: tc.cache}
			}
			res, err := Simulate(context.Background(), tc.w, o)
			if err != nil {
				t.Fatal(err)
			}
			var best *metrics.Result
			var pl *metrics.Result
			for i := range res {
				r := &res[i]
				t.Logf("%-13s hit %5.1f%% p50 %6.3fs p99 %6.3fs skew %.2f", r.Router, 100*r.TokenHitRate(), r.TTFTP50.Seconds(), r.TTFTP99.Seconds(), r.LoadSkew)
				if best == nil || r.TTFTP99 < best.TTFTP99 {
					best = r
				}
				if r.Router == router.PreciseLoad {
					pl = r
				}
				if r.Completed != len(tc.w.Requests) {
					t.Errorf("%s completed %d of %d", r.Router, r.Completed, len(tc.w.Requests))
				}
			}
			if float64(pl.TTFTP99) > 1.10*float64(best.TTFTP99) {
				t.Errorf("precise+load p99 %v more than 10%% above the best (%s, %v)", pl.TTFTP99, best.Router, best.TTFTP99)
			}
		})
	}
}
