package indexer

import (
	"fmt"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// invariantSpan is the resident blocks a worker may hold per batch between
// two of its invariant checks (see Worker.endLocked). Under -race a check
// costs about 60 times what it does without, a block: at 256 the checks
// took 90% of the simulator's race-run tests (TestNoCollapse 159 s, 13 s
// without them); at 32, 17 s. Nothing between checks goes unchecked.
const invariantSpan = 32

// assertInvariantsLocked checks, at the end of a change to w, the nodes it
// retired and held since the last check, its engine map and the tree's
// record of it. Callers hold w.mu and no node lock. For tests only: it
// allocates.
func (w *Worker) assertInvariantsLocked() {
	c := &w.cur
	live := w.assertNodesLocked()
	locs := w.assertEntriesLocked()
	w.assertAliasesLocked(locs)
	w.assertTreeLocked(locs, live)
	w.assertSideLocked()
	clear(c.touched)
	clear(c.retired)
	c.touched, c.retired = c.touched[:0], c.retired[:0]
}

// assertNodesLocked checks the nodes w retired and held since the last
// check, and returns the held ones still alive.
func (w *Worker) assertNodesLocked() []*node {
	c := &w.cur
	for _, n := range c.retired {
		w.ix.assertRetired(n)
	}
	seen := map[*node]bool{}
	var live []*node
	for _, n := range c.touched {
		if seen[n] {
			continue
		}
		seen[n] = true
		n.mu.Lock()
		if !n.dead.Load() {
			w.ix.assertNodeLocked(n)
			live = append(live, n)
		}
		n.mu.Unlock()
	}
	return live
}

// assertEntriesLocked checks w's engine map entry by entry and its counts,
// and returns what the entries at each key add up to.
func (w *Worker) assertEntriesLocked() map[loc]locTally {
	locs := map[loc]locTally{}
	var res int64
	var resBy [events.NumMedia]int64
	dups := 0
	for slot := range w.engine.All() {
		e := w.entry(slot)
		h := w.engine.Hash(slot)
		m := e.media()
		if m == 0 {
			brokenInvariant(fmt.Sprintf("worker %s: engine entry %#x holds no medium", w.info.Ref, h))
		}
		if w.info.Keyed {
			if kc := w.keyed[h]; e.dup() != (kc != nil) {
				brokenInvariant(fmt.Sprintf("worker %s: keyed entry %#x has dup %v, counts %v", w.info.Ref, h, e.dup(), kc))
			} else if kc != nil {
				dups++
				if !kc.valid() || kc.simple() || kc.media() != m {
					brokenInvariant(fmt.Sprintf("worker %s: keyed entry %#x in media %06b has counts %+v", w.info.Ref, h, m, *kc))
				}
			}
		} else if r := w.dups[h]; e.dup() != (r != nil) {
			brokenInvariant(fmt.Sprintf("worker %s: engine entry %#x has dup %v, store counts %v", w.info.Ref, h, e.dup(), r))
		} else if r != nil {
			dups++
			for i, n := range r {
				if (n != 0) != (m&(1<<i) != 0) {
					brokenInvariant(fmt.Sprintf("worker %s: engine entry %#x in media %06b has store counts %v", w.info.Ref, h, m, *r))
				}
			}
			if !anyAbove1(r) {
				brokenInvariant(fmt.Sprintf("worker %s: engine entry %#x has store counts %v, none over 1", w.info.Ref, h, *r))
			}
		}
		l := w.locOf(e) // panics on a stale node id
		if l.n.dead.Load() {
			brokenInvariant(fmt.Sprintf("worker %s: engine entry %#x in dead node %p (id %d)", w.info.Ref, h, l.n, e.node()))
		}
		a := locs[l]
		a.entries++
		a.media |= m
		for i := range events.NumMedia {
			if m&(1<<i) != 0 {
				a.by[i]++
				if !w.info.Keyed {
					resBy[i]++
				}
			}
		}
		locs[l] = a
		if !w.info.Keyed {
			res++
			continue
		}
		kc := w.countsLocked(slot)
		res += int64(kc.blocks)
		for i, n := range kc.in {
			resBy[i] += int64(n)
		}
	}
	sides := len(w.dups)
	if w.info.Keyed {
		sides = len(w.keyed)
		if len(w.dups) != 0 || len(w.aliases) != 0 {
			brokenInvariant(fmt.Sprintf("worker %s: keyed, with %d store counts and %d aliases of engine entries", w.info.Ref, len(w.dups), len(w.aliases)))
		}
	} else if len(w.keyed) != 0 {
		brokenInvariant(fmt.Sprintf("worker %s: fed engine events, with %d keyed counts", w.info.Ref, len(w.keyed)))
	}
	if dups != sides {
		brokenInvariant(fmt.Sprintf("worker %s: %d store counts kept for %d entries stored more than once", w.info.Ref, sides, dups))
	}
	if res != w.res || resBy != w.resBy {
		brokenInvariant(fmt.Sprintf("worker %s: resident counts %d %v, engine entries say %d %v", w.info.Ref, w.res, w.resBy, res, resBy))
	}
	return locs
}

// assertAliasesLocked checks that w's aliases count exactly the keys two
// or more entries resolve to, and their entries' media.
func (w *Worker) assertAliasesLocked(locs map[loc]locTally) {
	for l, a := range w.aliases {
		at := locs[l]
		if at.entries != a.entries || a.entries < 2 {
			brokenInvariant(fmt.Sprintf("worker %s: alias at %p+%d counts %d entries, the engine map has %d there", w.info.Ref, l.n, l.off, a.entries, at.entries))
		}
		for m, k := range a.media {
			if int(k) != at.by[m] {
				brokenInvariant(fmt.Sprintf("worker %s: alias at %p+%d counts %d entries in %s, the engine map has %d", w.info.Ref, l.n, l.off, k, events.Medium(m), at.by[m]))
			}
		}
	}
	for l, a := range locs {
		if a.entries > 1 && w.aliases[l] == nil {
			brokenInvariant(fmt.Sprintf("worker %s: %d engine entries at %p+%d but no alias", w.info.Ref, a.entries, l.n, l.off))
		}
	}
}

// assertTreeLocked checks that the tree has w holding each key in exactly
// the media of w's entries there, and nothing more in the nodes it held.
func (w *Worker) assertTreeLocked(locs map[loc]locTally, live []*node) {
	for l, a := range locs {
		l.n.mu.Lock()
		if int(l.off) >= len(l.n.keys) || l.off < 0 {
			brokenInvariant(fmt.Sprintf("worker %s: engine entry at %p+%d, past the run's %d keys", w.info.Ref, l.n, l.off, len(l.n.keys)))
		}
		got := l.n.segs[segIndex(l.n.segs, l.off)].set.Media(uint32(w.id))
		l.n.mu.Unlock()
		if got != a.media {
			brokenInvariant(fmt.Sprintf("worker %s: tree has media %06b at %p+%d, engine entries say %06b", w.info.Ref, got, l.n, l.off, a.media))
		}
	}
	for _, n := range live {
		n.mu.Lock()
		if !n.dead.Load() {
			for i, s := range n.segs {
				m := s.set.Media(uint32(w.id))
				if m == 0 {
					continue
				}
				end := int32(len(n.keys))
				if i+1 < len(n.segs) {
					end = n.segs[i+1].start
				}
				for off := s.start; off < end; off++ {
					if a := locs[loc{n, off}]; a.media != m {
						brokenInvariant(fmt.Sprintf("worker %s: tree has media %06b at %p+%d, engine entries say %06b", w.info.Ref, m, n, off, a.media))
					}
				}
			}
		}
		n.mu.Unlock()
	}
}

// locTally is what a worker's engine entries at one key add up to.
type locTally struct {
	entries int                  // entries at the key
	media   uint8                // the union of their media
	by      [events.NumMedia]int // entries with a store in each medium
}

// assertNodeLocked checks the invariants of the live node n (see node),
// that it is published as its writer left it, and that it is in heads
// (unless a key collision kept it out) and the node table.
func (ix *Index) assertNodeLocked(n *node) {
	broken := func(format string, args ...any) {
		brokenInvariant(fmt.Sprintf("node %p (id %d, first key %#016x): ", n, n.id, uint64(n.first)) + fmt.Sprintf(format, args...))
	}
	if len(n.keys) == 0 || n.keys[0] != n.first {
		broken("run of %d keys does not start with the node's first key", len(n.keys))
	}
	if len(n.segs) == 0 || n.segs[0].start != 0 {
		broken("segments %v do not start at offset 0", n.segs)
	}
	for i, s := range n.segs {
		if s.start >= int32(len(n.keys)) {
			broken("segment %d starts at %d, past the run's %d keys", i, s.start, len(n.keys))
		}
		if i > 0 && s.start <= n.segs[i-1].start {
			broken("segment %d starts at %d, segment %d at %d", i-1, n.segs[i-1].start, i, s.start)
		}
		if i > 0 && holders.Equal(s.set, n.segs[i-1].set) {
			broken("segments %d and %d have equal sets", i-1, i)
		}
		if why := s.set.Broken(); why != "" {
			broken("segment %d's set: %s", i, why)
		}
	}
	for i, ch := range n.children {
		if ch.dead.Load() {
			continue // its retirer is about to unlink it
		}
		if ch.parent != n || int(ch.cidx) != i {
			broken("child %d (%p) links to parent %p at index %d", i, ch, ch.parent, ch.cidx)
		}
		if ch.attach < 0 || ch.attach > n.maxAttach || int(n.maxAttach) >= len(n.keys) {
			broken("child %d (%p) attaches at %d, maxAttach %d, run of %d keys", i, ch, ch.attach, n.maxAttach, len(n.keys))
		}
	}
	if n.deadLocked() {
		broken("holds nothing and has no children, but is not dead")
	}
	if n.dirty {
		broken("changed but not published after its writer released it")
	}
	vis := n.visibleLocked()
	v := n.view.Load()
	switch {
	case v == nil:
		broken("never published")
	case v.n.Load() != vis:
		broken("view shows %d keys, the run's visible length is %d", v.n.Load(), vis)
	case int(vis) > len(v.keys):
		broken("view's array of %d keys is shorter than its length %d", len(v.keys), vis)
	case !segsAgree(v.segs, n.segs, vis):
		broken("view's segments %v differ from the writer's %v below %d", v.segs, n.segs, vis)
	}
	for i := range vis {
		if v.keys[i] != n.keys[i] {
			broken("view's key %d is %#016x, the run's %#016x", i, uint64(v.keys[i]), uint64(n.keys[i]))
		}
	}
	if ix.collisions.Load() == 0 {
		if h := ix.head(n.first); h != n {
			broken("heads has %p for its first key", h)
		}
	}
	if got := ix.nodes.get(n.id, n.gen); got != n {
		broken("node table has %p for its id", got)
	}
}

// assertRetired checks that the retired node n is out of heads, its
// parent's children and the node table.
func (ix *Index) assertRetired(n *node) {
	if !n.dead.Load() {
		brokenInvariant(fmt.Sprintf("retired node %p (id %d) is not dead", n, n.id))
	}
	if h := ix.head(n.first); h == n {
		brokenInvariant(fmt.Sprintf("retired node %p (id %d) is still in heads", n, n.id))
	}
	if p := n.parent; p != nil {
		p.mu.Lock()
		for i, ch := range p.children {
			if ch == n {
				p.mu.Unlock()
				brokenInvariant(fmt.Sprintf("retired node %p (id %d) is still child %d of %p", n, n.id, i, p))
			}
		}
		p.mu.Unlock()
	}
	ix.nodes.mu.Lock()
	cs := *ix.nodes.chunks.Load()
	still := cs[n.id/nodeChunkLen].nodes[n.id%nodeChunkLen] == n
	ix.nodes.mu.Unlock()
	if still {
		brokenInvariant(fmt.Sprintf("retired node %p (id %d) is still in the node table", n, n.id))
	}
}

// assertSideLocked checks the side groups: each held count is the number
// of the group's blocks at the key (engine-fed workers), no count or
// store count is zero, and the totals agree.
func (w *Worker) assertSideLocked() {
	var total int64
	for _, sg := range w.side.order {
		if g := w.groupOfLocked(sg.g.Index); g == nil || g.side != sg {
			brokenInvariant("a side group not in the worker's groups")
		}
		if sg.g.Blocks != int64(len(sg.held)) {
			brokenInvariant("a side group's block count is not its held keys'")
		}
		total += int64(len(sg.held))
		for _, n := range sg.held {
			if n == 0 {
				brokenInvariant("a side key held by no block")
			}
		}
		if sg.blocks == nil {
			continue
		}
		per := map[Key]uint32{}
		for _, b := range sg.blocks {
			if b.refs == 0 {
				brokenInvariant("a side block with no stores")
			}
			per[b.key]++
		}
		if len(per) != len(sg.held) {
			brokenInvariant("a side group's held keys are not its blocks' keys")
		}
		for k, n := range per {
			if sg.held[k] != n {
				brokenInvariant("a side key's count is not its blocks'")
			}
		}
	}
	if total != w.sideRes {
		brokenInvariant("the side groups' held keys do not add up")
	}
	for _, sp := range w.side.specs {
		if sp.held == nil {
			continue
		}
		want := map[Key]uint64{}
		for _, sg := range sp.members {
			if sg.spec != sp {
				brokenInvariant("a spec's member names another spec")
			}
			for k := range sg.held {
				want[k] |= sg.bit
			}
		}
		if len(want) != len(sp.held) {
			brokenInvariant("a spec's keys are not its members' held keys")
		}
		for k, v := range want {
			if sp.held[k] != v {
				brokenInvariant("a spec's bits for a key are not its holders'")
			}
		}
	}
}
