package engine

import "github.com/kvindex/kvindex/testbed/sim/workload"

// none marks an absent block index in the pool's links, and vLLM's null
// block in a request's block list (a position it holds no block for).
const none = -1

// block is one KV block of the pool.
type block struct {
	hash uint64
	// prev and next link the block into the free queue while free.
	prev, next int32
	// dup links the cached blocks that share a key.
	dup    int32
	ref    int32
	group  uint8 // the KV-cache group it was cached in
	cached bool
	free   bool
}

// blockKey is the pool's key of hash in group g: vLLM caches a block
// under (hash, group), so a hash cached in one group is no hit in
// another. Group 0's key is the hash itself; other groups' differ from
// every hash but with probability 2^-64 per pair.
func blockKey(hash uint64, g int) uint64 {
	if g == 0 {
		return hash
	}
	return hash ^ workload.Mix64(0x67726f7570<<8|uint64(g)) // "group"
}

// pool is vLLM's BlockPool: fixed blocks shared by every KV-cache group,
// a free queue in eviction order (least recently freed first) and a map
// from key (blockKey) to cached blocks.
//
// # Invariants
//
//   - A block is in the free queue exactly when ref == 0.
//   - A block is in cached[key]'s dup chain exactly when cached.
//   - numFree is the length of the free queue.
//   - perGroup[g] is the number of keys of group g in cached.
type pool struct {
	blocks             []block
	freeHead, freeTail int32
	numFree            int
	cached             *table
	perGroup           []int

	// onEvict, when set, is told of every evicted cached block.
	onEvict func(hash uint64, group int)
}

// newPool returns a pool of n free blocks for groups KV-cache groups.
func newPool(n, groups int) *pool {
	p := &pool{blocks: make([]block, n), freeHead: none, freeTail: none, cached: newTable(n), perGroup: make([]int, groups)}
	for i := range p.blocks {
		p.blocks[i] = block{prev: none, next: none, dup: none}
		p.pushFree(int32(i))
	}
	return p
}

// pushFree appends b to the tail of the free queue (most recently freed).
func (p *pool) pushFree(b int32) {
	blk := &p.blocks[b]
	blk.free = true
	blk.prev, blk.next = p.freeTail, none
	if p.freeTail != none {
		p.blocks[p.freeTail].next = b
	} else {
		p.freeHead = b
	}
	p.freeTail = b
	p.numFree++
}

// removeFree unlinks b from the free queue.
func (p *pool) removeFree(b int32) {
	blk := &p.blocks[b]
	if blk.prev != none {
		p.blocks[blk.prev].next = blk.next
	} else {
		p.freeHead = blk.next
	}
	if blk.next != none {
		p.blocks[blk.next].prev = blk.prev
	} else {
		p.freeTail = blk.prev
	}
	blk.prev, blk.next, blk.free = none, none, false
	p.numFree--
}

// lookup returns a cached block with the key, or none.
func (p *pool) lookup(k uint64) int32 { return p.cached.get(k) }

// touch takes a reference on a cached block (a prefix-cache hit), taking
// it off the free queue if it was free.
func (p *pool) touch(b int32) {
	if p.blocks[b].ref == 0 {
		p.removeFree(b)
	}
	p.blocks[b].ref++
}

// allocate takes the least recently freed block, evicting its hash if it
// was cached. Callers check numFree > 0.
func (p *pool) allocate() int32 {
	b := p.freeHead
	if b == none {
		panic("engine: allocate from an empty free queue")
	}
	p.removeFree(b)
	blk := &p.blocks[b]
	if blk.cached {
		p.uncache(b)
		if p.onEvict != nil {
			p.onEvict(blk.hash, int(blk.group))
		}
	}
	blk.ref = 1
	return b
}

// uncache removes b from its key's dup chain.
func (p *pool) uncache(b int32) {
	blk := &p.blocks[b]
	h := blockKey(blk.hash, int(blk.group))
	head := p.cached.get(h)
	if head == b {
		if blk.dup == none {
			p.cached.del(h)
			p.perGroup[blk.group]--
		} else {
			p.cached.set(h, blk.dup)
		}
	} else {
		for cur := head; cur != none; cur = p.blocks[cur].dup {
			if p.blocks[cur].dup == b {
				p.blocks[cur].dup = blk.dup
				break
			}
		}
	}
	blk.dup, blk.cached = none, false
}

// cache gives a full block its hash in group g and makes it hittable. A
// key already cached gets a second block (vLLM does not deduplicate).
func (p *pool) cache(b int32, h uint64, g int) {
	blk := &p.blocks[b]
	blk.hash, blk.group, blk.cached = h, uint8(g), true
	k := blockKey(h, g)
	blk.dup = p.cached.get(k)
	if blk.dup == none {
		p.perGroup[g]++
	}
	p.cached.set(k, b)
}

// release drops one reference; a block with none left joins the free
// queue's tail and keeps its hash until reused.
func (p *pool) release(b int32) {
	blk := &p.blocks[b]
	blk.ref--
	if blk.ref == 0 {
		p.pushFree(b)
	}
}

// inUse is the number of blocks with a reference.
func (p *pool) inUse() int { return len(p.blocks) - p.numFree }
