package indexer

import (
	"encoding/binary"
	"errors"
	"fmt"
	"math"
	"slices"
	"strings"
	"sync"

	"github.com/kvindex/kvindex/events"
)

// KV-cache groups. vLLM keeps one KV-cache group per kind of attention
// layer of a model and announces each group's blocks with its group_idx,
// kv_cache_spec_kind and block_size; every group of a hybrid model
// announces the same block hash for the same block. Its
// HybridKVCacheCoordinator realizes a hit only as far as every group can
// serve it (vllm/v1/core/kv_cache_coordinator.py, find_longest_cache_hit,
// and the per-kind managers in single_type_kv_cache_manager.py).
//
// A worker learns its groups from BlockStored events. The first group of a
// prefix class it sees is its anchor: its blocks are the worker's residency
// in the key tree, which Match walks. Every other group of a class with a
// hit rule is a side group, whose blocks are kept per (group, content key)
// and checked by Worker.Cap; a group of a kind kvindex does not model is
// counted and not tracked. Content keys do not depend on the group, only
// on the tokens and the block size, so a side group's keys are the anchor's
// keys of the same blocks.

// GroupClass is the part a KV-cache group plays in a prefix hit.
type GroupClass uint8

const (
	// ClassPrefix groups keep every token's KV (full_attention,
	// mla_attention, sink_full_attention, or no kind: vLLM announced one
	// full-attention group before kinds): a hit needs every block from the
	// first.
	ClassPrefix GroupClass = iota + 1
	// ClassWindow groups keep the last sliding window (sliding_window,
	// sliding_window_mla): a hit of L blocks needs the window's blocks
	// before the cut, or every block when L is shorter than the window.
	ClassWindow
	// ClassMamba groups keep a recurrent state per block (mamba): a hit of
	// L blocks needs the state at the cut, block L-1.
	ClassMamba
	// ClassOther groups are of a kind whose hit rule kvindex does not
	// model ("unknown", chunked local attention, a window of unknown
	// size): counted, not tracked, and shown by Diagnose.
	ClassOther
)

var classNames = [...]string{"", "prefix", "window", "mamba", "other"}

// String returns the class's name ("prefix", "window", "mamba", "other").
func (c GroupClass) String() string {
	if int(c) < len(classNames) && c != 0 {
		return classNames[c]
	}
	return fmt.Sprintf("class(%d)", uint8(c))
}

// ClassOf returns the class of a kv_cache_spec_kind (vLLM's
// get_kv_cache_spec_kind names), ignoring case.
func ClassOf(kind string) GroupClass {
	switch kind {
	case "", "full_attention", "mla_attention", "sink_full_attention":
		return ClassPrefix
	case "sliding_window", "sliding_window_mla":
		return ClassWindow
	case "mamba":
		return ClassMamba
	}
	if l := strings.ToLower(kind); l != kind {
		return ClassOf(l)
	}
	return ClassOther
}

// ClassOfGroup returns the class of a group of kind with a sliding window
// of window tokens (0: none sent): ClassOf, except that a window kind
// without a window is ClassOther (it has no rule to follow).
func ClassOfGroup(kind string, window int) GroupClass {
	class := ClassOf(kind)
	if class == ClassWindow && window <= 0 {
		return ClassOther
	}
	return class
}

// MaxGroups bounds a KV-cache group's index: an event naming a group at or
// past it is invalid (counted, not applied). vLLM's models use a handful.
const MaxGroups = 64

// maxSideBlocks bounds each side group's blocks while the worker's
// capacity is unknown; past its bound a side group refuses new blocks
// (counted in Stats.SideRefused), which can only make Cap stricter.
const maxSideBlocks = 1 << 22

// ErrGroup is an event whose KV-cache group cannot be used: an index out of
// range, or a removal for a group the worker never saw stored.
var ErrGroup = errors.New("indexer: KV-cache group")

// Group is one KV-cache group of a worker, as its events describe it.
type Group struct {
	Index     int        // group_idx (0 when the engine sends none).
	Kind      string     // kv_cache_spec_kind as sent ("" when none).
	Class     GroupClass // the part it plays in a hit.
	BlockSize int        // tokens per block (0 until a store with tokens).
	Window    int        // the sliding window in tokens (ClassWindow).
	// Anchor marks the group whose blocks are the worker's residency in
	// the key tree; the others with a hit rule cap it (Worker.Cap).
	Anchor bool
	Blocks int64 // the group's resident blocks (the anchor's: Stats.ResidentBlocks).
}

// Role says what kvindex does with the group: "prefix" for the anchor
// (its blocks are the worker's residency), "cap" for a side group (it caps
// hits, Worker.Cap), "not modelled" for ClassOther (counted only).
func (g *Group) Role() string {
	switch {
	case g.Anchor:
		return "prefix"
	case g.Class == ClassOther:
		return "not modelled"
	}
	return "cap"
}

// windowBlocks is how many blocks before the cut a window group needs:
// vLLM's cdiv(sliding_window - 1, block_size), at least one.
func (g *Group) windowBlocks() int {
	return max((g.Window-1+g.BlockSize-1)/g.BlockSize, 1)
}

// describe returns "group 1 (sliding_window, window 128)" for messages.
func (g *Group) describe() string {
	kind := g.Kind
	if kind == "" {
		kind = "no kind"
	}
	if g.Class == ClassWindow {
		return fmt.Sprintf("group %d (%s, window %d)", g.Index, kind, g.Window)
	}
	return fmt.Sprintf("group %d (%s)", g.Index, kind)
}

// groupState is a group the worker learned, with its side blocks when it
// is a side group.
type groupState struct {
	Group
	side *sideGroup // nil for the anchor and ClassOther
}

// sideGroup is the residency of one side group.
//
// A worker fed engine events maps engine hash to its block (blocks); a
// keyed worker has no engine hashes and keeps only held, the number of the
// source's blocks at each key.
type sideGroup struct {
	g      *groupState
	blocks map[uint64]sideBlock // engine hash -> block; nil for a keyed worker
	held   map[Key]uint32       // content key -> blocks of the group at it
	spec   *sideSpec            // the spec it is a member of (nil: no block size yet)
	bit    uint64               // its bit in spec
}

// sideBlock is one engine block of a side group: its key and its stores
// not yet removed (in any medium: a side group's hit rule does not weigh
// tiers).
type sideBlock struct {
	key  Key
	refs uint32
}

// sideStore is a worker's side groups, which Cap reads.
//
// # Concurrency
//
// Writers hold Worker.mu, then mu; Cap takes mu shared and never
// Worker.mu, so it does not wait on the worker's whole batch, only on its
// side events (lock order: Worker.mu, then sideStore.mu).
type sideStore struct {
	mu    sync.RWMutex // guards the groups' maps, order and specs
	order []*sideGroup // in group index order
	specs []*sideSpec  // the groups by description, which Cap reads
}

// groupOfLocked returns the worker's group idx, or nil.
func (w *Worker) groupOfLocked(idx int) *groupState {
	if idx >= 0 && idx < len(w.groups) {
		return w.groups[idx]
	}
	return nil
}

// eventGroup returns the group index an event names (0 when none) and
// whether it is in range.
func eventGroup(ev *events.Event) (int, bool) {
	if !ev.HasGroupIdx {
		return 0, true
	}
	return ev.GroupIdx, ev.GroupIdx >= 0 && ev.GroupIdx < MaxGroups
}

// learnGroupLocked returns the group of a BlockStored event whose tokens
// were checked, learning it (and the anchor) on its first store. A group
// the engine describes anew (another kind, window or block size) is
// relearned while it holds nothing, as after a restart; while it holds
// blocks the event is refused and counted (Stats.LayoutChanges): a
// running engine cannot change its layout, and a restart resets the
// worker first.
func (w *Worker) learnGroupLocked(ev *events.Event) (*groupState, error) {
	idx, ok := eventGroup(ev)
	if !ok {
		w.c.invalid.Add(1)
		return nil, fmt.Errorf("%w: group_idx %d outside [0, %d)", ErrGroup, ev.GroupIdx, MaxGroups)
	}
	class, window := ClassOf(ev.SpecKind), 0
	if class == ClassWindow {
		if !ev.HasSlidingWindow || ev.SlidingWindow <= 0 {
			class = ClassOther // a window of unknown size has no rule to follow
		} else {
			window = ev.SlidingWindow
		}
	}
	bs := ev.BlockSize
	if len(ev.TokenIDs) == 0 {
		bs = 0 // offload events need not carry the block size
	}
	g := w.groupOfLocked(idx)
	if g == nil {
		return w.addGroupLocked(idx, ev.SpecKind, class, bs, window), nil
	}
	if bs == 0 && ev.SpecKind == "" {
		return g, nil // an offload placeholder (no tokens, block size or kind) describes no layout
	}
	if g.Class == class && g.Window == window && (bs == 0 || g.BlockSize == 0 || g.BlockSize == bs) {
		if g.BlockSize == 0 && bs > 0 {
			w.setGroupBlockSizeLocked(g, bs)
		}
		g.Kind = ev.SpecKind
		return g, nil
	}
	if w.groupBlocksLocked(g) > 0 {
		w.c.layoutChanges.Add(1)
		return nil, fmt.Errorf("%w: a store describes %s as %s with window %d and %d-token blocks while it holds %d-token blocks: not applied", ErrGroup, g.describe(), orNoKind(ev.SpecKind), window, bs, g.BlockSize)
	}
	w.dropGroupLocked(g)
	return w.addGroupLocked(idx, ev.SpecKind, class, bs, window), nil
}

func orNoKind(kind string) string {
	if kind == "" {
		return "no kind"
	}
	return kind
}

// addGroupLocked adds group idx; the first prefix group becomes the
// anchor, later ones and window and mamba groups side groups.
func (w *Worker) addGroupLocked(idx int, kind string, class GroupClass, bs, window int) *groupState {
	g := &groupState{Group: Group{Index: idx, Kind: kind, Class: class, Window: window}}
	if idx >= len(w.groups) {
		w.groups = append(w.groups, make([]*groupState, idx+1-len(w.groups))...)
	}
	w.groups[idx] = g
	w.layoutDirty = true
	defer w.publishLayoutLocked()
	switch {
	case class == ClassPrefix && w.anchor < 0:
		g.Anchor = true
		w.anchor = idx
	case class == ClassPrefix || class == ClassWindow || class == ClassMamba:
		g.side = &sideGroup{g: g, held: make(map[Key]uint32)}
		if !w.info.Keyed {
			g.side.blocks = make(map[uint64]sideBlock)
		}
		w.side.mu.Lock()
		w.side.order = append(w.side.order, g.side)
		sortSide(w.side.order)
		w.side.mu.Unlock()
		w.capped.Store(true)
	}
	if bs > 0 {
		w.setGroupBlockSizeLocked(g, bs)
	}
	return g
}

// sortSide orders side groups by index (insertion sort: a handful).
func sortSide(s []*sideGroup) {
	for i := 1; i < len(s); i++ {
		for j := i; j > 0 && s[j].g.Index < s[j-1].g.Index; j-- {
			s[j], s[j-1] = s[j-1], s[j]
		}
	}
}

// dropGroupLocked forgets an empty group (to be described anew).
func (w *Worker) dropGroupLocked(g *groupState) {
	w.groups[g.Index] = nil
	w.layoutDirty = true
	defer w.publishLayoutLocked()
	if g.Anchor {
		w.anchor = -1
		w.setPrefixBlockSizeLocked(0)
	}
	if g.side != nil {
		w.side.mu.Lock()
		for i, sg := range w.side.order {
			if sg == g.side {
				w.side.order = append(w.side.order[:i], w.side.order[i+1:]...)
				break
			}
		}
		w.capped.Store(len(w.side.order) > 0)
		w.side.mu.Unlock()
		w.rebuildSpecsLocked()
	}
}

// setGroupBlockSizeLocked records a group's block size; the anchor's is
// the worker's prefix block size.
func (w *Worker) setGroupBlockSizeLocked(g *groupState, bs int) {
	g.BlockSize = bs
	w.layoutDirty = true
	defer w.publishLayoutLocked()
	if g.Anchor {
		w.setPrefixBlockSizeLocked(bs)
	}
	if g.side != nil {
		w.rebuildSpecsLocked()
	}
}

// groupBlocksLocked returns the blocks group g holds.
func (w *Worker) groupBlocksLocked(g *groupState) int64 {
	if g.Anchor {
		return w.res
	}
	if g.side != nil {
		return int64(len(g.side.held))
	}
	return 0
}

// sideCapLocked is the most blocks a side group may hold: the worker's
// capacity when it has one, else maxSideBlocks.
func (w *Worker) sideCapLocked() int {
	if c := w.capacityLocked(); c > 0 {
		return int(min(c, maxSideBlocks))
	}
	return maxSideBlocks
}

// sideStoreLocked applies a BlockStored event of a side group: each block
// is keyed as the anchor keys it, chained from its parent, which any group
// of the same block size may know.
func (w *Worker) sideStoreLocked(sg *sideGroup, ev *events.Event) error {
	if len(ev.TokenIDs) == 0 {
		// An offload: known blocks gain a store.
		unknown := 0
		w.side.mu.Lock()
		for _, h := range ev.BlockHashes {
			if b, ok := sg.blocks[h]; ok {
				b.refs = min(b.refs+1, 1<<31)
				sg.blocks[h] = b
			} else {
				unknown++
			}
		}
		w.side.mu.Unlock()
		if unknown > 0 {
			w.c.unknown.Add(int64(unknown))
			return fmt.Errorf("%w: %d of %d blocks of %s offloaded to %s were never stored", ErrUnknownBlock, unknown, len(ev.BlockHashes), sg.g.describe(), ev.Medium)
		}
		return nil
	}
	bs := ev.BlockSize
	parentKey := w.rootFor(ev.LoRAName)
	var err error
	if ev.HasParent {
		k, ok := w.keyOfHashLocked(sg, ev.ParentHash, bs)
		if ok {
			parentKey = k
		} else {
			n := len(ev.BlockHashes)
			w.c.orphans.Add(int64(n))
			parentKey = orphanRoot(w.id, ev.ParentHash)
			err = fmt.Errorf("%w %#016x in %s: %d blocks indexed as orphans", ErrOrphan, ev.ParentHash, sg.g.describe(), n)
		}
	}
	limit := w.sideCapLocked()
	refused := 0
	var stack [128]byte
	scratch := stack[:0]
	px := PromptExtras{LoRAName: ev.LoRAName}
	if !ev.HasParent {
		px.CacheSalt = ev.CacheSalt
	}
	// The hashes are the last blocks: vLLM leaves out the null blocks a
	// window group keeps behind its window and a mamba group before a
	// chunk's last state, not their tokens (checkTokensLocked). Those are
	// keyed to chain through, without extra keys (after a multimodal one,
	// a key no prompt has: Cap only stricter).
	skip := len(ev.TokenIDs)/bs - len(ev.BlockHashes)
	w.side.mu.Lock()
	for j := range skip + len(ev.BlockHashes) {
		var extra events.ExtraKeys
		switch {
		case j >= skip && ev.ExtraKeys != nil:
			extra = ev.ExtraKeys[j-skip]
		case ev.LoRAName != "" || ev.CacheSalt != "":
			extra, scratch = px.blockExtras(j, scratch)
		}
		k := BlockKey(parentKey, ev.TokenIDs[j*bs:(j+1)*bs], extra)
		if j >= skip && !w.sideAddLocked(sg, ev.BlockHashes[j-skip], k, limit) {
			refused++
		}
		parentKey = k
	}
	w.side.mu.Unlock()
	w.stored += int64(len(ev.BlockHashes) - refused)
	if refused > 0 {
		w.c.sideRefused.Add(int64(refused))
		err = errors.Join(err, fmt.Errorf("%w: %s holds its limit of %d blocks: %d refused", ErrGroup, sg.g.describe(), limit, refused))
	}
	return err
}

// checkTokensLocked checks that a store's tokens and extra keys cover its
// blocks of bs tokens, counting what does not; a window or mamba group's
// may cover more blocks, which vLLM skips (sideStoreLocked).
func (w *Worker) checkTokensLocked(ev *events.Event, bs int) error {
	n := len(ev.BlockHashes)
	skips := ClassOf(ev.SpecKind) == ClassWindow || ClassOf(ev.SpecKind) == ClassMamba
	if bs <= 0 || len(ev.TokenIDs) != n*bs && (!skips || len(ev.TokenIDs)%bs != 0 || len(ev.TokenIDs) < n*bs) {
		w.c.invalid.Add(1)
		return fmt.Errorf("%w: %d token_ids for %d blocks of %d", ErrTokenCount, len(ev.TokenIDs), n, bs)
	}
	if ev.ExtraKeys != nil && len(ev.ExtraKeys) != n {
		w.c.invalid.Add(1)
		return fmt.Errorf("%w: %d extra_keys for %d blocks", ErrTokenCount, len(ev.ExtraKeys), n)
	}
	return nil
}

// keyOfHashLocked finds the content key of engine hash h for blocks of bs
// tokens: in sg, else in the anchor, else in another side group of the
// same block size (every group announces the same hash for a block).
func (w *Worker) keyOfHashLocked(sg *sideGroup, h uint64, bs int) (Key, bool) {
	if b, ok := sg.blocks[h]; ok {
		return b.key, true
	}
	if a := w.groupOfLocked(w.anchor); a != nil && a.BlockSize == bs {
		if slot, ok := w.engine.Get(h); ok {
			return w.cur.keyAt(w.locOf(w.entry(slot))), true
		}
	}
	for _, o := range w.side.order {
		if o != sg && o.g.BlockSize == bs {
			if b, ok := o.blocks[h]; ok {
				return b.key, true
			}
		}
	}
	return 0, false
}

// sideAddLocked records one store of block h (key k) in sg, and reports
// false when it is a new block beyond limit (refused). Callers hold
// side.mu.
func (w *Worker) sideAddLocked(sg *sideGroup, h uint64, k Key, limit int) bool {
	if b, ok := sg.blocks[h]; ok {
		if b.key == k {
			b.refs = min(b.refs+1, 1<<31)
			sg.blocks[h] = b
			return true
		}
		// The engine reused a hash for other content: move the block.
		w.sideUnholdLocked(sg, b.key)
		delete(sg.blocks, h)
	}
	if len(sg.blocks) >= limit {
		return false
	}
	sg.blocks[h] = sideBlock{key: k, refs: 1}
	w.sideHoldLocked(sg, k)
	return true
}

// sideHoldLocked counts one more block of sg at k, recording the effect
// when the key becomes held.
func (w *Worker) sideHoldLocked(sg *sideGroup, k Key) {
	n := sg.held[k]
	sg.held[k] = n + 1
	if n == 0 {
		sg.specHoldLocked(k)
		w.sideRes++
		sg.g.Blocks++
		if w.rec != nil {
			w.rec.Entries = append(w.rec.Entries, DeltaEntry{Op: OpStore, Key: k, Group: uint8(sg.g.Index) + 1, BlockEdge: true, MediumEdge: true})
		}
	}
}

// sideUnholdLocked counts one block of sg less at k, recording the effect
// when the key is no longer held.
func (w *Worker) sideUnholdLocked(sg *sideGroup, k Key) {
	n := sg.held[k]
	if n > 1 {
		sg.held[k] = n - 1
		return
	}
	delete(sg.held, k)
	sg.specUnholdLocked(k)
	w.sideRes--
	sg.g.Blocks--
	if w.rec != nil {
		w.rec.Entries = append(w.rec.Entries, DeltaEntry{Op: OpRemove, Key: k, Group: uint8(sg.g.Index) + 1, BlockEdge: true, MediumEdge: true})
	}
}

// sideRemoveLocked applies a BlockRemoved event of a side group.
func (w *Worker) sideRemoveLocked(sg *sideGroup, ev *events.Event) error {
	unknown, removed := 0, 0
	w.side.mu.Lock()
	for _, h := range ev.BlockHashes {
		b, ok := sg.blocks[h]
		if !ok {
			unknown++
			continue
		}
		removed++
		if b.refs > 1 {
			b.refs--
			sg.blocks[h] = b
			continue
		}
		delete(sg.blocks, h)
		w.sideUnholdLocked(sg, b.key)
	}
	w.side.mu.Unlock()
	w.removed += int64(removed)
	if m := ev.Medium; removed > 0 && int(m) < events.NumMedia && w.learned[m] == 0 {
		w.learned[m] = w.learnedAtLocked(m)
	}
	if unknown > 0 {
		w.c.unknown.Add(int64(unknown))
		return fmt.Errorf("%w: %d of %d blocks removed from %s were not held there", ErrUnknownBlock, unknown, len(ev.BlockHashes), sg.g.describe())
	}
	return nil
}

// learnedAtLocked is what a first removal in medium m says the tier holds
// (see Worker, Capacity): the worker's blocks in m, and for GPU its side
// groups' too, since a hybrid model's groups share one pool of blocks and
// vLLM evicts when that pool, not the prefix group's share, is full.
func (w *Worker) learnedAtLocked(m events.Medium) int64 {
	if m == events.MediumGPU {
		return w.resBy[m] + w.sideRes
	}
	return w.resBy[m]
}

// clearSideLocked forgets every block of one side group.
func (w *Worker) clearSideLocked(sg *sideGroup) {
	w.side.mu.Lock()
	w.sideRes -= int64(len(sg.held))
	sg.g.Blocks = 0
	for k := range sg.held {
		sg.specUnholdLocked(k)
	}
	clear(sg.held)
	if sg.blocks != nil {
		clear(sg.blocks)
	}
	w.side.mu.Unlock()
}

// clearAllSideLocked forgets every block of every side group (the layout
// stays: an engine's groups survive a cleared cache and its restart).
func (w *Worker) clearAllSideLocked() {
	for _, sg := range w.side.order {
		w.clearSideLocked(sg)
	}
}

// publishLayoutLocked publishes the groups' descriptions for Group.
func (w *Worker) publishLayoutLocked() {
	l := w.layoutLocked()
	w.layout.Store(&l)
}

// Group returns the description of the worker's group idx (Blocks unset)
// and whether it has one, without waiting on its events. Cost: an atomic
// load and a scan of a handful.
func (w *Worker) Group(idx int) (Group, bool) {
	if l := w.layout.Load(); l != nil {
		for _, g := range *l {
			if g.Index == idx {
				return g, true
			}
		}
	}
	return Group{}, false
}

// Groups returns the worker's KV-cache groups in index order.
func (w *Worker) Groups() []Group {
	w.mu.Lock()
	defer w.mu.Unlock()
	var out []Group
	for _, g := range w.groups {
		if g == nil {
			continue
		}
		gr := g.Group
		if g.Anchor {
			gr.Blocks = w.res
		}
		out = append(out, gr)
	}
	return out
}

// layoutLocked returns the worker's groups as a checkpoint or snapshot
// keeps them (Blocks zero).
func (w *Worker) layoutLocked() []Group { return w.appendLayoutLocked(nil) }

// appendLayoutLocked appends the worker's groups to out, as layoutLocked.
func (w *Worker) appendLayoutLocked(out []Group) []Group {
	for _, g := range w.groups {
		if g != nil {
			gr := g.Group
			gr.Blocks = 0
			out = append(out, gr)
		}
	}
	return out
}

// adoptLayoutLocked makes gs (checked by checkLayout) the worker's
// groups: a group described as before keeps its blocks, one described
// anew or absent from gs is dropped with its side blocks, and a new one is
// added, the anchor first.
func (w *Worker) adoptLayoutLocked(gs []Group) {
	for _, g := range w.groups {
		if g == nil {
			continue
		}
		i := slices.IndexFunc(gs, func(b Group) bool { return b.Index == g.Index })
		if i >= 0 && sameGroup(&g.Group, &gs[i]) {
			g.Kind = gs[i].Kind
			continue
		}
		if g.side != nil {
			w.clearSideLocked(g.side)
		}
		w.dropGroupLocked(g)
	}
	for _, anchor := range []bool{true, false} {
		for _, b := range gs {
			if b.Anchor == anchor && w.groupOfLocked(b.Index) == nil {
				w.addGroupLocked(b.Index, b.Kind, b.Class, b.BlockSize, b.Window)
			}
		}
	}
}

// sameGroup reports whether two descriptions of a group keep its blocks.
func sameGroup(a, b *Group) bool {
	return a.Class == b.Class && a.Window == b.Window && a.BlockSize == b.BlockSize && a.Anchor == b.Anchor
}

// maxKindLen bounds a group's kind in checkpoints and snapshots.
const maxKindLen = 64

// checkLayout says why gs is not a layout a worker could have, "" if it
// is: indices ascending in [0, MaxGroups), classes agreeing with kinds and
// windows, and one anchor, of the prefix class, when there is a prefix
// group (the first one the worker saw, of any index).
func checkLayout(gs []Group) string {
	anchors, prefix := 0, 0
	for i, g := range gs {
		class := ClassOfGroup(g.Kind, g.Window)
		switch {
		case g.Index < 0 || g.Index >= MaxGroups:
			return fmt.Sprintf("group index %d outside [0, %d)", g.Index, MaxGroups)
		case i > 0 && g.Index <= gs[i-1].Index:
			return fmt.Sprintf("group %d after group %d", g.Index, gs[i-1].Index)
		case len(g.Kind) > maxKindLen:
			return fmt.Sprintf("group %d: a kind of %d bytes", g.Index, len(g.Kind))
		case g.Class != class:
			return fmt.Sprintf("group %d: class %s for kind %q and window %d", g.Index, g.Class, g.Kind, g.Window)
		case g.BlockSize < 0 || g.Window < 0:
			return fmt.Sprintf("group %d: block size %d, window %d", g.Index, g.BlockSize, g.Window)
		case g.Anchor && g.Class != ClassPrefix:
			return fmt.Sprintf("group %d: an anchor of class %s", g.Index, g.Class)
		}
		if g.Anchor {
			anchors++
		}
		if g.Class == ClassPrefix {
			prefix++
		}
	}
	if anchors > 1 || prefix > 0 && anchors == 0 {
		return fmt.Sprintf("%d anchors for %d prefix groups", anchors, prefix)
	}
	return ""
}

// appendLayout appends the encoding of a layout (see the checkpoint
// encoding).
func appendLayout(b []byte, gs []Group) []byte {
	b = binary.AppendUvarint(b, uint64(len(gs)))
	for _, g := range gs {
		b = binary.AppendUvarint(b, uint64(g.Index))
		b = binary.AppendUvarint(b, uint64(g.BlockSize))
		b = binary.AppendUvarint(b, uint64(g.Window))
		b = binary.AppendUvarint(b, uint64(len(g.Kind)))
		b = append(b, g.Kind...)
		var anchor byte
		if g.Anchor {
			anchor = 1
		}
		b = append(b, anchor)
	}
	return b
}

// layout decodes appendLayout's encoding; the class follows from the kind
// and window, and checkLayout checks the rest.
func (d *segDecoder) layout() []Group {
	n := int(d.uvarint(MaxGroups))
	var gs []Group
	for i := 0; i < n && d.err == nil; i++ {
		g := Group{Index: int(d.uvarint(MaxGroups)), BlockSize: int(d.uvarint(math.MaxInt32)), Window: int(d.uvarint(math.MaxInt32))}
		g.Kind = string(d.bytes(int(d.uvarint(maxKindLen))))
		switch a := d.byte(); {
		case a > 1:
			d.fail("group %d: anchor byte %d", g.Index, a)
		default:
			g.Anchor = a == 1
		}
		g.Class = ClassOfGroup(g.Kind, g.Window)
		gs = append(gs, g)
	}
	return gs
}

// describeSizes says which block sizes a model's workers announce.
func describeSizes(m *Model) string {
	sizes := m.LearnedBlockSizes()
	if len(sizes) == 0 {
		return "none announced yet"
	}
	parts := make([]string, len(sizes))
	for i, s := range sizes {
		parts[i] = fmt.Sprintf("%d workers at %d", s.Workers, s.BlockSize)
	}
	return "its workers: " + strings.Join(parts, ", ")
}
