package indexer

import (
	"errors"
	"reflect"
	"slices"
	"strings"
	"testing"

	"github.com/kvindex/kvindex/events"
)

const testModel = "m"

func seqTokens(start, n int) []uint32 {
	t := make([]uint32, n)
	for i := range t {
		t[i] = uint32(start + i)
	}
	return t
}

func stored(parent uint64, hasParent bool, hashes []uint64, tokens []uint32) events.Event {
	return events.Event{Kind: events.KindBlockStored, BlockHashes: hashes, ParentHash: parent, HasParent: hasParent, TokenIDs: tokens, BlockSize: 4}
}

func removed(m events.Medium, hashes ...uint64) events.Event {
	return events.Event{Kind: events.KindBlockRemoved, BlockHashes: hashes, Medium: m}
}

func newTestIndex(t *testing.T, workers ...string) (*Index, []*Worker) {
	t.Helper()
	ix := New(Config{Shards: 4})
	if _, err := ix.AddModel(testModel, 4); err != nil {
		t.Fatal(err)
	}
	var ws []*Worker
	for _, p := range workers {
		w, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: p}, Model: testModel})
		if err != nil {
			t.Fatal(err)
		}
		ws = append(ws, w)
	}
	return ix, ws
}

func apply(t *testing.T, w *Worker, evs ...events.Event) error {
	t.Helper()
	return w.ApplyBatch(&events.Batch{Events: evs})
}

// matchOf returns worker w's match for the prompt, or a zero Match.
func matchOf(ix *Index, tokens []uint32, extras *PromptExtras, w *Worker) Match {
	keys := PromptKeys(testModel, 4, tokens, extras, nil)
	for _, m := range ix.Match(keys, nil, nil) {
		if m.Worker == w.ID() {
			return m
		}
	}
	return Match{Worker: w.ID()}
}

func TestStoreChainsAcrossEvents(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	// Blocks 0-1 in one event, block 2 in a later one naming its parent.
	if err := apply(t, w, stored(0, false, []uint64{11, 12}, seqTokens(0, 8))); err != nil {
		t.Fatal(err)
	}
	if err := apply(t, w, stored(12, true, []uint64{13}, seqTokens(8, 4))); err != nil {
		t.Fatal(err)
	}
	prompt := seqTokens(0, 14) // 3 full blocks + 2 tokens
	m := matchOf(ix, prompt, nil, w)
	if m.Blocks != 3 || m.ByMedium[events.MediumGPU] != 3 || m.ByMedium[events.MediumCPU] != 0 {
		t.Fatalf("match = %+v, want 3 GPU blocks", m)
	}
	// A prompt that diverges in block 1 matches one block.
	other := seqTokens(0, 12)
	other[5] = 999
	if m := matchOf(ix, other, nil, w); m.Blocks != 1 {
		t.Fatalf("diverging prompt matched %d blocks, want 1", m.Blocks)
	}
	if s := w.Stats(); s.ResidentBlocks != 3 || s.BlocksStored != 3 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestRemoveMiddleShortensPrefix(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	apply(t, w, stored(0, false, []uint64{1, 2, 3, 4}, seqTokens(0, 16)))
	if err := apply(t, w, removed(events.MediumGPU, 2)); err != nil {
		t.Fatal(err)
	}
	if m := matchOf(ix, seqTokens(0, 16), nil, w); m.Blocks != 1 {
		t.Fatalf("after removing block 1, matched %d, want 1", m.Blocks)
	}
	if s := w.Stats(); s.ResidentBlocks != 3 || s.BlocksRemoved != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestStoredTwiceNeedsTwoRemovals(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	ev := stored(0, false, []uint64{1}, seqTokens(0, 4))
	apply(t, w, ev)
	apply(t, w, ev)
	apply(t, w, removed(events.MediumGPU, 1))
	if m := matchOf(ix, seqTokens(0, 4), nil, w); m.Blocks != 1 {
		t.Fatalf("after one of two removals matched %d, want 1", m.Blocks)
	}
	apply(t, w, removed(events.MediumGPU, 1))
	if m := matchOf(ix, seqTokens(0, 4), nil, w); m.Blocks != 0 {
		t.Fatalf("after both removals matched %d, want 0", m.Blocks)
	}
	err := apply(t, w, removed(events.MediumGPU, 1))
	if !errors.Is(err, ErrUnknownBlock) {
		t.Fatalf("third removal: err = %v, want ErrUnknownBlock", err)
	}
	if s := w.Stats(); s.ResidentBlocks != 0 || s.UnknownBlocks != 1 {
		t.Fatalf("stats = %+v", s)
	}
}

func TestClearAndReset(t *testing.T) {
	ix, ws := newTestIndex(t, "a", "b")
	for _, w := range ws {
		apply(t, w, stored(0, false, []uint64{1, 2}, seqTokens(0, 8)))
	}
	apply(t, ws[0], events.Event{Kind: events.KindAllBlocksCleared})
	ws[1].Reset("test restart")
	for _, w := range ws {
		if m := matchOf(ix, seqTokens(0, 8), nil, w); m.Blocks != 0 {
			t.Fatalf("worker %d still matches %d blocks", w.ID(), m.Blocks)
		}
		if s := w.Stats(); s.ResidentBlocks != 0 {
			t.Fatalf("worker %d resident = %d", w.ID(), s.ResidentBlocks)
		}
	}
	if s := ws[0].Stats(); s.Clears != 1 {
		t.Fatalf("clears = %d", s.Clears)
	}
	if s := ws[1].Stats(); s.Resets != 1 || s.LastReset != "test restart" {
		t.Fatalf("resets = %d %q", s.Resets, s.LastReset)
	}
	// A cleared worker learns again from scratch.
	apply(t, ws[0], stored(0, false, []uint64{1}, seqTokens(0, 4)))
	if m := matchOf(ix, seqTokens(0, 8), nil, ws[0]); m.Blocks != 1 {
		t.Fatalf("after re-store matched %d", m.Blocks)
	}
}

func TestTwoWorkersDifferentPrefixes(t *testing.T) {
	ix, ws := newTestIndex(t, "a", "b", "c")
	apply(t, ws[0], stored(0, false, []uint64{1, 2, 3}, seqTokens(0, 12)))
	apply(t, ws[1], stored(0, false, []uint64{7}, seqTokens(0, 4)))
	keys := PromptKeys(testModel, 4, seqTokens(0, 16), nil, nil)
	got := ix.Match(keys, nil, nil)
	if len(got) != 2 {
		t.Fatalf("got %d matches, want 2: %+v", len(got), got)
	}
	want := map[WorkerID]int{ws[0].ID(): 3, ws[1].ID(): 1}
	for _, m := range got {
		if want[m.Worker] != m.Blocks {
			t.Fatalf("worker %d matched %d, want %d", m.Worker, m.Blocks, want[m.Worker])
		}
	}
	// The filter leaves out worker a.
	got = ix.Match(keys, func(id WorkerID) bool { return id != ws[0].ID() }, nil)
	if len(got) != 1 || got[0].Worker != ws[1].ID() {
		t.Fatalf("filtered = %+v", got)
	}
}

func TestMediaAndOffload(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	apply(t, w, stored(0, false, []uint64{1, 2, 3}, seqTokens(0, 12)))
	// Offload blocks 1 and 2 to CPU: empty token_ids, known hashes.
	off := events.Event{Kind: events.KindBlockStored, BlockHashes: []uint64{1, 2}, Medium: events.MediumCPU}
	if err := apply(t, w, off); err != nil {
		t.Fatal(err)
	}
	apply(t, w, removed(events.MediumGPU, 2))
	m := matchOf(ix, seqTokens(0, 12), nil, w)
	if m.Blocks != 3 || m.ByMedium[events.MediumGPU] != 1 || m.ByMedium[events.MediumCPU] != 2 {
		t.Fatalf("match = %+v, want any 3 (block 1 only on CPU), GPU 1, CPU 2", m)
	}
	s := w.Stats()
	if s.ResidentBlocks != 3 || s.ResidentByMedium[events.MediumGPU] != 2 || s.ResidentByMedium[events.MediumCPU] != 2 {
		t.Fatalf("stats = %+v", s)
	}
	// Offload of a block never stored is counted, not applied.
	err := apply(t, w, events.Event{Kind: events.KindBlockStored, BlockHashes: []uint64{99}, Medium: events.MediumCPU})
	if !errors.Is(err, ErrUnknownBlock) || w.Stats().UnknownBlocks != 1 {
		t.Fatalf("err = %v, unknown = %d", err, w.Stats().UnknownBlocks)
	}
}

func TestLoRAAndSaltDoNotMix(t *testing.T) {
	ix, ws := newTestIndex(t, "base", "lora")
	tokens := seqTokens(0, 8)
	apply(t, ws[0], stored(0, false, []uint64{1, 2}, tokens))
	lora := stored(0, false, []uint64{1, 2}, tokens)
	lora.LoRAName = "my-lora"
	lora.ExtraKeys = []events.ExtraKeys{
		events.AppendString(events.AppendTuple(nil, 1), "my-lora"),
		events.AppendString(events.AppendTuple(nil, 1), "my-lora"),
	}
	apply(t, ws[1], lora)

	if m := matchOf(ix, tokens, nil, ws[0]); m.Blocks != 2 {
		t.Fatalf("base prompt on base worker: %d", m.Blocks)
	}
	if m := matchOf(ix, tokens, nil, ws[1]); m.Blocks != 0 {
		t.Fatalf("base prompt on lora worker: %d, want 0", m.Blocks)
	}
	loraReq := &PromptExtras{LoRAName: "my-lora"}
	if m := matchOf(ix, tokens, loraReq, ws[1]); m.Blocks != 2 {
		t.Fatalf("lora prompt on lora worker: %d, want 2", m.Blocks)
	}
	if m := matchOf(ix, tokens, loraReq, ws[0]); m.Blocks != 0 {
		t.Fatalf("lora prompt on base worker: %d, want 0", m.Blocks)
	}
	// Without extra_keys on the wire, lora_name alone keys the same way.
	ix2, ws2 := newTestIndex(t, "lora")
	bare := stored(0, false, []uint64{1, 2}, tokens)
	bare.LoRAName = "my-lora"
	apply(t, ws2[0], bare)
	if m := matchOf(ix2, tokens, loraReq, ws2[0]); m.Blocks != 2 {
		t.Fatalf("lora_name-only event: %d, want 2", m.Blocks)
	}

	// cache_salt sits in block 0's extra keys only.
	ix3, ws3 := newTestIndex(t, "salted")
	salted := stored(0, false, []uint64{1, 2}, tokens)
	salted.ExtraKeys = []events.ExtraKeys{events.AppendString(events.AppendTuple(nil, 1), "s3cret"), nil}
	apply(t, ws3[0], salted)
	if m := matchOf(ix3, tokens, &PromptExtras{CacheSalt: "s3cret"}, ws3[0]); m.Blocks != 2 {
		t.Fatalf("salted prompt: %d, want 2", m.Blocks)
	}
	if m := matchOf(ix3, tokens, nil, ws3[0]); m.Blocks != 0 {
		t.Fatalf("unsalted prompt on salted blocks: %d, want 0", m.Blocks)
	}
	if m := matchOf(ix3, tokens, &PromptExtras{CacheSalt: "other"}, ws3[0]); m.Blocks != 0 {
		t.Fatalf("other salt: %d, want 0", m.Blocks)
	}
}

func TestModelsDoNotMix(t *testing.T) {
	ix := New(Config{})
	ix.AddModel("m1", 4)
	ix.AddModel("m2", 4)
	w1, _ := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "p1"}, Model: "m1"})
	apply(t, w1, stored(0, false, []uint64{1}, seqTokens(0, 4)))
	if got := ix.Match(PromptKeys("m2", 4, seqTokens(0, 4), nil, nil), nil, nil); len(got) != 0 {
		t.Fatalf("m2 prompt matched m1 blocks: %+v", got)
	}
	if got := ix.Match(PromptKeys("m1", 4, seqTokens(0, 4), nil, nil), nil, nil); len(got) != 1 {
		t.Fatalf("m1 prompt: %+v", got)
	}
	if _, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "p1"}, Model: "m1"}); !errors.Is(err, ErrDuplicateWorker) {
		t.Fatalf("duplicate worker: %v", err)
	}
	if _, err := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "p9"}, Model: "nope"}); !errors.Is(err, ErrUnknownModel) {
		t.Fatalf("unknown model: %v", err)
	}
	if _, err := ix.AddModel("m1", 16); !errors.Is(err, ErrBlockSize) {
		t.Fatalf("block size change: %v", err)
	}
}

func TestBadEventsAreCountedAndSkipped(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	// The engine's first store announces 16-token blocks, not the
	// configured 4: the worker and its model learn 16.
	first := stored(0, false, []uint64{1}, seqTokens(0, 16))
	first.BlockSize = 16
	short := stored(0, false, []uint64{5, 6}, seqTokens(0, 5))
	short.BlockSize = 16
	other := stored(0, false, []uint64{7}, seqTokens(0, 4)) // 4-token blocks while it holds 16-token ones
	good := stored(1, true, []uint64{2}, seqTokens(16, 16))
	good.BlockSize = 16
	err := apply(t, w, first, short, other, good)
	if !errors.Is(err, ErrGroup) || !errors.Is(err, ErrTokenCount) {
		t.Fatalf("err = %v", err)
	}
	m, _ := ix.Model("m")
	if m.BlockSize() != 16 || m.ConfiguredBlockSize() != 4 {
		t.Fatalf("model block size %d (configured %d), want 16 learned", m.BlockSize(), m.ConfiguredBlockSize())
	}
	if got := ix.Match(m.PromptKeys(seqTokens(0, 32), nil, nil), nil, nil); len(got) != 1 || got[0].Blocks != 2 {
		t.Fatalf("the good event after bad ones was not applied: %+v, want 2 blocks", got)
	}
	s := w.Stats()
	if s.BlockSizeMismatches != 0 || s.InvalidEvents != 1 || s.LayoutChanges != 1 || s.ResidentBlocks != 2 || s.BlockSize != 16 {
		t.Fatalf("stats = %+v", s)
	}
}

// TestWorkersDisagreeingOnBlockSize: the model keys prompts at the block
// size most of its workers announce; the odd worker is flagged, its blocks
// kept at its own size and counted, and Diagnose says why it misses.
func TestWorkersDisagreeingOnBlockSize(t *testing.T) {
	ix, ws := newTestIndex(t, "a", "b", "c")
	ev := func(bs int) events.Event {
		e := stored(0, false, []uint64{1, 2}, seqTokens(0, 2*bs))
		e.BlockSize = bs
		return e
	}
	apply(t, ws[0], ev(16))
	apply(t, ws[1], ev(16))
	apply(t, ws[2], ev(32))
	m, _ := ix.Model("m")
	if m.BlockSize() != 16 {
		t.Fatalf("model block size %d, want 16 (two workers of three)", m.BlockSize())
	}
	if want := []BlockSizeCount{{16, 2}, {32, 1}}; !reflect.DeepEqual(m.LearnedBlockSizes(), want) {
		t.Fatalf("learned %v, want %v", m.LearnedBlockSizes(), want)
	}
	if ws[0].BlockSizeMismatch() || !ws[2].BlockSizeMismatch() {
		t.Fatalf("mismatch flags %v %v, want false true", ws[0].BlockSizeMismatch(), ws[2].BlockSizeMismatch())
	}
	if s := ws[2].Stats(); s.BlockSizeMismatches != 1 || s.ResidentBlocks != 2 || s.BlockSize != 32 {
		t.Fatalf("odd worker's stats %+v", s)
	}
	got := sortMatches(ix.Match(m.PromptKeys(seqTokens(0, 64), nil, nil), nil, nil))
	if len(got) != 2 || got[0].Blocks != 2 || got[1].Blocks != 2 || got[1].Worker != ws[1].ID() {
		t.Fatalf("matches %+v, want a and b with 2 blocks", got)
	}
	d := ix.Diagnose(&DiagnoseQuery{Model: m, Worker: ws[2], Tokens: seqTokens(0, 64)})
	if !slices.ContainsFunc(d.Findings, func(f Finding) bool { return f.Reason == ReasonBlockSize }) {
		t.Fatalf("diagnosis %+v lacks %v", d, ReasonBlockSize)
	}
	// The odd worker's engine restarts with 16-token blocks: the model
	// learns nothing new, the worker is no longer flagged.
	ws[2].Reset("restart")
	apply(t, ws[2], ev(16))
	if ws[2].BlockSizeMismatch() || m.BlockSize() != 16 {
		t.Fatalf("after the restart: flagged %v, model %d", ws[2].BlockSizeMismatch(), m.BlockSize())
	}
}

func TestOrphansAreCountedAndNeverMatch(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	err := apply(t, w, stored(777, true, []uint64{2, 3}, seqTokens(4, 8)))
	if !errors.Is(err, ErrOrphan) {
		t.Fatalf("err = %v", err)
	}
	// A descendant of the orphan resolves through the engine map.
	if err := apply(t, w, stored(3, true, []uint64{4}, seqTokens(12, 4))); err != nil {
		t.Fatalf("descendant: %v", err)
	}
	s := w.Stats()
	if s.Orphans != 2 || s.ResidentBlocks != 3 {
		t.Fatalf("stats = %+v", s)
	}
	if got := ix.Match(PromptKeys(testModel, 4, seqTokens(0, 16), nil, nil), nil, nil); len(got) != 0 {
		t.Fatalf("orphans matched a prompt: %+v", got)
	}
	// Removals of orphans work.
	if err := apply(t, w, removed(events.MediumGPU, 2, 3, 4)); err != nil {
		t.Fatal(err)
	}
	if w.Stats().ResidentBlocks != 0 {
		t.Fatalf("resident = %d", w.Stats().ResidentBlocks)
	}
}

func TestSlidingWindowGroupIgnored(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	full := stored(0, false, []uint64{1, 2}, seqTokens(0, 8))
	full.SpecKind, full.GroupIdx, full.HasGroupIdx = "full_attention", 0, true
	sw := stored(0, false, []uint64{1, 2}, seqTokens(0, 8))
	sw.SpecKind, sw.GroupIdx, sw.HasGroupIdx = "sliding_window", 1, true
	apply(t, w, full, sw)
	rmSW := removed(events.MediumGPU, 1)
	rmSW.GroupIdx, rmSW.HasGroupIdx = 1, true
	if err := apply(t, w, rmSW); err != nil {
		t.Fatal(err)
	}
	if m := matchOf(ix, seqTokens(0, 8), nil, w); m.Blocks != 2 {
		t.Fatalf("sliding-window removal touched full-attention residency: %d", m.Blocks)
	}
	s := w.Stats()
	if s.ResidentBlocks != 2 || s.SkippedGroupEvents != 2 {
		t.Fatalf("stats = %+v", s)
	}
}

// TestSGLangCacheSalt: SGLang carries cache_salt on the event instead of in
// extra_keys; its blocks match only prompts with the same salt, and events
// continuing a salted sequence inherit the salt through their parent.
func TestSGLangCacheSalt(t *testing.T) {
	ix, ws := newTestIndex(t, "sglang")
	w := ws[0]
	first := stored(0, false, []uint64{1, 2}, seqTokens(0, 8))
	first.CacheSalt = "tenant-a"
	next := stored(2, true, []uint64{3}, seqTokens(8, 4))
	next.CacheSalt = "tenant-a"
	if err := apply(t, w, first, next); err != nil {
		t.Fatal(err)
	}
	prompt := seqTokens(0, 12)
	if m := matchOf(ix, prompt, &PromptExtras{CacheSalt: "tenant-a"}, w); m.Blocks != 3 {
		t.Fatalf("same salt: %d, want 3", m.Blocks)
	}
	if m := matchOf(ix, prompt, nil, w); m.Blocks != 0 {
		t.Fatalf("unsalted prompt: %d, want 0", m.Blocks)
	}
	if m := matchOf(ix, prompt, &PromptExtras{CacheSalt: "tenant-b"}, w); m.Blocks != 0 {
		t.Fatalf("other salt: %d, want 0", m.Blocks)
	}
}

// TestDiagnoseHybridGroups: Diagnose says which KV-cache group caps a
// hybrid worker's hit and what vLLM realizes, and names a group whose hit
// rule kvindex does not model.
func TestDiagnoseHybridGroups(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	toks := seqTokens(0, 6*4+1)
	full := stored(0, false, []uint64{1, 2, 3, 4, 5, 6}, toks[:24])
	full.SpecKind, full.GroupIdx, full.HasGroupIdx = "full_attention", 0, true
	win := full
	win.SpecKind, win.GroupIdx, win.SlidingWindow, win.HasSlidingWindow = "sliding_window", 1, 9, true // 2 blocks
	local := full
	local.SpecKind, local.GroupIdx = "chunked_local_attention", 2
	apply(t, w, full, win, local)
	m, _ := ix.Model(testModel)
	d := ix.Diagnose(&DiagnoseQuery{Model: m, Worker: w, Tokens: toks})
	if got := d.Findings[0].Reason; got != ReasonGroupNotModelled || !strings.Contains(d.Findings[0].Detail, "chunked_local_attention") {
		t.Fatalf("findings %+v, want the unmodelled group first", d.Findings)
	}
	if !slices.ContainsFunc(d.Findings, func(f Finding) bool { return f.Reason == ReasonHit }) {
		t.Fatalf("findings %+v: the window holds every block, a hit", d.Findings)
	}
	// The window loses blocks 3 and 4 (hashes 4, 5): the longest cut with
	// both blocks before it is 3 (blocks 1 and 2).
	rm := events.Event{Kind: events.KindBlockRemoved, BlockHashes: []uint64{4, 5}, GroupIdx: 1, HasGroupIdx: true}
	apply(t, w, rm)
	d = ix.Diagnose(&DiagnoseQuery{Model: m, Worker: w, Tokens: toks})
	i := slices.IndexFunc(d.Findings, func(f Finding) bool { return f.Reason == ReasonGroupCap })
	if i < 0 || d.Matched != 6 || !strings.Contains(d.Findings[i].Detail, "vLLM realizes 3 blocks") || !strings.Contains(d.Findings[i].Detail, "group 1 (sliding_window, window 9)") {
		t.Fatalf("matched %d, findings %+v: want the window group capping 6 blocks at 3", d.Matched, d.Findings)
	}
	if slices.ContainsFunc(d.Findings, func(f Finding) bool { return f.Reason == ReasonHit }) {
		t.Fatalf("findings %+v: a capped hit is no hit", d.Findings)
	}
}

// TestSideStoreChainsThroughNullBlocks: vLLM leaves a group's null blocks out of
// block_hashes but not out of token_ids (a mamba group in align mode names
// only the last block of a chunk): the hashes are the last blocks', keyed
// through the ones before; the prefix group, which has none, refuses it.
func TestSideStoreChainsThroughNullBlocks(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	toks := seqTokens(0, 4*4+1)
	full := stored(0, false, []uint64{1, 2, 3, 4}, toks[:16])
	full.SpecKind, full.GroupIdx, full.HasGroupIdx = "full_attention", 1, true
	chunk := stored(0, false, []uint64{2}, toks[:8]) // blocks 0 and 1, the state at block 1
	chunk.SpecKind, chunk.GroupIdx, chunk.HasGroupIdx = "mamba", 0, true
	next := stored(2, true, []uint64{4}, toks[8:16]) // blocks 2 and 3 after block 1
	next.SpecKind, next.GroupIdx, next.HasGroupIdx = "mamba", 0, true
	apply(t, w, full, chunk, next)
	m, _ := ix.Model(testModel)
	keys := m.PromptKeys(toks, nil, nil)
	at := func(int) []Key { return keys }
	if tok, by := w.Cap(4*4, 4*4, at); tok != 16 || by != -1 {
		t.Fatalf("Cap at 4 blocks = %d tokens (by %d), want 16: the mamba state at block 3 is held", tok, by)
	}
	if tok, by := w.Cap(4*4, 3*4, at); tok != 8 || by != 0 {
		t.Fatalf("Cap at 3 blocks = %d tokens (by %d), want 8: the last state before is block 1's", tok, by)
	}
	if s := w.Stats(); s.SideBlocks != 2 || s.InvalidEvents != 0 {
		t.Fatalf("stats %+v, want 2 side blocks", s)
	}
	bad := stored(4, true, []uint64{9}, seqTokens(100, 8)) // two blocks' tokens, one hash, in the prefix group
	bad.SpecKind, bad.GroupIdx, bad.HasGroupIdx = "full_attention", 1, true
	if err := w.ApplyBatch(&events.Batch{Events: []events.Event{bad}}); !errors.Is(err, ErrTokenCount) {
		t.Fatalf("a prefix-group store with null blocks: %v, want ErrTokenCount", err)
	}
}

// TestSideGroupsOfOneDescription: side groups of one description (Gemma 3's
// five sliding-window groups) are looked up together: a block is held
// only when every one holds it, as vLLM's coordinator asks of a spec.
func TestSideGroupsOfOneDescription(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	toks := seqTokens(0, 10*4+1)
	var hs []uint64
	for i := range 10 {
		hs = append(hs, uint64(100+i))
	}
	evs := []events.Event{stored(0, false, hs, toks[:40])}
	evs[0].SpecKind, evs[0].GroupIdx, evs[0].HasGroupIdx = "full_attention", 0, true
	for g := 1; g <= 3; g++ {
		e := evs[0]
		e.SpecKind, e.GroupIdx, e.SlidingWindow, e.HasSlidingWindow = "sliding_window", g, 9, true // 2 blocks
		evs = append(evs, e)
	}
	apply(t, w, evs...)
	m, _ := ix.Model(testModel)
	keys := m.PromptKeys(toks, nil, nil)
	at := func(int) []Key { return keys }
	if tok, by := w.Cap(40, 40, at); tok != 40 || by != -1 {
		t.Fatalf("every group holds every block: Cap = %d (by %d), want 40", tok, by)
	}
	// Group 2 alone loses block 8: no cut with blocks 8 before it is whole
	// for the spec, so the longest is 8 (blocks 6 and 7).
	apply(t, w, events.Event{Kind: events.KindBlockRemoved, BlockHashes: []uint64{108}, GroupIdx: 2, HasGroupIdx: true})
	if tok, by := w.Cap(40, 40, at); tok != 32 || by != 1 {
		t.Fatalf("group 2 lost block 8: Cap = %d (by %d), want 32 by group 1, the spec's first", tok, by)
	}
	// A wider window in group 3 makes it a spec of its own.
	w.Reset("restart")
	for i := range evs {
		if evs[i].GroupIdx == 3 {
			evs[i].SlidingWindow = 17 // 4 blocks
		}
	}
	apply(t, w, evs...)
	apply(t, w, events.Event{Kind: events.KindBlockRemoved, BlockHashes: []uint64{106}, GroupIdx: 3, HasGroupIdx: true})
	if tok, by := w.Cap(40, 40, at); tok != 24 || by != 3 {
		t.Fatalf("group 3 (4-block window) lost block 6: Cap = %d (by %d), want 24 by group 3", tok, by)
	}
}
