package router

import (
	"container/heap"
	"context"
	"fmt"
	"math/bits"
	"time"

	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// SGLang's model gateway, policy cache_aware with its defaults
// (github.com/sgl-project/sglang, sgl-model-gateway/src/policies/
// cache_aware.rs at commit b93974f140de, tree.rs; defaults cache_threshold
// 0.3, balance_abs_threshold 64, balance_rel_threshold 1.5,
// eviction_interval 120 s, max_tree_size 2^26 in the gateway's CLI):
//
//   - Load is the gateway's own count of requests it sent to a worker and
//     has not seen finish.
//   - If max - min load > 64 and max > 1.5 x min, the least loaded worker
//     (the first in worker order).
//   - Else the longest match of the prompt in an approximate radix tree of
//     the prompts routed so far; if the matched share of the prompt is
//     above 0.3, a worker holding the deepest matched node (the tree keeps
//     no order among them: one at random), else the least loaded.
//   - The prompt is inserted for the chosen worker either way.
//   - Every 120 s, a worker holding more than 2^26 tokens in the tree loses
//     its least recently inserted leaves until it holds no more.
//
// The gateway's tree holds characters (later versions tokens); here it holds
// the prompt's blocks of the fleet's block size, then the partial last
// block as one node, so a match ends at a block boundary (at most a block's
// tokens short of a token-level match). Each node keeps one last-access
// time for all its workers, so eviction orders a worker's leaves by the
// latest insert of any worker.
const (
	sglangCacheThreshold = 0.3
	sglangBalanceAbs     = 64
	sglangBalanceRel     = 1.5
	sglangEvictEvery     = 120 * time.Second
	sglangMaxTreeTokens  = 1 << 26
)

type sglang struct {
	base
	ties
	load inflight

	// The tree: nodes by the chained hash of their prefix; a node's tenants
	// are a bit per worker.
	index   map[uint64]int32
	nodes   []sgNode
	held    []int64 // tokens each worker holds in the tree
	maxHeld int64
	evictAt time.Duration

	bs     int
	hashes []uint64
	toks   []uint32
	lens   []int32
}

type sgNode struct {
	hash    uint64
	parent  int32 // -1: the root's child
	tokens  int32
	tenants uint64
	last    time.Duration
}

func newSGLang(cfg Config) (*sglang, error) {
	n := cfg.Fleet.Engines()
	if n > 64 {
		return nil, fmt.Errorf("router %s: %d engines; its tree marks at most 64", SGLang, n)
	}
	return &sglang{ties: newTies(cfg.Seed, 0x59a), load: newInflight(n), index: make(map[uint64]int32),
		bs: cfg.BlockSize, held: make([]int64, n), maxHeld: sglangMaxTreeTokens, evictAt: sglangEvictEvery}, nil
}

func (r *sglang) Name() string { return SGLang }

func (r *sglang) Route(_ context.Context, req *Request) (int, error) {
	now := req.Arrival
	for now >= r.evictAt {
		r.evict()
		r.evictAt += sglangEvictEvery
	}
	r.path(req)
	lo, hi := r.load.n[0], r.load.n[0]
	for _, l := range r.load.n {
		lo, hi = min(lo, l), max(hi, l)
	}
	var pick int
	if hi-lo > sglangBalanceAbs && float32(hi) > float32(lo)*sglangBalanceRel {
		pick = r.leastLoaded()
	} else {
		matched, node := 0, int32(-1)
		for k, h := range r.hashes {
			i, ok := r.index[h]
			if !ok {
				break
			}
			matched += int(r.lens[k])
			node = i
		}
		if node >= 0 && float32(matched)/float32(req.PromptLen) > sglangCacheThreshold {
			r.reset()
			for m := r.nodes[node].tenants; m != 0; m &= m - 1 {
				r.add(bits.TrailingZeros64(m))
			}
			pick = r.pick()
		} else {
			pick = r.leastLoaded()
		}
	}
	r.insert(pick, now)
	r.load.add(req.ID, pick)
	return pick, nil
}

// Finished implements Finisher.
func (r *sglang) Finished(req *workload.Request, _ int) { r.load.done(req.ID) }

func (r *sglang) leastLoaded() int {
	best := 0
	for i, l := range r.load.n {
		if l < r.load.n[best] {
			best = i
		}
	}
	return best
}

// path sets hashes and lens to the prompt's nodes: its full blocks, then
// its partial last block.
func (r *sglang) path(req *Request) {
	r.hashes = chain(r.hashes[:0], 0x73676c616e67, req.Content[:req.PromptBlocks]) // "sglang"
	r.lens = r.lens[:0]
	for range r.hashes {
		r.lens = append(r.lens, int32(r.bs))
	}
	full := req.PromptBlocks * r.bs
	if tail := req.PromptLen - full; tail > 0 {
		r.toks = req.AppendTokens(r.toks[:0], full, req.PromptLen)
		h := uint64(0x7461696c) // "tail"
		if len(r.hashes) > 0 {
			h = r.hashes[len(r.hashes)-1]
		}
		for _, t := range r.toks {
			h = workload.Mix64(h ^ uint64(t) ^ 0x746f6b)
		}
		r.hashes = append(r.hashes, h)
		r.lens = append(r.lens, int32(tail))
	}
}

// insert adds worker w to every node of the current path, creating the
// missing ones.
func (r *sglang) insert(w int, now time.Duration) {
	bit := uint64(1) << w
	parent := int32(-1)
	for k, h := range r.hashes {
		i, ok := r.index[h]
		if !ok {
			i = int32(len(r.nodes))
			r.nodes = append(r.nodes, sgNode{hash: h, parent: parent, tokens: r.lens[k]})
			r.index[h] = i
		}
		n := &r.nodes[i]
		if n.tenants&bit == 0 {
			n.tenants |= bit
			r.held[w] += int64(n.tokens)
		}
		n.last = now
		parent = i
	}
}

// evict runs an eviction pass: every worker holding more than
// maxHeld tokens loses its least recently used leaves until it holds no
// more. Cost: a pass over the tree per such worker, then log n a leaf.
func (r *sglang) evict() {
	for w, held := range r.held {
		if held > r.maxHeld {
			r.evictWorker(w)
		}
	}
}

func (r *sglang) evictWorker(w int) {
	bit := uint64(1) << w
	kids := make([]int32, len(r.nodes)) // children holding w, per node
	for i := range r.nodes {
		if n := &r.nodes[i]; n.tenants&bit != 0 && n.parent >= 0 {
			kids[n.parent]++
		}
	}
	h := &sgLeaves{nodes: r.nodes}
	for i := range r.nodes {
		if r.nodes[i].tenants&bit != 0 && kids[i] == 0 {
			h.items = append(h.items, int32(i))
		}
	}
	heap.Init(h)
	for r.held[w] > r.maxHeld && h.Len() > 0 {
		n := &r.nodes[heap.Pop(h).(int32)]
		n.tenants &^= bit
		r.held[w] -= int64(n.tokens)
		if n.tenants == 0 {
			delete(r.index, n.hash)
		}
		if p := n.parent; p >= 0 {
			if kids[p]--; kids[p] == 0 {
				heap.Push(h, p)
			}
		}
	}
}

// sgLeaves is a min-heap (container/heap) of node indices by last access.
type sgLeaves struct {
	nodes []sgNode
	items []int32
}

func (h *sgLeaves) Len() int           { return len(h.items) }
func (h *sgLeaves) Less(i, j int) bool { return h.nodes[h.items[i]].last < h.nodes[h.items[j]].last }
func (h *sgLeaves) Swap(i, j int)      { h.items[i], h.items[j] = h.items[j], h.items[i] }
func (h *sgLeaves) Push(x any)         { h.items = append(h.items, x.(int32)) }
func (h *sgLeaves) Pop() any {
	x := h.items[len(h.items)-1]
	h.items = h.items[:len(h.items)-1]
	return x
}
