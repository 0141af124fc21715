package scoring

import (
	"testing"

	"github.com/kvindex/kvindex/events"
	"github.com/kvindex/kvindex/indexer"
)

func TestRankLongestPrefix(t *testing.T) {
	r := Ranker{Names: []events.WorkerRef{{Pod: "c"}, {Pod: "a", DPRank: 1}, {Pod: "a"}, {Pod: "b"}}}
	gpu := func(w indexer.WorkerID, blocks, onGPU int) indexer.Match {
		m := indexer.Match{Worker: w, Blocks: blocks}
		m.ByMedium[events.MediumGPU] = onGPU
		m.ByMedium[events.MediumCPU] = blocks
		return m
	}
	ms := []indexer.Match{
		gpu(0, 4, 4), // c: 4 blocks
		gpu(1, 9, 2), // a/1: 9 blocks, 2 on GPU
		gpu(2, 9, 9), // a/0: 9 on GPU: best
		gpu(3, 9, 2), // b: ties a/1; a/1 wins by name
		gpu(7, 9, 2), // unknown id: last among equals
	}
	r.Rank(ms)
	want := []indexer.WorkerID{2, 1, 3, 7, 0}
	for i, w := range want {
		if ms[i].Worker != w {
			t.Fatalf("rank %d = worker %d, want %d (all: %+v)", i, ms[i].Worker, w, ms)
		}
	}
}

func TestRankAllocatesNothing(t *testing.T) {
	r := &Ranker{Names: []events.WorkerRef{{Pod: "a"}, {Pod: "b"}, {Pod: "c"}}}
	ms := []indexer.Match{{Worker: 2, Blocks: 1}, {Worker: 0, Blocks: 3}, {Worker: 1, Blocks: 3}}
	if n := testing.AllocsPerRun(100, func() { r.Rank(ms) }); n != 0 {
		t.Fatalf("Rank allocates %v times", n)
	}
}
