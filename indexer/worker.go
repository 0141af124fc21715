package indexer

import (
	"cmp"
	"errors"
	"fmt"
	"math"
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
	var r [events.NumMedia]uint8
	for m := range r {
		if e.media()&(1<<m) != 0 {
			r[m] = 1
		}
	}
	return r
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
// tag invariants). Callers hold w.mu.
func (w *Worker) endLocked() {
	w.cur.finish()
	w.hist.now = 0
	if invariantsOn {
		w.assertInvariantsLocked()
	}
	w.c.stored.Store(w.stored)
	w.c.removed.Store(w.removed)
	w.c.resident.Store(w.res)
	for m, n := range w.resBy {
		w.c.residentByMedium[m].Store(n)
	}
	w.c.capacity.Store(w.capacityLocked())
}

// fullAttention is the kv_cache_spec_kind whose blocks decide prefix reuse.
const fullAttention = "full_attention"

// ApplyBatch applies b's events in order (events.Sink). An event that cannot
// be applied is counted and skipped; the others still apply. The returned
// error joins one error per problem, each naming the event. The batch's
// changes are visible to Match when ApplyBatch returns. A keyed worker
// refuses engine events (ErrWorkerKind).
//
// Cost (BenchmarkApply, a worker holding 80 k blocks, one core): about
// 230 ns per stored block, its later removal included (4.1-4.4 M blocks/s
// on the benchmark machine of docs/benchmarks.md), and 13 allocations per
// batch of about 80 blocks: a node and its key array per new branch, and
// a view when a run's array grows or its holders change inside it. With
// everything in cache (BenchmarkApplyCached) it is 5 M blocks/s: cache
// misses are a fifth of the time, the engine map's work two fifths. The
// map+mutex baseline (BenchmarkNaiveApply) does 1.0 M blocks/s with 318
// allocations.
func (w *Worker) ApplyBatch(b *events.Batch) error { return w.applyBatch(b, nil) }

// applyBatch is ApplyBatch, recording the batch's effects in d when d is
// not nil (ApplyBatchDelta).
func (w *Worker) applyBatch(b *events.Batch, d *Delta) error {
	if w.info.Keyed {
		return fmt.Errorf("%w: worker %s is keyed (batch of %d engine events not applied)", ErrWorkerKind, w.info.Ref, len(b.Events))
	}
	w.mu.Lock()
	if w.gone {
		w.mu.Unlock()
		return fmt.Errorf("%w: %s (batch of %d events not applied)", ErrRemovedWorker, w.info.Ref, len(b.Events))
	}
	before := w.res
	w.rec = d
	w.warmBatchLocked(b)
	var errs []error
	for i := range b.Events {
		if err := w.applyLocked(&b.Events[i]); err != nil {
			errs = append(errs, fmt.Errorf("worker %s event %d (%s): %w", w.info.Ref, i, b.Events[i].Kind, err))
		}
	}
	w.enforceCapacityLocked()
	w.endRecordLocked(d)
	w.unlockThen(before, after{apply: true, tell: true, what: Applied{Batch: b}})
	return errors.Join(errs...)
}

// warmBatchLocked loads the engine-map buckets of every block hash of b
// before b is applied: a worker's batch finds its map out of cache when
// other workers' batches (a daemon dialing many engines) or other work (an
// agent between its engine's steps) ran since its last, and loading them
// all first overlaps those misses instead of taking them one after
// another. Measured on 32 default-shape workers' batches interleaved
// (BenchmarkEngineApplyInterleaved, docs/benchmarks.md, "Fleet benchmarks:
// the second designs"): 1.0 M to 1.6 M new blocks a CPU-second, alternated;
// no loss on one worker whose map stays in cache (BenchmarkApply). Cost:
// four loads per block hash.
func (w *Worker) warmBatchLocked(b *events.Batch) {
	var sum uint64
	for i := range b.Events {
		for _, h := range b.Events[i].BlockHashes {
			sum += w.engine.Warm(h)
		}
	}
	w.warmSink = sum
}

// Reset forgets every block of the worker (events.Sink), e.g. after an
// engine restart.
func (w *Worker) Reset(reason string) { w.reset(reason, nil) }

// reset is Reset, recording its effect in d when d is not nil
// (ResetDelta).
func (w *Worker) reset(reason string, d *Delta) {
	w.mu.Lock()
	if w.gone {
		w.mu.Unlock()
		return
	}
	before := w.res
	w.rec = d
	w.clearLocked()
	w.lastReset = reason
	w.c.lastResetAt.Store(time.Now().UnixNano())
	w.c.resets.Add(1)
	w.endRecordLocked(d)
	w.unlockThen(before, after{tell: true, what: Applied{Reset: reason}})
}

// applyLocked applies one event. Callers hold w.mu.
func (w *Worker) applyLocked(ev *events.Event) error {
	switch ev.Kind {
	case events.KindBlockStored:
		return w.storeLocked(ev)
	case events.KindBlockRemoved:
		return w.removeLocked(ev)
	case events.KindAllBlocksCleared:
		w.clearLocked()
		w.c.clears.Add(1)
		w.c.lastClearAt.Store(time.Now().UnixNano())
		return nil
	}
	w.c.invalid.Add(1)
	return fmt.Errorf("unknown event kind %d", ev.Kind)
}

// skipGroupLocked reports whether ev belongs to a KV-cache group that does
// not decide prefix reuse, learning groups from BlockStored's spec kind.
func (w *Worker) skipGroupLocked(ev *events.Event) bool {
	if ev.Kind == events.KindBlockStored && ev.SpecKind != "" && ev.SpecKind != fullAttention {
		if ev.HasGroupIdx {
			if w.ignoredGroups == nil {
				w.ignoredGroups = make(map[int]struct{})
			}
			w.ignoredGroups[ev.GroupIdx] = struct{}{}
		}
		return true
	}
	if ev.HasGroupIdx && w.ignoredGroups != nil {
		_, skip := w.ignoredGroups[ev.GroupIdx]
		return skip
	}
	return false
}

// storeLocked applies a BlockStored event. Callers hold w.mu.
//
// Cost per block: one BlockKey, one engine-map probe and insert, and in the
// tree O(1) when the block extends or follows its parent's run (the
// common case: a request's blocks arrive in order); a heads probe when the
// parent has branches; a node when the block starts a new branch.
func (w *Worker) storeLocked(ev *events.Event) error {
	if w.skipGroupLocked(ev) {
		w.c.group.Add(1)
		return nil
	}
	medium := ev.Medium
	var mediumErr error
	if medium == events.MediumOther {
		mediumErr = fmt.Errorf("%w %q, indexed as OTHER", ErrUnknownMedium, ev.MediumName)
	}
	if int(medium) >= events.NumMedia {
		w.c.invalid.Add(1)
		return fmt.Errorf("%w: medium %d", ErrUnknownMedium, medium)
	}
	if len(ev.TokenIDs) == 0 {
		// An offload event: the blocks are known, and now also resident in
		// another medium.
		unknown := 0
		for _, h := range ev.BlockHashes {
			slot, ok := w.engine.Get(h)
			if !ok {
				unknown++
				continue
			}
			w.engine.Touch(slot)
			e := w.entry(slot)
			ne, counted := w.addRefLocked(h, e, medium)
			w.engine.SetVal(slot, uint64(ne))
			if counted && w.rec != nil {
				l := w.locOf(e)
				k := w.cur.keyAt(l)
				p, hasParent := w.parentOfLocked(l)
				w.recStore(k, p, hasParent, medium, false, e.media()&(1<<medium) == 0)
			}
		}
		if unknown > 0 {
			w.c.unknown.Add(int64(unknown))
			return errors.Join(mediumErr, fmt.Errorf("%w: %d of %d blocks offloaded to %s were never stored", ErrUnknownBlock, unknown, len(ev.BlockHashes), medium))
		}
		return mediumErr
	}
	bs := w.model.BlockSize
	if ev.BlockSize != bs {
		w.c.blockSize.Add(1)
		w.c.lastBadBlockSize.Store(int64(ev.BlockSize))
		return fmt.Errorf("%w: event block_size %d, model %q uses %d", ErrBlockSize, ev.BlockSize, w.model.Name, bs)
	}
	n := len(ev.BlockHashes)
	if len(ev.TokenIDs) != n*bs {
		w.c.invalid.Add(1)
		return fmt.Errorf("%w: %d token_ids for %d blocks of %d", ErrTokenCount, len(ev.TokenIDs), n, bs)
	}
	if ev.ExtraKeys != nil && len(ev.ExtraKeys) != n {
		w.c.invalid.Add(1)
		return fmt.Errorf("%w: %d extra_keys for %d blocks", ErrTokenCount, len(ev.ExtraKeys), n)
	}
	var err error
	c := &w.cur
	var parent loc // parent.n == nil: the parent is a root
	parentKey := w.rootFor(ev.LoRAName)
	if ev.LoRAName != "" {
		w.hist.noteLoRA(ev.LoRAName)
	}
	if ev.HasParent {
		if slot, ok := w.engine.Get(ev.ParentHash); ok {
			w.engine.Touch(slot)
			parent = w.locOf(w.entry(slot))
			parentKey = c.keyAt(parent)
		} else {
			// The chain above this block is unknown, so its key cannot
			// match any prompt. Index it under a key derived from the
			// worker and the missing parent, so that its removal and its
			// descendants still resolve, and count it.
			parentKey = orphanRoot(w.id, ev.ParentHash)
			w.c.orphans.Add(int64(n))
			err = fmt.Errorf("%w %#016x: %d blocks indexed as orphans", ErrOrphan, ev.ParentHash, n)
		}
	}
	single := w.ix.single(uint32(w.id), 1<<medium)
	var stack [128]byte
	scratch := stack[:0]
	for i, h := range ev.BlockHashes {
		var extra events.ExtraKeys
		switch {
		case ev.ExtraKeys != nil:
			extra = ev.ExtraKeys[i]
		case ev.LoRAName != "" || ev.CacheSalt != "":
			// Engines that send lora_name (or SGLang's event-level
			// cache_salt) without extra_keys: key the blocks exactly as a
			// prompt with that adapter and salt is keyed, the adapter on
			// every block and the salt on the first block of a sequence.
			px := PromptExtras{LoRAName: ev.LoRAName}
			if !ev.HasParent {
				px.CacheSalt = ev.CacheSalt
			}
			extra, scratch = px.blockExtras(i, scratch)
		}
		k := BlockKey(parentKey, ev.TokenIDs[i*bs:(i+1)*bs], extra)
		slot, known := w.engine.Get(h)
		if known {
			e := w.entry(slot)
			l := w.locOf(e)
			if c.keyAt(l) == k {
				// Stored again: one more reference.
				w.engine.Touch(slot)
				ne, counted := w.addRefLocked(h, e, medium)
				w.engine.SetVal(slot, uint64(ne))
				if counted && w.rec != nil {
					w.recStore(k, parentKey, parent.n != nil, medium, false, e.media()&(1<<medium) == 0)
				}
				parent, parentKey = l, k
				continue
			}
			// The engine reused a hash for different content (or its
			// earlier store was an orphan): move the entry to the new key.
			w.dropEntryLocked(slot)
		}
		var l loc
		var fresh bool
		if parent.n == nil {
			l, fresh = c.top(k, single, n-i)
		} else {
			l, fresh = c.next(parent, k, single, n-i)
		}
		var e engineEntry
		if fresh {
			// The new key was created with this worker as its holder.
			e = newEntry(l, 1<<medium)
			w.res++
			w.resBy[medium]++
		} else {
			w.joinLocked(l)
			e, _ = w.addRefLocked(h, newEntry(l, 0), medium)
		}
		if w.rec != nil {
			w.recStore(k, parentKey, parent.n != nil, medium, true, true)
			if known {
				// The entry's old key was dropped first, and may be the
				// parent (the engine reused its parent's hash, or one hash
				// twice in an event). The two effects commute on counts;
				// recorded store first, a replica still holds the parent
				// when it creates the key under it.
				es := w.rec.Entries
				es[len(es)-2], es[len(es)-1] = es[len(es)-1], es[len(es)-2]
			}
		}
		if known {
			w.engine.SetVal(slot, uint64(e))
			w.engine.Touch(slot)
		} else {
			w.engine.Insert(h, uint64(e))
		}
		parent, parentKey = l, k
	}
	w.stored += int64(n)
	return errors.Join(err, mediumErr)
}

// rootFor returns the chain root of the worker's model for an adapter.
func (w *Worker) rootFor(lora string) Key {
	if lora == "" {
		return w.model.root
	}
	return RootKey(w.model.Name, lora)
}

// orphanRoot is the stand-in parent key of blocks whose parent is unknown.
func orphanRoot(w WorkerID, parentHash uint64) Key {
	var b [12]byte
	b[0], b[1], b[2], b[3] = byte(w), byte(w>>8), byte(w>>16), byte(w>>24)
	for i := 0; i < 8; i++ {
		b[4+i] = byte(parentHash >> (8 * i))
	}
	return BlockKey(RootKey("\x00orphan", ""), nil, b[:])
}

// addRefLocked counts one more store in medium m of the block of engine
// hash h with entry e (media 0 for a block not yet stored anywhere),
// adding the medium to the worker's residency of its key on the first,
// and returns the entry updated, which the caller writes to the engine
// map, and whether the store counted (not when the count was saturated).
// Callers hold w.mu.
func (w *Worker) addRefLocked(h uint64, e engineEntry, m events.Medium) (engineEntry, bool) {
	bit := uint8(1) << m
	if e.media() == 0 {
		w.res++
	}
	if e.media()&bit == 0 {
		w.resBy[m]++
		l := w.locOf(e)
		if w.aliases != nil {
			if a := w.aliases[l]; a != nil {
				a.media[m]++
			}
		}
		w.cur.change(l, holders.Op{Worker: uint32(w.id), Set: bit})
		if e.dup() {
			w.dups[h][m] = 1
		}
		return e.with(e.media() | bit), true
	}
	// Stored again in m: the counts move to dups (saturating at 255: a
	// saturated count takes 255 removals).
	if e.dup() {
		r := w.dups[h]
		if r[m] == math.MaxUint8 {
			return e, false
		}
		r[m]++
		return e, true
	}
	r := new([events.NumMedia]uint8)
	for i := range r {
		if e.media()&(1<<i) != 0 {
			r[i] = 1
		}
	}
	r[m] = 2
	if w.dups == nil {
		w.dups = make(map[uint64]*[events.NumMedia]uint8)
	}
	w.dups[h] = r
	return e | entryDup, true
}

// dropEntryLocked removes all of the residency of the block in slot from
// the index and its counts, without deleting it from the engine map (the
// caller deletes it, or points it at another key). Callers hold w.mu.
func (w *Worker) dropEntryLocked(slot int) {
	if w.info.Keyed {
		w.dropKeyLocked(slot)
		return
	}
	e := w.entry(slot)
	if w.rec != nil {
		w.recDrop(w.cur.keyAt(w.locOf(e)), w.refsOf(slot))
	}
	mask := e.media()
	for m := range events.NumMedia {
		if mask&(1<<m) != 0 {
			w.resBy[m]--
		}
	}
	if mask != 0 {
		w.res--
	}
	if e.dup() {
		delete(w.dups, w.engine.Hash(slot))
	}
	w.releaseLocked(w.locOf(e), mask, true)
}

// releaseLocked ends one engine entry's residency of the key at l in the
// media of mask (leaving the key when leave), and takes the worker's
// residency off the tree in each medium no other entry at l still holds.
// Callers hold w.mu.
func (w *Worker) releaseLocked(l loc, mask uint8, leave bool) {
	var a *alias
	if w.aliases != nil {
		a = w.aliases[l]
	}
	switch {
	case a != nil:
		for m := range a.media {
			if mask&(1<<m) != 0 {
				if a.media[m]--; a.media[m] > 0 {
					mask &^= 1 << m
				}
			}
		}
		if leave {
			if a.entries--; a.entries <= 1 {
				delete(w.aliases, l)
			}
		}
	case leave && mask != 0:
		// The only entry at l leaves: the worker leaves the key in every
		// medium, and one op for all media batches runs of keys better.
		mask = allMedia
	}
	if mask != 0 {
		w.cur.change(l, holders.Op{Worker: uint32(w.id), Clear: mask})
	}
}

// joinLocked records that a new engine entry (with no stores yet) resolves
// to the existing key at l, which makes l an alias when the worker already
// holds it through another entry. Callers hold w.mu.
func (w *Worker) joinLocked(l loc) {
	if a := w.aliases[l]; a != nil {
		a.entries++
		return
	}
	held := w.cur.mediaOf(l, uint32(w.id))
	if held == 0 {
		return
	}
	a := &alias{entries: 2}
	for m := range a.media {
		if held&(1<<m) != 0 {
			a.media[m] = 1
		}
	}
	if w.aliases == nil {
		w.aliases = make(map[loc]*alias)
	}
	w.aliases[l] = a
}

// removeLocked applies a BlockRemoved event. Callers hold w.mu.
func (w *Worker) removeLocked(ev *events.Event) error {
	if w.skipGroupLocked(ev) {
		w.c.group.Add(1)
		return nil
	}
	m := ev.Medium
	if int(m) >= events.NumMedia {
		w.c.invalid.Add(1)
		return fmt.Errorf("%w: medium %d", ErrUnknownMedium, m)
	}
	unknown, removed := 0, 0
	bit := uint8(1) << m
	for _, h := range ev.BlockHashes {
		slot, ok := w.engine.Get(h)
		var e engineEntry
		if ok {
			e = w.entry(slot)
		}
		if e.media()&bit == 0 {
			unknown++
			continue
		}
		if w.learned[m] == 0 {
			w.learned[m] = w.resBy[m]
		}
		removed++
		if e.dup() {
			r := w.dups[h]
			if r[m] > 1 {
				// One of several stores in m: the block stays.
				r[m]--
				if !anyAbove1(r) {
					delete(w.dups, h)
					w.engine.SetVal(slot, uint64(e&^entryDup))
				}
				if w.rec != nil {
					w.recRemove(w.cur.keyAt(w.locOf(e)), m, false, false)
				}
				continue
			}
			r[m] = 0
		}
		w.resBy[m]--
		e = e.with(e.media() &^ bit)
		gone := e.media() == 0
		l := w.locOf(e)
		w.releaseLocked(l, bit, gone)
		if w.rec != nil {
			w.recRemove(w.cur.keyAt(l), m, gone, true)
		}
		if gone {
			if w.hist.on() {
				w.hist.add(w.cur.keyAt(l), CauseRemoved)
			}
			w.res--
			w.engine.Delete(slot)
		} else {
			w.engine.SetVal(slot, uint64(e))
		}
	}
	w.removed += int64(removed)
	if unknown > 0 {
		w.c.unknown.Add(int64(unknown))
		return fmt.Errorf("%w: %d of %d blocks removed from %s were not held there", ErrUnknownBlock, unknown, len(ev.BlockHashes), m)
	}
	return nil
}

// anyAbove1 reports whether some medium has two stores or more in r.
func anyAbove1(r *[events.NumMedia]uint8) bool {
	for _, n := range r {
		if n > 1 {
			return true
		}
	}
	return false
}

// clearLocked forgets every block of the worker. Callers hold w.mu.
// Cost: O(blocks log blocks); the blocks are released in tree order, so
// runs of one node become one holder-set change each.
func (w *Worker) clearLocked() {
	if w.rec != nil {
		w.rec.Entries = append(w.rec.Entries, DeltaEntry{Op: OpClear})
	}
	w.evict = w.evict[:0]
	for slot := range w.engine.All() {
		w.evict = append(w.evict, uint64(w.entry(slot)))
	}
	slices.SortFunc(w.evict, func(a, b uint64) int { return cmp.Compare(engineEntry(a).pos(), engineEntry(b).pos()) })
	for _, x := range w.evict {
		// Through releaseLocked, so that a key several entries resolve to
		// (an alias) is left only with the last of them, and its node is
		// not retired while a later entry still points into it.
		e := engineEntry(x)
		w.releaseLocked(w.locOf(e), e.media(), true)
	}
	w.engine.Reset()
	w.evict = nil
	w.dups = nil
	w.aliases = nil
	w.keyed = nil
	w.res = 0
	w.resBy = [events.NumMedia]int64{}
}
