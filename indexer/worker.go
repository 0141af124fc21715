package indexer

import (
	"errors"
	"fmt"
	"math"
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
// ApplyBatch, Reset and SetCapacity serialise on mu; Stats reads atomics
// (and lastReset under mu) and may run at any time.
//
// # Capacity
//
// A worker holds at most its capacity of blocks (all media together);
// beyond it, the blocks stored least recently (a store, a duplicate store,
// an offload or being named as a parent all count; a Match never does) are
// evicted from the index and counted in Stats.Evictions. The bound exists
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
	info  WorkerInfo
	model *Model
	ix    *Index

	// singles are the interned one-worker holder sets of this worker, by
	// media mask (see Index.single).
	singles [1 << events.NumMedia]atomic.Pointer[holders.Set]

	mu sync.Mutex // guards everything below, and cur's use of the tree
	// engine maps the engine's block hash to the block's place in the
	// tree and its per-medium store counts, in store order. It resolves
	// BlockRemoved and parent_block_hash, which name engine hashes only.
	engine blockmap.Map[engineEntry]
	cur    cursor
	// ignoredGroups are KV-cache groups (hybrid models) whose events do not
	// decide prefix reuse; learned from BlockStored's kv_cache_spec_kind.
	ignoredGroups map[int]struct{}
	lastReset     string
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

	c counters
}

// minLearnedCapacity is the least capacity a worker learns (an engine's
// cache is thousands of blocks; this keeps small test setups unbounded in
// practice).
const minLearnedCapacity = 4096

// engineEntry is one engine block of a worker: where its content key is in
// the tree (node id and offset), and how many times it was stored per
// medium, saturating at 255 (vLLM stores a block in a medium at most a few
// times before removing it; a saturated count takes 255 removals).
//
// Cost: 16 bytes, 32 in blockmap's slab with the hash and the list links,
// 42 per block with blockmap's index (BenchmarkMemory10M), and no pointer,
// so the garbage collector skips the engine maps (see nodeTable).
type engineEntry struct {
	node uint32
	off  int32
	refs [events.NumMedia]uint8
	gen  nodeGen // node's generation (see nodeTable), in what was padding
}

// entryAt returns the engine entry of a block at l.
func entryAt(l loc) engineEntry {
	return engineEntry{node: l.n.id, off: l.off, gen: l.n.gen}
}

// locOf returns the tree position of the block in slot. It panics
// (brokenInvariant) if the entry's node id is stale (see nodeTable).
func (w *Worker) locOf(slot uint32) loc {
	e := w.engine.At(slot)
	return loc{w.ix.nodes.get(e.node, e.gen), e.off}
}

// brokenInvariant is the one place the indexer panics: on a state its
// invariants (see node) rule out, which no input can cause.
func brokenInvariant(what string) {
	panic("indexer: broken invariant: " + what)
}

// media returns the mask of media e has stores in.
func (e *engineEntry) media() uint8 {
	var m uint8
	for i, r := range e.refs {
		if r != 0 {
			m |= 1 << i
		}
	}
	return m
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
		Capacity:            w.c.capacity.Load(),
	}
	for m := range s.ResidentByMedium {
		s.ResidentByMedium[m] = w.c.residentByMedium[m].Load()
	}
	if ns := w.c.lastApply.Load(); ns != 0 {
		s.LastApply = time.Unix(0, ns)
	}
	w.mu.Lock()
	s.LastReset = w.lastReset
	w.mu.Unlock()
	return s
}

// SetCapacity sets the most blocks the worker may hold in all media
// together, e.g. vLLM's num_gpu_blocks plus its offload tiers' sizes when
// they are known: blocks > 0 bounds it (evicting at once if the worker
// holds more), 0 returns to learning it, < 0 makes it unbounded.
func (w *Worker) SetCapacity(blocks int) {
	w.mu.Lock()
	before := w.res
	w.capConfigured = int64(max(blocks, -1))
	w.enforceCapacityLocked()
	w.endLocked()
	delta := w.res - before
	w.mu.Unlock()
	w.ix.resident.Add(delta)
}

// capacityLocked returns the worker's capacity, 0 for unbounded. Callers
// hold w.mu.
func (w *Worker) capacityLocked() int64 {
	switch {
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
		w.c.evictions.Add(w.evictLocked(w.res - c))
	}
}

// evictLocked drops up to n of the least recently stored blocks and
// returns how many it dropped. Callers hold w.mu.
func (w *Worker) evictLocked(n int64) int64 {
	var done int64
	for ; done < n; done++ {
		slot, ok := w.engine.Oldest()
		if !ok {
			break
		}
		w.dropEntryLocked(slot)
		w.engine.Delete(slot)
	}
	return done
}

// evictForBudget evicts up to n blocks for the index's memory budget and
// returns how many it evicted.
func (w *Worker) evictForBudget(n int64) int64 {
	w.mu.Lock()
	done := w.evictLocked(n)
	w.endLocked()
	w.mu.Unlock()
	w.ix.resident.Add(-done)
	w.c.evictions.Add(done)
	w.c.budgetEvict.Add(done)
	return done
}

// endLocked ends a batch: publishes the changed nodes and the resident
// counts, after checking the invariants when they are compiled in (build
// tag invariants). Callers hold w.mu.
func (w *Worker) endLocked() {
	w.cur.finish()
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
// changes are visible to Match when ApplyBatch returns.
//
// Cost (BenchmarkApply, a worker holding 80 k blocks, one core): about
// 200 ns per stored block, its later removal included (4.8-5.3 M blocks/s
// on the benchmark machine, whose speed drifts by ~7% over a day), and
// 11 allocations per batch of about 80 blocks: a node and its key array
// per new branch, and a view when a run's array grows or its holders
// change inside it. A quarter of the time is the removal's one cache miss
// on an entry stored long before. The map+mutex baseline
// (BenchmarkNaiveApply) does 1.17 M blocks/s with 318 allocations.
func (w *Worker) ApplyBatch(b *events.Batch) error {
	w.mu.Lock()
	before := w.res
	var errs []error
	for i := range b.Events {
		if err := w.applyLocked(&b.Events[i]); err != nil {
			errs = append(errs, fmt.Errorf("worker %s event %d (%s): %w", w.info.Ref, i, b.Events[i].Kind, err))
		}
	}
	w.enforceCapacityLocked()
	w.endLocked()
	delta := w.res - before
	w.mu.Unlock()
	w.c.lastApply.Store(time.Now().UnixNano())
	w.ix.resident.Add(delta)
	w.ix.checkBudget()
	return errors.Join(errs...)
}

// Reset forgets every block of the worker (events.Sink), e.g. after an
// engine restart.
func (w *Worker) Reset(reason string) {
	w.mu.Lock()
	before := w.res
	w.clearLocked()
	w.lastReset = reason
	w.endLocked()
	w.mu.Unlock()
	w.ix.resident.Add(-before)
	w.c.resets.Add(1)
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
			w.addRefLocked(slot, medium)
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
	if ev.HasParent {
		if slot, ok := w.engine.Get(ev.ParentHash); ok {
			w.engine.Touch(slot)
			parent = w.locOf(slot)
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
			l := w.locOf(slot)
			if c.keyAt(l) == k {
				// Stored again: one more reference.
				w.engine.Touch(slot)
				w.addRefLocked(slot, medium)
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
		if known {
			*w.engine.At(slot) = entryAt(l)
			w.engine.Touch(slot)
		} else {
			slot = w.engine.Insert(h, entryAt(l))
		}
		if fresh {
			// The new key was created with this worker as its holder.
			w.engine.At(slot).refs[medium] = 1
			w.res++
			w.resBy[medium]++
		} else {
			w.joinLocked(l)
			w.addRefLocked(slot, medium)
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

// addRefLocked counts one more store of the block in slot in medium m,
// adding the medium to the worker's residency of its key on the first.
// Callers hold w.mu.
func (w *Worker) addRefLocked(slot uint32, m events.Medium) {
	e := w.engine.At(slot)
	if e.refs == ([events.NumMedia]uint8{}) {
		w.res++
	}
	if e.refs[m] == 0 {
		w.resBy[m]++
		l := w.locOf(slot)
		if w.aliases != nil {
			if a := w.aliases[l]; a != nil {
				a.media[m]++
			}
		}
		w.cur.change(l, holders.Op{Worker: uint32(w.id), Set: 1 << m})
		e = w.engine.At(slot)
	}
	if e.refs[m] < math.MaxUint8 {
		e.refs[m]++
	}
}

// dropEntryLocked removes all of the block's residency from the index,
// zeroes its counts and detaches it from its key, without deleting it from
// the engine map. Callers hold w.mu.
func (w *Worker) dropEntryLocked(slot uint32) {
	e := w.engine.At(slot)
	mask := e.media()
	for m, r := range e.refs {
		if r != 0 {
			w.resBy[m]--
		}
	}
	if mask != 0 {
		w.res--
	}
	e.refs = [events.NumMedia]uint8{}
	w.releaseLocked(w.locOf(slot), mask, true)
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
	for _, h := range ev.BlockHashes {
		slot, ok := w.engine.Get(h)
		if !ok || w.engine.At(slot).refs[m] == 0 {
			unknown++
			continue
		}
		if w.learned[m] == 0 {
			w.learned[m] = w.resBy[m]
		}
		e := w.engine.At(slot)
		if e.refs[m]--; e.refs[m] == 0 {
			w.resBy[m]--
			gone := e.refs == ([events.NumMedia]uint8{})
			w.releaseLocked(w.locOf(slot), 1<<m, gone)
			if gone {
				w.res--
				w.engine.Delete(slot)
			}
		}
		removed++
	}
	w.removed += int64(removed)
	if unknown > 0 {
		w.c.unknown.Add(int64(unknown))
		return fmt.Errorf("%w: %d of %d blocks removed from %s were not held there", ErrUnknownBlock, unknown, len(ev.BlockHashes), m)
	}
	return nil
}

// clearLocked forgets every block of the worker. Callers hold w.mu.
// Cost: O(blocks); the blocks are visited in store order, so runs of one
// node become one holder-set change each.
func (w *Worker) clearLocked() {
	for slot, ok := w.engine.Oldest(); ok; slot, ok = w.engine.Next(slot) {
		// Through releaseLocked, so that a key several entries resolve to
		// (an alias) is left only with the last of them, and its node is
		// not retired while a later entry still points into it.
		w.releaseLocked(w.locOf(slot), w.engine.At(slot).media(), true)
	}
	w.engine.Reset()
	w.aliases = nil
	w.res = 0
	w.resBy = [events.NumMedia]int64{}
}
