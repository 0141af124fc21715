package indexer

import (
	"cmp"
	"encoding/binary"
	"fmt"
	"math"
	"slices"

	"github.com/kvindex/kvindex/events"
)

// Snapshots. A snapshot is a worker's resident set as keys, each with where
// it attaches (its parent key, or top level) and its counts summed over the
// worker's blocks at the key, every parent before its key; Restore makes a
// keyed worker hold exactly that, and ApplyDelta continues from its Seq.
//
// A restore must put every key where it is in the source's tree, or no
// prompt could reach it and later stores of its chain would create a second
// node for it. The engine may evict a parent before its child, so a
// snapshot includes the ancestors a held key needs, up to the nearest held
// or top-level key, as placeholders (no blocks), which a restore creates
// held by nobody. A placeholder is always followed at once by a key under
// it, which Restore checks: a node of placeholders alone would die before
// the key that keeps it alive arrives.

// SnapshotSegmentKeys is the most keys one SnapshotSegment holds (about
// 40 KB encoded).
const SnapshotSegmentKeys = 4096

// SnapshotSegment is one part of a worker's snapshot.
type SnapshotSegment struct {
	Seq    uint64        // the worker's delta seq at the snapshot, in every segment.
	Part   uint32        // numbers the segments of a snapshot from 0.
	Total  uint64        // the number of keys in the whole snapshot, in every segment.
	Last   bool          // marks the snapshot's last segment.
	Digest uint64        // in the last segment, the worker's Digest.
	Keys   []SnapshotKey // at most SnapshotSegmentKeys keys, each after its parent.
	// TotalSide is the number of side keys in the whole snapshot, in every
	// segment; Groups the worker's KV-cache groups, in part 0 only; Side
	// at most SnapshotSegmentKeys side keys, after every key of the tree.
	TotalSide uint64
	Groups    []Group
	Side      []SideKey
}

// SnapshotKey is one key of a snapshot and what the worker holds of it,
// summed over its blocks at the key; a placeholder has all counts zero.
type SnapshotKey struct {
	Key       Key
	Parent    Key // the key Key attaches under, when HasParent.
	HasParent bool
	Blocks    uint32                  // the worker's blocks that resolve to Key.
	BlocksIn  [events.NumMedia]uint32 // of those, how many are in each medium.
	Refs      [events.NumMedia]uint32 // their stores per medium.
}

func (sk *SnapshotKey) counts() keyCounts {
	return keyCounts{blocks: sk.Blocks, in: sk.BlocksIn, refs: sk.Refs}
}

// Snapshot calls emit with the worker's snapshot, segment by segment. The
// keys are gathered under the worker's mutex, as after some batch, and
// emitted with no lock held; emit must not keep the segment (it is
// reused), and its error ends the snapshot. Works for both kinds of
// worker; an empty worker's snapshot is one empty segment.
//
// Cost: treeOrderLocked's under the mutex, and 72 bytes a key of memory
// until it returns (BenchmarkSnapshot).
func (w *Worker) Snapshot(emit func(*SnapshotSegment) error) error {
	keys, side, layout, seq, digest, err := w.snapshotKeys()
	if err != nil {
		return err
	}
	seg := SnapshotSegment{Seq: seq, Total: uint64(len(keys)), TotalSide: uint64(len(side)), Groups: layout}
	for part := uint32(0); ; part++ {
		n := min(len(keys), SnapshotSegmentKeys)
		seg.Part, seg.Keys, keys = part, keys[:n:n], keys[n:]
		ns := 0
		if len(keys) == 0 {
			ns = min(len(side), SnapshotSegmentKeys)
		}
		seg.Side, side = side[:ns:ns], side[ns:]
		seg.Last = len(keys) == 0 && len(side) == 0
		if part > 0 {
			seg.Groups = nil
		}
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

// snapHeld is a key the worker holds: its position (engineEntry.pos), its
// entries slots[lo:] up to the next key's, and its key once it is out.
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

// posOf is l's engineEntry.pos.
func posOf(l loc) uint64 { return uint64(l.off) | uint64(l.n.id)<<entryNodeShift }

// A 43-bit position and an index of up to 21 bits pack into one integer,
// so smaller engine maps sort as integers (three times faster).
const snapIndexBits = 64 - entryGenShift

// snapshotKeys gathers, under the mutex, the keys in tree order, the side
// keys, the layout, the delta seq and the digest.
func (w *Worker) snapshotKeys() ([]SnapshotKey, []SideKey, []Group, uint64, uint64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gone {
		return nil, nil, nil, 0, 0, fmt.Errorf("%w: %s (no snapshot)", ErrRemovedWorker, w.info.Ref)
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
	return out, w.sideKeysLocked(), w.layoutLocked(), w.deltaSeq, digest + w.sideDigestLocked(), nil
}

// treeOrderLocked calls visit for every key the worker holds and every
// placeholder they need, each parent before its key and each placeholder
// followed at once by a key under it, with where the key attaches and the
// slots of the worker's entries at it (nil for a placeholder; valid until
// the worker changes). visit must not change the worker or lock nodes.
//
// Cost: O(blocks log blocks), and 24 bytes a block of memory.
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
	// find returns the index in held of pos, trying next-1 first (a
	// parent in the same node).
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
//	version 2 | seq uvarint | part uvarint | total uvarint | total side uvarint | last 0 or 1 |
//	[digest 8 if last] | [layout, in part 0] | keys uvarint | key... | side keys uvarint | side key...
//
// The layout is encoded as in a checkpoint; a side key is its group's
// index (a byte), the key (8 bytes) and its blocks (uvarint). Version 1,
// read still, had no total side, layout or side keys.
//
// and of a key: a tag byte (bits 0-1: where it attaches, see attachTag;
// bits 2-3: its counts, 0 one block with one store per medium of a media
// byte that follows, 1 none (a placeholder), 2 a media byte, blocks, then
// per medium in it its blocks and stores, uvarints), the key (8 bytes),
// then the parent (8) and counts as the tag says.
const (
	segVersion     = 2
	segVersion1    = 1
	tagSimple      = 0 << 2
	tagPlaceholder = 1 << 2
	tagCounted     = 2 << 2
)

// AppendBinary appends the segment's encoding to b (encoding.BinaryAppender).
// It fails only for a segment of more than SnapshotSegmentKeys keys.
func (s *SnapshotSegment) AppendBinary(b []byte) ([]byte, error) {
	if len(s.Keys) > SnapshotSegmentKeys {
		return b, fmt.Errorf("%w: segment %d has %d keys, over %d", ErrBadSnapshot, s.Part, len(s.Keys), SnapshotSegmentKeys)
	}
	if len(s.Side) > SnapshotSegmentKeys || s.Part > 0 && len(s.Groups) > 0 {
		return b, fmt.Errorf("%w: segment %d has %d side keys (at most %d) and %d groups (in part 0 only)", ErrBadSnapshot, s.Part, len(s.Side), SnapshotSegmentKeys, len(s.Groups))
	}
	b = append(b, segVersion)
	b = binary.AppendUvarint(b, s.Seq)
	b = binary.AppendUvarint(b, uint64(s.Part))
	b = binary.AppendUvarint(b, s.Total)
	b = binary.AppendUvarint(b, s.TotalSide)
	b = appendLast(b, s.Last, s.Digest)
	if s.Part == 0 {
		b = appendLayout(b, s.Groups)
	}
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
	b = binary.AppendUvarint(b, uint64(len(s.Side)))
	for _, sk := range s.Side {
		if sk.Group < 0 || sk.Group >= MaxGroups {
			return b, fmt.Errorf("%w: a side key of group %d", ErrBadSnapshot, sk.Group)
		}
		b = append(b, byte(sk.Group))
		b = binary.LittleEndian.AppendUint64(b, uint64(sk.Key))
		b = binary.AppendUvarint(b, uint64(sk.Blocks))
	}
	return b, nil
}

// UnmarshalBinary decodes a segment that AppendBinary encoded into s,
// reusing s.Keys (encoding.BinaryUnmarshaler). Bad input is ErrBadSnapshot,
// naming the offset; it never panics. Restore checks what the keys say.
func (s *SnapshotSegment) UnmarshalBinary(data []byte) error {
	d := segDecoder{b: data, bad: ErrBadSnapshot}
	v1 := len(data) > 0 && data[0] == segVersion1
	if v1 {
		d.version(segVersion1)
	} else {
		d.version(segVersion)
	}
	seq := d.uvarint(math.MaxUint64)
	part := d.uvarint(math.MaxUint32)
	total := d.uvarint(math.MaxUint64)
	var totalSide uint64
	if !v1 {
		totalSide = d.uvarint(math.MaxUint64)
	}
	last, digest := d.last()
	var groups []Group
	if part == 0 && !v1 {
		groups = d.layout()
	}
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
	var side []SideKey
	if !v1 {
		ns := int(d.uvarint(SnapshotSegmentKeys))
		side = s.Side[:0]
		for i := 0; i < ns && d.err == nil; i++ {
			sk := SideKey{Group: int(d.byte()), Key: Key(d.uint64()), Blocks: uint32(d.uvarint(math.MaxUint32))}
			if d.err == nil && sk.Group >= MaxGroups {
				d.fail("side key %d: group %d", i, sk.Group)
			}
			side = append(side, sk)
		}
	}
	if err := d.end(); err != nil {
		return err
	}
	if len(side) == 0 {
		side = nil
	}
	*s = SnapshotSegment{Seq: seq, Part: uint32(part), Total: total, TotalSide: totalSide, Last: last, Digest: digest, Keys: keys,
		Groups: groups, Side: side}
	return nil
}
