package router

import (
	"context"
	"math/rand/v2"

	"github.com/hashicorp/golang-lru/v2/simplelru"

	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// ApproxConfig tunes the approximate router (GIE's prefix-cache-scorer
// with its queue and KV-cache-utilisation scorers).
type ApproxConfig struct {
	// LRUBlocks is each engine's router-side LRU capacity in blocks
	// (GIE's lruCapacityPerServer; default: the engines' cache size, as
	// GIE's autoTune reads it from the engines' metrics).
	LRUBlocks int
	// MaxBlocks is how many leading blocks are hashed and matched (GIE's
	// maxPrefixBlocksToMatch, default 256).
	MaxBlocks int
	// PrefixWeight, QueueWeight and KVWeight weigh the three scorers
	// (default 2 each, GIE's example profile).
	PrefixWeight, QueueWeight, KVWeight float64
}

func (c *ApproxConfig) defaults(cacheBlocks int) {
	if c.LRUBlocks <= 0 {
		c.LRUBlocks = cacheBlocks
	}
	if c.LRUBlocks <= 0 {
		c.LRUBlocks = 31250 // GIE's default lruCapacityPerServer
	}
	if c.MaxBlocks <= 0 {
		c.MaxBlocks = 256
	}
	if c.PrefixWeight == 0 && c.QueueWeight == 0 && c.KVWeight == 0 {
		c.PrefixWeight, c.QueueWeight, c.KVWeight = 2, 2, 2
	}
}

// approximate remembers which block hashes it sent to which engine: per
// engine an LRU set of hashes, each refreshed when routed there again
// (Contains does not refresh it; GIE's cache does not either).
type approximate struct {
	base
	f      Fleet
	cfg    ApproxConfig
	lrus   []*simplelru.LRU[uint64, struct{}]
	rng    *rand.Rand
	hashes []uint64
	scores []float64
	ties   []int
}

func newApproximate(cfg Config) *approximate {
	c := cfg.Approx
	c.defaults(0)
	n := cfg.Fleet.Engines()
	r := &approximate{f: cfg.Fleet, cfg: c, rng: newRand(cfg.Seed, 0xa99), scores: make([]float64, n)}
	for range n {
		l, _ := simplelru.NewLRU[uint64, struct{}](max(1, c.LRUBlocks), nil) // errs only on a size below 1
		r.lrus = append(r.lrus, l)
	}
	return r
}

// Name implements Router.
func (r *approximate) Name() string { return Approximate }

// Route scores every engine (prefix match in the router's own memory,
// normalised waiting queue, free KV cache), picks the best (ties at
// random) and remembers the request's blocks on it.
func (r *approximate) Route(_ context.Context, req *Request) (int, error) {
	n := r.f.Engines()
	k := min(req.PromptBlocks, r.cfg.MaxBlocks)
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
		if q > maxQ {
			maxQ = q
		}
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
		s := r.cfg.PrefixWeight*prefix + r.cfg.QueueWeight*queue + r.cfg.KVWeight*(1-l.KVUsage)
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
