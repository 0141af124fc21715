package indexer

import (
	"slices"
	"sync"

	"github.com/kvindex/kvindex/events"
)

// refIndex is the simplest index that could work: one mutex, a map from
// key to each holder's per-medium store counts, and per worker a map from
// engine hash to key. It is the reference model the randomised and stress
// tests check Index against, and the naive baseline (map+mutex) the
// benchmarks measure Index against. It applies events exactly as the
// package documentation says, without capacity or budget.
type refIndex struct {
	mu      sync.RWMutex
	models  map[string]int // block sizes
	res     map[Key]map[WorkerID]*[events.NumMedia]uint32
	workers []*refWorker
}

type refWorker struct {
	ix     *refIndex
	id     WorkerID
	model  string
	bs     int
	engine map[uint64]*refEntry
	// groups are the KV-cache groups learned; anchor the first prefix
	// group's index (-1: none), whose blocks are engine and res.
	groups map[int]*refGroup
	anchor int
	stats  Stats
}

// refGroup is a learned group; a side group's blocks and held keys.
type refGroup struct {
	class      GroupClass
	bs, window int
	blocks     map[uint64]*refSide
	held       map[Key]int
}

type refSide struct {
	key  Key
	refs int
}

type refEntry struct {
	key  Key
	refs [events.NumMedia]uint32
}

func newRefIndex() *refIndex {
	return &refIndex{models: map[string]int{}, res: map[Key]map[WorkerID]*[events.NumMedia]uint32{}}
}

func (r *refIndex) addModel(name string, bs int) { r.models[name] = bs }

func (r *refIndex) addWorker(model string) *refWorker {
	w := &refWorker{ix: r, id: WorkerID(len(r.workers)), model: model, bs: r.models[model], engine: map[uint64]*refEntry{},
		groups: map[int]*refGroup{}, anchor: -1}
	r.workers = append(r.workers, w)
	return w
}

func (w *refWorker) apply(b *events.Batch) {
	w.ix.mu.Lock()
	defer w.ix.mu.Unlock()
	for i := range b.Events {
		w.applyLocked(&b.Events[i])
	}
}

func (w *refWorker) reset() {
	w.ix.mu.Lock()
	defer w.ix.mu.Unlock()
	w.clearLocked()
	w.stats.Resets++
}

func (w *refWorker) addRef(e *refEntry, m events.Medium) {
	if e.refs == ([events.NumMedia]uint32{}) {
		w.stats.ResidentBlocks++
	}
	if e.refs[m] == 0 {
		w.stats.ResidentByMedium[m]++
	}
	e.refs[m]++
	hs := w.ix.res[e.key]
	if hs == nil {
		hs = map[WorkerID]*[events.NumMedia]uint32{}
		w.ix.res[e.key] = hs
	}
	h := hs[w.id]
	if h == nil {
		h = new([events.NumMedia]uint32)
		hs[w.id] = h
	}
	h[m]++
}

// dropRefs removes n stores in medium m of e's key (all when n is 0).
func (w *refWorker) dropRefs(key Key, m events.Medium, n uint32) {
	hs := w.ix.res[key]
	h := hs[w.id]
	if h == nil {
		return
	}
	if n == 0 || h[m] <= n {
		h[m] = 0
	} else {
		h[m] -= n
	}
	if *h == ([events.NumMedia]uint32{}) {
		delete(hs, w.id)
		if len(hs) == 0 {
			delete(w.ix.res, key)
		}
	}
}

func (w *refWorker) dropEntry(e *refEntry) {
	if e.refs == ([events.NumMedia]uint32{}) {
		return
	}
	for m, r := range e.refs {
		if r != 0 {
			w.dropRefs(e.key, events.Medium(m), r)
			w.stats.ResidentByMedium[m]--
		}
	}
	e.refs = [events.NumMedia]uint32{}
	w.stats.ResidentBlocks--
}

// group returns the group a store applies to (nil: refused), learning it
// as the package documentation says: the first prefix group is the anchor;
// a group described anew is relearned while empty, else refused.
func (w *refWorker) group(ev *events.Event) *refGroup {
	idx := 0
	if ev.HasGroupIdx {
		idx = ev.GroupIdx
	}
	if idx < 0 || idx >= MaxGroups {
		w.stats.InvalidEvents++
		return nil
	}
	class, window, bs := ClassOf(ev.SpecKind), 0, ev.BlockSize
	if class == ClassWindow {
		if ev.HasSlidingWindow && ev.SlidingWindow > 0 {
			window = ev.SlidingWindow
		} else {
			class = ClassOther
		}
	}
	if len(ev.TokenIDs) == 0 {
		bs = 0
	}
	g := w.groups[idx]
	if g != nil && (g.class != class || g.window != window || bs != 0 && g.bs != 0 && g.bs != bs) {
		held := len(g.held)
		if idx == w.anchor {
			held = int(w.stats.ResidentBlocks)
		}
		if held > 0 {
			w.stats.LayoutChanges++
			return nil
		}
		if idx == w.anchor {
			w.anchor = -1
		}
		g = nil
	}
	if g == nil {
		g = &refGroup{class: class, window: window}
		switch {
		case class == ClassPrefix && w.anchor < 0:
			w.anchor = idx
		case class != ClassOther:
			g.blocks, g.held = map[uint64]*refSide{}, map[Key]int{}
		}
		w.groups[idx] = g
	}
	if g.bs == 0 {
		g.bs = bs
	}
	return g
}

func (w *refWorker) applyLocked(ev *events.Event) {
	switch ev.Kind {
	case events.KindAllBlocksCleared:
		w.clearLocked()
		w.stats.Clears++
		return
	case events.KindBlockStored:
		w.store(ev)
	case events.KindBlockRemoved:
		w.remove(ev)
	default:
		w.stats.InvalidEvents++
	}
}

func (w *refWorker) remove(ev *events.Event) {
	if ev.HasGroupIdx && ev.GroupIdx != w.anchor {
		if ev.GroupIdx < 0 || ev.GroupIdx >= MaxGroups {
			w.stats.InvalidEvents++
			return
		}
		g := w.groups[ev.GroupIdx]
		switch {
		case g == nil:
			w.stats.UnknownGroupBlocks += int64(len(ev.BlockHashes))
		case g.blocks != nil:
			for _, h := range ev.BlockHashes {
				b := g.blocks[h]
				if b == nil {
					w.stats.UnknownBlocks++
					continue
				}
				w.stats.BlocksRemoved++
				if b.refs--; b.refs == 0 {
					delete(g.blocks, h)
					w.unhold(g, b.key)
				}
			}
		default:
			w.stats.SkippedGroupEvents++
		}
		return
	}
	m := ev.Medium
	for _, h := range ev.BlockHashes {
		e := w.engine[h]
		if e == nil || e.refs[m] == 0 {
			w.stats.UnknownBlocks++
			continue
		}
		e.refs[m]--
		w.dropRefs(e.key, m, 1)
		if e.refs[m] == 0 {
			w.stats.ResidentByMedium[m]--
			if e.refs == ([events.NumMedia]uint32{}) {
				w.stats.ResidentBlocks--
				delete(w.engine, h)
			}
		}
		w.stats.BlocksRemoved++
	}
}

func (w *refWorker) hold(g *refGroup, k Key) {
	if g.held[k]++; g.held[k] == 1 {
		w.stats.SideBlocks++
	}
}

func (w *refWorker) unhold(g *refGroup, k Key) {
	if g.held[k]--; g.held[k] == 0 {
		delete(g.held, k)
		w.stats.SideBlocks--
	}
}

// keyOf finds engine hash h's key for bs-token blocks in g, the anchor or
// another side group of that block size, as Worker.keyOfHashLocked does.
func (w *refWorker) keyOf(g *refGroup, h uint64, bs int) (Key, bool) {
	if b := g.blocks[h]; b != nil {
		return b.key, true
	}
	if a := w.groups[w.anchor]; a != nil && a.bs == bs {
		if e := w.engine[h]; e != nil {
			return e.key, true
		}
	}
	for _, o := range w.groups {
		if o != g && o.blocks != nil && o.bs == bs {
			if b := o.blocks[h]; b != nil {
				return b.key, true
			}
		}
	}
	return 0, false
}

func (w *refWorker) store(ev *events.Event) {
	m := ev.Medium
	n := len(ev.BlockHashes)
	bs := ev.BlockSize
	if len(ev.TokenIDs) > 0 && (bs <= 0 || len(ev.TokenIDs) != n*bs || ev.ExtraKeys != nil && len(ev.ExtraKeys) != n) {
		w.stats.InvalidEvents++
		return
	}
	g := w.group(ev)
	if g == nil {
		return
	}
	idx := 0
	if ev.HasGroupIdx {
		idx = ev.GroupIdx
	}
	side := idx != w.anchor
	if side && g.blocks == nil {
		w.stats.SkippedGroupEvents++
		return
	}
	if len(ev.TokenIDs) == 0 {
		for _, h := range ev.BlockHashes {
			switch {
			case side && g.blocks[h] != nil:
				g.blocks[h].refs++
			case !side && w.engine[h] != nil:
				w.addRef(w.engine[h], m)
			default:
				w.stats.UnknownBlocks++
			}
		}
		return
	}
	if !side && bs != w.bs {
		w.stats.BlockSizeMismatches++
	}
	parent := RootKey(w.model, ev.LoRAName)
	if ev.HasParent {
		var k Key
		var ok bool
		if side {
			k, ok = w.keyOf(g, ev.ParentHash, bs)
		} else if e := w.engine[ev.ParentHash]; e != nil {
			k, ok = e.key, true
		}
		if ok {
			parent = k
		} else {
			parent = orphanRoot(w.id, ev.ParentHash)
			w.stats.Orphans += int64(n)
		}
	}
	for i, h := range ev.BlockHashes {
		var extra events.ExtraKeys
		switch {
		case ev.ExtraKeys != nil:
			extra = ev.ExtraKeys[i]
		case ev.LoRAName != "" || ev.CacheSalt != "":
			px := PromptExtras{LoRAName: ev.LoRAName}
			if !ev.HasParent {
				px.CacheSalt = ev.CacheSalt
			}
			extra, _ = px.blockExtras(i, nil)
		}
		k := BlockKey(parent, ev.TokenIDs[i*bs:(i+1)*bs], extra)
		parent = k
		if side {
			b := g.blocks[h]
			switch {
			case b != nil && b.key == k:
				b.refs++
			default:
				if b != nil {
					w.unhold(g, b.key)
				}
				g.blocks[h] = &refSide{key: k, refs: 1}
				w.hold(g, k)
			}
			continue
		}
		e := w.engine[h]
		if e == nil {
			e = &refEntry{key: k}
			w.engine[h] = e
		} else if e.key != k {
			w.dropEntry(e)
			e.key = k
		}
		w.addRef(e, m)
	}
	w.stats.BlocksStored += int64(n)
}

func (w *refWorker) clearLocked() {
	for h, e := range w.engine {
		w.dropEntry(e)
		delete(w.engine, h)
	}
	for _, g := range w.groups {
		if g.blocks != nil {
			w.stats.SideBlocks -= int64(len(g.held))
			clear(g.blocks)
			clear(g.held)
		}
	}
}

// match is worker w's match of keys, and whether it holds the first key.
// Callers hold r.mu (shared).
func (w *refWorker) matchLocked(keys []Key) (Match, bool) {
	mt := Match{Worker: w.id}
	var media [events.NumMedia]bool
	for i := range media {
		media[i] = true
	}
	for i, k := range keys {
		h := w.ix.res[k][w.id]
		if h == nil {
			break
		}
		mt.Blocks = i + 1
		for m, r := range h {
			if media[m] && r > 0 {
				mt.ByMedium[m] = i + 1
			} else {
				media[m] = false
			}
		}
	}
	return mt, mt.Blocks > 0
}

// match is the reference Match, sorted by worker.
func (r *refIndex) match(keys []Key, allow func(WorkerID) bool) []Match {
	r.mu.RLock()
	defer r.mu.RUnlock()
	var out []Match
	if len(keys) == 0 {
		return nil
	}
	for _, w := range r.workers {
		if allow != nil && !allow(w.id) {
			continue
		}
		if mt, ok := w.matchLocked(keys); ok {
			out = append(out, mt)
		}
	}
	return out
}

// naiveMatch is the baseline's Match as a router-facing index would write
// it: walk the keys, one probe of the shared map per key under the read
// lock, O(holders) per key, stopping when no worker still matches.
func (r *refIndex) naiveMatch(keys []Key, dst []Match, pos []int32) []Match {
	r.mu.RLock()
	defer r.mu.RUnlock()
	base := len(dst)
	for i, k := range keys {
		hs := r.res[k]
		ext := false
		for w, refs := range hs {
			if i == 0 {
				mt := Match{Worker: w, Blocks: 1}
				for m, n := range refs {
					if n > 0 {
						mt.ByMedium[m] = 1
					}
				}
				pos[w] = int32(len(dst))
				dst = append(dst, mt)
				ext = true
				continue
			}
			p := pos[w]
			if p < 0 || dst[p].Blocks != i {
				continue
			}
			mt := &dst[p]
			mt.Blocks = i + 1
			for m, n := range refs {
				if n > 0 && mt.ByMedium[m] == i {
					mt.ByMedium[m] = i + 1
				}
			}
			ext = true
		}
		if !ext {
			break
		}
	}
	for _, mt := range dst[base:] {
		pos[mt.Worker] = -1
	}
	return dst
}

// sortMatches sorts ms by worker, for comparisons.
func sortMatches(ms []Match) []Match {
	slices.SortFunc(ms, func(a, b Match) int { return int(a.Worker) - int(b.Worker) })
	return ms
}

// capLocked is the reference Cap, by brute force: the longest length, at
// most prefix blocks, that every side group's rule accepts (window groups
// their window's blocks before the cut or every block, mamba groups the
// block at the cut, prefix groups every block).
func (w *refWorker) capLocked(keys []Key, prefix int) int {
	held := func(g *refGroup, from, to int) bool {
		for i := from; i < to; i++ {
			if g.held[keys[i]] == 0 {
				return false
			}
		}
		return true
	}
	for l := prefix; l > 0; l-- {
		ok := true
		for _, g := range w.groups {
			if g.blocks == nil || g.bs == 0 {
				continue
			}
			switch g.class {
			case ClassWindow:
				n := max((g.window-1+g.bs-1)/g.bs, 1)
				ok = ok && (l >= n && held(g, l-n, l) || l < n && held(g, 0, l))
			case ClassMamba:
				ok = ok && held(g, l-1, l)
			case ClassPrefix:
				ok = ok && held(g, 0, l)
			}
		}
		if ok {
			return l
		}
	}
	return 0
}
