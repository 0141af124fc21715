package indexer

import (
	"errors"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// inGroup returns ev as group g of kind announces it.
func inGroup(ev events.Event, g int, kind string, window int) events.Event {
	ev.GroupIdx, ev.HasGroupIdx, ev.SpecKind = g, true, kind
	ev.SlidingWindow, ev.HasSlidingWindow = window, window > 0
	return ev
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
