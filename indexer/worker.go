package indexer

import (
	"errors"
	"fmt"
	"sync"
	"time"

	"github.com/kvindex/kvindex/events"
)

// Worker is one KV cache (pod, DP rank) in the index: its engine-hash map
// and counters. It implements events.Sink for its subscriber.
//
// # Concurrency
//
// ApplyBatch and Reset serialise on mu; Stats reads atomics and may run at
// any time.
type Worker struct {
	id    WorkerID
	info  WorkerInfo
	model *Model
	ix    *Index

	mu sync.Mutex // guards engine, ignoredGroups, lastReset
	// engine maps the engine's block hash to the content key it was stored
	// under and its per-medium store counts. It resolves BlockRemoved and
	// parent_block_hash, which name engine hashes only.
	engine map[uint64]*engineEntry
	// ignoredGroups are KV-cache groups (hybrid models) whose events do not
	// decide prefix reuse; learned from BlockStored's kv_cache_spec_kind.
	ignoredGroups map[int]struct{}
	lastReset     string

	c counters
}

// engineEntry is one engine block of a worker.
type engineEntry struct {
	key  Key
	refs [events.NumMedia]uint32
}

func (e *engineEntry) empty() bool {
	for _, r := range e.refs {
		if r != 0 {
			return false
		}
	}
	return true
}

// ID returns the worker's dense id.
func (w *Worker) ID() WorkerID { return w.id }

// Info returns what the worker was added with.
func (w *Worker) Info() WorkerInfo { return w.info }

// Model returns the worker's model.
func (w *Worker) Model() *Model { return w.model }

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
		Clears:              w.c.clears.Load(),
		Resets:              w.c.resets.Load(),
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

// fullAttention is the kv_cache_spec_kind whose blocks decide prefix reuse.
const fullAttention = "full_attention"

// ApplyBatch applies b's events in order (events.Sink). An event that cannot
// be applied is counted and skipped; the others still apply. The returned
// error joins one error per problem, each naming the event.
func (w *Worker) ApplyBatch(b *events.Batch) error {
	w.mu.Lock()
	var errs []error
	for i := range b.Events {
		if err := w.applyLocked(&b.Events[i]); err != nil {
			errs = append(errs, fmt.Errorf("worker %s event %d (%s): %w", w.info.Ref, i, b.Events[i].Kind, err))
		}
	}
	w.mu.Unlock()
	w.c.lastApply.Store(time.Now().UnixNano())
	return errors.Join(errs...)
}

// Reset forgets every block of the worker (events.Sink), e.g. after an
// engine restart.
func (w *Worker) Reset(reason string) {
	w.mu.Lock()
	w.clearLocked()
	w.lastReset = reason
	w.mu.Unlock()
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
	if len(ev.TokenIDs) == 0 {
		// An offload event: the blocks are known, and now also resident in
		// another medium.
		unknown := 0
		for _, h := range ev.BlockHashes {
			e := w.engine[h]
			if e == nil {
				unknown++
				continue
			}
			w.addRefLocked(e, medium)
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
	var err error
	parent := w.rootFor(ev.LoRAName)
	if ev.HasParent {
		if e := w.engine[ev.ParentHash]; e != nil {
			parent = e.key
		} else {
			// The chain above this block is unknown, so its key cannot
			// match any prompt. Index it under a key derived from the
			// worker and the missing parent, so that its removal and its
			// descendants still resolve, and count it.
			parent = orphanRoot(w.id, ev.ParentHash)
			w.c.orphans.Add(int64(n))
			err = fmt.Errorf("%w %#016x: %d blocks indexed as orphans", ErrOrphan, ev.ParentHash, n)
		}
	}
	var stack [128]byte
	scratch := stack[:0]
	for i, h := range ev.BlockHashes {
		var extra events.ExtraKeys
		switch {
		case ev.ExtraKeys != nil:
			extra = ev.ExtraKeys[i]
		case ev.LoRAName != "":
			// Engines that send lora_name without extra_keys still hashed
			// the adapter as vLLM's first extra key; rebuild it.
			scratch = events.AppendString(events.AppendTuple(scratch[:0], 1), ev.LoRAName)
			extra = scratch
		}
		k := BlockKey(parent, ev.TokenIDs[i*bs:(i+1)*bs], extra)
		e := w.engine[h]
		if e == nil {
			e = &engineEntry{key: k}
			w.engine[h] = e
		} else if e.key != k {
			// The engine reused a hash for different content (or its
			// earlier store was an orphan): move the entry to the new key.
			w.dropEntryLocked(e)
			e.key = k
		}
		w.addRefLocked(e, medium)
		parent = k
	}
	w.c.stored.Add(int64(n))
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

// addRefLocked counts one more store of e in medium m. Callers hold w.mu.
func (w *Worker) addRefLocked(e *engineEntry, m events.Medium) {
	if e.empty() {
		w.c.resident.Add(1)
	}
	if e.refs[m] == 0 {
		w.c.residentByMedium[m].Add(1)
	}
	e.refs[m]++
	w.ix.addResidency(e.key, w.id, m)
}

// dropEntryLocked removes all of e's residency from the index without
// deleting it from the engine map. Callers hold w.mu.
func (w *Worker) dropEntryLocked(e *engineEntry) {
	for m, r := range e.refs {
		if r == 0 {
			continue
		}
		w.ix.dropResidency(e.key, w.id, events.Medium(m), r)
		w.c.residentByMedium[m].Add(-1)
		e.refs[m] = 0
	}
	w.c.resident.Add(-1)
}

// removeLocked applies a BlockRemoved event. Callers hold w.mu.
func (w *Worker) removeLocked(ev *events.Event) error {
	if w.skipGroupLocked(ev) {
		w.c.group.Add(1)
		return nil
	}
	m := ev.Medium
	unknown := 0
	for _, h := range ev.BlockHashes {
		e := w.engine[h]
		if e == nil || e.refs[m] == 0 {
			unknown++
			continue
		}
		e.refs[m]--
		w.ix.dropResidency(e.key, w.id, m, 1)
		if e.refs[m] == 0 {
			w.c.residentByMedium[m].Add(-1)
			if e.empty() {
				w.c.resident.Add(-1)
				delete(w.engine, h)
			}
		}
		w.c.removed.Add(1)
	}
	if unknown > 0 {
		w.c.unknown.Add(int64(unknown))
		return fmt.Errorf("%w: %d of %d blocks removed from %s were not held there", ErrUnknownBlock, unknown, len(ev.BlockHashes), m)
	}
	return nil
}

// clearLocked forgets every block of the worker. Callers hold w.mu.
func (w *Worker) clearLocked() {
	for h, e := range w.engine {
		if !e.empty() {
			w.dropEntryLocked(e)
		}
		delete(w.engine, h)
	}
}
