package indexer

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/kvindex/kvindex/events"
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
