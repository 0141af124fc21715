package engine

import (
	"fmt"
	"strings"
	"testing"
	"time"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/testbed/sim/workload"
)

// hybrid returns an engine of 4-token blocks with layout groups and KV
// events on.
func hybrid(t *testing.T, blocks int, groups ...Group) *Engine {
	t.Helper()
	e, err := New(0, Config{BlockSize: 4, CacheBlocks: blocks, MaxBatchedTokens: 64, Events: true, HashSeed: 7, Layout: Layout{Groups: groups}})
	if err != nil {
		t.Fatal(err)
	}
	return e
}

// hashesOf returns r's block hashes on e, naming the new ones prefix0,
// prefix1... by position.
func hashesOf(e *Engine, r *workload.Request, names map[uint64]string, prefix string) []uint64 {
	hs := e.BlockHashes(nil, r.AppendBlockContent(nil, e.cfg.BlockSize, r.OutputSegment(e.cfg.OutputSeed)))
	for i, h := range hs {
		if _, ok := names[h]; !ok {
			names[h] = fmt.Sprintf("%s%d", prefix, i)
		}
	}
	return hs
}

// groupStep runs one step and renders its events: "S<g>[a0 a1]<p" stored
// in group g with parent p ("-": none), "R<g>[a0]" removed, checking
// each event's group fields against e's layout.
func groupStep(t *testing.T, e *Engine, now time.Duration, names map[uint64]string) (*StepResult, string) {
	t.Helper()
	d, ok := e.StartStep(now)
	if !ok {
		t.Fatal("nothing to schedule")
	}
	res := e.FinishStep(now + d)
	if res.Batch == nil {
		return res, ""
	}
	name := func(h uint64) string {
		if n, ok := names[h]; ok {
			return n
		}
		return fmt.Sprintf("?%x", h)
	}
	var parts []string
	for _, ev := range res.Batch.Events {
		var hs []string
		for _, h := range ev.BlockHashes {
			hs = append(hs, name(h))
		}
		if !ev.HasGroupIdx || ev.GroupIdx >= len(e.groups) || ev.MediumName != "GPU" {
			t.Fatalf("event %+v: group %d (has %v) of %d", ev, ev.GroupIdx, ev.HasGroupIdx, len(e.groups))
		}
		g := e.groups[ev.GroupIdx]
		switch ev.Kind {
		case events.KindBlockStored:
			window := g.Kind == KindSlidingWindow
			if ev.SpecKind != g.Kind || ev.HasSlidingWindow != window || (window && ev.SlidingWindow != g.SlidingWindow) ||
				ev.BlockSize != 4 || len(ev.TokenIDs)%4 != 0 || len(ev.TokenIDs) < 4*len(ev.BlockHashes) {
				t.Fatalf("BlockStored %+v in group %+v", ev, g)
			}
			p := "-"
			if ev.HasParent {
				p = name(ev.ParentHash)
			}
			parts = append(parts, fmt.Sprintf("S%d[%s]<%s", ev.GroupIdx, strings.Join(hs, " "), p))
		case events.KindBlockRemoved:
			parts = append(parts, fmt.Sprintf("R%d[%s]", ev.GroupIdx, strings.Join(hs, " ")))
		default:
			parts = append(parts, ev.Kind.String())
		}
	}
	return res, strings.Join(parts, " ")
}

// expectSteps runs a step per want, checking its rendered events.
func expectSteps(t *testing.T, e *Engine, names map[uint64]string, now *time.Duration, want ...string) *StepResult {
	t.Helper()
	var res *StepResult
	for i, w := range want {
		var got string
		res, got = groupStep(t, e, *now, names)
		if got != w {
			t.Fatalf("step %d: events %q, want %q", i+1, got, w)
		}
		*now += time.Second
	}
	return res
}

// TestSlidingWindowLayoutMatchesVLLM runs gpt-oss's layout (a window
// group 0, full attention group 1) at a window of 8 tokens: a hit needs
// cdiv(7, 4) = 2 window blocks before the cut.
func TestSlidingWindowLayoutMatchesVLLM(t *testing.T) {
	e := hybrid(t, 12, Group{Kind: KindSlidingWindow, SlidingWindow: 8}, Group{Kind: KindFullAttention})
	names := map[uint64]string{}
	now := time.Duration(0)
	// A: 16 prompt tokens, 5 output tokens: blocks a0..a3, a4 (output).
	a := req(1, 5, workload.Segment{ID: 100, Len: 16})
	hashesOf(e, a, names, "a")
	submit(t, e, a)
	// Step 1 prefills A: both groups take 4 blocks (window 0-3, full 4-7)
	// and announce the same hashes. Step 2 (computed 16: tokens before
	// 16-8+1 = 9 are behind the window) frees window positions 1 then 0,
	// and takes blocks 8 (window) and 9 (full) for position 4. Step 5
	// (computed 19, skipping 12) frees window position 2; position 4
	// fills and A finishes, freeing window positions 4, 3, then full 4..0:
	// the free queue is 10 11 | 1 0 2 | 8 3 | 9 7 6 5 4.
	expectSteps(t, e, names, &now, "S0[a0 a1 a2 a3]<- S1[a0 a1 a2 a3]<-", "", "", "", "S0[a4]<a3 S1[a4]<a3")
	if e.p.numFree != 12 || e.CachedBlocks() != 10 || e.CachedBlocksIn(0) != 5 || e.CachedBlocksIn(1) != 5 {
		t.Fatalf("%d free, %d cached (%d + %d)", e.p.numFree, e.CachedBlocks(), e.CachedBlocksIn(0), e.CachedBlocksIn(1))
	}
	// C shares A's 16 prompt tokens. Freed window blocks stay cached
	// until evicted: all 4 hit.
	c := req(3, 1, workload.Segment{ID: 100, Len: 16}, workload.Segment{ID: 300, Len: 4})
	ch := hashesOf(e, c, names, "c")
	if got := e.CachedTokens(ch, c.PromptLen); got != 16 {
		t.Fatalf("C would hit %d tokens, want 16", got)
	}
	// B (12 new tokens) takes 3 + 3 blocks from the queue's head: the
	// window blocks freed early go first.
	b := req(2, 1, workload.Segment{ID: 200, Len: 12})
	hashesOf(e, b, names, "b")
	submit(t, e, b)
	expectSteps(t, e, names, &now, "R0[a1] R0[a0] R0[a2] R0[a4] S0[b0 b1 b2]<- S1[b0 b1 b2]<-")
	// Full attention still holds a0..a3, the window only a3: no run of 2
	// before the cut at 4 and none from block 0, so C hits nothing.
	for i := range 4 {
		if e.p.lookup(blockKey(ch[i], 1)) == none {
			t.Fatalf("full attention lost a%d", i)
		}
	}
	if got := e.CachedTokens(ch, c.PromptLen); got != 0 {
		t.Fatalf("C would hit %d tokens, want 0 (the window rule)", got)
	}
	submit(t, e, c)
	res := expectSteps(t, e, names, &now, "R0[a3] R1[a4] R1[a3] R1[a2] R1[a1] R1[a0] R0[b2] R0[b1] R0[b0] R1[b2] "+
		"S0[a0 a1 a2 a3 c4]<- S1[a0 a1 a2 a3 c4]<-")
	if len(res.FirstTokens) != 1 || res.FirstTokens[0].CachedTokens != 0 {
		t.Fatalf("C's first token %+v, want a hit of 0", res.FirstTokens)
	}
}

// TestMambaLayoutMatchesVLLM runs qwen3-next's layout shape (mamba group
// 0, full attention group 1) in align mode.
func TestMambaLayoutMatchesVLLM(t *testing.T) {
	e := hybrid(t, 16, Group{Kind: KindMamba}, Group{Kind: KindFullAttention})
	names := map[uint64]string{}
	now := time.Duration(0)
	// A: 10 prompt tokens, 3 output: blocks a0, a1, a2 (2 output tokens).
	a := req(1, 3, workload.Segment{ID: 100, Len: 10})
	ah := hashesOf(e, a, names, "a")
	submit(t, e, a)
	// Step 1 prefills 8 tokens (the chunk ends at the last block boundary
	// of the prompt): mamba keeps one state block, at position 1, and
	// announces it alone over all 8 tokens; full attention both. Step 2
	// prefills the 2-token tail (no block fills). Step 3 (computed 10)
	// frees the position-1 state. Step 4 fills position 2 in both groups.
	res := expectSteps(t, e, names, &now, "S0[a1]<- S1[a0 a1]<-")
	if len(res.FirstTokens) != 0 {
		t.Fatal("a first token after 8 of 10 prompt tokens")
	}
	if n := len(res.Batch.Events[0].TokenIDs); n != 8 {
		t.Fatalf("mamba's BlockStored has %d token_ids, want the 8 of positions 0-1", n)
	}
	res = expectSteps(t, e, names, &now, "")
	if len(res.FirstTokens) != 1 || res.FirstTokens[0].CachedTokens != 0 {
		t.Fatalf("step 2 first tokens %+v", res.FirstTokens)
	}
	res = expectSteps(t, e, names, &now, "", "S0[a2]<a1 S1[a2]<a1")
	if len(res.Finished) != 1 || e.p.numFree != 16 {
		t.Fatalf("finished %d, %d free", len(res.Finished), e.p.numFree)
	}
	// B repeats A's prompt: full attention holds a0 a1, mamba the state
	// at a1: a hit of (10-1)/4 = 2 blocks, and nothing announced.
	b := req(2, 1, workload.Segment{ID: 100, Len: 10})
	submit(t, e, b)
	res = expectSteps(t, e, names, &now, "")
	if res.FirstTokens[0].CachedTokens != 8 {
		t.Fatalf("B hit %d tokens, want 8", res.FirstTokens[0].CachedTokens)
	}
	// E (44 new tokens) takes 1 + 11 blocks; the 10th and 11th of full
	// attention evict a2 in both groups (the queue: 7..15, 3 (a2/mamba),
	// 4 (a2/full), 5, 0 (a1/mamba), 6, 2, 1).
	en := req(3, 1, workload.Segment{ID: 500, Len: 44})
	hashesOf(e, en, names, "e")
	submit(t, e, en)
	expectSteps(t, e, names, &now, "R0[a2] R1[a2] S0[e10]<- S1[e0 e1 e2 e3 e4 e5 e6 e7 e8 e9 e10]<-")
	// F's mamba block evicts the state at a1; full attention keeps a0 a1.
	f := req(4, 1, workload.Segment{ID: 600, Len: 4})
	hashesOf(e, f, names, "f")
	submit(t, e, f)
	expectSteps(t, e, names, &now, "R0[a1] S0[f0]<- S1[f0]<-")
	if e.p.lookup(blockKey(ah[0], 1)) == none || e.p.lookup(blockKey(ah[1], 1)) == none {
		t.Fatal("full attention lost a0 or a1")
	}
	// With no state at a1 nor a0, A's prompt hits nothing.
	if got := e.CachedTokens(ah, a.PromptLen); got != 0 {
		t.Fatalf("A's prompt would hit %d tokens, want 0 (the mamba rule)", got)
	}
}

// TestMambaChunksAlignToBlocks checks the aligned split of a 30-token
// prompt under a 10-token budget: whole blocks (8) up to 24, then 4 to
// the last block boundary (28) though 6 would fit, then the 2-token tail.
func TestMambaChunksAlignToBlocks(t *testing.T) {
	e, err := New(0, Config{BlockSize: 4, CacheBlocks: 64, MaxBatchedTokens: 10, Layout: Layout{Groups: []Group{{Kind: KindMamba}, {Kind: KindFullAttention}}}})
	if err != nil {
		t.Fatal(err)
	}
	r := req(1, 1, workload.Segment{ID: 1, Len: 30})
	submit(t, e, r)
	var chunks []int
	now := time.Duration(0)
	for !e.Idle() {
		d, ok := e.StartStep(now)
		if !ok {
			t.Fatal("stalled")
		}
		chunks = append(chunks, e.running[0].chunk)
		now += d
		e.FinishStep(now)
	}
	if fmt.Sprint(chunks) != "[8 8 8 4 2]" {
		t.Fatalf("chunks %v, want [8 8 8 4 2]", chunks)
	}
}

// TestLegacyLayoutAnnouncesNoGroups checks that the zero Layout's events
// carry no group fields and an explicit one-group layout's do.
func TestLegacyLayoutAnnouncesNoGroups(t *testing.T) {
	for _, l := range []Layout{{}, {Groups: []Group{{Kind: KindFullAttention}}}} {
		e, err := New(0, Config{BlockSize: 4, CacheBlocks: 3, Events: true, Layout: l})
		if err != nil {
			t.Fatal(err)
		}
		submit(t, e, req(1, 1, workload.Segment{ID: 1, Len: 8}))
		d, _ := e.StartStep(0)
		e.FinishStep(d)
		submit(t, e, req(2, 1, workload.Segment{ID: 2, Len: 8}))
		d, _ = e.StartStep(time.Second)
		res := e.FinishStep(time.Second + d)
		announced := len(l.Groups) > 0
		for _, ev := range res.Batch.Events {
			if ev.HasGroupIdx != announced || (ev.SpecKind != "") != (announced && ev.Kind == events.KindBlockStored) || ev.HasSlidingWindow {
				t.Errorf("layout %v: %+v", l, ev)
			}
		}
		if len(res.Batch.Events) != 2 { // an eviction, a store
			t.Errorf("layout %v: %d events", l, len(res.Batch.Events))
		}
	}
}
