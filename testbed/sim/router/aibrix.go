package router

import (
	"context"
	"fmt"
	"math"
	"math/bits"
	"slices"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// AIBrix's gateway, routing algorithm prefix-cache with its defaults
// (github.com/vllm-project/aibrix, tag v0.7.0, commit c5465890951a:
// pkg/plugins/gateway/algorithms/prefix_cache.go, least_request.go,
// util.go; pkg/utils/prefixcacheindexer/hash.go; pkg/utils/lrustore; the
// thresholds unchanged in prefix_cache.go at commit 429c45e90fb4):
//
//   - Load is the gateway's own count of requests running on each pod
//     (routed, not finished).
//   - If max - min load > 8, only the least-loaded pods are candidates.
//   - The prompt's chained block hashes are matched in one table shared
//     by all pods: walking the blocks in order, a candidate stays while it
//     holds every block so far; its match is the share of blocks it held,
//     in whole percent.
//   - Matched pods sorted by match, then fewer requests (shuffled first,
//     so equal pods come in random order); the first whose load is at
//     most the mean + 1 (sample) standard deviation of all pods' loads.
//   - Otherwise (no match, or none within it) the least-loaded pod, ties
//     at random; the chosen pod is added to every block of the prompt.
//   - The table is an LRU of 200,000 blocks (refreshed when a route adds
//     a pod, not when matched), whose entries also expire 20 minutes
//     after they were last added to.
//
// AIBrix's default tokenizer is characters, in blocks of 4: here a token
// stands for 4 characters (kvsim analyze's estimate), so a block of the
// fleet's block size stands for that many of AIBrix's, and the table holds
// 200,000 / block size of them (12,500 at 16 tokens).
const (
	aibrixImbalance   = 8
	aibrixStdFactor   = 1
	aibrixTableBlocks = 200000
	aibrixTTL         = 20 * time.Minute
)

type aibrix struct {
	base
	ties
	load        inflight
	table       *simplelru.LRU[uint64, aibrixBlock]
	tableBlocks int

	hashes []uint64
	pct    []int // match per engine, -1 none
	order  []int
}

// aibrixBlock is one table entry: the pods added to it, and when last.
type aibrixBlock struct {
	pods uint64
	put  time.Duration
}

func newAIBrix(cfg Config) (*aibrix, error) {
	n := cfg.Fleet.Engines()
	if n > 64 {
		return nil, fmt.Errorf("router %s: %d engines; its table marks at most 64", AIBrix, n)
	}
	size := max(1, aibrixTableBlocks/cfg.BlockSize)
	t, _ := simplelru.NewLRU[uint64, aibrixBlock](size, nil) // errs only on a size below 1
	return &aibrix{ties: newTies(cfg.Seed, 0xa1b), load: newInflight(n), table: t, tableBlocks: size, pct: make([]int, n)}, nil
}

func (r *aibrix) Name() string { return AIBrix }

func (r *aibrix) Route(_ context.Context, req *Request) (int, error) {
	now := req.Arrival
	n := r.load.n
	lo, hi := n[0], n[0]
	for _, l := range n {
		lo, hi = min(lo, l), max(hi, l)
	}
	cand := uint64(1)<<len(n) - 1
	if len(n) == 64 {
		cand = math.MaxUint64
	}
	if hi-lo > aibrixImbalance {
		cand = 0
		for i, l := range n {
			if l == lo {
				cand |= 1 << i
			}
		}
	}
	r.hashes = chain(r.hashes[:0], 0x61696272, req.Content[:req.PromptBlocks]) // "aibr"
	matched := r.match(cand, now)
	pick := -1
	if matched {
		pick = r.withinDeviation()
	}
	if pick < 0 {
		r.reset()
		for i, l := range n {
			if l == lo {
				r.add(i)
			}
		}
		pick = r.pick()
	}
	for _, h := range r.hashes {
		b, ok := r.table.Peek(h)
		if !ok || now-b.put > aibrixTTL {
			b = aibrixBlock{}
		}
		b.pods |= 1 << pick
		b.put = now
		r.table.Add(h, b)
	}
	r.load.add(req.ID, pick)
	return pick, nil
}

// match sets pct for the candidates that hold the prompt's first blocks
// and reports whether any does.
func (r *aibrix) match(cand uint64, now time.Duration) bool {
	for i := range r.pct {
		r.pct[i] = -1
	}
	any := false
	for k, h := range r.hashes {
		b, ok := r.table.Peek(h)
		if !ok || now-b.put > aibrixTTL {
			break
		}
		if cand &= b.pods; cand == 0 {
			break
		}
		any = true
		p := (k + 1) * 100 / len(r.hashes)
		for m := cand; m != 0; m &= m - 1 {
			r.pct[bits.TrailingZeros64(m)] = p
		}
	}
	return any
}

// withinDeviation returns the matched pod of the highest match, then the
// fewest requests (equal pods in random order), whose load is within the
// mean + 1 standard deviation, or -1.
func (r *aibrix) withinDeviation() int {
	n := r.load.n
	mean, sd := meanStd(n)
	r.order = r.order[:0]
	for i, p := range r.pct {
		if p >= 0 {
			r.order = append(r.order, i)
		}
	}
	r.rng.Shuffle(len(r.order), func(i, j int) { r.order[i], r.order[j] = r.order[j], r.order[i] })
	slices.SortStableFunc(r.order, func(a, b int) int {
		if r.pct[a] != r.pct[b] {
			return r.pct[b] - r.pct[a]
		}
		return n[a] - n[b]
	})
	for _, i := range r.order {
		if float64(n[i]) <= mean+aibrixStdFactor*sd {
			return i
		}
	}
	return -1
}

// meanStd returns the mean and the sample standard deviation of xs.
func meanStd(xs []int) (mean, sd float64) {
	for _, x := range xs {
		mean += float64(x)
	}
	mean /= float64(len(xs))
	if len(xs) < 2 {
		return mean, 0
	}
	for _, x := range xs {
		sd += (float64(x) - mean) * (float64(x) - mean)
	}
	return mean, math.Sqrt(sd / float64(len(xs)-1))
}

// Finished implements Finisher.
func (r *aibrix) Finished(req *workload.Request, _ int) { r.load.done(req.ID) }
