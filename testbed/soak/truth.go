package soak

import (
	"container/list"
	"encoding/binary"
	"fmt"
	"math/rand/v2"

	"github.com/zeebo/xxh3"

	"github.com/kvindex/kvindex/events"
)

// BlockHashes appends to dst the engine block hashes of the full blocks of
// tokens: block i's hash is xxh3 (seeded with seed, an engine's hash seed)
// over block i-1's hash and block i's tokens, as vLLM chains its block
// hashes. The trailing partial block has none.
func BlockHashes(seed uint64, blockSize int, tokens []uint32, dst []uint64) []uint64 {
	if blockSize <= 0 {
		return dst
	}
	buf := make([]byte, 8+4*blockSize)
	var parent uint64
	for i := 0; i+blockSize <= len(tokens); i += blockSize {
		binary.LittleEndian.PutUint64(buf, parent)
		for j, t := range tokens[i : i+blockSize] {
			binary.LittleEndian.PutUint32(buf[8+4*j:], t)
		}
		parent = xxh3.HashSeed(buf, seed)
		dst = append(dst, parent)
	}
	return dst
}

// Cache is one engine's true prefix cache: what a vLLM engine with a
// fixed number of KV blocks holds after the requests it served.
//
// A request first reuses the longest cached prefix of its prompt, then
// takes a physical block for each remaining full block, evicting cached
// blocks that no running request uses (one BlockRemoved each) when the
// cache is full, and caches the new blocks (one BlockStored). When it
// finishes, its blocks are freed last block first, so they are evicted in
// that order: vLLM's free queue is LRU and a request's tail goes before
// its head. A block whose content is already cached but lies after a miss
// (after an eviction out of LRU order) is cached again in a second
// physical block, and needs two removals to go, as in vLLM.
// Cost: a request is O(its blocks) map operations plus O(1) per eviction;
// memory is O(capacity). A Cache is not safe for concurrent use.
type Cache struct {
	blockSize, capacity int
	seed                uint64
	// randomEvict is the fraction of evictions that take a random free
	// block instead of the LRU one (drawn from rng).
	randomEvict float64
	rng         *rand.Rand

	held   map[uint64]*entry // by engine hash; only entries with copies
	free   *list.List        // of physical blocks, LRU first; freeAt the same, for random picks
	freeAt []*phys
	nphys  int

	hashes []uint64 // scratch
}

// entry is one cached content block and its physical copies.
type entry struct {
	hash, parent uint64
	hasParent    bool
	tokens       []uint32
	copies       []*phys
}

// phys is one physical KV block holding an entry's content.
type phys struct {
	e    *entry
	elem *list.Element // in free
	at   int           // index in freeAt, -1 while in use
}

// NewCache returns an empty cache of capacity physical blocks of
// blockSize tokens; seed is the engine's hash seed, and randomEvict the
// fraction of evictions made out of LRU order (drawn from rng).
func NewCache(blockSize, capacity int, seed uint64, randomEvict float64, rng *rand.Rand) (*Cache, error) {
	if blockSize <= 0 || capacity <= 0 {
		return nil, fmt.Errorf("soak: cache of %d blocks of %d tokens: both must be positive", capacity, blockSize)
	}
	if randomEvict < 0 || randomEvict > 1 || (randomEvict > 0 && rng == nil) {
		return nil, fmt.Errorf("soak: random eviction fraction %v: must be in [0, 1], and above 0 needs a random source", randomEvict)
	}
	return &Cache{blockSize: blockSize, capacity: capacity, seed: seed, randomEvict: randomEvict, rng: rng, held: make(map[uint64]*entry), free: list.New()}, nil
}

// Resident returns the number of distinct blocks cached (what kvindex
// reports as the worker's resident blocks).
func (c *Cache) Resident() int { return len(c.held) }

// Holds reports whether the cache holds the block of engine hash h.
func (c *Cache) Holds(h uint64) bool { return c.held[h] != nil }

// Hashes appends the engine hash of every block the cache holds to dst,
// in no particular order.
func (c *Cache) Hashes(dst []uint64) []uint64 {
	for h := range c.held {
		dst = append(dst, h)
	}
	return dst
}

// Physical returns the number of physical blocks in use by cached content.
func (c *Cache) Physical() int { return c.nphys }

// Request serves one request with prompt tokens and appends the events
// the engine publishes for it to dst: a BlockRemoved per evicted block,
// then one BlockStored for the blocks it cached (none when its whole
// prompt was cached). A prompt longer than the cache is served for its
// first capacity blocks.
func (c *Cache) Request(tokens []uint32, dst []events.Event) []events.Event {
	c.hashes = BlockHashes(c.seed, c.blockSize, tokens, c.hashes[:0])
	hashes := c.hashes
	if len(hashes) > c.capacity {
		hashes = hashes[:c.capacity]
	}
	n := len(hashes)
	if n == 0 {
		return dst
	}
	k := 0
	for k < n && c.held[hashes[k]] != nil {
		k++
	}
	used := make([]*phys, n)
	for i := 0; i < k; i++ {
		p := c.held[hashes[i]].copies[0]
		c.unlink(p)
		used[i] = p
	}
	for c.nphys+(n-k) > c.capacity {
		// The LRU free block, or with probability randomEvict a random one.
		v := c.free.Front().Value.(*phys)
		if c.randomEvict > 0 && c.rng.Float64() < c.randomEvict {
			v = c.freeAt[c.rng.IntN(len(c.freeAt))]
		}
		c.unlink(v)
		c.dropCopy(v)
		dst = append(dst, events.Event{Kind: events.KindBlockRemoved, BlockHashes: []uint64{v.e.hash}, MediumName: "GPU"})
	}
	if k < n {
		st := events.Event{
			Kind:        events.KindBlockStored,
			BlockHashes: append([]uint64(nil), hashes[k:]...),
			TokenIDs:    append([]uint32(nil), tokens[k*c.blockSize:n*c.blockSize]...),
			BlockSize:   c.blockSize,
			MediumName:  "GPU",
		}
		if k > 0 {
			st.ParentHash, st.HasParent = hashes[k-1], true
		}
		for i := k; i < n; i++ {
			e := c.held[hashes[i]]
			if e == nil {
				e = &entry{hash: hashes[i], tokens: append([]uint32(nil), tokens[i*c.blockSize:(i+1)*c.blockSize]...)}
				if i > 0 {
					e.parent, e.hasParent = hashes[i-1], true
				}
				c.held[e.hash] = e
			}
			p := &phys{e: e, at: -1}
			e.copies = append(e.copies, p)
			c.nphys++
			used[i] = p
		}
		dst = append(dst, st)
	}
	for i := n - 1; i >= 0; i-- {
		c.pushFree(used[i])
	}
	return dst
}

// Clear drops every cached block (vLLM's reset_prefix_cache) and returns
// the event the engine publishes for it.
func (c *Cache) Clear() events.Event {
	clear(c.held)
	c.free.Init()
	c.freeAt, c.nphys = c.freeAt[:0], 0
	return events.Event{Kind: events.KindAllBlocksCleared}
}

// LongestPrefix returns how many blocks from the start of tokens' full
// blocks the cache holds, consecutively: what kvindex must answer for
// this engine's worker.
func (c *Cache) LongestPrefix(tokens []uint32) int {
	c.hashes = BlockHashes(c.seed, c.blockSize, tokens, c.hashes[:0])
	n := 0
	for _, h := range c.hashes {
		if c.held[h] == nil {
			break
		}
		n++
	}
	return n
}

// Chain returns the tokens of a cached chain that ends at a cached block
// chosen with rng, from its root, or nil when some block above it is not
// cached (a hole left by an eviction out of LRU order) or the cache is
// empty. The choice depends only on the cache's history and rng.
func (c *Cache) Chain(rng *rand.Rand) []uint32 {
	if len(c.freeAt) == 0 {
		return nil
	}
	return c.chain(c.freeAt[rng.IntN(len(c.freeAt))].e)
}

// chain returns the tokens from the root to e, or nil when a block above
// e is not cached.
func (c *Cache) chain(e *entry) []uint32 {
	var rev []*entry
	for {
		rev = append(rev, e)
		if !e.hasParent {
			break
		}
		if e = c.held[e.parent]; e == nil {
			return nil
		}
	}
	out := make([]uint32, 0, len(rev)*c.blockSize)
	for i := len(rev) - 1; i >= 0; i-- {
		out = append(out, rev[i].tokens...)
	}
	return out
}

// dropCopy forgets one physical copy of its entry, and with the last the
// entry.
func (c *Cache) dropCopy(p *phys) {
	e := p.e
	for i, q := range e.copies {
		if q == p {
			e.copies = append(e.copies[:i], e.copies[i+1:]...)
			break
		}
	}
	c.nphys--
	if len(e.copies) == 0 {
		delete(c.held, e.hash)
	}
}

// pushFree appends p to the free queue's tail (most recently used).
func (c *Cache) pushFree(p *phys) {
	p.elem = c.free.PushBack(p)
	p.at = len(c.freeAt)
	c.freeAt = append(c.freeAt, p)
}

// unlink takes p off the free queue.
func (c *Cache) unlink(p *phys) {
	if p.at < 0 {
		return
	}
	c.free.Remove(p.elem)
	last := c.freeAt[len(c.freeAt)-1]
	c.freeAt[p.at] = last
	last.at = p.at
	c.freeAt = c.freeAt[:len(c.freeAt)-1]
	p.at = -1
}
