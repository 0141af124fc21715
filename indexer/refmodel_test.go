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
	groups map[int]bool
	stats  Stats
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
	w := &refWorker{ix: r, id: WorkerID(len(r.workers)), model: model, bs: r.models[model], engine: map[uint64]*refEntry{}}
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

func (w *refWorker) skip(ev *events.Event) bool {
	if ev.Kind == events.KindBlockStored && ev.SpecKind != "" && ev.SpecKind != fullAttention {
		if ev.HasGroupIdx {
			if w.groups == nil {
				w.groups = map[int]bool{}
			}
			w.groups[ev.GroupIdx] = true
		}
		return true
	}
	return ev.HasGroupIdx && w.groups[ev.GroupIdx]
}

func (w *refWorker) applyLocked(ev *events.Event) {
	switch ev.Kind {
	case events.KindAllBlocksCleared:
		w.clearLocked()
		w.stats.Clears++
		return
	case events.KindBlockStored, events.KindBlockRemoved:
	default:
		w.stats.InvalidEvents++
		return
	}
	if w.skip(ev) {
		w.stats.SkippedGroupEvents++
		return
	}
	m := ev.Medium
	if ev.Kind == events.KindBlockRemoved {
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
		return
	}
	if len(ev.TokenIDs) == 0 {
		for _, h := range ev.BlockHashes {
			if e := w.engine[h]; e != nil {
				w.addRef(e, m)
			} else {
				w.stats.UnknownBlocks++
			}
		}
		return
	}
	n := len(ev.BlockHashes)
	if ev.BlockSize != w.bs {
		w.stats.BlockSizeMismatches++
		return
	}
	if len(ev.TokenIDs) != n*w.bs || ev.ExtraKeys != nil && len(ev.ExtraKeys) != n {
		w.stats.InvalidEvents++
		return
	}
	parent := RootKey(w.model, ev.LoRAName)
	if ev.HasParent {
		if e := w.engine[ev.ParentHash]; e != nil {
			parent = e.key
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
		k := BlockKey(parent, ev.TokenIDs[i*w.bs:(i+1)*w.bs], extra)
		e := w.engine[h]
		if e == nil {
			e = &refEntry{key: k}
			w.engine[h] = e
		} else if e.key != k {
			w.dropEntry(e)
			e.key = k
		}
		w.addRef(e, m)
		parent = k
	}
	w.stats.BlocksStored += int64(n)
}

func (w *refWorker) clearLocked() {
	for h, e := range w.engine {
		w.dropEntry(e)
		delete(w.engine, h)
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
