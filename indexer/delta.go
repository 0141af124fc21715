package indexer

import (
	"fmt"
	"math"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// Replication (see the package documentation). Several of the source's
// blocks may resolve to one key (aliases), and a block may be stored more
// than once in a medium (dups); the replica keeps one entry per key with
// the sums over the source's blocks (blocks, blocks per medium, stores per
// medium), and effects say which sums they change, so they stay exact.

// DeltaOp is what a DeltaEntry does.
type DeltaOp uint8

// The effects a batch can have on a worker's resident set; zero is invalid.
const (
	// OpStore is one more store of Key in Medium. BlockEdge: the first
	// store of one of the source's blocks (a new resident block or a new
	// alias); MediumEdge: its block's first in Medium (implied by
	// BlockEdge). Parent and HasParent say where a replica creates the key.
	OpStore DeltaOp = iota + 1
	// OpRemove is one store less of Key in Medium. MediumEdge: its block's
	// last store in Medium; BlockEdge: its last at all (implies MediumEdge).
	OpRemove
	// OpDrop is one of the source's blocks at Key leaving with all its
	// stores, Refs of them per medium (an eviction, or a hash moved).
	OpDrop
	OpClear // every block leaving (AllBlocksCleared, Reset).
)

var deltaOpNames = [...]string{"invalid", "store", "remove", "drop", "clear"}

// String returns the op's name.
func (op DeltaOp) String() string {
	if int(op) < len(deltaOpNames) {
		return deltaOpNames[op]
	}
	return fmt.Sprintf("op(%d)", uint8(op))
}

// DeltaEntry is one effect on a worker's resident set (see DeltaOp). It is
// 32 bytes.
type DeltaEntry struct {
	Key       Key           // the content key the effect is on (unused by OpClear).
	Parent    Key           // the key Key attaches under when HasParent (OpStore).
	Op        DeltaOp       // the effect.
	Medium    events.Medium // the medium of an OpStore or OpRemove.
	HasParent bool          // says Key attaches under Parent rather than at top level.
	// BlockEdge and MediumEdge: see OpStore and OpRemove.
	BlockEdge, MediumEdge bool
	Refs                  [events.NumMedia]uint8 // for OpDrop, the stores per medium of the block dropped.
	// Group is 0 for an effect on the worker's prefix residency (the key
	// tree), else 1 + the index of the side group whose key becomes held
	// (OpStore) or no longer held (OpRemove); see Worker.Cap.
	Group uint8
}

// Delta is a sequence of effects on one worker's resident set, in order:
// what ApplyBatchDelta, ResetDelta and SetCapacityDelta append and
// ApplyDelta applies. Reset keeps its memory for reuse.
type Delta struct {
	// Seq is the caller's sequence number of the delta. A worker that
	// records or applies it remembers it, and its snapshots carry it, so a
	// replica restored from one knows which deltas follow.
	Seq     uint64
	Entries []DeltaEntry // the effects.
	// Layout, when not empty, is the worker's KV-cache groups (as
	// Worker.Groups, without Blocks) after the call, which changed them; a
	// replica adopts it before the effects (a group described anew was
	// empty when it was, so its effects fit either way).
	Layout []Group
}

// Reset empties d, keeping the memory of its entries.
func (d *Delta) Reset() {
	d.Seq = 0
	d.Entries = d.Entries[:0]
	d.Layout = d.Layout[:0]
}

// ApplyBatchDelta is ApplyBatch that also appends to d the batch's effects
// on the worker's resident set, in content keys, and remembers d.Seq. A
// replica fed these deltas in order (ApplyDelta) holds what this worker
// holds. The source must use the *Delta variants of ApplyBatch, Reset and
// SetCapacity, and have no Config.MemoryBudget (budget evictions are not
// recorded). Cost: 5% over ApplyBatch (BenchmarkApplyBatchDelta); no
// allocation when d is reused.
func (w *Worker) ApplyBatchDelta(b *events.Batch, d *Delta) error {
	return w.applyBatch(b, d)
}

// ResetDelta is Reset that also appends an OpClear to d and remembers
// d.Seq.
func (w *Worker) ResetDelta(reason string, d *Delta) { w.reset(reason, d) }

// SetCapacityDelta is SetCapacity that also appends to d the evictions it
// causes and remembers d.Seq.
func (w *Worker) SetCapacityDelta(blocks int, d *Delta) { w.setCapacity(blocks, d) }

// DeltaSeq returns the Seq of the last delta the worker recorded or
// applied, or of the snapshot it was restored from; 0 if none.
func (w *Worker) DeltaSeq() uint64 {
	w.mu.Lock()
	defer w.mu.Unlock()
	return w.deltaSeq
}

// endRecordLocked ends the recording of a call into d (nil: none).
func (w *Worker) endRecordLocked(d *Delta) {
	w.rec = nil
	if d != nil {
		w.deltaSeq = d.Seq
		if w.layoutDirty {
			d.Layout = w.appendLayoutLocked(d.Layout[:0])
		}
	}
	w.layoutDirty = false
}

// recStore records an OpStore; w.rec is not nil.
func (w *Worker) recStore(k, parent Key, hasParent bool, m events.Medium, blockEdge, mediumEdge bool) {
	if !hasParent {
		parent = 0
	}
	w.rec.Entries = append(w.rec.Entries, DeltaEntry{Op: OpStore, Key: k, Parent: parent, HasParent: hasParent,
		Medium: m, BlockEdge: blockEdge, MediumEdge: mediumEdge})
}

// recRemove records an OpRemove; w.rec is not nil.
func (w *Worker) recRemove(k Key, m events.Medium, blockEdge, mediumEdge bool) {
	w.rec.Entries = append(w.rec.Entries, DeltaEntry{Op: OpRemove, Key: k, Medium: m, BlockEdge: blockEdge, MediumEdge: mediumEdge})
}

// parentLoc returns the position of the tree parent of the key at l, and
// false at top level. It reads only immutable fields.
func parentLoc(l loc) (loc, bool) {
	switch {
	case l.off > 0:
		return loc{l.n, l.off - 1}, true
	case l.n.parent != nil:
		return loc{l.n.parent, l.n.attach}, true
	}
	return loc{}, false
}

// parentOfLocked returns the key the key at l attaches under, and false
// at top level.
func (w *Worker) parentOfLocked(l loc) (Key, bool) {
	p, ok := parentLoc(l)
	if !ok {
		return 0, false
	}
	return w.cur.keyAt(p), true
}

// keyCounts is what a keyed worker holds of one key: the source's blocks
// at the key, how many of them are in each medium, and their stores per
// medium. A key held as one block with one store in each of its media has
// none (its entry's media say it all).
//
// Valid: per medium stores >= blocks in it, both zero or neither, no
// medium has more blocks than the key, and every block is in some medium.
type keyCounts struct {
	blocks uint32
	in     [events.NumMedia]uint32
	refs   [events.NumMedia]uint32
}

// media returns the mask of the media the key is held in.
func (kc *keyCounts) media() uint8 { return mediaOf(&kc.refs) }

// simple reports whether the entry's media alone say the counts.
func (kc *keyCounts) simple() bool {
	if kc.blocks != 1 {
		return false
	}
	for i := range kc.refs {
		if kc.refs[i] > 1 || kc.in[i] != kc.refs[i] {
			return false
		}
	}
	return true
}

// valid reports whether the counts are valid (see keyCounts).
func (kc *keyCounts) valid() bool {
	var sum uint64
	for i := range kc.refs {
		in, r := kc.in[i], kc.refs[i]
		if in > r || (r == 0) != (in == 0) || in > kc.blocks {
			return false
		}
		sum += uint64(in)
	}
	return uint64(kc.blocks) <= sum
}

// simpleCounts returns the counts of an entry without keyCounts.
func simpleCounts(media uint8) keyCounts {
	kc := keyCounts{blocks: 1}
	for i := range kc.refs {
		if media&(1<<i) != 0 {
			kc.in[i], kc.refs[i] = 1, 1
		}
	}
	return kc
}

// countsLocked returns the counts of the keyed worker's entry in slot.
func (w *Worker) countsLocked(slot int) keyCounts {
	e := w.entry(slot)
	if e.dup() {
		return *w.keyed[w.engine.Hash(slot)]
	}
	return simpleCounts(e.media())
}

// setCountsLocked makes kc (valid, not zero) the counts of the keyed
// worker's entry e of key h, and returns the updated entry for the caller
// to write.
func (w *Worker) setCountsLocked(h uint64, e engineEntry, kc *keyCounts) engineEntry {
	e = e.with(kc.media())
	if kc.simple() {
		if e.dup() {
			delete(w.keyed, h)
		}
		return e &^ entryDup
	}
	if e.dup() {
		*w.keyed[h] = *kc
		return e
	}
	if w.keyed == nil {
		w.keyed = make(map[uint64]*keyCounts)
	}
	c := *kc
	w.keyed[h] = &c
	return e | entryDup
}

// dropKeyLocked removes the keyed worker's key in slot from the tree and
// its counts; the caller deletes the entry.
func (w *Worker) dropKeyLocked(slot int) {
	kc := w.countsLocked(slot)
	e := w.entry(slot)
	w.res -= int64(kc.blocks)
	for m, n := range kc.in {
		w.resBy[m] -= int64(n)
	}
	if e.dup() {
		delete(w.keyed, w.engine.Hash(slot))
	}
	w.cur.change(w.locOf(e), holders.Op{Worker: uint32(w.id), Clear: allMedia})
}

// ApplyDelta applies d's effects in order to the keyed worker and
// remembers d.Seq. An effect that does not fit the worker's state is
// skipped and counted (Stats.DeltaMismatches), the others still apply, and
// the error wraps ErrDeltaMismatch: the worker needs a new snapshot. A
// worker fed engine events refuses (ErrWorkerKind). Effects on keys the
// memory budget evicted do not fit. Changes are visible on return.
//
// Cost: per stored key an engine-map probe and insert and a store's tree
// work; per removal a probe and a holder-set change (BenchmarkApplyDelta).
func (w *Worker) ApplyDelta(d *Delta) error {
	if !w.info.Keyed {
		return fmt.Errorf("%w: worker %s is fed engine events (delta %d of %d effects not applied)", ErrWorkerKind, w.info.Ref, d.Seq, len(d.Entries))
	}
	w.mu.Lock()
	if w.gone {
		w.mu.Unlock()
		return fmt.Errorf("%w: %s (delta %d of %d effects not applied)", ErrRemovedWorker, w.info.Ref, d.Seq, len(d.Entries))
	}
	before := w.res
	bad := 0
	var first error
	if len(d.Layout) > 0 {
		if why := checkLayout(d.Layout); why != "" {
			bad, first = 1, fmt.Errorf("layout: %s", why)
		} else {
			w.adoptLayoutLocked(d.Layout)
		}
	}
	a := deltaApplier{w: w, d: d}
	if len(d.Entries) >= warmMin {
		// A replica's workers' deltas interleave, so each map is out of
		// cache: see warmBatchLocked.
		var sum uint64
		for i := range d.Entries {
			sum += w.engine.Warm(uint64(d.Entries[i].Key))
		}
		w.warmSink = sum
	}
	for i := range d.Entries {
		if why := a.apply(i); why != "" {
			if bad == 0 {
				de := &d.Entries[i]
				first = fmt.Errorf("effect %d (%s of key %#016x in %s): %s", i, de.Op, uint64(de.Key), de.Medium, why)
			}
			bad++
		} else if de := &d.Entries[i]; w.hist.on() && (de.Op == OpRemove && de.BlockEdge || de.Op == OpDrop) {
			cause := CauseRemoved
			if de.Op == OpDrop {
				cause = CauseCapacity
			}
			w.hist.add(de.Key, cause)
		}
	}
	w.deltaSeq = d.Seq
	w.unlockThen(before, after{apply: true, what: Applied{Delta: d}})
	if bad > 0 {
		w.c.deltaMismatches.Add(int64(bad))
		return fmt.Errorf("%w: worker %s, delta %d: %d of %d effects skipped; the first: %w", ErrDeltaMismatch, w.info.Ref, d.Seq, bad, len(d.Entries), first)
	}
	return nil
}

// deltaApplier is the state of one ApplyDelta: the last stored key's place
// (a chain's next key attaches there with no probe) and the end of the
// current chain of stores, which sizes the nodes it creates.
type deltaApplier struct {
	w        *Worker
	d        *Delta
	prev     Key
	prevLoc  loc
	prevOK   bool
	chainEnd int
}

// Reasons an effect does not fit (no allocation: constants).
const (
	whyMedium     = "unknown medium"
	whyEdges      = "a block's first or last store is also its first or last in its medium"
	whyNotHeld    = "the worker does not hold the key"
	whyNotFirst   = "the worker does not hold the key, and the store is not a new block's"
	whyParent     = "the worker does not hold the parent key"
	whyNoStore    = "the worker holds no store of the key in the medium"
	whyCounts     = "the key's counts would become inconsistent"
	whyDropNone   = "a drop of no stores"
	whyDropMore   = "a drop of more stores or blocks than the worker holds"
	whyOp         = "unknown op"
	whySaturation = "a count would overflow"
)

// apply applies effect i, returning why it does not fit ("" if it did).
func (a *deltaApplier) apply(i int) string {
	w := a.w
	de := &a.d.Entries[i]
	if de.Group != 0 {
		return a.side(de)
	}
	if de.Op != OpStore {
		// Removals may retire the node the last stored key is in.
		a.prevOK = false
	}
	switch de.Op {
	case OpStore, OpRemove:
		if int(de.Medium) >= events.NumMedia {
			return whyMedium
		}
		if de.BlockEdge && !de.MediumEdge {
			return whyEdges
		}
		if de.Op == OpStore {
			return a.store(i, de)
		}
		return a.remove(de)
	case OpDrop:
		return a.drop(de)
	case OpClear:
		w.clearLocked()
		w.c.clears.Add(1)
		return ""
	}
	return whyOp
}

// store applies an OpStore of a valid medium and edges.
func (a *deltaApplier) store(i int, de *DeltaEntry) string {
	w := a.w
	m := de.Medium
	bit := uint8(1) << m
	h := uint64(de.Key)
	slot, held := w.engine.Get(h)
	if !held {
		if !de.BlockEdge {
			return whyNotFirst
		}
		var l loc
		var fresh bool
		single := w.ix.single(uint32(w.id), bit)
		if de.HasParent {
			var p loc
			if a.prevOK && a.prev == de.Parent {
				p = a.prevLoc
			} else if ps, ok := w.engine.Get(uint64(de.Parent)); ok {
				p = w.locOf(w.entry(ps))
			} else {
				return whyParent
			}
			l, fresh = w.cur.next(p, de.Key, single, a.chain(i))
		} else {
			l, fresh = w.cur.top(de.Key, single, a.chain(i))
		}
		if !fresh {
			w.cur.change(l, holders.Op{Worker: uint32(w.id), Set: bit})
		}
		w.engine.Insert(h, uint64(newEntry(l, bit)))
		w.res++
		w.resBy[m]++
		w.stored++
		a.prev, a.prevLoc, a.prevOK = de.Key, l, true
		return ""
	}
	e := w.entry(slot)
	kc := w.countsLocked(slot)
	if kc.refs[m] == math.MaxUint32 || kc.blocks == math.MaxUint32 {
		return whySaturation
	}
	kc.refs[m]++
	if de.MediumEdge {
		kc.in[m]++
	}
	if de.BlockEdge {
		kc.blocks++
	}
	if !kc.valid() {
		return whyCounts
	}
	l := w.locOf(e)
	if e.media()&bit == 0 {
		w.cur.change(l, holders.Op{Worker: uint32(w.id), Set: bit})
	}
	w.engine.SetVal(slot, uint64(w.setCountsLocked(h, e, &kc)))
	w.engine.Touch(slot)
	if de.BlockEdge {
		w.res++
	}
	if de.MediumEdge {
		w.resBy[m]++
	}
	w.stored++
	a.prev, a.prevLoc, a.prevOK = de.Key, l, true
	return ""
}

// chain returns the number of stores from effect i on that form a chain,
// at least 1: what the nodes they create are sized for.
func (a *deltaApplier) chain(i int) int {
	if i >= a.chainEnd {
		es := a.d.Entries
		j := i + 1
		for j < len(es) && es[j].Op == OpStore && es[j].HasParent && es[j].Parent == es[j-1].Key {
			j++
		}
		a.chainEnd = j
	}
	return a.chainEnd - i
}

// remove applies an OpRemove of a valid medium and edges.
func (a *deltaApplier) remove(de *DeltaEntry) string {
	w := a.w
	m := de.Medium
	slot, held := w.engine.Get(uint64(de.Key))
	if !held {
		return whyNotHeld
	}
	kc := w.countsLocked(slot)
	if kc.refs[m] == 0 {
		return whyNoStore
	}
	kc.refs[m]--
	if de.MediumEdge {
		if kc.in[m] == 0 {
			return whyCounts
		}
		kc.in[m]--
	}
	if de.BlockEdge {
		if kc.blocks == 0 {
			return whyCounts
		}
		kc.blocks--
	}
	if !kc.valid() {
		return whyCounts
	}
	if de.BlockEdge {
		w.res--
	}
	if de.MediumEdge {
		w.resBy[m]--
	}
	w.removed++
	a.setOrDelete(slot, &kc)
	return ""
}

// drop applies an OpDrop.
func (a *deltaApplier) drop(de *DeltaEntry) string {
	w := a.w
	slot, held := w.engine.Get(uint64(de.Key))
	if !held {
		return whyNotHeld
	}
	if de.Refs == ([events.NumMedia]uint8{}) {
		return whyDropNone
	}
	kc := w.countsLocked(slot)
	if kc.blocks == 0 {
		return whyDropMore
	}
	kc.blocks--
	for m, r := range de.Refs {
		if r == 0 {
			continue
		}
		if kc.refs[m] < uint32(r) || kc.in[m] == 0 {
			return whyDropMore
		}
		kc.refs[m] -= uint32(r)
		kc.in[m]--
	}
	if !kc.valid() {
		return whyCounts
	}
	w.res--
	for m, r := range de.Refs {
		if r != 0 {
			w.resBy[m]--
		}
	}
	a.setOrDelete(slot, &kc)
	return ""
}

// setOrDelete makes kc the counts of the entry in slot after a removal,
// taking lost media off the tree and deleting the entry when it is empty.
func (a *deltaApplier) setOrDelete(slot int, kc *keyCounts) {
	w := a.w
	e := w.entry(slot)
	h := w.engine.Hash(slot)
	if kc.blocks == 0 {
		if e.dup() {
			delete(w.keyed, h)
		}
		w.cur.change(w.locOf(e), holders.Op{Worker: uint32(w.id), Clear: allMedia})
		w.engine.Delete(slot)
		return
	}
	if lost := e.media() &^ kc.media(); lost != 0 {
		w.cur.change(w.locOf(e), holders.Op{Worker: uint32(w.id), Clear: lost})
	}
	w.engine.SetVal(slot, uint64(w.setCountsLocked(h, e, kc)))
}

// warmMin is the smallest delta ApplyDelta warms the engine map for.
const warmMin = 8
