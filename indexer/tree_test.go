package indexer

import (
	"fmt"
	"testing"

	"github.com/kvindex/kvindex/events"
)

// chain returns a BlockStored event of blocks [from, to) of a sequence
// whose block i has engine hash base+i and tokens seqTokens(4*i+salt, 4),
// chained to block from-1.
func chain(base uint64, salt, from, to int) events.Event {
	ev := events.Event{Kind: events.KindBlockStored, BlockSize: 4}
	if from > 0 {
		ev.HasParent, ev.ParentHash = true, base+uint64(from-1)
	}
	for i := from; i < to; i++ {
		ev.BlockHashes = append(ev.BlockHashes, base+uint64(i))
		ev.TokenIDs = append(ev.TokenIDs, seqTokens(4*i+salt, 4)...)
	}
	return ev
}

// chainTokens are the tokens of blocks [0, n) of chain(_, salt, ...).
func chainTokens(salt, n int) []uint32 {
	var t []uint32
	for i := range n {
		t = append(t, seqTokens(4*i+salt, 4)...)
	}
	return t
}

func TestHotPrefixIsOneNodeAndOneSet(t *testing.T) {
	const workers, prefix = 100, 64
	var names []string
	for i := range workers {
		names = append(names, fmt.Sprint("w", i))
	}
	ix, ws := newTestIndex(t, names...)
	for i, w := range ws {
		// Every worker stores the prefix, in pieces, then a tail of its own
		// (tokens that differ from block prefix on).
		for from := 0; from < prefix; from += 16 {
			if err := apply(t, w, chain(1000, 0, from, from+16)); err != nil {
				t.Fatal(err)
			}
		}
		tail := events.Event{Kind: events.KindBlockStored, BlockSize: 4, HasParent: true, ParentHash: 1000 + prefix - 1,
			BlockHashes: []uint64{5000 + uint64(i), 6000 + uint64(i)}, TokenIDs: seqTokens(100000*(i+1), 8)}
		if err := apply(t, w, tail); err != nil {
			t.Fatal(err)
		}
	}
	keys := PromptKeys(testModel, 4, chainTokens(0, prefix), nil, nil)
	top := ix.head(keys[0])
	// One segment (one Set) for the prefix, one for the first worker's
	// tail, which extends the run.
	if top == nil || len(top.segs) != 2 || top.segs[0].set.Len() != workers || top.segs[1].start != prefix {
		t.Fatalf("prefix node segments: %+v", top.segs)
	}
	if n := len(top.keys); n != prefix+2 { // the first worker's tail extends the run
		t.Fatalf("prefix node holds %d keys, want %d", n, prefix+2)
	}
	if len(top.children) != workers-1 {
		t.Fatalf("prefix node has %d children, want %d", len(top.children), workers-1)
	}
	got := ix.Match(keys, nil, nil)
	if len(got) != workers {
		t.Fatalf("%d matches, want %d", len(got), workers)
	}
	for _, m := range got {
		if m.Blocks != prefix || m.ByMedium[events.MediumGPU] != prefix {
			t.Fatalf("match %+v, want %d blocks", m, prefix)
		}
	}
	// Worker 7's full prompt: prefix then its own tail. With a filter of
	// 2 of 100 holders, Match looks them up instead of scanning each set.
	full := append(chainTokens(0, prefix), seqTokens(100000*8, 8)...)
	keys = PromptKeys(testModel, 4, full, nil, nil)
	got = sortMatches(ix.Match(keys, func(id WorkerID) bool { return id == 7 || id == 50 }, nil))
	if len(got) != 2 || got[0].Worker != 7 || got[0].Blocks != prefix+2 || got[1].Blocks != prefix {
		t.Fatalf("filtered matches %+v", got)
	}
	// Half the workers drop the prefix's last 16 blocks: one more set.
	for _, w := range ws[:workers/2] {
		var hs []uint64
		for i := prefix - 1; i >= prefix-16; i-- {
			hs = append(hs, 1000+uint64(i))
		}
		if err := apply(t, w, removed(events.MediumGPU, hs...)); err != nil {
			t.Fatal(err)
		}
	}
	if n := len(top.segs); n != 3 {
		t.Fatalf("prefix node has %d segments, want 3", n)
	}
	for _, m := range ix.Match(keys, nil, nil) {
		want := prefix - 16
		if m.Worker >= workers/2 {
			want = prefix
			if m.Worker == 7+workers/2 {
				want = prefix + 2
			}
		}
		if m.Worker == 7 || m.Blocks != want && m.Worker != 7+workers/2 {
			if m.Blocks != want {
				t.Fatalf("worker %d matched %d, want %d", m.Worker, m.Blocks, want)
			}
		}
	}
	checkInvariants(t, ix)
}

func TestDeadTailIsCompacted(t *testing.T) {
	ix, ws := newTestIndex(t, "a", "b")
	a, b := ws[0], ws[1]
	apply(t, a, chain(1, 0, 0, 200))
	// b branches off at block 99.
	apply(t, b, chain(1, 0, 0, 100), events.Event{Kind: events.KindBlockStored, BlockSize: 4, HasParent: true,
		ParentHash: 100, BlockHashes: []uint64{9000}, TokenIDs: seqTokens(777777, 4)})
	// a evicts its blocks 60..199 last first, b its blocks 0..99.
	for i := 199; i >= 60; i-- {
		apply(t, a, removed(events.MediumGPU, 1+uint64(i)))
	}
	keys := PromptKeys(testModel, 4, chainTokens(0, 200), nil, nil)
	n := ix.head(keys[0])
	if l := len(n.keys); l != 100 {
		t.Fatalf("run is %d keys after its tail died, want 100 (b's branch attaches at 99)", l)
	}
	for i := 99; i >= 0; i-- {
		apply(t, b, removed(events.MediumGPU, 1+uint64(i)))
	}
	if l := len(n.keys); l != 100 {
		t.Fatalf("run is %d keys, want 100", l)
	}
	got := sortMatches(ix.Match(keys, nil, nil))
	if len(got) != 1 || got[0].Blocks != 60 {
		t.Fatalf("matches %+v, want a with 60", got)
	}
	apply(t, b, removed(events.MediumGPU, 9000))
	// The branch died. a evicts blocks 59 down to 49: when the dead tail
	// is half the run (a holds 0-49), the node is compacted to 50 keys.
	for i := 59; i >= 49; i-- {
		apply(t, a, removed(events.MediumGPU, 1+uint64(i)))
		if want := 100; i > 50 && len(n.keys) != want {
			t.Fatalf("run is %d keys with a dead tail under half, want %d", len(n.keys), want)
		}
	}
	if l := len(n.keys); l != 50 {
		t.Fatalf("run is %d keys, want 50", l)
	}
	checkInvariants(t, ix)
	a.Reset("done")
	if ix.head(keys[0]) != nil || !n.dead.Load() {
		t.Fatal("empty node still in the tree")
	}
	checkInvariants(t, ix)
}

func TestCapacityEvictsLeastRecentlyStored(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	w.SetCapacity(10)
	apply(t, w, chain(100, 0, 0, 4)) // sequence A: 4 blocks
	apply(t, w, chain(200, 1, 0, 8)) // sequence B: 8 blocks, 2 over capacity
	s := w.Stats()
	if s.ResidentBlocks != 10 || s.Evictions != 2 || s.Capacity != 10 {
		t.Fatalf("stats %+v", s)
	}
	// A's first two blocks went: A no longer matches, B does.
	if m := matchOf(ix, chainTokens(0, 4), nil, w); m.Blocks != 0 {
		t.Fatalf("A matches %d blocks after its head was evicted", m.Blocks)
	}
	if m := matchOf(ix, chainTokens(1, 8), nil, w); m.Blocks != 8 {
		t.Fatalf("B matches %d", m.Blocks)
	}
	// Naming A's last block as a parent touches it; B's oldest go next.
	apply(t, w, chain(100, 0, 4, 6))
	if m := matchOf(ix, chainTokens(1, 8), nil, w); m.Blocks != 0 {
		t.Fatalf("B matches %d after its head was evicted", m.Blocks)
	}
	if s := w.Stats(); s.Evictions != 4 || s.ResidentBlocks != 10 {
		t.Fatalf("stats %+v", s)
	}
	// Removals of evicted blocks are unknown, as they would be after a gap.
	if err := apply(t, w, removed(events.MediumGPU, 200)); err == nil {
		t.Fatal("removal of an evicted block: no error")
	}
	w.SetCapacity(-1)
	apply(t, w, chain(300, 2, 0, 20))
	if s := w.Stats(); s.ResidentBlocks != 30 || s.Capacity != 0 {
		t.Fatalf("unbounded: stats %+v", s)
	}
	checkInvariants(t, ix)
}

func TestCapacityIsLearnedAtTheFirstRemoval(t *testing.T) {
	ix, ws := newTestIndex(t, "a")
	w := ws[0]
	apply(t, w, chain(1, 0, 0, 3000))
	if s := w.Stats(); s.Capacity != 0 {
		t.Fatalf("capacity %d before any removal", s.Capacity)
	}
	apply(t, w, removed(events.MediumGPU, 1+2999))
	if s := w.Stats(); s.Capacity != 6000 {
		t.Fatalf("learned capacity %d, want 2 x 3000", s.Capacity)
	}
	// Offloads to CPU that never see a removal there leave it unbounded.
	apply(t, w, events.Event{Kind: events.KindBlockStored, Medium: events.MediumCPU, BlockHashes: []uint64{1}})
	if s := w.Stats(); s.Capacity != 0 {
		t.Fatalf("capacity %d with an unlearned medium", s.Capacity)
	}
	apply(t, w, removed(events.MediumCPU, 1))
	apply(t, w, chain(100000, 5, 0, 4000))
	s := w.Stats()
	if s.Capacity != 6002 || s.ResidentBlocks != 6002 || s.Evictions != 2999+4000-6002 {
		t.Fatalf("stats %+v", s)
	}
	checkInvariants(t, ix)
}

func TestMemoryBudgetEvictsFromTheLargest(t *testing.T) {
	ix := New(Config{Shards: 4, MemoryBudget: 1000 * EstimatedBytesPerBlock, WorkerCapacity: -1})
	ix.AddModel(testModel, 4)
	a, _ := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "a"}, Model: testModel})
	b, _ := ix.AddWorker(WorkerInfo{Ref: events.WorkerRef{Pod: "b"}, Model: testModel})
	apply(t, b, chain(1, 0, 0, 400))
	apply(t, a, chain(100000, 1, 0, 800))
	sa, sb := a.Stats(), b.Stats()
	if total := sa.ResidentBlocks + sb.ResidentBlocks; total > 1000 || total < 900 {
		t.Fatalf("%d blocks resident over a budget of 1000", total)
	}
	if sb.Evictions != 0 || sa.BudgetEvictions == 0 || sa.Evictions != sa.BudgetEvictions {
		t.Fatalf("a %+v\nb %+v", sa, sb)
	}
	checkInvariants(t, ix)
}

func TestMatchStopsAtTheFirstBlockNobodyExtends(t *testing.T) {
	ix, ws := newTestIndex(t, "a", "b")
	apply(t, ws[0], chain(1, 0, 0, 10))
	apply(t, ws[1], chain(1, 0, 0, 3))
	// b offloads blocks 0-1 to CPU, a holds block 0 on CPU too.
	apply(t, ws[1], events.Event{Kind: events.KindBlockStored, Medium: events.MediumCPU, BlockHashes: []uint64{1, 2}})
	apply(t, ws[0], events.Event{Kind: events.KindBlockStored, Medium: events.MediumCPU, BlockHashes: []uint64{1}})
	got := sortMatches(ix.Match(PromptKeys(testModel, 4, chainTokens(0, 20), nil, nil), nil, nil))
	want := []Match{
		{Worker: 0, Blocks: 10, ByMedium: [events.NumMedia]int{10, 1}},
		{Worker: 1, Blocks: 3, ByMedium: [events.NumMedia]int{3, 2}},
	}
	if fmt.Sprint(got) != fmt.Sprint(want) {
		t.Fatalf("got %+v, want %+v", got, want)
	}
}
