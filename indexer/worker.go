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
// ApplyBatch, Reset and SetCapacity (and their recording variants),
// ApplyDelta, Restore, Snapshot's gathering of keys and Digest serialise
// on mu; Stats reads atomics (and lastReset under mu) and may run at any
// time.
//
// # Kinds
//
// A worker is fed engine events (ApplyBatch, or ApplyBatchDelta to record
// them for replicas: see Delta), or, when added with WorkerInfo.Keyed, is
// a replica fed keyed effects (ApplyDelta, Restore), whose engine map is
// keyed by content key with per-key counts (keyCounts) in place of dups
// and aliases. Each kind refuses the other's calls (ErrWorkerKind).
//
// # Capacity
//
// A worker holds at most its capacity of blocks (all media together);
// beyond it, the blocks stored least recently (a store, a duplicate store,
// an offload or being named as a parent all count; a Match never does) are
// evicted from the index and counted in Stats.Evictions. The order is
// exact for workers of under 64 blocks, and kept to within 1/64 of the
// worker's blocks otherwise (recency epochs rather than a list: see
// blockmap). The bound exists
// for removals that were lost, since an engine never holds more blocks than
// its cache has room for. The capacity is Config.WorkerCapacity or
// SetCapacity's, or else learned: vLLM removes a cached block only to reuse
// its slot when its cache is full, so the number of blocks a worker holds
// in a medium when its first removal in that medium arrives is that tier's
// size; the learned capacity is twice the sum over media (and at least
// minLearnedCapacity), and stays unbounded while a medium that holds
// blocks has seen no removal yet.
type Worker struct {
	id    WorkerID
	gen   uint32 // generation of id (see WorkerID)
	info  WorkerInfo
	model *Model
	ix    *Index

	// singles are the interned one-worker holder sets of this worker, by
	// media mask (see Index.single).
	singles [1 << events.NumMedia]atomic.Pointer[holders.Set]

	mu sync.Mutex // guards everything below, and cur's use of the tree
	// engine maps the engine's block hash to the block's place in the
	// tree and the media it is stored in (an engineEntry), with its store
	// recency. It resolves BlockRemoved and parent_block_hash, which name
	// engine hashes only.
	engine blockmap.Map
	// warmSink keeps the sum of ApplyDelta's and ApplyBatch's warm-up
	// loads, so that the compiler keeps them.
	warmSink uint64
	// dups has the per-medium store counts of the blocks stored more than
	// once in some medium (their entries' dup bit), by engine hash; vLLM
	// does that rarely, and each store needs its own removal.
	dups map[uint64]*[events.NumMedia]uint8
	cur  cursor
	// evict is scratch for clears.
	evict []uint64
	// ignoredGroups are KV-cache groups (hybrid models) whose events do not
	// decide prefix reuse; learned from BlockStored's kv_cache_spec_kind.
	ignoredGroups map[int]struct{}
	lastReset     string
	// gone is set by RemoveWorker; the worker then refuses events.
	gone bool
	// res and resBy count resident blocks, stored and removed blocks
	// stored and removed; published to c at batch end.
	res             int64
	resBy           [events.NumMedia]int64
	stored, removed int64
	// unchecked counts batches ended since the last invariant check (only
	// with invariantsOn; see endLocked).
	unchecked int64
	// capConfigured is the configured capacity: > 0 bounds, -1 unbounded,
	// 0 learns from learned.
	capConfigured int64
	// learned[m] is resBy[m] when the first known removal in m arrived.
	learned [events.NumMedia]int64
	// aliases counts, for the rare keys that two or more of the worker's
	// engine blocks resolve to (the engine reused a hash, or re-stored an
	// orphan under its real parent), how many of them hold the key in each
	// medium, so that the worker's residency of the key ends with the last
	// one. nil when there are none.
	aliases map[loc]*alias
	// keyed has, for a keyed worker (WorkerInfo.Keyed), the counts of the
	// keys that are not one block with one store per medium (their
	// entries' dup bit), by key. nil when there are none, and always for
	// workers fed engine events.
	keyed map[uint64]*keyCounts
	// rec is the delta that the call being applied records its effects
	// in (ApplyBatchDelta, ResetDelta, SetCapacityDelta), nil otherwise.
	rec *Delta
	// deltaSeq is the Seq of the last delta recorded or applied, or of the
	// snapshot restored (see Snapshot).
	deltaSeq uint64
	// hist is the worker's bounded removal record (see Removal).
	hist history

	c counters
}

// minLearnedCapacity is the least capacity a worker learns (an engine's
// cache is thousands of blocks; this keeps small test setups unbounded in
// practice).
const minLearnedCapacity = 4096

// engineEntry is one engine block of a worker, packed into the 56-bit
// value of its engine map slot: where its content key is in the tree
// (offset, node id and the node id's generation), the media it is stored
// in, and whether it was stored more than once in some medium (dup: its
// counts are in Worker.dups). From bit 0:
//
//	offset 16 | node id 27 | generation 6 | media 6 | dup 1
//
// So a node's run holds at most 1<<16 keys (longer chains continue in a
// child node, see maxRun) and the index at most 1<<27 nodes at once
// (134 M; at 300 bytes or more each, 40 GB of nodes). The offset is in the
// low bits, so that entries sort by (node, offset) as numbers.
//
// Cost: 7 bytes of a 16-byte slot (blockmap), no pointer, so the garbage
// collector skips the engine maps (see nodeTable); 17 to 19 bytes per
// block with the table's free slots (BenchmarkMemory10M).
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

	// maxRun is the most keys a node's run holds.
	maxRun = 1 << entryOffBits
	// maxNodes is the most nodes the index holds at once.
	maxNodes = 1 << entryNodeBits
	// genMask keeps a node id slot's generation to the bits an entry has.
	genMask = 1<<entryGenBits - 1
)

// newEntry returns the entry of a block at l stored in media.
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

// entry returns the engine entry in slot.
func (w *Worker) entry(slot int) engineEntry { return engineEntry(w.engine.Val(slot)) }

// locOf returns the tree position of e. It panics (brokenInvariant) if
// e's node id is stale (see nodeTable).
func (w *Worker) locOf(e engineEntry) loc {
	return loc{w.ix.nodes.get(e.node(), e.gen()), e.off()}
}

// refsOf returns the store counts per medium of the entry in slot, of a
// worker fed engine events (a keyed worker's are its keyCounts).
func (w *Worker) refsOf(slot int) [events.NumMedia]uint8 {
	e := w.entry(slot)
	if e.dup() {
		return *w.dups[w.engine.Hash(slot)]
	}
	return onePerMedium(e.media())
}

// onePerMedium returns the store counts of a block stored once in each
// medium of media.
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
// invariants (see node) rule out, which no input can cause.
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

// ResidentBlocks returns the blocks resident on the worker (every medium)
// as of the last batch's end. Cost: one atomic load; the Score path reads
// it.
func (w *Worker) ResidentBlocks() int64 { return w.c.resident.Load() }

// Stats returns a snapshot of the worker's counters. Counts of resident
// blocks are as of the last batch's end.
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

// SetCapacity sets the most blocks the worker may hold in all media
// together, e.g. vLLM's num_gpu_blocks plus its offload tiers' sizes when
// they are known: blocks > 0 bounds it (evicting at once if the worker
// holds more), 0 returns to learning it, < 0 makes it unbounded. A keyed
// worker has no capacity of its own; it keeps the setting and ignores it.
func (w *Worker) SetCapacity(blocks int) { w.setCapacity(blocks, nil) }

// setCapacity is SetCapacity, recording its evictions in d when d is not
// nil (SetCapacityDelta).
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

// capacityLocked returns the worker's capacity, 0 for unbounded. Callers
// hold w.mu.
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

// enforceCapacityLocked evicts the least recently stored blocks beyond the
// worker's capacity. Callers hold w.mu.
func (w *Worker) enforceCapacityLocked() {
	if c := w.capacityLocked(); c > 0 && w.res > c {
		w.c.evictions.Add(w.evictLocked(w.res-c, CauseCapacity))
	}
}

// evictLocked drops up to n of the least recently stored blocks and
// returns how many it dropped, recording cause in the removal record.
// Callers hold w.mu.
func (w *Worker) evictLocked(n int64, cause RemovalCause) int64 {
	var done int64
	for done < n && w.engine.Len() > 0 {
		// In chunks, each in tree order, so that runs of a node become one
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

// evictForBudget evicts up to n blocks for the index's memory budget and
// returns how many it evicted.
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
	// apply stamps Stats.LastApply and enforces the memory budget: the
	// change applied a batch, a delta or a restore.
	apply bool
	// tell tells the observers what happened.
	tell bool
	what Applied
}

// unlockThen ends a change to the worker made under w.mu, which began
// when the worker held before blocks: it publishes the change
// (endLocked), releases w.mu, adds the change to the index's resident
// count, and then, with no lock held, does what then says. Every change
// to a worker ends here, so that no observer and no budget eviction ever
// runs under a worker's lock. Callers hold w.mu.
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
	if obs := w.ix.observers.Load(); obs != nil && then.tell {
		a := then.what
		w.ix.notify(*obs, w, &a)
	}
}

// endLocked ends a batch: publishes the changed nodes and the resident
// counts, after checking the invariants when they are compiled in (build
// tag invariants, or -race). Callers hold w.mu.
//
// The check is amortised: it walks the whole worker, so a worker of n
// resident blocks is checked once every n/invariantSpan batches (every
// batch while n < invariantSpan), which keeps a check's cost near
// O(invariantSpan) a batch; what happened between checks (the nodes held
// and retired) is kept until the next one, so nothing goes unchecked.
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
	for m, n := range w.resBy {
		w.c.residentByMedium[m].Store(n)
	}
	w.c.capacity.Store(w.capacityLocked())
}
