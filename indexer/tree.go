package indexer

import (
	"fmt"
	"slices"
	"sync"
	"sync/atomic"

	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// node is a run of consecutive content keys (a chain without branches in
// between); a branch is a child node attached at any key of its parent's
// run, and segments give each stretch of the run its holder set (see the
// package documentation, Structure).
//
// # Concurrency
//
// Readers (Match) use only the immutable fields and the published view,
// with no lock. Writers (ApplyBatch of any worker) change the writer-side
// state under mu and publish it when their cursor releases the node, at the
// latest when their batch ends (cursor.finish).
//
// Lock order: see Index.
//
// # Invariants
//
//   - keys[0] == first; once a key is written into a keys array at an
//     index below a published view's length, that slot is never written
//     again (writers only append past len(keys), and compaction copies to a
//     new array), so readers may read published keys without a lock.
//   - segs is sorted by start, segs[0].start == 0, adjacent segments have
//     unequal sets, and every segment is non-empty.
//   - A node with no children and only the nil set is dead: it is marked
//     dead, removed from heads and from its parent, and never used again.
//     An engine entry only points into a node where its worker holds the
//     key, so no engine entry points into a dead node.
//   - Every child's attach offset is <= maxAttach < len(keys).
//
// assertNodeLocked checks these when invariants are compiled in.
type node struct {
	// Set at creation, then immutable.
	parent *node // nil for a top-level node (its first key's parent is a root)
	attach int32 // offset in parent of this node's first key's parent; -1 at top level
	first  Key
	id     uint32  // in Index.nodes, for engine entries
	gen    nodeGen // of id's slot while n holds it (see nodeTable)

	view    atomic.Pointer[view] // the run as readers see it; nil until published
	dead    atomic.Bool          // set under mu; readable without it
	retired atomic.Bool          // set by the one retire that removes it

	mu         sync.Mutex // guards the fields below
	keys       []Key
	segs       []seg // in segs0 while it fits
	segs0      [viewSegs]seg
	segsShared bool // segs is referenced by a published view: copy before writing
	dirty      bool // changed since the last publish
	view0      view // the first view, allocated with the node
	children   []*node
	maxAttach  int32 // >= every child's attach; -1 with no children
	cidx       int32 // index in parent.children, -1 when unlinked; guarded by parent.mu
}

// view is what readers see of a node: its key array and segments
// (immutable) and the visible length n of the run (atomic).
//
// A change that the view's array and segments still describe (keys
// appended with the run's last holder set, or a holder leaving the tail:
// see visibleLocked) is published by storing a new n; only a change of
// holders inside the visible run, or a new array, costs a new view. Up to
// viewSegs segments are copied into the view, so that the writer edits
// its own short segment list in place.
type view struct {
	keys  []Key // to the array's capacity; readers use keys[:n]
	n     atomic.Int32
	segs  []seg
	segs0 [viewSegs]seg
}

const viewSegs = 2

// seg says that the keys from start to the next segment's start are held
// by set (nil: by no worker).
type seg struct {
	start int32
	set   *holders.Set
}

// headShard indexes the nodes whose first key falls into it.
type headShard struct {
	mu sync.RWMutex // guards m; readers take it shared for one probe
	m  map[Key]*node
	_  [32]byte // keep neighbouring shards' locks off one cache line
}

// nodeTable gives nodes 32-bit ids, so that engine entries name their node
// without a pointer and the engine maps, the largest structure, are not
// scanned by the garbage collector (a pointer per entry would be 400 MB to
// mark per cycle at 10 M residencies).
//
// Freed ids are reused last in, first out. Each slot has a 6-bit
// generation, bumped when its node is removed; engine entries keep the
// generation they were made with, and get panics on a mismatch, so a stale
// id cannot silently name the next node in its slot (unless the slot was
// reused a multiple of 64 times since).
type nodeTable struct {
	mu     sync.Mutex // guards free and next, and growing chunks
	chunks atomic.Pointer[[]*nodeChunk]
	free   []uint32
	next   uint32
}

// nodeGen is a node id slot's generation.
type nodeGen uint8

// nodeChunk is nodeChunkLen slots of a nodeTable. A slot is written only
// under the table's mutex, and only while no engine entry names it.
type nodeChunk struct {
	nodes [nodeChunkLen]*node
	gens  [nodeChunkLen]nodeGen
}

const nodeChunkLen = 1024

// add gives n an id and its slot's generation.
func (t *nodeTable) add(n *node) {
	t.mu.Lock()
	if l := len(t.free); l > 0 {
		n.id = t.free[l-1]
		t.free = t.free[:l-1]
	} else {
		if t.next == maxNodes {
			t.mu.Unlock()
			panic(fmt.Sprintf("indexer: the index holds its maximum of %d tree nodes", maxNodes))
		}
		n.id = t.next
		t.next++
	}
	cs := t.chunks.Load()
	if cs == nil || int(n.id/nodeChunkLen) >= len(*cs) {
		var grown []*nodeChunk
		if cs != nil {
			grown = append(grown, *cs...)
		}
		grown = append(grown, new(nodeChunk))
		t.chunks.Store(&grown)
		cs = &grown
	}
	c := (*cs)[n.id/nodeChunkLen]
	c.nodes[n.id%nodeChunkLen] = n
	n.gen = c.gens[n.id%nodeChunkLen]
	t.mu.Unlock()
}

// get returns the node with id id of generation gen, and panics on an id
// out of range, free, or of another generation.
func (t *nodeTable) get(id uint32, gen nodeGen) *node {
	cs := *t.chunks.Load()
	if int(id/nodeChunkLen) >= len(cs) {
		brokenInvariant(fmt.Sprintf("node id %d out of range", id))
	}
	c := cs[id/nodeChunkLen]
	n := c.nodes[id%nodeChunkLen]
	if g := c.gens[id%nodeChunkLen]; n == nil || g != gen {
		brokenInvariant(fmt.Sprintf("stale node id %d of generation %d: its slot is at generation %d (node %p)", id, gen, g, n))
	}
	return n
}

// remove frees n's id and bumps its slot's generation; n is dead.
func (t *nodeTable) remove(n *node) {
	t.mu.Lock()
	c := (*t.chunks.Load())[n.id/nodeChunkLen]
	c.nodes[n.id%nodeChunkLen] = nil
	c.gens[n.id%nodeChunkLen] = (c.gens[n.id%nodeChunkLen] + 1) & genMask
	t.free = append(t.free, n.id)
	t.mu.Unlock()
}

// head returns the node whose first key is k, or nil. Cost: one shard
// read lock and one map probe.
func (ix *Index) head(k Key) *node {
	sh := ix.shardOf(k)
	sh.mu.RLock()
	n := sh.m[k]
	sh.mu.RUnlock()
	return n
}

func (ix *Index) shardOf(k Key) *headShard {
	// Keys are xxh3 outputs, so their low bits are uniform already.
	return &ix.heads[uint64(k)&ix.mask]
}

// A new node's run gets room for twice the keys its first event brings, at
// least minKeys: a request's chain grows over several events.
const minKeys = 8

// A full run grows by the rest of the event's keys or by 1/keysGrowth of
// its length, whichever is more, not by doubling: runs then hold 4-7% more
// keys than they use, not 25-30%.
const keysGrowth = 8

// newKeys returns an empty key array with room for at least c keys (all
// its size class holds).
func newKeys(c int) []Key {
	return slices.Grow([]Key(nil), c)
}

// newNode returns a node holding the single key k with holder set s, with
// room for its first event's capHint keys.
func newNode(parent *node, attach int32, k Key, s *holders.Set, capHint int) *node {
	n := &node{parent: parent, attach: attach, first: k, maxAttach: -1, cidx: -1}
	n.keys = append(newKeys(min(max(2*capHint, minKeys), maxRun)), k)
	n.segs0[0] = seg{0, s}
	n.segs = n.segs0[:1]
	n.dirty = true
	return n
}

// visibleLocked is the length of the run before its first key that no
// worker holds: no match can extend past it, so readers need not see it.
func (n *node) visibleLocked() int32 {
	for _, s := range n.segs {
		if s.set == nil {
			return s.start
		}
	}
	return int32(len(n.keys))
}

// segsAgree reports whether segments vs and ws agree below offset vis.
func segsAgree(vs, ws []seg, vis int32) bool {
	for i := 0; ; i++ {
		va := i < len(vs) && vs[i].start < vis
		wa := i < len(ws) && ws[i].start < vis
		if va != wa {
			return false
		}
		if !va {
			return true
		}
		if vs[i] != ws[i] {
			return false
		}
	}
}

// deadLocked reports whether n holds nothing and has no children.
func (n *node) deadLocked() bool {
	return len(n.children) == 0 && len(n.segs) == 1 && n.segs[0].set == nil
}

// publishLocked makes n's writer-side state what readers see. Cost: one
// atomic store when the published view still describes the run (see
// view), else a new view.
func (n *node) publishLocked() {
	vis := n.visibleLocked()
	old := n.view.Load()
	if old != nil && len(old.keys) > 0 && cap(n.keys) > 0 && &old.keys[0] == &n.keys[:1][0] &&
		int(vis) <= len(old.keys) && segsAgree(old.segs, n.segs, vis) {
		old.n.Store(vis)
		n.dirty = false
		return
	}
	v := &n.view0
	if old != nil {
		v = new(view)
	}
	v.keys = n.keys[:cap(n.keys)]
	if len(n.segs) <= viewSegs {
		v.segs = v.segs0[:copy(v.segs0[:], n.segs)]
	} else {
		v.segs = n.segs
		n.segsShared = true
	}
	v.n.Store(vis)
	n.view.Store(v)
	n.dirty = false
}

// segIndex returns the index of the segment that contains offset off.
func segIndex(segs []seg, off int32) int {
	lo, hi := 0, len(segs)
	for hi-lo > 1 {
		m := int(uint(lo+hi) >> 1)
		if segs[m].start <= off {
			lo = m
		} else {
			hi = m
		}
	}
	return lo
}

// appendSeg appends the segment (start, s) to segs, unless the last one
// has an equal set.
func appendSeg(segs []seg, start int32, s *holders.Set) []seg {
	if l := len(segs); l > 0 && holders.Equal(segs[l-1].set, s) {
		return segs
	}
	return append(segs, seg{start, s})
}

// A node keeps its dead tail (trailing keys nobody holds) until it is at
// least compactMin keys and half the run, then copies the live part.
const compactMin = 32

// loc is a key's position in the tree.
type loc struct {
	n   *node
	off int32
}

// cursor is a worker's writer-side access to the tree, used under the
// worker's mu. It holds one node lock at a time (two, parent then child,
// while stepping down), batches consecutive holder-set changes on the held
// node into one segment rewrite, and publishes a node when it releases it.
type cursor struct {
	ix   *Index
	held *node

	// The pending change: op on offsets [lo, hi) of held.
	pending bool
	lo, hi  int32
	op      holders.Op

	// memo of the last set transition.
	memoOK       bool
	memoOp       holders.Op
	memoFrom, to *holders.Set

	tmp []seg // scratch for segment rewrites

	// With invariantsOn, the nodes held and retired since the last check.
	touched, retired []*node
}

// lock makes n the held node, releasing the previous one; a child of the
// held node is locked before its parent is released.
func (c *cursor) lock(n *node) {
	if c.held == n {
		return
	}
	if c.held != nil && n.parent == c.held {
		n.mu.Lock()
		c.releaseAlive()
	} else {
		c.release()
		n.mu.Lock()
	}
	c.held = n
	if invariantsOn {
		c.touched = append(c.touched, n)
	}
}

// releaseAlive releases the held node, which has a child (so is alive).
func (c *cursor) releaseAlive() {
	n := c.held
	c.flushLocked()
	if n.dirty {
		n.publishLocked()
	}
	n.mu.Unlock()
	c.held = nil
}

// release publishes and releases the held node, or retires it if it died.
func (c *cursor) release() {
	n := c.held
	if n == nil {
		return
	}
	c.flushLocked()
	c.held = nil
	if n.deadLocked() {
		// Not published: a Match that still reaches n found it in heads
		// before this batch retired it, so every holder its last view
		// shows that is gone now left during that Match.
		n.dead.Store(true)
		n.mu.Unlock()
		var log *[]*node
		if invariantsOn {
			log = &c.retired
		}
		c.ix.retire(n, log)
		return
	}
	c.compactLocked(n)
	if n.dirty {
		n.publishLocked()
	}
	n.mu.Unlock()
}

// finish releases the held node at the end of each batch.
func (c *cursor) finish() {
	c.release()
	c.memoOK = false
}

// retire removes the dead node n from heads and its parent, and retires
// the parent too if that left it dead, logging each to log when not nil.
// It takes one node lock at a time, going up.
func (ix *Index) retire(n *node, log *[]*node) {
	for {
		// The writer that killed n and one that found it dead may both
		// retire it; the first does.
		if !n.retired.CompareAndSwap(false, true) {
			return
		}
		if log != nil {
			*log = append(*log, n)
		}
		ix.nodes.remove(n)
		sh := ix.shardOf(n.first)
		sh.mu.Lock()
		if sh.m[n.first] == n {
			delete(sh.m, n.first)
		}
		sh.mu.Unlock()
		p := n.parent
		if p == nil {
			return
		}
		p.mu.Lock()
		unlinkChildLocked(p, n)
		if !p.deadLocked() {
			p.mu.Unlock()
			return
		}
		p.dead.Store(true)
		p.mu.Unlock()
		n = p
	}
}

// unlinkChildLocked removes c from p's children if it is still there.
func unlinkChildLocked(p, c *node) {
	i := c.cidx
	if i < 0 || int(i) >= len(p.children) || p.children[i] != c {
		return
	}
	last := len(p.children) - 1
	p.children[i] = p.children[last]
	p.children[i].cidx = i
	p.children[last] = nil
	p.children = p.children[:last]
	c.cidx = -1
	if last == 0 {
		p.maxAttach = -1
	}
}

// keyAt returns the key at l, locking l.n.
func (c *cursor) keyAt(l loc) Key {
	c.lock(l.n)
	return l.n.keys[l.off]
}

// top returns the position of the top-level key k, creating a node for it
// with holder set s and room for capHint keys if there is none (fresh).
// The returned node is held.
func (c *cursor) top(k Key, s *holders.Set, capHint int) (l loc, fresh bool) {
	sh := c.ix.shardOf(k)
	for {
		// One write-lock round trip for the lookup and the insert: a new
		// sequence is the common case.
		sh.mu.Lock()
		t := sh.m[k]
		switch {
		case t != nil && t.parent == nil && !t.dead.Load():
			sh.mu.Unlock()
			c.lock(t)
			if !t.dead.Load() {
				return loc{t, 0}, false
			}
			continue // it died meanwhile: look again
		case t == nil || t.dead.Load():
			nt := newNode(nil, -1, k, s, capHint)
			c.ix.nodes.add(nt)
			sh.m[k] = nt
			sh.mu.Unlock()
			c.lock(nt)
			return loc{nt, 0}, true
		default:
			// A 64-bit collision with a key deeper in the tree: keep this
			// node out of heads, where no prompt can reach it.
			sh.mu.Unlock()
			c.ix.collisions.Add(1)
			nt := newNode(nil, -1, k, s, capHint)
			c.ix.nodes.add(nt)
			c.lock(nt)
			return loc{nt, 0}, true
		}
	}
}

// next returns the position of key k under the key at p, creating it with
// holder set s if it is not in the tree (fresh). The returned node is
// held. A new key extends p's run when p is its node's last key (below
// maxRun), else starts a child node attached at p. Cost: O(1) along a
// run; a heads probe when p's node has children at p.
func (c *cursor) next(p loc, k Key, s *holders.Set, capHint int) (l loc, fresh bool) {
	n := p.n
	for {
		c.lock(n)
		last := int32(len(n.keys)) - 1
		if p.off < last && n.keys[p.off+1] == k {
			return loc{n, p.off + 1}, false
		}
		if len(n.children) > 0 && n.maxAttach >= p.off {
			sh := c.ix.shardOf(k)
			sh.mu.RLock()
			ch := sh.m[k]
			sh.mu.RUnlock()
			// A child marked dead is as good as absent: a new one replaces
			// it in heads, and its retirer unlinks it from n.
			if ch != nil && ch.parent == n && ch.attach == p.off && !ch.dead.Load() {
				c.lock(ch) // parent first, then the parent is released
				if !ch.dead.Load() {
					return loc{ch, 0}, false
				}
				// It died after we looked: releasing it retires it, and
				// n may have changed meanwhile, so look again.
				continue
			}
		}
		if p.off == last && last+1 < maxRun {
			c.appendLocked(n, k, s, capHint)
			return loc{n, last + 1}, true
		}
		ch := newNode(n, p.off, k, s, capHint)
		c.ix.nodes.add(ch)
		sh := c.ix.shardOf(k)
		sh.mu.Lock()
		if cur := sh.m[k]; cur == nil || cur.dead.Load() {
			sh.m[k] = ch
		} else {
			c.ix.collisions.Add(1) // see top
		}
		sh.mu.Unlock()
		ch.cidx = int32(len(n.children))
		n.children = append(n.children, ch)
		n.maxAttach = max(n.maxAttach, p.off)
		c.lock(ch)
		return loc{ch, 0}, true
	}
}

// appendLocked extends n's run with key k held by s. It writes only past
// len(n.keys), which no published view covers.
func (c *cursor) appendLocked(n *node, k Key, s *holders.Set, capHint int) {
	off := int32(len(n.keys))
	if l := len(n.keys); l == cap(n.keys) {
		keys := newKeys(l + min(max(capHint, l/keysGrowth, minKeys), maxRun-l))[:l]
		copy(keys, n.keys)
		n.keys = keys
	}
	n.keys = append(n.keys, k)
	if !holders.Equal(n.segs[len(n.segs)-1].set, s) {
		c.ownSegsLocked(n, len(n.segs)+1)
		n.segs = append(n.segs, seg{off, s})
	}
	n.dirty = true
}

// ownSegsLocked makes n.segs private to the writer, with room for want.
func (c *cursor) ownSegsLocked(n *node, want int) {
	if want <= viewSegs {
		if &n.segs[0] != &n.segs0[0] {
			n.segs = n.segs0[:copy(n.segs0[:], n.segs)]
			n.segsShared = false
		}
		return
	}
	if n.segsShared || cap(n.segs) < want {
		ns := make([]seg, len(n.segs), want+2)
		copy(ns, n.segs)
		n.segs = ns
		n.segsShared = false
	}
}

// mediaOf returns worker w's media at l, counting the pending change.
func (c *cursor) mediaOf(l loc, w uint32) uint8 {
	c.lock(l.n)
	s := l.n.segs[segIndex(l.n.segs, l.off)].set
	if c.pending && l.off >= c.lo && l.off < c.hi {
		s = c.transform(s, c.op)
	}
	return s.Media(w)
}

// change applies op to the key at l, batching it with the pending change
// when it extends it.
func (c *cursor) change(l loc, op holders.Op) {
	c.lock(l.n)
	if c.pending && c.op == op {
		switch l.off {
		case c.hi:
			c.hi++
			return
		case c.lo - 1:
			c.lo--
			return
		}
		if l.off >= c.lo && l.off < c.hi {
			return // ops are idempotent
		}
	}
	c.flushLocked()
	c.pending, c.lo, c.hi, c.op = true, l.off, l.off+1, op
}

// flushLocked applies the pending change to the held node.
func (c *cursor) flushLocked() {
	if !c.pending {
		return
	}
	c.pending = false
	c.applyLocked(c.held, c.lo, c.hi, c.op)
}

// transform returns s changed by op, remembering the last answer.
func (c *cursor) transform(s *holders.Set, op holders.Op) *holders.Set {
	if c.memoOK && c.memoOp == op && c.memoFrom == s {
		return c.to
	}
	t := op.Apply(s, c.ix.singleFn)
	c.memoOK, c.memoOp, c.memoFrom, c.to = true, op, s, t
	return t
}

// applyLocked changes the holder sets of offsets [lo, hi) of n by op.
// Cost: O(log segments) when nothing changes, else O(segments) plus one
// holders.Op.Apply per distinct set in the range.
func (c *cursor) applyLocked(n *node, lo, hi int32, op holders.Op) {
	segs := n.segs
	end := int32(len(n.keys))
	j := segIndex(segs, lo)
	if j+1 < len(segs) {
		end = segs[j+1].start
	}
	if hi <= end && c.transform(segs[j].set, op) == segs[j].set {
		return
	}
	tmp := append(c.tmp[:0], segs[:j]...)
	l := int32(len(n.keys))
	for k := j; k < len(segs); k++ {
		s := segs[k]
		e := l
		if k+1 < len(segs) {
			e = segs[k+1].start
		}
		if s.start >= hi {
			tmp = appendSeg(tmp, s.start, s.set)
			continue
		}
		if s.start < lo {
			tmp = appendSeg(tmp, s.start, s.set)
		}
		tmp = appendSeg(tmp, max(s.start, lo), c.transform(s.set, op))
		if e > hi {
			tmp = appendSeg(tmp, hi, s.set)
		}
	}
	c.tmp = tmp
	switch {
	case len(tmp) <= viewSegs:
		n.segs = n.segs0[:len(tmp)]
		n.segsShared = false
	case n.segsShared || cap(n.segs) < len(tmp):
		n.segs = make([]seg, len(tmp), len(tmp)+2)
		n.segsShared = false
	default:
		n.segs = n.segs[:len(tmp)]
	}
	copy(n.segs, tmp)
	clear(c.tmp[:len(tmp)]) // drop set pointers from the scratch
	n.dirty = true
}

// compactLocked drops n's dead tail when it is at least compactMin keys
// and half the run, keeping every key a child attaches to.
func (c *cursor) compactLocked(n *node) {
	ls := n.segs[len(n.segs)-1]
	l := int32(len(n.keys))
	if ls.set != nil || l-ls.start < compactMin || 2*(l-ls.start) < l {
		return
	}
	keep := ls.start
	if len(n.children) > 0 {
		n.maxAttach = -1
		for _, ch := range n.children {
			n.maxAttach = max(n.maxAttach, ch.attach)
		}
		keep = max(keep, n.maxAttach+1)
	}
	if keep >= l || l-keep < compactMin {
		return
	}
	keys := make([]Key, keep, keep+keep/8+1)
	copy(keys, n.keys)
	n.keys = keys
	if ls.start >= keep {
		c.ownSegsLocked(n, len(n.segs))
		n.segs = n.segs[:len(n.segs)-1]
	}
	n.dirty = true
}
