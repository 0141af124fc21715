package indexer

import (
	"cmp"
	"errors"
	"fmt"
	"math"
	"slices"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// ApplyBatch applies b's events in order (events.Sink). An event that
// cannot be applied is counted and skipped, and the returned error joins
// one error per problem, each naming the event. The changes are visible to
// Match when it returns. A keyed worker refuses (ErrWorkerKind).
//
// Cost: about 230 ns per stored block, its removal included, and 13
// allocations per batch of 80 blocks (BenchmarkApply).
func (w *Worker) ApplyBatch(b *events.Batch) error { return w.applyBatch(b, nil) }

// applyBatch is ApplyBatch, recording the effects in d when not nil.
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
	w.unlockThen(before, after{apply: true, what: Applied{Batch: b}})
	return errors.Join(errs...)
}

// warmBatchLocked loads the engine-map buckets of every block hash of b
// before applying it, so that a map out of cache (other workers' batches
// ran since) takes its misses overlapped rather than one after another.
// Cost: four cache lines requested per hash (prefetches on amd64).
func (w *Worker) warmBatchLocked(b *events.Batch) {
	var sum uint64
	for i := range b.Events {
		for _, h := range b.Events[i].BlockHashes {
			sum += w.engine.Warm(h)
		}
	}
	w.warmSink = sum
}

// Reset forgets every block of the worker (events.Sink).
func (w *Worker) Reset(reason string) { w.reset(reason, nil) }

// reset is Reset, recording its effect in d when not nil.
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
	w.unlockThen(before, after{what: Applied{Reset: reason}})
}

// applyLocked applies one event.
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

// storeLocked applies a BlockStored event. Cost per block: a BlockKey, an
// engine-map probe and insert, and O(1) in the tree when the block follows
// its parent's run; a heads probe or a new node for a branch.
func (w *Worker) storeLocked(ev *events.Event) error {
	if len(ev.TokenIDs) > 0 {
		if err := w.checkTokensLocked(ev, ev.BlockSize); err != nil {
			return err
		}
	}
	g, err := w.learnGroupLocked(ev)
	switch {
	case g == nil:
		return err
	case g.side != nil:
		return w.sideStoreLocked(g.side, ev)
	case !g.Anchor:
		w.c.group.Add(1)
		return nil
	}
	return w.storeAnchorLocked(ev)
}

// storeAnchorLocked applies a BlockStored event of the anchor group. A
// medium name kvindex does not know is no error: its class (OTHER unless
// the transport's events.Tiers says otherwise) is counted and shown by the
// transport, and the worker stays healthy.
func (w *Worker) storeAnchorLocked(ev *events.Event) error {
	if int(ev.Medium) >= events.NumMedia {
		w.c.invalid.Add(1)
		return fmt.Errorf("%w: medium %d", ErrUnknownMedium, ev.Medium)
	}
	if len(ev.TokenIDs) == 0 {
		return w.offloadLocked(ev)
	}
	if n := len(ev.BlockHashes); len(ev.TokenIDs) != n*ev.BlockSize {
		// The prefix group has no null blocks: its blocks chain in the
		// tree, each under the one before.
		w.c.invalid.Add(1)
		return fmt.Errorf("%w: %d token_ids for %d blocks of %d in the prefix group", ErrTokenCount, len(ev.TokenIDs), n, ev.BlockSize)
	}
	w.checkStoreLocked(ev)
	parent, parentKey, err := w.storeParentLocked(ev)
	w.storeBlocksLocked(ev, parent, parentKey)
	w.stored += int64(len(ev.BlockHashes))
	return err
}

// offloadLocked applies a BlockStored event without tokens: its known
// blocks are now also resident in its medium.
func (w *Worker) offloadLocked(ev *events.Event) error {
	medium := ev.Medium
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
		return fmt.Errorf("%w: %d of %d blocks offloaded to %s were never stored", ErrUnknownBlock, unknown, len(ev.BlockHashes), medium)
	}
	return nil
}

// checkStoreLocked counts a block size other than the model's (the blocks
// are still indexed, at the engine's block size: a worker that disagrees
// with its model is flagged, and its blocks match once the model's keys
// use its size).
func (w *Worker) checkStoreLocked(ev *events.Event) {
	if ev.BlockSize != w.model.BlockSize() {
		w.c.blockSize.Add(1)
		w.c.lastBadBlockSize.Store(int64(ev.BlockSize))
	}
}

// storeParentLocked returns where the event's first block attaches: its
// parent's place and key (parent.n nil: under the adapter's root). An
// unknown parent makes the blocks orphans, keyed under a key derived from
// the worker and the missing parent.
func (w *Worker) storeParentLocked(ev *events.Event) (parent loc, parentKey Key, err error) {
	parentKey = w.rootFor(ev.LoRAName)
	if ev.LoRAName != "" {
		w.hist.noteLoRA(ev.LoRAName)
	}
	if !ev.HasParent {
		return loc{}, parentKey, nil
	}
	if slot, ok := w.engine.Get(ev.ParentHash); ok {
		w.engine.Touch(slot)
		parent = w.locOf(w.entry(slot))
		return parent, w.cur.keyAt(parent), nil
	}
	n := len(ev.BlockHashes)
	w.c.orphans.Add(int64(n))
	return loc{}, orphanRoot(w.id, ev.ParentHash), fmt.Errorf("%w %#016x: %d blocks indexed as orphans", ErrOrphan, ev.ParentHash, n)
}

// storeBlocksLocked keys and stores a checked event's blocks, each under
// the one before.
func (w *Worker) storeBlocksLocked(ev *events.Event, parent loc, parentKey Key) {
	bs, n := ev.BlockSize, len(ev.BlockHashes)
	single := w.ix.single(uint32(w.id), 1<<ev.Medium)
	var stack [128]byte
	scratch := stack[:0]
	for i, h := range ev.BlockHashes {
		var extra events.ExtraKeys
		switch {
		case ev.ExtraKeys != nil:
			extra = ev.ExtraKeys[i]
		case ev.LoRAName != "" || ev.CacheSalt != "":
			// lora_name or cache_salt without extra_keys: key the blocks
			// as a prompt with that adapter and salt is keyed.
			px := PromptExtras{LoRAName: ev.LoRAName}
			if !ev.HasParent {
				px.CacheSalt = ev.CacheSalt
			}
			extra, scratch = px.blockExtras(i, scratch)
		}
		k := BlockKey(parentKey, ev.TokenIDs[i*bs:(i+1)*bs], extra)
		parent = w.storeBlockLocked(h, k, ev.Medium, parent, parentKey, single, n-i)
		parentKey = k
	}
}

// storeBlockLocked stores the block (h, k) in medium m under parentKey at
// parent, single being the worker's set of m and rest the event's blocks
// from this one on, and returns the key's place.
func (w *Worker) storeBlockLocked(h uint64, k Key, m events.Medium, parent loc, parentKey Key, single *holders.Set, rest int) loc {
	c := &w.cur
	slot, known := w.engine.Get(h)
	if known {
		e := w.entry(slot)
		l := w.locOf(e)
		if c.keyAt(l) == k {
			// Stored again: one more reference.
			w.engine.Touch(slot)
			ne, counted := w.addRefLocked(h, e, m)
			w.engine.SetVal(slot, uint64(ne))
			if counted && w.rec != nil {
				w.recStore(k, parentKey, parent.n != nil, m, false, e.media()&(1<<m) == 0)
			}
			return l
		}
		// The engine reused a hash for different content (or the earlier
		// store was an orphan): move the entry.
		w.dropEntryLocked(slot)
	}
	var l loc
	var fresh bool
	if parent.n == nil {
		l, fresh = c.top(k, single, rest)
	} else {
		l, fresh = c.next(parent, k, single, rest)
	}
	var e engineEntry
	if fresh {
		e = newEntry(l, 1<<m)
		w.res++
		w.resBy[m]++
	} else {
		w.joinLocked(l)
		e, _ = w.addRefLocked(h, newEntry(l, 0), m)
	}
	if w.rec != nil {
		w.recStore(k, parentKey, parent.n != nil, m, true, true)
		if known {
			// The old key was dropped first and may be the parent; the
			// effects commute on counts, and recorded store first a replica
			// still holds the parent when it creates the key.
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
	return l
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

// addRefLocked counts one more store in medium m of block h with entry e
// (media 0: not yet stored), adding the medium to the key's residency on
// the first. It returns the updated entry, for the caller to write, and
// whether the store counted (not when saturated).
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
	// Stored again in m: the counts move to dups, saturating at 255.
	if e.dup() {
		r := w.dups[h]
		if r[m] == math.MaxUint8 {
			return e, false
		}
		r[m]++
		return e, true
	}
	r := new([events.NumMedia]uint8)
	*r = onePerMedium(e.media())
	r[m] = 2
	if w.dups == nil {
		w.dups = make(map[uint64]*[events.NumMedia]uint8)
	}
	w.dups[h] = r
	return e | entryDup, true
}

// dropEntryLocked removes all of the block's residency in slot from the
// index and its counts; the caller deletes or repoints the entry.
func (w *Worker) dropEntryLocked(slot int) {
	if w.info.Keyed {
		w.dropKeyLocked(slot)
		return
	}
	e := w.entry(slot)
	if w.rec != nil {
		w.rec.Entries = append(w.rec.Entries, DeltaEntry{Op: OpDrop, Key: w.cur.keyAt(w.locOf(e)), Refs: w.refsOf(slot)})
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

// releaseLocked ends one entry's residency of the key at l in the media of
// mask (leaving the key when leave), taking the worker off the tree in each
// medium no other entry at l still holds.
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
		// The only entry leaves: one op for all media batches runs better.
		mask = allMedia
	}
	if mask != 0 {
		w.cur.change(l, holders.Op{Worker: uint32(w.id), Clear: mask})
	}
}

// joinLocked records a new entry (no stores yet) at the existing key l,
// which makes l an alias when the worker already holds it.
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

// removeLocked applies a BlockRemoved event.
func (w *Worker) removeLocked(ev *events.Event) error {
	if ev.HasGroupIdx && ev.GroupIdx != w.anchor {
		idx, ok := eventGroup(ev)
		if !ok {
			w.c.invalid.Add(1)
			return fmt.Errorf("%w: group_idx %d outside [0, %d)", ErrGroup, ev.GroupIdx, MaxGroups)
		}
		g := w.groupOfLocked(idx)
		switch {
		case g == nil:
			// Never stored since kvindex joined: nothing of it is held,
			// and nothing of another group may be touched.
			w.c.unknownGroup.Add(int64(len(ev.BlockHashes)))
			return fmt.Errorf("%w %d: %d blocks removed from a group never stored", ErrGroup, idx, len(ev.BlockHashes))
		case g.side != nil:
			return w.sideRemoveLocked(g.side, ev)
		default:
			w.c.group.Add(1)
			return nil
		}
	}
	return w.removeAnchorLocked(ev)
}

// removeAnchorLocked applies a BlockRemoved event of the anchor group (or
// of no group: vLLM before group_idx announced one group).
func (w *Worker) removeAnchorLocked(ev *events.Event) error {
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
			w.learned[m] = w.learnedAtLocked(m)
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

// clearLocked forgets every block of the worker, releasing them in tree
// order so that a node's runs become one holder-set change each.
func (w *Worker) clearLocked() {
	if w.rec != nil {
		w.rec.Entries = append(w.rec.Entries, DeltaEntry{Op: OpClear})
	}
	evict := make([]uint64, 0, w.engine.Len())
	for slot := range w.engine.All() {
		evict = append(evict, uint64(w.entry(slot)))
	}
	slices.SortFunc(evict, func(a, b uint64) int { return cmp.Compare(engineEntry(a).pos(), engineEntry(b).pos()) })
	for _, x := range evict {
		// Through releaseLocked, so that an alias is left only with its
		// last entry, and its node not retired while one still points in.
		e := engineEntry(x)
		w.releaseLocked(w.locOf(e), e.media(), true)
	}
	w.engine.Reset()
	w.dups = nil
	w.aliases = nil
	w.keyed = nil
	w.res = 0
	w.resBy = [events.NumMedia]int64{}
	w.clearAllSideLocked()
}
