package indexer

import (
	"errors"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// inGroup returns ev as KV-cache group g of kind (a sliding window of
// window tokens when window > 0) announces it.
func inGroup(ev events.Event, g int, kind string, window int) events.Event {
	ev.GroupIdx, ev.HasGroupIdx, ev.SpecKind = g, true, kind
	ev.SlidingWindow, ev.HasSlidingWindow = window, window > 0
	return ev
}

// capOf is w's Cap for a prompt of tokens whose prefix group holds
// prefix blocks of 4 tokens, taken whole.
func capOf(w *Worker, tokens []uint32, prefix int) (blocks, capper int) {
	t, by := w.Cap(prefix*4, len(tokens), func(bs int) []Key { return PromptKeys(testModel, bs, tokens, nil, nil) })
	return t / 4, by
}

// TestSideStoreSkipsNullBlocks: vLLM leaves the null blocks of a mamba
// group (every state of a chunk but its last, in "align" mode) and of a
// window group (behind the window) out of block_hashes but not out of
// token_ids. The hashes are the event's last blocks, keyed through the
// skipped ones; a prefix group's store must still cover its hashes exactly.
func TestSideStoreSkipsNullBlocks(t *testing.T) {
	_, ws := newTestIndex(t, "mamba", "window")
	prompt := seqTokens(0, 16)
	// Full attention holds blocks 0-3 (hashes 1-4) on both workers.
	for _, w := range ws {
		if err := apply(t, w, inGroup(stored(0, false, []uint64{1, 2, 3, 4}, prompt), 0, "full_attention", 0)); err != nil {
			t.Fatal(err)
		}
	}
	// A mamba chunk of blocks 0-1 caches its state at block 1 (hash 2),
	// then a decode step block 3 (hash 4) after block 2's null state.
	m := ws[0]
	if err := apply(t, m, inGroup(stored(0, false, []uint64{2}, prompt[:8]), 1, "mamba", 0),
		inGroup(stored(2, true, []uint64{4}, prompt[8:16]), 1, "mamba", 0)); err != nil {
		t.Fatal(err)
	}
	if s := m.Stats(); s.InvalidEvents != 0 || s.SideBlocks != 2 || s.Orphans != 0 {
		t.Fatalf("mamba stats %+v, want 2 side blocks and nothing invalid", s)
	}
	// The state at block 3 serves a 4-block hit; without it, block 1's
	// serves 2 (block 2 has none).
	if b, by := capOf(m, prompt, 4); b != 4 || by != -1 {
		t.Fatalf("mamba cap at 4 blocks: %d (by %d), want 4 uncapped", b, by)
	}
	rm := removed(events.MediumGPU, 4)
	rm.GroupIdx, rm.HasGroupIdx = 1, true
	if err := apply(t, m, rm); err != nil {
		t.Fatal(err)
	}
	if b, by := capOf(m, prompt, 4); b != 2 || by != 1 {
		t.Fatalf("mamba cap without block 3's state: %d (by %d), want 2 by group 1", b, by)
	}

	// A window of 5 tokens needs the block before the cut; the store
	// names blocks 2-3 after 2 skipped ones.
	w := ws[1]
	if err := apply(t, w, inGroup(stored(0, false, []uint64{3, 4}, prompt), 1, "sliding_window", 5)); err != nil {
		t.Fatal(err)
	}
	if b, by := capOf(w, prompt, 4); b != 4 || by != -1 || w.Stats().SideBlocks != 2 {
		t.Fatalf("window cap at 4 blocks: %d (by %d, %d side blocks), want 4 uncapped of 2", b, by, w.Stats().SideBlocks)
	}
	if b, by := capOf(w, prompt, 2); b != 0 || by != 1 {
		t.Fatalf("window cap at 2 blocks: %d (by %d), want 0 by group 1 (block 1 skipped)", b, by)
	}

	// Tokens that are not whole blocks, or fewer than the hashes, or more
	// in a prefix group, are refused and counted.
	for i, ev := range []events.Event{
		inGroup(stored(0, false, []uint64{9}, prompt[:6]), 1, "sliding_window", 5),
		inGroup(stored(0, false, []uint64{9, 10}, prompt[:4]), 1, "sliding_window", 5),
		inGroup(stored(0, false, []uint64{9}, prompt[:8]), 0, "full_attention", 0),
	} {
		before := w.Stats().InvalidEvents
		if err := apply(t, w, ev); !errors.Is(err, ErrTokenCount) || w.Stats().InvalidEvents != before+1 {
			t.Fatalf("event %d: %v, invalid %d, want ErrTokenCount counted", i, err, w.Stats().InvalidEvents)
		}
	}
}

// TestOffloadPlaceholderKeepsGroups: vLLM's offloading connector names an
// offloaded chunk with no tokens, block size or kind; it keeps the group's
// kind, and a window group stays one (not refused as a layout change).
func TestOffloadPlaceholderKeepsGroups(t *testing.T) {
	_, ws := newTestIndex(t, "a")
	w := ws[0]
	toks := seqTokens(0, 8)
	if err := apply(t, w, inGroup(stored(0, false, []uint64{1, 2}, toks), 0, "sliding_window", 8),
		inGroup(stored(0, false, []uint64{1, 2}, toks), 1, "full_attention", 0)); err != nil {
		t.Fatal(err)
	}
	for g := range 2 {
		ev := events.Event{Kind: events.KindBlockStored, BlockHashes: []uint64{2}, Medium: events.MediumCPU, GroupIdx: g, HasGroupIdx: true}
		if err := apply(t, w, ev); err != nil {
			t.Fatalf("group %d placeholder: %v", g, err)
		}
	}
	gs := w.Groups()
	if len(gs) != 2 || gs[0].Kind != "sliding_window" || gs[0].Class != ClassWindow || gs[0].Window != 8 || gs[0].Blocks != 2 ||
		gs[1].Kind != "full_attention" || !gs[1].Anchor || gs[1].Blocks != 2 {
		t.Fatalf("groups after placeholders: %+v", gs)
	}
	if s := w.Stats(); s.LayoutChanges != 0 || s.ResidentByMedium[events.MediumCPU] != 1 {
		t.Fatalf("stats %+v, want no layout change and 1 CPU block", s)
	}
	// The window group's block 1 has a CPU store: a GPU removal keeps it.
	rm := removed(events.MediumGPU, 2)
	rm.GroupIdx, rm.HasGroupIdx = 0, true
	if err := apply(t, w, rm); err != nil || w.Stats().SideBlocks != 2 {
		t.Fatalf("window GPU removal of an offloaded block: %v, %d side blocks, want 2", err, w.Stats().SideBlocks)
	}
}

// TestSideGroupStoresSkipPositions: a side group's BlockStored names only
// the positions it keeps while its token_ids cover every position of the
// range (vLLM's null blocks, as a mamba group in align mode and a sliding
// window send them): every block is applied, keyed at its position (the
// last ones of the range), and Cap follows the states where they are. The
// prefix group skips no position: such a store of it is refused.
func TestSideGroupStoresSkipPositions(t *testing.T) {
	_, ws := newTestIndex(t, "a")
	w := ws[0]
	prompt := seqTokens(0, 16) // 4 blocks of 4, engine hashes 1..4
	// Two chunks of two blocks: the mamba group keeps the state at each
	// chunk's last block (hashes 2 and 4), full attention every block.
	if err := apply(t, w,
		inGroup(stored(0, false, []uint64{2}, prompt[:8]), 0, "mamba", 0),
		inGroup(stored(0, false, []uint64{1, 2}, prompt[:8]), 1, "full_attention", 0)); err != nil {
		t.Fatal(err)
	}
	if err := apply(t, w,
		inGroup(stored(2, true, []uint64{4}, prompt[8:]), 0, "mamba", 0),
		inGroup(stored(2, true, []uint64{3, 4}, prompt[8:]), 1, "full_attention", 0)); err != nil {
		t.Fatal(err)
	}
	s := w.Stats()
	if s.InvalidEvents != 0 || s.Orphans != 0 || s.ResidentBlocks != 4 {
		t.Fatalf("stats %+v, want 4 resident blocks and nothing refused", s)
	}
	if gs := w.Groups(); len(gs) != 2 || gs[0].Blocks != 2 || gs[1].Blocks != 4 || !gs[1].Anchor {
		t.Fatalf("groups %+v, want mamba holding 2 and the full-attention anchor 4", gs)
	}
	keys := PromptKeys(testModel, 4, prompt, nil, nil)
	at := func(int) []Key { return keys }
	for _, c := range []struct{ limit, want, by int }{
		{16, 16, -1}, // the state at block 3 is held
		{12, 8, 0},   // at 3 blocks the last state held is block 1's
		{4, 0, 0},    // block 0's state was never kept
	} {
		if got, by := w.Cap(16, c.limit, at); got != c.want || by != c.by {
			t.Errorf("Cap(16, at most %d) = %d tokens by group %d, want %d by %d", c.limit, got, by, c.want, c.by)
		}
	}

	// A window of one block whose store skips its first position, with
	// extra keys one a hash: hashes 2, 3 and 4 are positions 1 to 3.
	win := inGroup(stored(0, false, []uint64{2, 3, 4}, prompt), 2, "sliding_window", 5)
	win.ExtraKeys = []events.ExtraKeys{nil, nil, nil}
	if err := apply(t, w, win); err != nil {
		t.Fatal(err)
	}
	if got, by := w.Cap(16, 12, at); got != 8 || by != 0 {
		t.Errorf("with the window: Cap(16, at most 12) = %d by group %d, want 8 by the mamba group", got, by)
	}
	// The window loses block 3: cut at 3 blocks, where the mamba group
	// holds block 1's state only.
	rm := removed(events.MediumGPU, 4)
	rm.GroupIdx, rm.HasGroupIdx = 2, true
	if err := apply(t, w, rm); err != nil {
		t.Fatalf("removing a window block stored past a skipped position: %v", err)
	}
	if got, by := w.Cap(16, 16, at); got != 8 || by != 0 {
		t.Errorf("window without block 3: Cap(16, 16) = %d by %d, want 8 by the mamba group", got, by)
	}

	// The prefix group, or tokens not in whole blocks, or fewer tokens
	// than hashes: refused and counted.
	for _, ev := range []events.Event{
		inGroup(stored(4, true, []uint64{6}, seqTokens(16, 8)), 1, "full_attention", 0),
		inGroup(stored(4, true, []uint64{6}, seqTokens(16, 6)), 0, "mamba", 0),
		inGroup(stored(4, true, []uint64{5, 6}, seqTokens(16, 4)), 0, "mamba", 0),
	} {
		if err := apply(t, w, ev); !errors.Is(err, ErrTokenCount) {
			t.Errorf("%d token_ids for %d hashes in group %d: %v, want ErrTokenCount", len(ev.TokenIDs), len(ev.BlockHashes), ev.GroupIdx, err)
		}
	}
	if s := w.Stats(); s.InvalidEvents != 3 || s.ResidentBlocks != 4 {
		t.Errorf("after refusals: %d invalid events, %d resident, want 3 and 4", s.InvalidEvents, s.ResidentBlocks)
	}
}

// TestPoolBlocksCountEveryGroup: vLLM allocates every group's blocks from
// one pool, so the pool a hybrid worker fills is its resident blocks and
// its side groups' together.
func TestPoolBlocksCountEveryGroup(t *testing.T) {
	_, ws := newTestIndex(t, "a")
	w := ws[0]
	toks := seqTokens(0, 12)
	if err := apply(t, w, inGroup(stored(0, false, []uint64{1, 2, 3}, toks), 0, "full_attention", 0),
		inGroup(stored(0, false, []uint64{2, 3}, toks), 1, "sliding_window", 5)); err != nil {
		t.Fatal(err)
	}
	if r, p := w.ResidentBlocks(), w.PoolBlocks(); r != 3 || p != 5 {
		t.Fatalf("resident %d, pool %d, want 3 and 5", r, p)
	}
	rm := removed(events.MediumGPU, 3)
	rm.GroupIdx, rm.HasGroupIdx = 1, true
	if err := apply(t, w, rm); err != nil || w.ResidentBlocks() != 3 || w.PoolBlocks() != 4 {
		t.Fatalf("after a window removal: %v, resident %d, pool %d, want 3 and 4", err, w.ResidentBlocks(), w.PoolBlocks())
	}
}
