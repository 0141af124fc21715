package scoring

import (
	"math/rand/v2"
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

// hybridStore makes w hold blocks [from, to) of tokens in KV-cache group g
// of kind (a sliding window of window tokens for window kinds), hashes
// 1000+i for block i as every group of one vLLM engine announces them.
func hybridStore(t *testing.T, w *indexer.Worker, tokens []uint32, from, to, g int, kind string, window int) {
	t.Helper()
	ev := events.Event{Kind: events.KindBlockStored, BlockSize: testBS, TokenIDs: tokens[from*testBS : to*testBS],
		GroupIdx: g, HasGroupIdx: true, SpecKind: kind, SlidingWindow: window, HasSlidingWindow: window > 0}
	for i := from; i < to; i++ {
		ev.BlockHashes = append(ev.BlockHashes, uint64(1000+i))
	}
	if from > 0 {
		ev.ParentHash, ev.HasParent = uint64(1000+from-1), true
	}
	if err := w.ApplyBatch(&events.Batch{Events: []events.Event{ev}}); err != nil {
		t.Fatal(err)
	}
}

// hybridRemove removes blocks [from, to) from group g.
func hybridRemove(t *testing.T, w *indexer.Worker, from, to, g int) {
	t.Helper()
	ev := events.Event{Kind: events.KindBlockRemoved, GroupIdx: g, HasGroupIdx: true}
	for i := from; i < to; i++ {
		ev.BlockHashes = append(ev.BlockHashes, uint64(1000+i))
	}
	if err := w.ApplyBatch(&events.Batch{Events: []events.Event{ev}}); err != nil {
		t.Fatal(err)
	}
}

// TestScoreCapsHybridHits: a gpt-oss-like worker (full attention and a
// sliding window of 3 blocks' tokens) whose window group lost blocks is
// credited with the hit vLLM's coordinator realizes, not its full-attention
// prefix; the answer says which group capped it and what the prefix was. A
// mamba group caps at the last block it holds the state of.
func TestScoreCapsHybridHits(t *testing.T) {
	f := newTestFleet(t, 3)
	r := rand.New(rand.NewPCG(3, 3))
	prompt := tokens(r, 10*testBS+5) // 10 full blocks; vLLM takes at most the first 10
	window := 2*testBS + 1           // cdiv(window-1, 16) = 2 blocks before the cut
	for i, w := range f.ws[:2] {
		hybridStore(t, w, prompt, 0, 10, 0, "full_attention", 0)
		hybridStore(t, w, prompt, 0, 10, 1, "sliding_window", window)
		_ = i
	}
	// w0 lost window blocks 7 and 8: the longest cut with both blocks
	// before it is 7 (blocks 5 and 6).
	hybridRemove(t, f.ws[0], 7, 9, 1)
	// w2: full attention and a mamba group holding the state at block 5.
	hybridStore(t, f.ws[2], prompt, 0, 10, 0, "full_attention", 0)
	hybridStore(t, f.ws[2], prompt, 4, 6, 2, "mamba", 0)
	hybridRemove(t, f.ws[2], 4, 5, 2)

	s := New(f.ix, Options{})
	var res Result
	if err := s.Score(&Request{Model: f.model, Tokens: prompt}, &res); err != nil {
		t.Fatal(err)
	}
	want := map[events.WorkerRef]struct{ blocks, prefix, by int }{
		f.ws[0].Info().Ref: {7, 10, 1},
		f.ws[1].Info().Ref: {10, 0, 0},
		f.ws[2].Info().Ref: {6, 10, 2},
	}
	if len(res.Ranked) != 3 {
		t.Fatalf("ranked %d workers, want 3", len(res.Ranked))
	}
	for i := range res.Ranked {
		c := &res.Ranked[i]
		w := want[c.Ref]
		if c.Match.Blocks != w.blocks || c.Match.Prefix != w.prefix || w.prefix > 0 && c.Match.CappedBy != w.by {
			t.Errorf("%s: blocks %d prefix %d capped by %d, want %d, %d, %d", c.Ref, c.Match.Blocks, c.Match.Prefix, c.Match.CappedBy, w.blocks, w.prefix, w.by)
		}
		if c.Match.ByMedium[events.MediumGPU] != w.blocks {
			t.Errorf("%s: GPU match %d, want %d", c.Ref, c.Match.ByMedium[events.MediumGPU], w.blocks)
		}
		g, ok := res.CapGroup(c)
		if ok != (w.prefix > 0) || ok && g.Index != w.by {
			t.Errorf("%s: cap group %+v %v", c.Ref, g, ok)
		}
	}
	if res.Ranked[0].Ref != f.ws[1].Info().Ref {
		t.Errorf("best %s, want the worker whose window is whole", res.Ranked[0].Ref)
	}

	// A prompt of exactly 10 blocks: vLLM computes its last token, so the
	// rule is applied at 9 blocks, where w1 holds the window (7 and 8):
	// nothing caps it, and it is credited as a full-attention worker is.
	exact := prompt[:10*testBS]
	only1 := []events.WorkerRef{f.ws[1].Info().Ref}
	if err := s.Score(&Request{Model: f.model, Tokens: exact, Candidates: only1}, &res); err != nil {
		t.Fatal(err)
	}
	if c := res.Ranked[0]; c.Match.Blocks != 10 || c.Match.Prefix != 0 {
		t.Errorf("exact prompt: %d blocks of prefix %d, want 10 uncapped", c.Match.Blocks, c.Match.Prefix)
	}
	// w1 loses window block 7: at the cut vLLM takes (9) its window is
	// broken, though at 10 it would not be; the longest is 7.
	hybridRemove(t, f.ws[1], 7, 8, 1)
	if err := s.Score(&Request{Model: f.model, Tokens: exact, Candidates: only1}, &res); err != nil {
		t.Fatal(err)
	}
	if c := res.Ranked[0]; c.Match.Blocks != 7 || c.Match.Prefix != 10 || c.Match.CappedBy != 1 {
		t.Errorf("exact prompt, window broken at 7: %d blocks of prefix %d capped by %d, want 7 of 10 by 1", c.Match.Blocks, c.Match.Prefix, c.Match.CappedBy)
	}

	// Keys given: the rule is applied at the whole prompt (10: blocks 8
	// and 9 held).
	keys := f.model.PromptKeys(exact, nil, nil)
	if err := s.Score(&Request{Model: f.model, Keys: keys, Candidates: only1}, &res); err != nil {
		t.Fatal(err)
	}
	if c := res.Ranked[0]; c.Match.Blocks != 10 || c.Match.Prefix != 0 {
		t.Errorf("keys: %d blocks, prefix %d, want 10 uncapped", c.Match.Blocks, c.Match.Prefix)
	}
}

// TestScoreUsesTheLearnedBlockSize: engines that announce 528-token blocks
// (a hybrid model's raised block size) are matched at 528 though the model
// was configured with 16.
func TestScoreUsesTheLearnedBlockSize(t *testing.T) {
	f := newTestFleet(t, 1)
	r := rand.New(rand.NewPCG(4, 4))
	const bs = 528
	prompt := tokens(r, 3*bs+7)
	ev := events.Event{Kind: events.KindBlockStored, BlockSize: bs, TokenIDs: prompt[:3*bs], BlockHashes: []uint64{1, 2, 3},
		GroupIdx: 0, HasGroupIdx: true, SpecKind: "full_attention"}
	if err := f.ws[0].ApplyBatch(&events.Batch{Events: []events.Event{ev}}); err != nil {
		t.Fatal(err)
	}
	if f.model.BlockSize() != bs {
		t.Fatalf("model block size %d, want %d learned", f.model.BlockSize(), bs)
	}
	s := New(f.ix, Options{})
	var res Result
	if err := s.Score(&Request{Model: f.model, Tokens: prompt}, &res); err != nil {
		t.Fatal(err)
	}
	if len(res.Ranked) != 1 || res.Ranked[0].Match.Blocks != 3 || res.Prompt.BlockSize != bs {
		t.Fatalf("ranked %+v (prompt %+v), want 3 blocks of %d", res.Ranked, res.Prompt, bs)
	}
}

// TestSpeculationDoesNotLiftACap: a prompt routed to a hybrid worker counts
// as speculatively cached there, but only past what its prefix group
// holds: blocks it holds were announced with every group's, so once the
// window group lost some (vLLM frees a window's first blocks first, and
// evicts them first), the same prompt scored again is credited with the
// capped hit, not the routed one. Past the prefix group's blocks,
// speculation still extends the match.
func TestSpeculationDoesNotLiftACap(t *testing.T) {
	f := newTestFleet(t, 1)
	w := f.ws[0]
	r := rand.New(rand.NewPCG(5, 5))
	prompt := tokens(r, 8*testBS+3)
	window := 2*testBS + 1
	hybridStore(t, w, prompt, 0, 6, 0, "full_attention", 0)
	hybridStore(t, w, prompt, 0, 6, 1, "sliding_window", window)
	hybridRemove(t, w, 0, 6, 1) // evicted from the window group: no hit at all

	s := New(f.ix, Options{})
	var res Result
	score := func() Candidate {
		t.Helper()
		if err := s.Score(&Request{Model: f.model, Tokens: prompt[:6*testBS+3]}, &res); err != nil {
			t.Fatal(err)
		}
		if len(res.Ranked) != 1 {
			t.Fatalf("ranked %d workers", len(res.Ranked))
		}
		return res.Ranked[0]
	}
	if c := score(); c.Match.Blocks != 0 || c.Match.Prefix != 6 {
		t.Fatalf("before the route: %d blocks of prefix %d, want 0 of 6", c.Match.Blocks, c.Match.Prefix)
	}
	if _, err := s.Route("r1", "", &Request{Model: f.model, Tokens: prompt[:6*testBS+3]}, nil, &res); err != nil {
		t.Fatal(err)
	}
	if c := score(); c.Match.Blocks != 0 || c.Speculative != 0 || c.Match.Prefix != 6 || c.Match.CappedBy != 1 {
		t.Errorf("routed prompt scored again: %d blocks (%d speculative) of prefix %d capped by %d, want 0 (0) of 6 by group 1",
			c.Match.Blocks, c.Speculative, c.Match.Prefix, c.Match.CappedBy)
	}
	// A longer prompt routed: its blocks past the six held are expected.
	if _, err := s.Route("r2", "", &Request{Model: f.model, Tokens: prompt}, nil, &res); err != nil {
		t.Fatal(err)
	}
	if err := s.Score(&Request{Model: f.model, Tokens: prompt}, &res); err != nil {
		t.Fatal(err)
	}
	if c := res.Ranked[0]; c.Match.Blocks != 8 || c.Speculative != 8 || c.Match.Prefix != 0 {
		t.Errorf("longer prompt routed: %d blocks (%d speculative), prefix %d, want 8 (8) uncapped", c.Match.Blocks, c.Speculative, c.Match.Prefix)
	}
}

// TestNoGroupCapsMatchesThePrefixGroup: with Options.NoGroupCaps a
// hybrid worker whose window group lost blocks is credited with its
// prefix group's whole match, as before kvindex modelled the coordinator.
func TestNoGroupCapsMatchesThePrefixGroup(t *testing.T) {
	f := newTestFleet(t, 1)
	w := f.ws[0]
	r := rand.New(rand.NewPCG(6, 6))
	prompt := tokens(r, 8*testBS+1)
	hybridStore(t, w, prompt, 0, 8, 0, "full_attention", 0)
	hybridStore(t, w, prompt, 0, 8, 1, "sliding_window", 2*testBS+1)
	hybridRemove(t, w, 0, 8, 1)
	var res Result
	for _, c := range []struct {
		off          bool
		blocks, pref int
	}{{false, 0, 8}, {true, 8, 0}} {
		s := New(f.ix, Options{NoGroupCaps: c.off})
		if err := s.Score(&Request{Model: f.model, Tokens: prompt}, &res); err != nil {
			t.Fatal(err)
		}
		if m := res.Ranked[0].Match; m.Blocks != c.blocks || m.Prefix != c.pref || m.ByMedium[events.MediumGPU] != c.blocks {
			t.Errorf("NoGroupCaps %v: %d blocks (GPU %d), prefix %d, want %d and %d", c.off, m.Blocks, m.ByMedium[events.MediumGPU], m.Prefix, c.blocks, c.pref)
		}
	}
}
