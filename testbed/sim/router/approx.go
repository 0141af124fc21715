package router

import (
	"context"
	"math/rand/v2"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// GIE's defaults: lruCapacityPerServer, maxPrefixBlocksToMatch, and the
// example profile's weight of each of the three scorers.
const (
	approxLRUBlocks = 31250
	approxMaxBlocks = 256
	approxWeight    = 2
)

// approximate keeps per engine an LRU set of the block hashes it routed
// there, refreshed when routed there again (Contains does not refresh,
// as in GIE).
type approximate struct {
	base
	f      Fleet
	lrus   []*simplelru.LRU[uint64, struct{}]
	rng    *rand.Rand
	hashes []uint64
	ties   []int
}

func newApproximate(cfg Config) *approximate {
	size := cfg.LRUBlocks
	if size <= 0 {
		size = approxLRUBlocks
	}
	r := &approximate{f: cfg.Fleet, rng: rand.New(rand.NewPCG(cfg.Seed, 0xa99))}
	for range cfg.Fleet.Engines() {
		l, _ := simplelru.NewLRU[uint64, struct{}](size, nil) // errs only on a size below 1
		r.lrus = append(r.lrus, l)
	}
	return r
}

func (r *approximate) Name() string { return Approximate }

// Route scores every engine (prefix match in the router's own memory,
// normalised waiting queue, free KV cache), picks the best (ties at
// random) and remembers the request's blocks on it.
func (r *approximate) Route(_ context.Context, req *Request) (int, error) {
	n := r.f.Engines()
	k := min(req.PromptBlocks, approxMaxBlocks)
	r.hashes = r.hashes[:0]
	h := uint64(0x617070726f78) // "approx"
	for _, c := range req.Content[:k] {
		h = workload.Mix64(h ^ c)
		r.hashes = append(r.hashes, h)
	}
	minQ, maxQ := -1, -1
	for i := range n {
		q := r.f.Load(i).Waiting
		if minQ < 0 || q < minQ {
			minQ = q
		}
		maxQ = max(maxQ, q)
	}
	best := -1.0
	r.ties = r.ties[:0]
	for i := range n {
		l := r.f.Load(i)
		prefix := 0.0
		if k > 0 {
			m := 0
			for m < k && r.lrus[i].Contains(r.hashes[m]) {
				m++
			}
			prefix = float64(m) / float64(k)
		}
		queue := 1.0
		if maxQ > minQ {
			queue = float64(maxQ-l.Waiting) / float64(maxQ-minQ)
		}
		s := approxWeight * (prefix + queue + 1 - l.KVUsage)
		switch {
		case s > best:
			best = s
			r.ties = append(r.ties[:0], i)
		case s == best:
			r.ties = append(r.ties, i)
		}
	}
	pick := r.ties[0]
	if len(r.ties) > 1 {
		pick = r.ties[r.rng.IntN(len(r.ties))]
	}
	for _, h := range r.hashes {
		r.lrus[pick].Add(h, struct{}{})
	}
	return pick, nil
}
