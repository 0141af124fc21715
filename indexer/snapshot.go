package indexer

import (
	"cmp"
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// Snapshots. A snapshot is a worker's resident set as a list of keys, each
// with where it attaches in the tree (its parent key, or top level) and
// its counts summed over the worker's blocks at the key, in an order where
// every key's parent comes before it; Restore makes a keyed worker hold
// exactly that, then ApplyDelta continues from the snapshot's Seq.
//
// A restore must put every key where it is in the source's tree, or a
// prompt could not reach it, and later stores of its true chain (by any
// worker) would create a second node for it that heads cannot hold (see
// cursor.top and cursor.next). A key's parent is not always held by the
// worker: the engine may evict a parent before its child. So a snapshot
// includes the ancestors a held key needs, from its parent up to the
// nearest key the worker holds or the top-level key, as placeholders
// (keys with no blocks); a restore creates them held by nobody, as they
// are in the source's tree. A placeholder is always followed at once by a
// key under it (it lies on the way to a held key), which Restore checks:
// a node holding only placeholders would otherwise die before the key
// that keeps it alive arrives.

// SnapshotSegmentKeys is the most keys one SnapshotSegment holds: about
// 40 KB in AppendBinary's encoding, whose key held as one block with one
// store per medium costs 10 bytes (18 when its parent is not the key
// before it).
const SnapshotSegmentKeys = 4096

// SnapshotSegment is one part of a worker's snapshot (see Worker.Snapshot).
type SnapshotSegment struct {
	// Seq is the worker's delta seq when the snapshot was taken (see
	// Delta.Seq): a replica restored from it applies the deltas after it.
	// The same in every segment of a snapshot.
	Seq uint64
	// Part numbers the segments of a snapshot from 0.
	Part uint32
	// Total is the number of keys in the whole snapshot, the same in every
	// segment, so that a restore sizes its memory once.
	Total uint64
	// Last marks the snapshot's last segment.
	Last bool
	// Digest is, in the last segment, the worker's Digest when the
	// snapshot was taken; Restore checks the keys against it.
	Digest uint64
	// Keys are at most SnapshotSegmentKeys keys, each after its parent
	// (in this segment or an earlier one).
	Keys []SnapshotKey
}

// SnapshotKey is one key of a snapshot: where it attaches in the tree, and
// what the worker holds of it, summed over its blocks at the key (several
// for an alias). A placeholder (an ancestor of held keys that the worker
// does not hold) has all counts zero.
type SnapshotKey struct {
	// Key is the content key.
	Key Key
	// Parent is the key Key attaches under, when HasParent; otherwise Key
	// is at top level.
	Parent    Key
	HasParent bool
	// Blocks is how many of the worker's blocks resolve to Key, and
	// BlocksIn[m] how many of them are in medium m.
	Blocks   uint32
	BlocksIn [events.NumMedia]uint32
	// Refs[m] is the stores in medium m, summed over those blocks.
	Refs [events.NumMedia]uint32
}

// counts returns the key's counts.
func (sk *SnapshotKey) counts() keyCounts {
	return keyCounts{blocks: sk.Blocks, in: sk.BlocksIn, refs: sk.Refs}
}

// Snapshot calls emit with the worker's snapshot, segment by segment, in
// order (see SnapshotSegment). It is consistent: the keys are gathered
// under the worker's mutex, as they are after some batch, and then
// emitted with no lock held, so emit may be slow, or call into the index.
// emit must not keep the segment after it returns (it is reused); an
// error from emit ends the snapshot and is returned, wrapped. Works for
// workers fed engine events and keyed workers alike; an empty worker's
// snapshot is one empty segment.
//
// Cost: O(blocks log blocks) under the mutex (the blocks sorted by
// position, a node lock per run of keys in one node, a binary search per
// parent in another node), plus the placeholders; memory for the keys
// (72 bytes each) until it returns. BenchmarkSnapshot (docs/benchmarks.md):
// 8.5 ms for 30,000 blocks, encoding included.
func (w *Worker) Snapshot(emit func(*SnapshotSegment) error) error {
	keys, seq, digest, err := w.snapshotKeys()
	if err != nil {
		return err
	}
	seg := SnapshotSegment{Seq: seq, Total: uint64(len(keys))}
	for part := uint32(0); ; part++ {
		n := min(len(keys), SnapshotSegmentKeys)
		seg.Part, seg.Keys, keys = part, keys[:n:n], keys[n:]
		seg.Last = len(keys) == 0
		if seg.Last {
			seg.Digest = digest
		}
		if err := emit(&seg); err != nil {
			return fmt.Errorf("indexer: snapshot of worker %s: segment %d: %w", w.info.Ref, part, err)
		}
		if seg.Last {
			return nil
		}
	}
}

// snapHeld is a key the walk's worker holds: its position (see
// engineEntry.pos), its entries slots[lo:] up to the next key's, and
// once it is out, its key.
type snapHeld struct {
	pos uint64
	lo  int32
	out bool
	key Key
}

// snapStep is a key on the way up from a held key: held[idx], or a
// placeholder (idx -1), at l.
type snapStep struct {
	idx int32
	l   loc
}

// posOf returns the position of l as engineEntry.pos has it.
func posOf(l loc) uint64 { return uint64(l.off) | uint64(l.n.id)<<entryNodeShift }

// Positions are 43 bits (entryGenShift), so a position and an index of up
// to 21 bits pack into one integer, and an engine map of fewer entries is
// sorted by position as integers (three times faster than by a function).
const snapIndexBits = 64 - entryGenShift

// snapshotKeys gathers the worker's snapshot under its mutex: the keys in
// an order where parents come first, the delta seq and the digest.
func (w *Worker) snapshotKeys() ([]SnapshotKey, uint64, uint64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gone {
		return nil, 0, 0, fmt.Errorf("%w: %s (no snapshot)", ErrRemovedWorker, w.info.Ref)
	}
	out := make([]SnapshotKey, 0, w.engine.Len())
	var digest uint64
	w.treeOrderLocked(func(k, parent Key, hasParent bool, slots []int) {
		sk := SnapshotKey{Key: k, Parent: parent, HasParent: hasParent}
		if slots != nil {
			w.snapCountsLocked(&sk, slots)
			kc := sk.counts()
			digest += digestTerm(sk.Key, kc.media())
		}
		out = append(out, sk)
	})
	return out, w.deltaSeq, digest, nil
}

// treeOrderLocked calls visit for every key the worker holds, and every
// placeholder its held keys need (see the comment on snapshots above),
// in an order where each key's parent comes before it and a placeholder
// is followed at once by a key under it: with the key, where it attaches
// (under parent when hasParent, else at top level), and the slots of the
// worker's entries at the key (nil for a placeholder; valid until the
// worker next changes). Callers hold w.mu; visit must not change the
// worker or lock tree nodes.
//
// Cost: O(blocks log blocks): the entries sorted by position, a node
// lock per run of keys in one node, a binary search per parent in
// another node, plus the placeholders; 24 bytes per block of memory
// until it returns.
func (w *Worker) treeOrderLocked(visit func(k, parent Key, hasParent bool, slots []int)) {
	// The entries' slots, sorted by position.
	n := w.engine.Len()
	slots := make([]int, 0, n)
	for slot := range w.engine.All() {
		slots = append(slots, slot)
	}
	if n < 1<<snapIndexBits {
		packed := make([]uint64, n)
		for i, slot := range slots {
			packed[i] = w.entry(slot).pos()<<snapIndexBits | uint64(i)
		}
		slices.Sort(packed)
		sorted := make([]int, n)
		for i, x := range packed {
			sorted[i] = slots[x&(1<<snapIndexBits-1)]
		}
		slots = sorted
	} else {
		slices.SortFunc(slots, func(a, b int) int { return cmp.Compare(w.entry(a).pos(), w.entry(b).pos()) })
	}
	held := make([]snapHeld, 0, n)
	for i, slot := range slots {
		if pos := w.entry(slot).pos(); len(held) == 0 || held[len(held)-1].pos != pos {
			held = append(held, snapHeld{pos: pos, lo: int32(i)})
		}
	}
	entriesOf := func(i int) []int {
		if i+1 < len(held) {
			return slots[held[i].lo:held[i+1].lo:held[i+1].lo]
		}
		return slots[held[i].lo:]
	}
	// find returns the index in held of position pos, looking first at
	// next-1 (where a key's parent is when it is in the same node).
	find := func(pos uint64, next int) (int, bool) {
		if next > 0 && held[next-1].pos == pos {
			return next - 1, true
		}
		return slices.BinarySearchFunc(held, pos, func(h snapHeld, p uint64) int { return cmp.Compare(h.pos, p) })
	}
	var placeholders map[uint64]Key // by position
	var path []snapStep
	for i := range held {
		if held[i].out {
			continue
		}
		// Up from held[i] to a key already out, or to the top level: the
		// held keys not yet out and the placeholders on the way.
		l := w.locOf(w.entry(slots[held[i].lo]))
		path = append(path[:0], snapStep{int32(i), l})
		var parent Key
		hasParent := false
		for at := i; ; {
			p, ok := parentLoc(l)
			if !ok {
				break
			}
			pos := posOf(p)
			if j, ok := find(pos, at); ok {
				if held[j].out {
					parent, hasParent = held[j].key, true
					break
				}
				path = append(path, snapStep{int32(j), p})
				at = j
			} else if k, ok := placeholders[pos]; ok {
				parent, hasParent = k, true
				break
			} else {
				path = append(path, snapStep{-1, p})
				at = 0
			}
			l = p
		}
		// Out from the top down, each under the one before.
		for s := len(path) - 1; s >= 0; s-- {
			st := path[s]
			k := w.cur.keyAt(st.l)
			if st.idx < 0 {
				if placeholders == nil {
					placeholders = make(map[uint64]Key)
				}
				placeholders[posOf(st.l)] = k
				visit(k, parent, hasParent, nil)
			} else {
				held[st.idx].out, held[st.idx].key = true, k
				visit(k, parent, hasParent, entriesOf(int(st.idx)))
			}
			parent, hasParent = k, true
		}
	}
	w.endLocked()
}

// snapCountsLocked sets sk's counts from the worker's entries at its key.
// Callers hold w.mu.
func (w *Worker) snapCountsLocked(sk *SnapshotKey, slots []int) {
	if w.info.Keyed {
		kc := w.countsLocked(slots[0])
		sk.Blocks, sk.BlocksIn, sk.Refs = kc.blocks, kc.in, kc.refs
		return
	}
	for _, slot := range slots {
		sk.Blocks++
		for m, r := range w.refsOf(slot) {
			if r > 0 {
				sk.BlocksIn[m]++
				sk.Refs[m] += uint32(r)
			}
		}
	}
}

// Restore replaces the keyed worker's state with the snapshot that next
// returns segment by segment, until it returns io.EOF (any other error
// ends the restore and is returned, wrapped), and makes the snapshot's
// Seq the worker's delta seq. Every key is created where the snapshot
// says it attaches, placeholders held by nobody (see the comment on
// snapshots above), so the worker holds what the snapshot's worker held,
// at the same places in the tree.
//
// The segments must be in order (Part from 0, one Seq, one Last, at most
// SnapshotSegmentKeys keys each, as many in all as Total says), with no
// key twice, every parent before its key, every placeholder followed at
// once by a key under it, valid counts, and the keys' digest equal to the
// last segment's. A snapshot that fails a check is ErrBadSnapshot, and
// the worker is left as it was. The new state is visible to Match when
// Restore returns (readers may see part of it earlier, as with a batch).
// A worker fed engine events refuses snapshots (ErrWorkerKind).
//
// A worker that holds blocks is replaced in two passes: the segments are
// read and checked first with no lock held (their keys kept, with a map
// of them), and then, under the worker's mutex, what it held is cleared
// and the keys are built. An empty worker, which is what a replica
// restores into (its first sync, and every resync, which resets the
// worker first), is built in one pass instead: each segment is checked
// and built as it arrives, under the mutex, which is released while the
// next one is read; the engine map finds repeated keys and named parents
// as it is filled, so no key is copied or mapped; a check that fails
// clears what was built, leaving the worker empty, as it was.
// Placeholders at a segment's end are built with the next segment, with
// the key under them. A budget eviction or another call changing the
// worker between two segments ends the restore with an error (not
// ErrBadSnapshot), the worker cleared.
//
// Cost: the one-pass restore of a 30,000-block worker's snapshot, per
// key, the tree work of a store (a top-level key probes the heads, a
// branch creates a node) and an engine-map insert, and 7 allocations per
// 1,000 keys; the two-pass one adds a map of the keys, a copy of each,
// and the clear of what the worker held (O(blocks log blocks)).
// BenchmarkRestore and BenchmarkRestoreEmpty (docs/benchmarks.md).
func (w *Worker) Restore(next func() (*SnapshotSegment, error)) error {
	if !w.info.Keyed {
		return fmt.Errorf("%w: worker %s is fed engine events (no restore)", ErrWorkerKind, w.info.Ref)
	}
	w.mu.Lock()
	gone, empty := w.gone, w.engine.Len() == 0
	w.mu.Unlock()
	if gone {
		return fmt.Errorf("%w: %s (no restore)", ErrRemovedWorker, w.info.Ref)
	}
	if empty {
		return w.restoreEmpty(next)
	}
	st, err := readSnapshot(next)
	if err != nil {
		return fmt.Errorf("indexer: restore worker %s: %w", w.info.Ref, err)
	}
	w.mu.Lock()
	if w.gone {
		w.mu.Unlock()
		return fmt.Errorf("%w: %s (snapshot of %d keys not restored)", ErrRemovedWorker, w.info.Ref, len(st.keys))
	}
	before := w.res
	w.clearLocked()
	st.buildLocked(w)
	w.deltaSeq = st.seq
	w.unlockThen(before, w.restoredLocked("snapshot"))
	return nil
}

// errRestoreChanged: the worker changed between two segments of a
// one-pass restore.
var errRestoreChanged = errors.New("the worker changed during the restore (a budget eviction, or another call)")

// restoreEmpty is Restore into a worker that holds nothing, in one pass
// (see Restore).
func (w *Worker) restoreEmpty(next func() (*SnapshotSegment, error)) error {
	rs := restoreStream{w: w}
	err := rs.run(next)
	w.mu.Lock()
	if err == nil && w.gone {
		err = fmt.Errorf("%w: %s (restore of %d keys undone)", ErrRemovedWorker, w.info.Ref, rs.keys)
	}
	before := w.res
	if err != nil {
		if !w.gone {
			w.clearLocked() // back to empty, as it was
		}
		w.unlockThen(before, after{})
		if errors.Is(err, ErrRemovedWorker) {
			return err
		}
		return fmt.Errorf("indexer: restore worker %s: %w", w.info.Ref, err)
	}
	w.deltaSeq = rs.o.first.seq
	w.unlockThen(before, w.restoredLocked("snapshot"))
	return nil
}

// restoreStream is the state of a one-pass restore between segments.
type restoreStream struct {
	w      *Worker
	o      segOrder
	keys   int    // keys built
	digest uint64 // of the keys built
	// prev is the last key built and its place: a key under it (the next
	// key of a chain) attaches with no probe. prevHole says it is a
	// placeholder (the key after it must be under it).
	prev      Key
	prevLoc   loc
	havePrev  bool
	prevHole  bool
	holes     map[Key]loc // placeholders built (held keys are in the engine map)
	carry     []SnapshotKey
	scratch   []SnapshotKey
	entries   int   // the engine map's length when the mutex was last released
	evictions int64 // the worker's evictions then
}

// run reads, checks and builds every segment, and reports the first
// problem; the caller clears the worker if there is one.
func (rs *restoreStream) run(next func() (*SnapshotSegment, error)) error {
	rs.evictions = rs.w.c.evictions.Load()
	rs.o = segOrder{bad: ErrBadSnapshot, what: "snapshot", maxKeys: SnapshotSegmentKeys}
	if err := read(&rs.o, next, (*SnapshotSegment).head, rs.segment); err != nil {
		return err
	}
	switch {
	case len(rs.carry) > 0:
		return fmt.Errorf("%w: it ends with a placeholder (%#016x)", ErrBadSnapshot, uint64(rs.carry[len(rs.carry)-1].Key))
	case rs.prevHole:
		return fmt.Errorf("%w: it ends with a placeholder (%#016x)", ErrBadSnapshot, uint64(rs.prev))
	}
	return rs.o.checkDigest(rs.digest)
}

// segment checks and builds one segment under the worker's mutex, unless
// the worker changed since the segment before.
func (rs *restoreStream) segment(seg *SnapshotSegment) error {
	w := rs.w
	w.mu.Lock()
	before := w.res
	var err error
	switch {
	case w.gone:
		err = fmt.Errorf("%w: %s (restore of %d keys undone)", ErrRemovedWorker, w.info.Ref, rs.keys)
	case w.engine.Len() != rs.entries || w.c.evictions.Load() != rs.evictions:
		err = errRestoreChanged
	default:
		if seg.Part == 0 {
			// Sized once, up to a bound (Total is the sender's word), as
			// a grown table: deltas churn it next.
			w.engine.ReserveGrown(int(min(seg.Total, restoreReserve)))
		}
		err = rs.segmentLocked(seg)
		rs.entries = w.engine.Len()
	}
	w.unlockThen(before, after{}) // publishes the segment's nodes and releases them
	return err
}

// segmentLocked checks and builds one segment's keys, after the
// placeholders carried from the segment before, and carries its own
// trailing placeholders to the next (unless it is the last). Callers hold
// w.mu.
func (rs *restoreStream) segmentLocked(seg *SnapshotSegment) error {
	keys := seg.Keys
	end := len(keys)
	if !seg.Last {
		for end > 0 && keys[end-1].Blocks == 0 {
			end--
		}
	}
	if end == 0 && !seg.Last {
		rs.carry = append(rs.carry, keys...)
		return nil
	}
	run := keys[:end]
	if len(rs.carry) > 0 {
		rs.scratch = append(append(rs.scratch[:0], rs.carry...), run...)
		run = rs.scratch
	}
	if err := rs.buildLocked(seg.Part, run); err != nil {
		return err
	}
	rs.carry = append(rs.carry[:0], keys[end:]...)
	return nil
}

// buildLocked checks and builds run, the keys of segment part (after
// any carried from the one before). Callers hold w.mu.
func (rs *restoreStream) buildLocked(part uint32, run []SnapshotKey) error {
	w := rs.w
	c := &w.cur
	id := uint32(w.id)
	chainEnd := 0
	for i := range run {
		sk := &run[i]
		bad := func(why string) error {
			// rs.keys is the key's index in the snapshot: every key before
			// it is built.
			return fmt.Errorf("%w: key %d (%#016x), in segment %d or the one before: %s", ErrBadSnapshot, rs.keys, uint64(sk.Key), part, why)
		}
		kc := sk.counts()
		if !kc.valid() {
			return bad(sk.whyCounts())
		}
		// Where it attaches: under the key before it (a chain, no probe),
		// under a held key or a placeholder built before, or at top level.
		var under loc
		underPrev := sk.HasParent && rs.havePrev && rs.prev == sk.Parent
		switch {
		case !sk.HasParent:
		case underPrev:
			under = rs.prevLoc
		default:
			if slot, ok := w.engine.Get(uint64(sk.Parent)); ok {
				under = w.locOf(w.entry(slot))
			} else if l, ok := rs.holes[sk.Parent]; ok {
				under = l
			} else {
				return bad(whyParentLater(sk.Parent))
			}
		}
		if rs.prevHole && !underPrev {
			return bad(whyHoleLone)
		}
		if _, ok := w.engine.Get(uint64(sk.Key)); ok {
			return bad(whyTwice)
		}
		if _, ok := rs.holes[sk.Key]; ok {
			return bad(whyTwice)
		}
		if i >= chainEnd {
			// The chain from i (each key under the one before), whose
			// length sizes the nodes it creates.
			j := i + 1
			for j < len(run) && run[j].HasParent && run[j].Parent == run[j-1].Key {
				j++
			}
			chainEnd = j
		}
		media := kc.media()
		var set *holders.Set
		if media != 0 {
			set = w.ix.single(id, media)
		}
		var l loc
		var fresh bool
		// A node the restore creates holds the rest of its chain: sized for
		// it (newNode doubles its hint, for a chain that grows), not twice.
		hint := (chainEnd - i + 1) / 2
		if !sk.HasParent {
			l, fresh = c.top(sk.Key, set, hint)
		} else {
			l, fresh = c.next(under, sk.Key, set, hint)
		}
		rs.prev, rs.prevLoc, rs.havePrev, rs.prevHole = sk.Key, l, true, media == 0
		rs.keys++
		if media == 0 {
			if rs.holes == nil {
				rs.holes = make(map[Key]loc)
			}
			rs.holes[sk.Key] = l
			continue
		}
		if !fresh {
			c.change(l, holders.Op{Worker: id, Set: media})
		}
		h := uint64(sk.Key)
		w.engine.Insert(h, uint64(w.setCountsLocked(h, newEntry(l, 0), &kc)))
		w.res += int64(kc.blocks)
		for m, n := range kc.in {
			w.resBy[m] += int64(n)
		}
		rs.digest += digestTerm(sk.Key, media)
	}
	return nil
}

// restoreState is a snapshot read and checked: its keys, each key's
// parent's index in keys (-1 at top level), and its Seq.
type restoreState struct {
	seq    uint64
	keys   []SnapshotKey
	parent []int32
	held   int // keys that are not placeholders
}

// head returns what the segment says of its place in the snapshot.
func (s *SnapshotSegment) head() segHead {
	return segHead{part: s.Part, seq: s.Seq, total: s.Total, last: s.Last, digest: s.Digest, keys: len(s.Keys)}
}

// whyCounts says the key's counts are not a valid state.
func (sk *SnapshotKey) whyCounts() string {
	return fmt.Sprintf("inconsistent counts (%d blocks, %v in media, %v stores)", sk.Blocks, sk.BlocksIn, sk.Refs)
}

// readSnapshot reads and checks the segments next returns (see Restore).
func readSnapshot(next func() (*SnapshotSegment, error)) (*restoreState, error) {
	st := &restoreState{}
	o := segOrder{bad: ErrBadSnapshot, what: "snapshot", maxKeys: SnapshotSegmentKeys}
	var ko keyOrder
	var digest uint64
	err := read(&o, next, (*SnapshotSegment).head, func(seg *SnapshotSegment) error {
		if seg.Part == 0 {
			ko = newKeyOrder(seg.Total)
			st.keys = make([]SnapshotKey, 0, cap(ko.parent))
		}
		for j := range seg.Keys {
			sk := &seg.Keys[j]
			kc := sk.counts()
			why := ""
			if !kc.valid() {
				why = sk.whyCounts()
			} else {
				why = ko.add(sk.Key, sk.Parent, sk.HasParent, sk.Blocks == 0)
			}
			if why != "" {
				return fmt.Errorf("%w: segment %d key %d (%#016x): %s", ErrBadSnapshot, seg.Part, j, uint64(sk.Key), why)
			}
			st.keys = append(st.keys, *sk)
			if sk.Blocks > 0 {
				st.held++
				digest += digestTerm(sk.Key, kc.media())
			}
		}
		return nil
	})
	if err == nil {
		err = ko.end(ErrBadSnapshot)
	}
	if err == nil {
		err = o.checkDigest(digest)
	}
	if err != nil {
		return nil, err
	}
	st.seq, st.parent = o.first.seq, ko.parent
	return st, nil
}

// buildLocked adds the snapshot's keys to the worker, which holds none.
// Callers hold w.mu.
func (st *restoreState) buildLocked(w *Worker) {
	c := &w.cur
	id := uint32(w.id)
	w.engine.Reserve(st.held)
	kp := newKeyPlacer(st.parent)
	for i := range st.keys {
		sk := &st.keys[i]
		kc := sk.counts()
		media := kc.media()
		var set *holders.Set
		if media != 0 {
			set = w.ix.single(id, media)
		}
		l, fresh := kp.place(c, i, sk.Key, set)
		if media == 0 {
			continue // a placeholder: the next key keeps its node alive
		}
		if !fresh {
			c.change(l, holders.Op{Worker: id, Set: media})
		}
		h := uint64(sk.Key)
		w.engine.Insert(h, uint64(w.setCountsLocked(h, newEntry(l, 0), &kc)))
		w.res += int64(kc.blocks)
		for m, n := range kc.in {
			w.resBy[m] += int64(n)
		}
	}
}

// The encoding of a segment (AppendBinary), little-endian:
//
//	version 1 | seq uvarint | part uvarint | total uvarint | last 0 or 1 | [digest 8 if last] | keys uvarint | key...
//
// and of a key: a tag byte (bits 0-1: where it attaches, see attachTag;
// bits 2-3: its counts, 0 one block with one store in each medium of a
// media byte that follows, 1 none (a placeholder), 2 a media byte, then
// blocks uvarint and per medium in the media byte its blocks and stores,
// uvarints), the key (8 bytes), and then the parent (8 bytes) and counts
// the tag says. So a chain's key held once costs 10 bytes; counts are
// exact, up to 2^32-1 each.
const (
	segVersion     = 1
	tagSimple      = 0 << 2
	tagPlaceholder = 1 << 2
	tagCounted     = 2 << 2
)

// AppendBinary appends the segment's encoding to b (encoding.BinaryAppender).
// It fails only for a segment of more than SnapshotSegmentKeys keys. A
// key's Parent is encoded only when HasParent. Cost: O(keys), no
// allocation beyond b's growth.
func (s *SnapshotSegment) AppendBinary(b []byte) ([]byte, error) {
	if len(s.Keys) > SnapshotSegmentKeys {
		return b, fmt.Errorf("%w: segment %d has %d keys, over %d", ErrBadSnapshot, s.Part, len(s.Keys), SnapshotSegmentKeys)
	}
	b = append(b, segVersion)
	b = binary.AppendUvarint(b, s.Seq)
	b = binary.AppendUvarint(b, uint64(s.Part))
	b = binary.AppendUvarint(b, s.Total)
	b = appendLast(b, s.Last, s.Digest)
	b = binary.AppendUvarint(b, uint64(len(s.Keys)))
	var prev Key
	for i := range s.Keys {
		sk := &s.Keys[i]
		tag := attachTag(i, prev, sk.Parent, sk.HasParent)
		prev = sk.Key
		kc := sk.counts()
		var media uint8
		for m := range kc.refs {
			if kc.in[m] != 0 || kc.refs[m] != 0 {
				media |= 1 << m
			}
		}
		switch {
		case kc == keyCounts{}:
			tag |= tagPlaceholder
		case kc.simple() && media != 0:
			tag |= tagSimple
		default:
			tag |= tagCounted
		}
		b = appendKeyHead(b, tag, sk.Key, sk.Parent)
		switch tag & tagFormMask {
		case tagSimple:
			b = append(b, media)
		case tagCounted:
			b = append(b, media)
			b = binary.AppendUvarint(b, uint64(kc.blocks))
			for m := range kc.refs {
				if media&(1<<m) != 0 {
					b = binary.AppendUvarint(b, uint64(kc.in[m]))
					b = binary.AppendUvarint(b, uint64(kc.refs[m]))
				}
			}
		}
	}
	return b, nil
}

// UnmarshalBinary decodes a segment that AppendBinary encoded into s,
// reusing the memory of s.Keys (encoding.BinaryUnmarshaler). Input that
// is not such an encoding, truncated or with bytes after it is
// ErrBadSnapshot, naming the offset; it never panics. It checks the
// encoding only: Restore checks what the keys say.
func (s *SnapshotSegment) UnmarshalBinary(data []byte) error {
	d := segDecoder{b: data, bad: ErrBadSnapshot}
	d.version(segVersion)
	seq := d.uvarint(math.MaxUint64)
	part := d.uvarint(math.MaxUint32)
	total := d.uvarint(math.MaxUint64)
	last, digest := d.last()
	n := int(d.uvarint(SnapshotSegmentKeys))
	if d.err != nil {
		return d.err
	}
	keys := slices.Grow(s.Keys[:0], n)
	var prev Key
	for i := 0; i < n && d.err == nil; i++ {
		var sk SnapshotKey
		var tag byte
		tag, sk.Key, sk.Parent, sk.HasParent = d.keyHead(i, prev)
		prev = sk.Key
		switch tag & tagFormMask {
		case tagSimple:
			media := d.media(i)
			if d.err == nil && media == 0 {
				d.fail("key %d: no media", i)
			}
			sk.Blocks = 1
			for m := range sk.Refs {
				if media&(1<<m) != 0 {
					sk.BlocksIn[m], sk.Refs[m] = 1, 1
				}
			}
		case tagCounted:
			media := d.media(i)
			sk.Blocks = uint32(d.uvarint(math.MaxUint32))
			for m := range sk.Refs {
				if media&(1<<m) != 0 {
					sk.BlocksIn[m] = uint32(d.uvarint(math.MaxUint32))
					sk.Refs[m] = uint32(d.uvarint(math.MaxUint32))
				}
			}
		}
		keys = append(keys, sk)
	}
	if err := d.end(); err != nil {
		return err
	}
	*s = SnapshotSegment{Seq: seq, Part: uint32(part), Total: total, Last: last, Digest: digest, Keys: keys}
	return nil
}
