package indexer

import (
	"cmp"
	"fmt"
	"slices"
)

// Replication of side groups (see groups.go). A delta carries a side
// group's keys as they become held and no longer held (DeltaEntry.Group),
// and the layout when it changed (Delta.Layout); a snapshot carries the
// layout and each side group's held keys with their block counts; a
// checkpoint the layout and each side group's engine blocks. Digests sum a
// term per (side group, held key) besides the tree's.

// whyGroup: a side effect names a group the worker has not as a side group.
const whyGroup = "the worker has no such side group"

// side applies a side group's effect to a keyed worker.
func (a *deltaApplier) side(de *DeltaEntry) string {
	w := a.w
	g := w.groupOfLocked(int(de.Group) - 1)
	if g == nil || g.side == nil {
		return whyGroup
	}
	sg := g.side
	switch de.Op {
	case OpStore:
		if sg.held[de.Key] == maxSideHeld {
			return whySaturation
		}
		w.side.mu.Lock()
		w.sideHoldLocked(sg, de.Key)
		w.side.mu.Unlock()
		w.stored++
	case OpRemove:
		if sg.held[de.Key] == 0 {
			return whyNotHeld
		}
		w.side.mu.Lock()
		w.sideUnholdLocked(sg, de.Key)
		w.side.mu.Unlock()
		w.removed++
	default:
		return whyOp
	}
	return ""
}

// maxSideHeld bounds the blocks a keyed worker counts at one side key.
const maxSideHeld = 1<<32 - 1

// sideDigestTerm is a held side key's term in a digest: the tree's terms
// have media masks below 1<<NumMedia, these the group's index above it.
func sideDigestTerm(group int, k Key) uint64 {
	return digestTerm(k, uint8(0x80|group))
}

// sideDigestLocked sums the side terms of the worker's side groups.
func (w *Worker) sideDigestLocked() uint64 {
	var d uint64
	for _, sg := range w.side.order {
		for k := range sg.held {
			d += sideDigestTerm(sg.g.Index, k)
		}
	}
	return d
}

// SideKey is a side group's held key in a snapshot, with the source's
// blocks of that group at it.
type SideKey struct {
	Group  int // the group's index
	Key    Key
	Blocks uint32
}

// sideKeysLocked returns the worker's held side keys, by group and key.
func (w *Worker) sideKeysLocked() []SideKey {
	var out []SideKey
	for _, sg := range w.side.order {
		for k, n := range sg.held {
			out = append(out, SideKey{Group: sg.g.Index, Key: k, Blocks: n})
		}
	}
	slices.SortFunc(out, func(a, b SideKey) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Key, b.Key))
	})
	return out
}

// CheckpointSideBlock is one engine block of a side group in a checkpoint.
type CheckpointSideBlock struct {
	Group int // the group's index
	Hash  uint64
	Key   Key
	Refs  uint32 // its stores not yet removed
}

// sideBlocksLocked returns the worker's side blocks, by group and hash.
func (w *Worker) sideBlocksLocked() []CheckpointSideBlock {
	var out []CheckpointSideBlock
	for _, sg := range w.side.order {
		for h, b := range sg.blocks {
			out = append(out, CheckpointSideBlock{Group: sg.g.Index, Hash: h, Key: b.key, Refs: b.refs})
		}
	}
	slices.SortFunc(out, func(a, b CheckpointSideBlock) int {
		return cmp.Or(cmp.Compare(a.Group, b.Group), cmp.Compare(a.Hash, b.Hash))
	})
	return out
}

// sideCheck checks the side items of a snapshot or checkpoint against its
// layout as they come: each names a side group of the layout, no item
// twice, and sums the digest terms of the keys it holds.
type sideCheck struct {
	side   map[int]bool // the layout's side groups
	seen   map[[2]uint64]struct{}
	held   map[[2]uint64]struct{} // (group, key) counted in digest
	digest uint64
}

func newSideCheck(gs []Group) *sideCheck {
	sc := &sideCheck{side: map[int]bool{}, seen: map[[2]uint64]struct{}{}, held: map[[2]uint64]struct{}{}}
	for _, g := range gs {
		if !g.Anchor && (g.Class == ClassPrefix || g.Class == ClassWindow || g.Class == ClassMamba) {
			sc.side[g.Index] = true
		}
	}
	return sc
}

// add checks one item: group and its identity (a key for a snapshot, an
// engine hash for a checkpoint), the key it holds and its count; it
// returns why it does not fit, "" if it does.
func (sc *sideCheck) add(group int, id uint64, k Key, n uint32) string {
	switch {
	case !sc.side[group]:
		return fmt.Sprintf("side group %d is not in the layout", group)
	case n == 0:
		return fmt.Sprintf("group %d: an item of no blocks or stores", group)
	}
	l := len(sc.seen)
	sc.seen[[2]uint64{uint64(group), id}] = struct{}{}
	if len(sc.seen) == l {
		return fmt.Sprintf("group %d: %#016x comes twice", group, id)
	}
	l = len(sc.held)
	sc.held[[2]uint64{uint64(group), uint64(k)}] = struct{}{}
	if len(sc.held) > l {
		sc.digest += sideDigestTerm(group, k)
	}
	return ""
}

// restoreSideKeysLocked adds snapshot side keys (checked) to a keyed
// worker whose layout is in place.
func (w *Worker) restoreSideKeysLocked(keys []SideKey) {
	defer w.rebuildSpecsLocked()
	w.side.mu.Lock()
	defer w.side.mu.Unlock()
	for _, sk := range keys {
		sg := w.groupOfLocked(sk.Group).side
		if sg.held[sk.Key] == 0 {
			w.sideRes++
			sg.g.Blocks++
		}
		sg.held[sk.Key] += sk.Blocks
	}
}

// restoreSideBlocksLocked adds checkpoint side blocks (checked) to a
// worker fed engine events whose layout is in place.
func (w *Worker) restoreSideBlocksLocked(blocks []CheckpointSideBlock) {
	w.side.mu.Lock()
	defer w.side.mu.Unlock()
	for _, b := range blocks {
		sg := w.groupOfLocked(b.Group).side
		sg.blocks[b.Hash] = sideBlock{key: b.Key, refs: b.Refs}
		w.sideHoldLocked(sg, b.Key)
	}
}
