package indexer

import (
	"cmp"
	"slices"
	"sync"
	"sync/atomic"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/blockmap"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// Worker is one KV cache (pod, DP rank) in the index: its engine-hash map
// and counters. It implements events.Sink for its subscriber.
//
// # Concurrency
//
// Every call that reads or changes its blocks serialises on mu; Stats
// reads atomics (and lastReset under mu) at any time.
//
// # Kinds
//
// A worker is fed engine events (ApplyBatch, or ApplyBatchDelta to record
// them for replicas), or, added with WorkerInfo.Keyed, keyed effects
// (ApplyDelta, Restore), its engine map keyed by content key with
// keyCounts in place of dups and aliases. Each kind refuses the other's
// calls (ErrWorkerKind).
//
// # Capacity
//
// A worker holds at most its capacity of blocks (all media together);
// beyond it the least recently stored (a store, an offload or being named
// as a parent counts; a Match never does) are evicted and counted, in an
// order exact to within 1/64 of its blocks (see blockmap). The capacity is
// configured, or learned: vLLM removes a cached block only when its cache
// is full, so the blocks a worker holds in a medium at its first removal
// there are that tier's size. The learned capacity is twice the sum over
// media, at least minLearnedCapacity, and unbounded while a medium that
// holds blocks has seen no removal.
type Worker struct {
	id    WorkerID
	gen   uint32 // generation of id (see WorkerID)
	info  WorkerInfo
	model *Model
	ix    *Index

	// singles are this worker's interned one-worker sets, by media mask.
	singles [1 << events.NumMedia]atomic.Pointer[holders.Set]
	// capped says the worker has a side group, so Cap has work to do;
	// prefixBS is its anchor's block size, 0 until learned. Both are
	// written under mu and read by Cap and the scorer without it.
	capped   atomic.Bool
	prefixBS atomic.Int32
	layout   atomic.Pointer[[]Group] // the groups' descriptions, for Group

	mu       sync.Mutex   // guards everything below, and cur's use of the tree
	engine   blockmap.Map // maps engine block hash to an engineEntry, with its store recency.
	warmSink uint64       // keeps the warm-up loads from being elided.
	// dups has the per-medium store counts of blocks stored more than
	// once in some medium (their entries' dup bit), by engine hash.
	dups map[uint64]*[events.NumMedia]uint8
	cur  cursor
	// groups are the KV-cache groups learned from the worker's events, by
	// index (nil where none); anchor is the index of the one whose blocks
	// are in the tree, -1 until learned (see groups.go).
	groups  []*groupState
	anchor  int
	side    sideStore
	sideRes int64 // the side groups' held keys, over all side groups
	// layoutDirty says the groups changed since the last recorded call
	// ended (Delta.Layout).
	layoutDirty bool
	lastReset   string
	gone        bool // set by RemoveWorker; the worker then refuses events.
	// res, resBy, stored and removed are published to c at batch end.
	res             int64
	resBy           [events.NumMedia]int64
	stored, removed int64
	unchecked       int64 // counts batches since the last invariant check.
	capConfigured   int64 // > 0 bounds, -1 unbounded, 0 learns.
	// learned[m] is resBy[m] when the first known removal in m arrived.
	learned [events.NumMedia]int64
	// aliases counts, for the rare keys two or more engine blocks resolve
	// to (a reused hash, an orphan re-stored under its parent), how many
	// hold the key in each medium, so that the worker's residency of the
	// key ends with the last. nil when there are none.
	aliases map[loc]*alias
	// keyed has a keyed worker's counts of the keys that are not one block
	// with one store per medium (their entries' dup bit), by key.
	keyed    map[uint64]*keyCounts
	rec      *Delta // the delta the current call records its effects in, or nil.
	deltaSeq uint64 // the Seq of the last delta recorded or applied, or of the snapshot restored.
	hist     history

	c counters
}

// minLearnedCapacity is the least capacity a worker learns.
const minLearnedCapacity = 4096

// engineEntry is one engine block of a worker, packed into its engine map
// slot's 56-bit value, from bit 0:
//
//	offset 16 | node id 27 | generation 6 | media 6 | dup 1
//
// So a run holds at most 1<<16 keys and the index at most 1<<27 nodes. The
// offset is in the low bits, so entries sort by (node, offset) as numbers.
// dup: the block's store counts are in Worker.dups.
type engineEntry uint64

const (
	entryOffBits   = 16
	entryNodeBits  = 27
	entryGenBits   = 6
	entryNodeShift = entryOffBits
	entryGenShift  = entryNodeShift + entryNodeBits
	entryMedShift  = entryGenShift + entryGenBits
	entryDup       = engineEntry(1) << (entryMedShift + events.NumMedia)
	entryPosMask   = engineEntry(1)<<entryGenShift - 1 // offset and node id

	maxRun   = 1 << entryOffBits   // the most keys a node's run holds.
	maxNodes = 1 << entryNodeBits  // the most nodes the index holds at once.
	genMask  = 1<<entryGenBits - 1 // keeps a node id slot's generation to the bits an entry has.
)

func newEntry(l loc, media uint8) engineEntry {
	return engineEntry(l.off) | engineEntry(l.n.id)<<entryNodeShift |
		engineEntry(l.n.gen)<<entryGenShift | engineEntry(media)<<entryMedShift
}

func (e engineEntry) off() int32   { return int32(e & (maxRun - 1)) }
func (e engineEntry) node() uint32 { return uint32(e>>entryNodeShift) & (maxNodes - 1) }
func (e engineEntry) gen() nodeGen { return nodeGen(e>>entryGenShift) & genMask }
func (e engineEntry) media() uint8 { return uint8(e>>entryMedShift) & (1<<events.NumMedia - 1) }
func (e engineEntry) dup() bool    { return e&entryDup != 0 }
func (e engineEntry) pos() uint64  { return uint64(e & entryPosMask) }
func (e engineEntry) with(m uint8) engineEntry {
	return e&^(engineEntry(1<<events.NumMedia-1)<<entryMedShift) | engineEntry(m)<<entryMedShift
}

func (w *Worker) entry(slot int) engineEntry { return engineEntry(w.engine.Val(slot)) }

// locOf returns the tree position of e, and panics if e's node id is
// stale.
func (w *Worker) locOf(e engineEntry) loc {
	return loc{w.ix.nodes.get(e.node(), e.gen()), e.off()}
}

// refsOf returns the store counts per medium of the entry in slot (of a
// worker fed engine events).
func (w *Worker) refsOf(slot int) [events.NumMedia]uint8 {
	e := w.entry(slot)
	if e.dup() {
		return *w.dups[w.engine.Hash(slot)]
	}
	return onePerMedium(e.media())
}

func onePerMedium(media uint8) [events.NumMedia]uint8 {
	var r [events.NumMedia]uint8
	for m := range r {
		r[m] = media >> m & 1
	}
	return r
}

// mediaOf returns the mask of the media whose count in c is not zero.
func mediaOf[T uint8 | uint16 | uint32](c *[events.NumMedia]T) uint8 {
	var m uint8
	for i, n := range c {
		if n != 0 {
			m |= 1 << i
		}
	}
	return m
}

// brokenInvariant is the one place the indexer panics: on a state its
// invariants rule out, which no input can cause.
func brokenInvariant(what string) {
	panic("indexer: broken invariant: " + what)
}

// alias is a key that several engine blocks of one worker resolve to.
type alias struct {
	entries int                     // engine entries at the key
	media   [events.NumMedia]uint16 // of those, how many hold it in each medium
}

// allMedia clears every medium of a worker in a holders.Op.
const allMedia = 0xff

// ID returns the worker's dense id.
func (w *Worker) ID() WorkerID { return w.id }

// Info returns what the worker was added with.
func (w *Worker) Info() WorkerInfo { return w.info }

// Model returns the worker's model.
func (w *Worker) Model() *Model { return w.model }

// ResidentBlocks returns the worker's resident blocks as of the last
// batch's end. Cost: one atomic load.
func (w *Worker) ResidentBlocks() int64 { return w.c.resident.Load() }

// PoolBlocks returns the blocks of the engine's KV-cache pool the worker
// holds as of the last batch's end: its resident blocks and its side
// groups' (vLLM allocates every group's blocks from one pool, so a hybrid
// engine holding a position in a window group and the full-attention
// group uses two). Cost: two atomic loads.
func (w *Worker) PoolBlocks() int64 { return w.c.resident.Load() + w.c.sideBlocks.Load() }

// Stats returns a snapshot of the worker's counters.
func (w *Worker) Stats() Stats {
	s := Stats{
		ResidentBlocks:      w.c.resident.Load(),
		BlocksStored:        w.c.stored.Load(),
		BlocksRemoved:       w.c.removed.Load(),
		Orphans:             w.c.orphans.Load(),
		UnknownBlocks:       w.c.unknown.Load(),
		BlockSizeMismatches: w.c.blockSize.Load(),
		InvalidEvents:       w.c.invalid.Load(),
		SkippedGroupEvents:  w.c.group.Load(),
		UnknownGroupBlocks:  w.c.unknownGroup.Load(),
		LayoutChanges:       w.c.layoutChanges.Load(),
		SideBlocks:          w.c.sideBlocks.Load(),
		SideRefused:         w.c.sideRefused.Load(),
		BlockSize:           int(w.prefixBS.Load()),
		Clears:              w.c.clears.Load(),
		Resets:              w.c.resets.Load(),
		Evictions:           w.c.evictions.Load(),
		BudgetEvictions:     w.c.budgetEvict.Load(),
		DeltaMismatches:     w.c.deltaMismatches.Load(),
		Capacity:            w.c.capacity.Load(),
	}
	for m := range s.ResidentByMedium {
		s.ResidentByMedium[m] = w.c.residentByMedium[m].Load()
	}
	if ns := w.c.lastApply.Load(); ns != 0 {
		s.LastApply = time.Unix(0, ns)
	}
	if ns := w.c.lastResetAt.Load(); ns != 0 {
		s.LastResetAt = time.Unix(0, ns)
	}
	if ns := w.c.lastClearAt.Load(); ns != 0 {
		s.LastClearAt = time.Unix(0, ns)
	}
	s.LastBadBlockSize = int(w.c.lastBadBlockSize.Load())
	w.mu.Lock()
	s.LastReset = w.lastReset
	w.mu.Unlock()
	return s
}

// SetCapacity sets the most blocks the worker may hold in all media:
// > 0 bounds it (evicting at once), 0 learns it, < 0 is unbounded. A keyed
// worker keeps the setting and ignores it.
func (w *Worker) SetCapacity(blocks int) { w.setCapacity(blocks, nil) }

// setCapacity is SetCapacity, recording its evictions in d when not nil.
func (w *Worker) setCapacity(blocks int, d *Delta) {
	w.mu.Lock()
	if w.gone {
		w.mu.Unlock()
		return
	}
	before := w.res
	w.capConfigured = int64(max(blocks, -1))
	w.rec = d
	w.enforceCapacityLocked()
	w.endRecordLocked(d)
	w.unlockThen(before, after{})
}

// capacityLocked returns the worker's capacity, 0 for unbounded.
func (w *Worker) capacityLocked() int64 {
	switch {
	case w.info.Keyed:
		return 0
	case w.capConfigured > 0:
		return w.capConfigured
	case w.capConfigured < 0:
		return 0
	}
	var sum int64
	for m, l := range w.learned {
		if l == 0 && w.resBy[m] > 0 {
			return 0
		}
		sum += l
	}
	if sum == 0 {
		return 0
	}
	return max(2*sum, minLearnedCapacity)
}

func (w *Worker) enforceCapacityLocked() {
	if c := w.capacityLocked(); c > 0 && w.res > c {
		w.c.evictions.Add(w.evictLocked(w.res-c, CauseCapacity))
	}
}

// evictLocked drops up to n of the least recently stored blocks, recording
// cause, and returns how many it dropped.
func (w *Worker) evictLocked(n int64, cause RemovalCause) int64 {
	var done int64
	for done < n && w.engine.Len() > 0 {
		// In chunks, each in tree order, so that a node's runs become one
		// holder-set change each.
		var slots [256]int
		got := w.engine.Oldest(int(min(n-done, int64(len(slots)))), slots[:0])
		slices.SortFunc(got, func(a, b int) int { return cmp.Compare(w.entry(a).pos(), w.entry(b).pos()) })
		for _, slot := range got {
			if w.hist.on() {
				w.hist.add(w.slotKeyLocked(slot), cause)
			}
			w.dropEntryLocked(slot)
			w.engine.Delete(slot)
		}
		done += int64(len(got))
	}
	return done
}

func (w *Worker) evictForBudget(n int64) int64 {
	w.mu.Lock()
	before := w.res
	done := w.evictLocked(n, CauseBudget)
	w.c.evictions.Add(done)
	w.c.budgetEvict.Add(done)
	w.unlockThen(before, after{}) // the change is -done, but for keys of several blocks of a keyed worker
	return done
}

// after is what unlockThen does once the worker's mutex is released.
type after struct {
	apply bool    // stamps Stats.LastApply and enforces the memory budget.
	what  Applied // what observers are told, unless zero.
}

// unlockThen ends a change made under w.mu (the worker held before blocks
// when it began): it publishes it, releases w.mu, updates the index's
// resident count, then does what then says with no lock held, so that no
// observer or budget eviction runs under a worker's lock.
func (w *Worker) unlockThen(before int64, then after) {
	w.endLocked()
	delta := w.res - before
	w.mu.Unlock()
	if then.apply {
		w.c.lastApply.Store(time.Now().UnixNano())
	}
	w.ix.resident.Add(delta)
	if then.apply {
		w.ix.checkBudget()
	}
	if obs := w.ix.observers.Load(); obs != nil && then.what != (Applied{}) {
		a := then.what
		for _, o := range *obs {
			o.fn(w, &a)
		}
	}
}

// endLocked ends a batch: checks the invariants when compiled in, then
// publishes the changed nodes and the counters.
//
// The check walks the whole worker, so a worker of n blocks is checked
// once every n/invariantSpan batches; what happened between checks (nodes
// held and retired) is kept for the next, so nothing goes unchecked.
func (w *Worker) endLocked() {
	w.cur.finish()
	w.hist.now = 0
	if invariantsOn {
		if w.unchecked++; w.unchecked*invariantSpan >= w.res {
			w.unchecked = 0
			w.assertInvariantsLocked()
		}
	}
	w.c.stored.Store(w.stored)
	w.c.removed.Store(w.removed)
	w.c.resident.Store(w.res)
	w.c.sideBlocks.Store(w.sideRes)
	for m, n := range w.resBy {
		w.c.residentByMedium[m].Store(n)
	}
	w.c.capacity.Store(w.capacityLocked())
}
