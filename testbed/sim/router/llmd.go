package router

import (
	"context"
	"time"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// llm-d's router (github.com/llm-d/llm-d-router, tag v0.10.0, commit
// 71f4f0999f95), as its two documented profiles configure it:
//
//   - llm-d, the default profile (pkg/epp/config/loader/defaults.go;
//     unchanged at commit 0b59e4edb532): queue-scorer 2,
//     kv-cache-utilization-scorer 2, prefix-cache-scorer 3,
//     max-score-picker. The prefix scorer reads the approximate
//     producer (pkg/epp/framework/plugins/requestcontrol/dataproducer/
//     approximateprefix/plugin.go, indexer.go, types.go; prefixhash/
//     hashing.go): the prompt in blocks of max(the engine's block size,
//     64) tokens, the last partial block included, at most 131,072
//     tokens, each hash chained on the one before; a per-pod LRU of the
//     block hashes routed there (golang-lru, refreshed by Add only),
//     sized by autoTune to the engine's block count (num_gpu_blocks, so
//     it remembers its 64-token blocks four times over what a 16-token
//     cache holds) and blind to evictions; a pod's match counts the blocks
//     it holds among those before the first block no pod holds.
//   - llm-d-precise, the precise-prefix-cache guide's profile
//     (deploy/config/epp-precise-prefix-cache-config.yaml): prefix-cache-
//     scorer 2 over the precise producer, kv-cache-utilization-scorer 1,
//     queue-scorer 1. The precise producer reads KV events into
//     llm-d-kv-cache's index (github.com/llm-d/llm-d-kv-cache, commit
//     7be76e119ca5: pkg/kvcache/kvblock_scorer.go, the longest consecutive
//     prefix per pod, GPU 1.0 and CPU 0.8 a block, pkg/kvcache/backend.go;
//     pkg/kvcache/kvblock/token_processor.go, 64-token request blocks, the
//     partial tail dropped). Here kvindex's exact index answers; the
//     simulated engines hold GPU blocks only.
//
// Both score every pod as prefix = matched / total blocks (scorer/prefix/
// plugin.go, its match-length term off by default), queue = (max - w) /
// (max - min) of num_requests_waiting, 1 when all are equal
// (scorer/queuedepth/queue.go), kv = 1 - kv_cache_usage_perc
// (scorer/kvcacheutilization/kvcache_utilization.go), and pick the highest
// weighted sum, ties at random (picker/maxscore/picker.go shuffles, then
// sorts stably). The metrics are vLLM's as scraped every 50 ms
// (pkg/epp/server/options.go, RefreshMetricsInterval). Not modelled: flow
// control, off by default in v0.10.0 (cmd/epp/runner/runner.go), and
// llm-d-kv-cache's speculative index, off by default.
const (
	llmdMinBlockTokens = 64
	llmdMaxTokens      = 131072
	llmdPreciseBlock   = 64
	llmdPoll           = 50 * time.Millisecond
)

// llmdWeights are a profile's weights of the prefix, queue and
// KV-utilisation scorers.
type llmdWeights struct{ prefix, queue, kv float64 }

var (
	llmdDefaultWeights = llmdWeights{prefix: 3, queue: 2, kv: 2}
	llmdPreciseWeights = llmdWeights{prefix: 2, queue: 1, kv: 1}
)

type llmd struct {
	base
	scrape
	ties
	name string
	w    llmdWeights

	// matched[i] is pod i's prefix blocks of the request being routed.
	matched []int

	// The approximate producer (llm-d): blockTokens per block, at most
	// maxBlocks, a per-pod LRU of routed block hashes.
	blockTokens, maxBlocks int
	lrus                   []*simplelru.LRU[uint64, struct{}]
	content, hashes        []uint64
	toks                   []uint32

	// The precise producer (llm-d-precise): kvindex's answer.
	pk preciseKV
}

func newLLMD(name string, cfg Config) *llmd {
	n := cfg.Fleet.Engines()
	r := &llmd{name: name, scrape: newScrape(cfg.Fleet), ties: newTies(cfg.Seed, 0x11d), matched: make([]int, n)}
	if name == LLMDPrecise {
		r.w, r.pk = llmdPreciseWeights, newPreciseKV(name, cfg)
		return r
	}
	r.w = llmdDefaultWeights
	r.blockTokens = max(cfg.BlockSize, llmdMinBlockTokens)
	r.maxBlocks = llmdMaxTokens / r.blockTokens
	size := cfg.LRUBlocks
	if size <= 0 {
		size = approxLRUBlocks
	}
	for range n {
		l, _ := simplelru.NewLRU[uint64, struct{}](size, nil) // errs only on a size below 1
		r.lrus = append(r.lrus, l)
	}
	return r
}

func (r *llmd) Name() string { return r.name }

// PollInterval implements Poller.
func (r *llmd) PollInterval() time.Duration { return llmdPoll }

// Route scores every pod and picks the best, ties at random; the default
// profile then remembers the request's blocks on the pod it chose.
func (r *llmd) Route(ctx context.Context, req *Request) (int, error) {
	var total int
	if r.name == LLMDPrecise {
		var err error
		if total, err = r.precisePrefix(ctx, req); err != nil {
			return 0, err
		}
	} else {
		total = r.approxPrefix(req)
	}
	minQ, maxQ := r.loads[0].Waiting, r.loads[0].Waiting
	for _, l := range r.loads {
		minQ, maxQ = min(minQ, l.Waiting), max(maxQ, l.Waiting)
	}
	best := -1.0
	r.reset()
	for i, l := range r.loads {
		prefix := 0.0
		if total > 0 {
			prefix = float64(r.matched[i]) / float64(total)
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-l.Waiting) / float64(maxQ-minQ)
		}
		s := r.w.prefix*prefix + r.w.queue*queue + r.w.kv*(1-l.KVUsage)
		switch {
		case s > best:
			best = s
			r.first(i)
		case s == best:
			r.add(i)
		}
	}
	pick := r.pick()
	for _, h := range r.hashes {
		r.lrus[pick].Add(h, struct{}{})
	}
	return pick, nil
}

// approxPrefix hashes the prompt into the producer's blocks, fills matched
// from the pods' LRUs and returns the number of blocks.
func (r *llmd) approxPrefix(req *Request) int {
	bt := r.blockTokens
	r.content = req.AppendBlockContent(r.content[:0], bt, workload.Segment{})
	if tail := req.PromptLen % bt; tail > 0 {
		r.toks = req.AppendTokens(r.toks[:0], req.PromptLen-tail, req.PromptLen)
		h := uint64(0x7461696c) // "tail"
		for _, t := range r.toks {
			h = workload.Mix64(h ^ uint64(t))
		}
		r.content = append(r.content, h)
	}
	if len(r.content) > r.maxBlocks {
		r.content = r.content[:r.maxBlocks]
	}
	r.hashes = chain(r.hashes[:0], 0x6c6c6d2d64, r.content) // "llm-d"
	clear(r.matched)
	for _, h := range r.hashes {
		held := false
		for i, l := range r.lrus {
			if l.Contains(h) {
				r.matched[i]++
				held = true
			}
		}
		if !held {
			break
		}
	}
	return len(r.hashes)
}

// precisePrefix fills matched with each pod's consecutive cached prefix
// in 64-token blocks, from kvindex, and returns the prompt's full 64-token
// blocks.
func (r *llmd) precisePrefix(ctx context.Context, req *Request) (int, error) {
	r.hashes = r.hashes[:0]
	tokens, err := r.pk.score(ctx, req)
	if err != nil {
		return 0, err
	}
	for i := range r.matched {
		r.matched[i] = tokens[i] / llmdPreciseBlock
	}
	return req.PromptLen / llmdPreciseBlock, nil
}
