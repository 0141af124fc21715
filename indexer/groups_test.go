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
