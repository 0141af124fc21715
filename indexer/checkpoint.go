package indexer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer/internal/holders"
)

// Checkpoints. A checkpoint saves a worker fed engine events whole, for a
// restarted agent to go on feeding it: a snapshot's keys (same order and
// placeholders), every engine block at its key (hash, stores per medium,
// recency), and the learned capacity, skipped groups and last reset.
//
// A restored worker is the source as far as any later call can tell; its
// eviction order is the source's to within one recency epoch. Stats'
// cumulative counters restart from zero, as a new process's metrics do,
// and so does the delta seq. Orphans are keyed under the worker's id, so
// restored into another id they still match no prompt.

// ErrBadCheckpoint: a checkpoint is incomplete, out of order, corrupt or
// inconsistent; nothing of it was applied.
var ErrBadCheckpoint = errors.New("indexer: bad checkpoint")

// Segment bounds: Checkpoint starts a new segment at CheckpointSegmentKeys
// keys or CheckpointSegmentBlocks blocks (a key's blocks are never split).
// A key held as one block encodes in 18 to 27 bytes: about 80 KB a segment.
const (
	CheckpointSegmentKeys   = 4096
	CheckpointSegmentBlocks = 8192
)

// CheckpointSegment is one part of a worker's checkpoint; its fields are
// a SnapshotSegment's, with blocks.
type CheckpointSegment struct {
	Part               uint32
	Total, TotalBlocks uint64 // the keys and blocks in the whole checkpoint, in every segment.
	Last               bool
	Digest             uint64
	State              CheckpointState   // the worker's state beyond its blocks, in part 0 only.
	Keys               []CheckpointKey   // at most CheckpointSegmentKeys keys, each after its parent.
	Blocks             []CheckpointBlock // the engine blocks of Keys, key by key.
	// TotalSide is the number of side group blocks in the whole
	// checkpoint, in every segment; Side at most CheckpointSegmentBlocks of
	// them, after every key.
	TotalSide uint64
	Side      []CheckpointSideBlock
}

// CheckpointState is what a checkpoint keeps of a worker besides blocks.
type CheckpointState struct {
	Learned   [events.NumMedia]int64 // the learned capacity per medium (see Worker), 0 before a removal.
	Groups    []Group                // the worker's KV-cache groups (Worker.Groups, without Blocks), by index.
	LastReset string                 // Stats.LastReset, cut to maxResetReason bytes.
}

// CheckpointKey is one key of a checkpoint.
type CheckpointKey struct {
	Key       Key
	Parent    Key // the key Key attaches under, when HasParent.
	HasParent bool
	Blocks    uint32 // the engine blocks at Key: over 1 for an alias, 0 for a placeholder.
}

// CheckpointBlock is one engine block of a checkpoint.
type CheckpointBlock struct {
	Hash uint64
	Refs [events.NumMedia]uint8 // the block's stores per medium.
	Age  uint8                  // the block's recency (blockmap.Map.Age).
}

func (b *CheckpointBlock) media() uint8 { return mediaOf(&b.Refs) }

// maxResetReason bounds CheckpointState.LastReset.
const maxResetReason = 1024

// Checkpoint calls emit with the worker's checkpoint, segment by segment,
// as Snapshot does. A keyed worker refuses (ErrWorkerKind). Cost:
// O(blocks log blocks) under the mutex, and 48 bytes a block of memory
// until it returns (BenchmarkCheckpoint).
func (w *Worker) Checkpoint(emit func(*CheckpointSegment) error) error {
	if w.info.Keyed {
		return fmt.Errorf("%w: worker %s is keyed (no checkpoint: take a snapshot)", ErrWorkerKind, w.info.Ref)
	}
	keys, blocks, side, state, digest, err := w.checkpointAll()
	if err != nil {
		return err
	}
	seg := CheckpointSegment{Total: uint64(len(keys)), TotalBlocks: uint64(len(blocks)), TotalSide: uint64(len(side)), State: state}
	for part := uint32(0); ; part++ {
		n, nb := 0, 0
		for n < len(keys) && n < CheckpointSegmentKeys && (n == 0 || nb < CheckpointSegmentBlocks) {
			nb += int(keys[n].Blocks)
			n++
		}
		seg.Part, seg.Keys, keys = part, keys[:n:n], keys[n:]
		seg.Blocks, blocks = blocks[:nb:nb], blocks[nb:]
		ns := 0
		if len(keys) == 0 {
			ns = min(len(side), CheckpointSegmentBlocks)
		}
		seg.Side, side = side[:ns:ns], side[ns:]
		seg.Last = len(keys) == 0 && len(side) == 0
		if seg.Last {
			seg.Digest = digest
		}
		if err := emit(&seg); err != nil {
			return fmt.Errorf("indexer: checkpoint of worker %s: segment %d: %w", w.info.Ref, part, err)
		}
		if seg.Last {
			return nil
		}
		seg.State = CheckpointState{}
	}
}

// checkpointAll gathers, under the mutex, the worker's keys in tree order,
// their blocks, its side blocks, its state and its digest.
func (w *Worker) checkpointAll() ([]CheckpointKey, []CheckpointBlock, []CheckpointSideBlock, CheckpointState, uint64, error) {
	w.mu.Lock()
	defer w.mu.Unlock()
	if w.gone {
		return nil, nil, nil, CheckpointState{}, 0, fmt.Errorf("%w: %s (no checkpoint)", ErrRemovedWorker, w.info.Ref)
	}
	keys := make([]CheckpointKey, 0, w.engine.Len())
	blocks := make([]CheckpointBlock, 0, w.engine.Len())
	var digest uint64
	w.treeOrderLocked(func(k, parent Key, hasParent bool, slots []int) {
		keys = append(keys, CheckpointKey{Key: k, Parent: parent, HasParent: hasParent, Blocks: uint32(len(slots))})
		var media uint8
		for _, slot := range slots {
			media |= w.entry(slot).media()
			blocks = append(blocks, CheckpointBlock{Hash: w.engine.Hash(slot), Refs: w.refsOf(slot), Age: w.engine.Age(slot)})
		}
		if slots != nil {
			digest += digestTerm(k, media)
		}
	})
	st := CheckpointState{Learned: w.learned, LastReset: w.lastReset}
	if len(st.LastReset) > maxResetReason {
		st.LastReset = st.LastReset[:maxResetReason]
	}
	st.Groups = w.layoutLocked()
	return keys, blocks, w.sideBlocksLocked(), st, digest + w.sideDigestLocked(), nil
}

// RestoreCheckpoint replaces the worker's state with the checkpoint that
// next returns segment by segment, until io.EOF; the worker then goes on as
// the checkpointed worker would. It records no delta: replicas must resync.
// The whole checkpoint is checked first, with no lock held (else
// ErrBadCheckpoint, the worker left as it was); then the state is replaced
// under the mutex and the capacity enforced. A keyed worker refuses
// (ErrWorkerKind). Cost: BenchmarkRestoreCheckpoint.
func (w *Worker) RestoreCheckpoint(next func() (*CheckpointSegment, error)) error {
	if w.info.Keyed {
		return fmt.Errorf("%w: worker %s is keyed (no checkpoint restore: restore a snapshot)", ErrWorkerKind, w.info.Ref)
	}
	ck, err := readCheckpoint(next)
	if err != nil {
		return fmt.Errorf("indexer: restore worker %s from a checkpoint: %w", w.info.Ref, err)
	}
	w.mu.Lock()
	if w.gone {
		w.mu.Unlock()
		return fmt.Errorf("%w: %s (checkpoint of %d blocks not restored)", ErrRemovedWorker, w.info.Ref, len(ck.blocks))
	}
	before := w.res
	w.clearLocked()
	ck.buildLocked(w)
	w.layoutDirty = false // no delta: replicas resync from a snapshot
	w.enforceCapacityLocked()
	w.unlockThen(before, w.restoredLocked("checkpoint"))
	return nil
}

// checkpointState is a checkpoint read and checked (parent: see keyOrder).
type checkpointState struct {
	keys   []CheckpointKey
	parent []int32
	blocks []CheckpointBlock
	side   []CheckpointSideBlock
	state  CheckpointState
}

func (s *CheckpointSegment) head() segHead {
	return segHead{part: s.Part, total: s.Total, totalBlocks: s.TotalBlocks, last: s.Last, digest: s.Digest,
		keys: len(s.Keys), blocks: len(s.Blocks), state: !s.State.zero(), side: len(s.Side), totalSide: s.TotalSide}
}

// readCheckpoint reads and checks the segments next returns.
func readCheckpoint(next func() (*CheckpointSegment, error)) (*checkpointState, error) {
	ck := &checkpointState{}
	o := segOrder{bad: ErrBadCheckpoint, what: "checkpoint", maxKeys: CheckpointSegmentKeys}
	var ko keyOrder
	var hashes map[uint64]struct{}
	var digest uint64
	var sc *sideCheck
	err := read(&o, next, (*CheckpointSegment).head, func(seg *CheckpointSegment) error {
		if seg.Part == 0 {
			for m, n := range seg.State.Learned {
				if n < 0 {
					return fmt.Errorf("%w: learned capacity %d in %s", ErrBadCheckpoint, n, events.Medium(m))
				}
			}
			ck.state = seg.State
			ck.state.Groups = slices.Clone(seg.State.Groups)
			if why := checkLayout(ck.state.Groups); why != "" {
				return fmt.Errorf("%w: layout: %s", ErrBadCheckpoint, why)
			}
			sc = newSideCheck(ck.state.Groups)
			// Sized once, up to a bound: the totals are the sender's word.
			ko = newKeyOrder(seg.Total)
			nb := int(min(seg.TotalBlocks, restoreReserve))
			hashes = make(map[uint64]struct{}, nb)
			ck.keys = make([]CheckpointKey, 0, cap(ko.parent))
			ck.blocks = make([]CheckpointBlock, 0, nb)
		}
		b := 0 // the segment's next block
		for j := range seg.Keys {
			k := &seg.Keys[j]
			bad := func(why string) error {
				return fmt.Errorf("%w: segment %d key %d (%#016x): %s", ErrBadCheckpoint, seg.Part, j, uint64(k.Key), why)
			}
			if why := ko.add(k.Key, k.Parent, k.HasParent, k.Blocks == 0); why != "" {
				return bad(why)
			}
			if uint64(k.Blocks) > uint64(len(seg.Blocks)-b) {
				return bad(fmt.Sprintf("it has %d blocks, the segment %d more", k.Blocks, len(seg.Blocks)-b))
			}
			var media uint8
			for _, blk := range seg.Blocks[b : b+int(k.Blocks)] {
				m := blk.media()
				if m == 0 {
					return bad(fmt.Sprintf("its block %#016x is in no medium", blk.Hash))
				}
				n := len(hashes)
				hashes[blk.Hash] = struct{}{}
				if len(hashes) == n {
					return bad(fmt.Sprintf("engine hash %#016x is in the checkpoint twice", blk.Hash))
				}
				media |= m
			}
			b += int(k.Blocks)
			if k.Blocks > 0 {
				digest += digestTerm(k.Key, media)
			}
			ck.keys = append(ck.keys, *k)
		}
		if b != len(seg.Blocks) {
			return fmt.Errorf("%w: segment %d has %d blocks, its keys %d", ErrBadCheckpoint, seg.Part, len(seg.Blocks), b)
		}
		ck.blocks = append(ck.blocks, seg.Blocks...)
		for i, sb := range seg.Side {
			if why := sc.add(sb.Group, sb.Hash, sb.Key, sb.Refs); why != "" {
				return fmt.Errorf("%w: segment %d side block %d: %s", ErrBadCheckpoint, seg.Part, i, why)
			}
		}
		ck.side = append(ck.side, seg.Side...)
		return nil
	})
	if err == nil {
		err = ko.end(&o, digest+sc.digest)
	}
	if err != nil {
		return nil, err
	}
	ck.parent = ko.parent
	return ck, nil
}

func (s *CheckpointState) zero() bool {
	return s.Learned == [events.NumMedia]int64{} && len(s.Groups) == 0 && s.LastReset == ""
}

// buildLocked adds the checkpoint's keys and blocks to the worker, which
// holds none, and sets its state.
func (ck *checkpointState) buildLocked(w *Worker) {
	w.adoptLayoutLocked(ck.state.Groups)
	w.restoreSideBlocksLocked(ck.side)
	c := &w.cur
	id := uint32(w.id)
	w.engine.ReserveGrown(len(ck.blocks)) // engine events churn it next
	kp := newKeyPlacer(ck.parent)
	b := 0
	for i := range ck.keys {
		k := &ck.keys[i]
		blocks := ck.blocks[b : b+int(k.Blocks)]
		b += int(k.Blocks)
		var media uint8
		for j := range blocks {
			media |= blocks[j].media()
		}
		var set *holders.Set
		if media != 0 {
			set = w.ix.single(id, media)
		}
		l, fresh := kp.place(c, i, k.Key, set)
		if media == 0 {
			continue // a placeholder: the next key keeps its node alive
		}
		if !fresh {
			c.change(l, holders.Op{Worker: id, Set: media})
		}
		var a *alias
		if len(blocks) > 1 {
			a = &alias{entries: len(blocks)}
			if w.aliases == nil {
				w.aliases = make(map[loc]*alias)
			}
			w.aliases[l] = a
		}
		for j := range blocks {
			blk := &blocks[j]
			bm := blk.media()
			e := newEntry(l, bm)
			if anyAbove1(&blk.Refs) {
				if w.dups == nil {
					w.dups = make(map[uint64]*[events.NumMedia]uint8)
				}
				refs := blk.Refs
				w.dups[blk.Hash] = &refs
				e |= entryDup
			}
			w.engine.InsertAged(blk.Hash, uint64(e), blk.Age)
			w.res++
			for m := range events.NumMedia {
				if bm&(1<<m) != 0 {
					w.resBy[m]++
					if a != nil {
						a.media[m]++
					}
				}
			}
		}
	}
	w.learned = ck.state.Learned
	w.lastReset = ck.state.LastReset
}

// The encoding of a segment (AppendBinary), little-endian:
//
//	version 2 | part uvarint | total uvarint | total blocks uvarint | total side uvarint | last 0 or 1 |
//	[digest 8 if last] | [state, in part 0] | keys uvarint | key... | side blocks uvarint | side block...
//
// The state: the learned capacities (a uvarint per medium), the KV-cache
// groups (a count, then each group's index, block size and window as
// uvarints, its kind as a length and bytes, and an anchor byte) and the
// reset reason (length, bytes). Version 1, read still, had a count of
// ignored groups as zig-zag varints in place of the groups. A key: a tag byte (bits 0-1: where it attaches, as in a
// snapshot; bits 2-3: its blocks, 0 one, 1 none, 2 a count uvarint after
// the key and parent), the key (8 bytes), the parent (8) when the tag says
// so, the count, then its blocks. A block: a flags byte (bits 0-5: media;
// bit 6: the segment's previous block's age, left out; bit 7: stores
// follow, a byte per medium of its media, else one in each), the engine
// hash (8), the age (1) unless bit 6, and the stores. A side block: its
// group's index (a byte), the engine hash (8), the key (8) and its stores
// (uvarint). Version 1 had no total side and no side blocks.
const (
	ckptVersion      = 2
	ckptVersion1     = 1
	ckptBlocksOne    = 0 << 2
	ckptPlaceholder  = 1 << 2
	ckptBlocksCount  = 2 << 2
	ckptBlockSameAge = 1 << 6
	ckptBlockRefs    = 1 << 7
	ckptMediaMask    = 1<<events.NumMedia - 1
	ckptMinBlock     = 9 // the fewest bytes a block takes: flags and hash.
)

// A block's flags byte has room for six media.
const _ = uint(6 - events.NumMedia)

// AppendBinary appends the segment's encoding to b
// (encoding.BinaryAppender). It fails only for a segment that could not
// come from Checkpoint.
func (s *CheckpointSegment) AppendBinary(b []byte) ([]byte, error) {
	if len(s.Keys) > CheckpointSegmentKeys {
		return b, fmt.Errorf("%w: segment %d has %d keys, over %d", ErrBadCheckpoint, s.Part, len(s.Keys), CheckpointSegmentKeys)
	}
	if s.Part > 0 && !s.State.zero() {
		return b, fmt.Errorf("%w: segment %d carries a state, which belongs in segment 0", ErrBadCheckpoint, s.Part)
	}
	if len(s.State.LastReset) > maxResetReason {
		return b, fmt.Errorf("%w: a reset reason of %d bytes, over %d", ErrBadCheckpoint, len(s.State.LastReset), maxResetReason)
	}
	nb := 0
	for i := range s.Keys {
		nb += int(s.Keys[i].Blocks)
	}
	if nb != len(s.Blocks) {
		return b, fmt.Errorf("%w: segment %d has %d blocks, its keys %d", ErrBadCheckpoint, s.Part, len(s.Blocks), nb)
	}
	if len(s.Side) > CheckpointSegmentBlocks {
		return b, fmt.Errorf("%w: segment %d has %d side blocks, over %d", ErrBadCheckpoint, s.Part, len(s.Side), CheckpointSegmentBlocks)
	}
	b = append(b, ckptVersion)
	b = binary.AppendUvarint(b, uint64(s.Part))
	b = binary.AppendUvarint(b, s.Total)
	b = binary.AppendUvarint(b, s.TotalBlocks)
	b = binary.AppendUvarint(b, s.TotalSide)
	b = appendLast(b, s.Last, s.Digest)
	if s.Part == 0 {
		for _, n := range s.State.Learned {
			b = binary.AppendUvarint(b, uint64(max(n, 0)))
		}
		b = appendLayout(b, s.State.Groups)
		b = binary.AppendUvarint(b, uint64(len(s.State.LastReset)))
		b = append(b, s.State.LastReset...)
	}
	b = binary.AppendUvarint(b, uint64(len(s.Keys)))
	next, prevAge, first := 0, uint8(0), true
	var prev Key
	for i := range s.Keys {
		k := &s.Keys[i]
		tag := attachTag(i, prev, k.Parent, k.HasParent)
		prev = k.Key
		switch k.Blocks {
		case 0:
			tag |= ckptPlaceholder
		case 1:
			tag |= ckptBlocksOne
		default:
			tag |= ckptBlocksCount
		}
		b = appendKeyHead(b, tag, k.Key, k.Parent)
		if tag&tagFormMask == ckptBlocksCount {
			b = binary.AppendUvarint(b, uint64(k.Blocks))
		}
		for _, blk := range s.Blocks[next : next+int(k.Blocks)] {
			m := blk.media()
			if m == 0 {
				return b, fmt.Errorf("%w: block %#016x of key %#016x is in no medium", ErrBadCheckpoint, blk.Hash, uint64(k.Key))
			}
			flags := m
			if !first && blk.Age == prevAge {
				flags |= ckptBlockSameAge
			}
			if anyAbove1(&blk.Refs) {
				flags |= ckptBlockRefs
			}
			b = append(b, flags)
			b = binary.LittleEndian.AppendUint64(b, blk.Hash)
			if flags&ckptBlockSameAge == 0 {
				b = append(b, blk.Age)
			}
			if flags&ckptBlockRefs != 0 {
				for _, r := range blk.Refs {
					if r > 0 {
						b = append(b, r)
					}
				}
			}
			prevAge, first = blk.Age, false
		}
		next += int(k.Blocks)
	}
	b = binary.AppendUvarint(b, uint64(len(s.Side)))
	for _, sb := range s.Side {
		if sb.Group < 0 || sb.Group >= MaxGroups {
			return b, fmt.Errorf("%w: a side block of group %d", ErrBadCheckpoint, sb.Group)
		}
		b = append(b, byte(sb.Group))
		b = binary.LittleEndian.AppendUint64(b, sb.Hash)
		b = binary.LittleEndian.AppendUint64(b, uint64(sb.Key))
		b = binary.AppendUvarint(b, uint64(sb.Refs))
	}
	return b, nil
}

// UnmarshalBinary decodes a segment that AppendBinary encoded into s,
// reusing its slices' memory (encoding.BinaryUnmarshaler). Bad input is
// ErrBadCheckpoint, naming the offset; it never panics and allocates no
// more than the input's size justifies. RestoreCheckpoint checks what the
// keys say.
func (s *CheckpointSegment) UnmarshalBinary(data []byte) error {
	d := segDecoder{b: data, bad: ErrBadCheckpoint}
	v1 := len(data) > 0 && data[0] == ckptVersion1
	if v1 {
		d.version(ckptVersion1)
	} else {
		d.version(ckptVersion)
	}
	part := d.uvarint(math.MaxUint32)
	total := d.uvarint(math.MaxUint64)
	totalBlocks := d.uvarint(math.MaxUint64)
	var totalSide uint64
	if !v1 {
		totalSide = d.uvarint(math.MaxUint64)
	}
	last, digest := d.last()
	var state CheckpointState
	if part == 0 {
		for m := range state.Learned {
			state.Learned[m] = int64(d.uvarint(math.MaxInt64))
		}
		if v1 {
			// Groups skipped by a version that indexed only full
			// attention: relearned from the next stores.
			ng := int(d.uvarint(uint64(d.left())))
			for range ng {
				d.varint(math.MinInt32, math.MaxInt32)
			}
		} else {
			state.Groups = d.layout()
		}
		n := int(d.uvarint(maxResetReason))
		state.LastReset = string(d.bytes(n))
	}
	n := int(d.uvarint(CheckpointSegmentKeys))
	if d.err != nil {
		return d.err
	}
	keys := slices.Grow(s.Keys[:0], n)
	blocks := s.Blocks[:0]
	var prevAge uint8
	var prev Key
	for i := 0; i < n && d.err == nil; i++ {
		var k CheckpointKey
		var tag byte
		tag, k.Key, k.Parent, k.HasParent = d.keyHead(i, prev)
		prev = k.Key
		switch tag & tagFormMask {
		case ckptBlocksOne:
			k.Blocks = 1
		case ckptBlocksCount:
			// Bounded by the bytes left: a corrupt count sizes nothing.
			k.Blocks = uint32(d.uvarint(min(math.MaxUint32, uint64(d.left()/ckptMinBlock))))
			if d.err == nil && k.Blocks == 0 {
				d.fail("key %d: a count of no blocks", i)
			}
		}
		for range k.Blocks {
			if d.err != nil {
				break
			}
			flags := d.byte()
			m := flags & ckptMediaMask
			if d.err == nil && m == 0 {
				d.fail("key %d: a block in no medium", i)
			}
			if d.err == nil && flags&ckptBlockSameAge != 0 && len(blocks) == 0 {
				d.fail("key %d: the segment's first block has its previous block's age", i)
			}
			blk := CheckpointBlock{Hash: d.uint64(), Age: prevAge}
			if flags&ckptBlockSameAge == 0 {
				blk.Age = d.byte()
			}
			for md := range blk.Refs {
				if m&(1<<md) == 0 {
					continue
				}
				blk.Refs[md] = 1
				if flags&ckptBlockRefs != 0 {
					if blk.Refs[md] = d.byte(); d.err == nil && blk.Refs[md] == 0 {
						d.fail("key %d: a block with no stores in a medium it is in", i)
					}
				}
			}
			prevAge = blk.Age
			blocks = append(blocks, blk)
		}
		keys = append(keys, k)
	}
	var side []CheckpointSideBlock
	if !v1 {
		ns := int(d.uvarint(CheckpointSegmentBlocks))
		side = s.Side[:0]
		for i := 0; i < ns && d.err == nil; i++ {
			sb := CheckpointSideBlock{Group: int(d.byte()), Hash: d.uint64(), Key: Key(d.uint64()), Refs: uint32(d.uvarint(math.MaxUint32))}
			if d.err == nil && sb.Group >= MaxGroups {
				d.fail("side block %d: group %d", i, sb.Group)
			}
			side = append(side, sb)
		}
	}
	if err := d.end(); err != nil {
		return err
	}
	if len(side) == 0 {
		side = nil
	}
	*s = CheckpointSegment{Part: uint32(part), Total: total, TotalBlocks: totalBlocks, TotalSide: totalSide, Last: last, Digest: digest,
		State: state, Keys: keys, Blocks: blocks, Side: side}
	return nil
}
